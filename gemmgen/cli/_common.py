"""Arguments and printing shared by several subcommands."""
from __future__ import annotations

import argparse
import json
import sys

from ..model.arch import Gpu, lookup_gpu
from ..model.errors import NoGpu
from ..model.problem import Problem


def add_problem_args(parser: argparse.ArgumentParser, shape: bool = True) -> None:
    """M N K and the operand description: dtype, layouts, epilogue."""
    if shape:
        parser.add_argument("M", help="rows of A and D")
        parser.add_argument("N", help="columns of B and D")
        parser.add_argument("K", help="the reduction dimension")
    parser.add_argument("--dtype", default="bf16", help="A/B/C dtype: bf16 (default), f16")
    parser.add_argument("--a", dest="a_layout", default="row", help="layout of A (M×K): row (default) or col")
    parser.add_argument("--b", dest="b_layout", default="row", help="layout of B (K×N): row (default) or col")
    parser.add_argument("--alpha", type=float, default=1.0, help="D = alpha*A@B + beta*C (default 1)")
    parser.add_argument("--beta", type=float, default=0.0, help="default 0: C is not read")
    parser.add_argument("--bias", action="store_true", help="add a bias per column of D")
    parser.add_argument("--activation", default="none", help="none (default), relu or gelu")


def problem_from_args(args) -> Problem:
    return Problem.create(args.M, args.N, args.K, args.dtype, args.a_layout, args.b_layout, None,
                          args.alpha, args.beta, args.bias, args.activation)


def add_gpu_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default=None,
                        help="catalogue name (h100, h100-pcie, h200, a100, l40s, rtx4090, ...); default: the GPU found")


def resolve_gpu(name: "str | None") -> Gpu:
    """The named catalogue GPU, else the one the driver reports, else a one-line NoGpu error."""
    if name:
        return lookup_gpu(name)
    from ..runtime.detect import detect_gpu  # the only path from here into cuda-python

    found = detect_gpu()
    if found.gpu is None:
        raise NoGpu(found.reason, "pass --gpu NAME, e.g. --gpu h100; `gemmgen gpus` lists the catalogue")
    return found.gpu


def print_json(payload) -> None:
    json.dump(payload, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def table(rows: "list[list[str]]", header: "list[str]") -> str:
    """Plain aligned text table."""
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
