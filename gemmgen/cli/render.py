"""`gemmgen render [M N K] [--dtype] [--a] [--b] [--lda/--ldb/--ldc] [--arch] [--config FILE] [--gpu]`: print a
kernel's CUDA source."""
from __future__ import annotations

import sys

from ._common import add_gpu_arg, add_problem_args, text_arg
from ._kernel import add_kernel_args, kernel_from_args


def register(subparsers) -> None:
    parser = subparsers.add_parser("render", help="print the CUDA source of a kernel",
                                   description="Print the CUDA source of the model's pick for M N K, or of --config.")
    parser.add_argument("shape", nargs="*", metavar="M N K", type=text_arg("M N K"),
                        help="problem shape (default 4096 4096 4096)")
    # --lda/--ldb/--ldc as compile takes them: a view's alignment picks another kernel (its name and source).
    add_problem_args(parser, shape=False, leading=True)
    add_gpu_arg(parser)
    add_kernel_args(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..codegen.render import render

    kernel, _problem, gpu = kernel_from_args(args)
    sys.stdout.write(render(kernel, gpu))
    return 0
