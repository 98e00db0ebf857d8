"""Arguments that pick one kernel: the problem, the GPU, the target arch and an optional config file."""
from __future__ import annotations

import argparse

from ..model.arch import Arch, lookup_gpu
from ..model.errors import InvalidInput
from ..model.problem import Problem
from ..model.tiles import Kernel, TileConfig
from ._common import problem_from_args, resolve_gpu, text_arg

DEFAULT_SHAPE = ("4096", "4096", "4096")


def add_kernel_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default=None, type=text_arg("--arch"),
                        help="target: sm_80, sm_86, sm_89, sm_90a (default: the GPU's)")
    parser.add_argument("--config", default=None, metavar="FILE", type=text_arg("--config"),
                        help="configuration (YAML or JSON, or a manifest); default: the model's pick")


def read_config(path: str) -> TileConfig:
    """The configuration in the file --config names (YAML, JSON, a manifest or a record)."""
    from ..model.files import read_text

    return TileConfig.from_text(read_text("--config", path), path)


def check_inputs(args) -> "tuple[Problem, Arch | None, TileConfig | None]":
    """The problem, --arch and --config, each validated before anything looks for a GPU: bad input is
    reported as bad input on any machine."""
    shape = getattr(args, "shape", None)
    if shape is not None:
        if len(shape) not in (0, 3):
            raise InvalidInput("the shape must be given as three integers M N K", " ".join(shape))
        args.M, args.N, args.K = shape or DEFAULT_SHAPE
    problem = problem_from_args(args)
    arch = Arch.parse(args.arch) if args.arch is not None else None
    config = read_config(args.config) if args.config is not None else None
    if args.gpu is not None:
        lookup_gpu(args.gpu)
    return problem, arch, config


def kernel_from_args(args) -> "tuple[Kernel, Problem, object]":
    """The kernel the arguments describe, validated against the GPU (InvalidConfig lists broken rules)."""
    from ..families import rules as constraints
    from ..rank.space import check_target, default_config

    problem, arch, config = check_inputs(args)
    gpu = resolve_gpu(args.gpu)
    arch = arch or gpu.arch
    check_target(gpu, arch, problem.a_dtype, problem.b_dtype)
    if config is None:
        from ._common import check_problem

        check_problem(problem, gpu, arch)  # a problem no family runs is refused naming the rule, as tune does
    config = config or default_config(problem, gpu, arch)
    constraints.validate(config, gpu, arch, problem)
    return Kernel(arch, problem.operands, config), problem, gpu
