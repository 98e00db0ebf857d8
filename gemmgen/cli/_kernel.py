"""Arguments that pick one kernel: the problem, the GPU, the target arch and an optional config file."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..model.arch import Arch
from ..model.errors import InvalidInput
from ..model.problem import Problem
from ..model.tiles import Kernel, TileConfig
from ._common import problem_from_args, resolve_gpu, text_arg

DEFAULT_SHAPE = ("4096", "4096", "4096")


def add_kernel_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default=None, type=text_arg("--arch"), help="target: sm_80, sm_86, sm_89, sm_90a (default: the GPU's)")
    parser.add_argument("--config", default=None, metavar="FILE", type=text_arg("--config"),
                        help="configuration (YAML or JSON, or a manifest); default: the model's pick")


def read_config(path: str) -> TileConfig:
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise InvalidInput("--config must name a readable file", path, exc.strerror) from None
    return TileConfig.from_text(text, str(file))


def kernel_from_args(args) -> "tuple[Kernel, Problem, object]":
    """The kernel the arguments describe, validated against the GPU (InvalidConfig lists broken rules)."""
    from ..families import rules as constraints
    from ..rank.space import default_config

    shape = getattr(args, "shape", None)
    if shape is not None:
        if len(shape) not in (0, 3):
            raise InvalidInput("the shape must be given as three integers M N K", " ".join(shape))
        args.M, args.N, args.K = shape or DEFAULT_SHAPE
    problem = problem_from_args(args)
    gpu = resolve_gpu(args.gpu)
    arch = Arch.parse(args.arch) if args.arch else gpu.arch
    if arch.cc > gpu.arch.cc or (arch.has_wgmma and not gpu.arch.has_wgmma):
        raise InvalidInput(f"arch must not exceed the GPU's ({gpu.arch.value} on {gpu.key})", arch.value)
    config = read_config(args.config) if args.config else default_config(problem, gpu, arch)
    constraints.validate(config, gpu, arch, problem)
    return Kernel(arch, problem.operands, config), problem, gpu
