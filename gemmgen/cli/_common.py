"""Arguments and printing shared by several subcommands."""
from __future__ import annotations

import argparse
import json
import sys

from ..model import parse
from ..model.arch import Gpu, lookup_gpu
from ..model.errors import InvalidInput, NoGpu
from ..model.problem import Problem


# --- values: every flag goes through model/parse (one parser per kind), refusals as argparse errors ---------

def _argtype(convert, label: str):
    """An argparse `type`: `convert(text)`, with InvalidInput turned into argparse's one-line usage error."""
    def parse_arg(text: str):
        try:
            return convert(text)
        except InvalidInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse_arg.__name__ = label
    return parse_arg


def int_arg(flag: str, lo: "int | None" = 1, hi: "int | None" = parse.INT64_MAX):
    """An integer flag within [lo, hi] (ASCII digits only: '1e30', '４', '' are refused)."""
    return _argtype(lambda text: parse.integer(flag, text, lo, hi), "integer")


def float_arg(flag: str, lo: "float | None" = None, hi: "float | None" = None, lo_open: bool = False):
    """A finite real flag within its range (NaN and infinity are refused)."""
    return _argtype(lambda text: parse.real(flag, text, lo, hi, lo_open=lo_open), "number")


def text_arg(flag: str):
    """A path, URL or list: any non-empty text without control characters ('' is an error, not "unset")."""
    return _argtype(lambda text: parse.text(flag, text), "text")


COUNT_MAX, JOBS_MAX, SECONDS_MAX, SEED_MAX = parse.COUNT_MAX, parse.JOBS_MAX, parse.SECONDS_MAX, parse.SEED_MAX


def given(args, flag: str) -> bool:
    """Whether `flag` changes anything: its value differs from its default (a flag repeated with its
    default value cannot be lost by being ignored)."""
    action = args._parser._option_string_actions[flag]
    return getattr(args, action.dest) != action.default


def refuse_together(args, flag: str, others: "tuple[str, ...]", why: str) -> None:
    """InvalidInput naming both flags when `flag` and any of `others` are given together: one of them
    would be silently ignored."""
    if not given(args, flag):
        return
    known = args._parser._option_string_actions  # a shared list may name flags this command does not have
    for other in others:
        if other in known and given(args, other):
            raise InvalidInput(f"{flag} and {other} cannot be used together ({why})", f"{flag} {other}")


def add_problem_args(parser: argparse.ArgumentParser, shape: bool = True, leading: "bool | None" = None) -> None:
    """M N K and the operand description: dtype, layouts, epilogue; and the leading dimensions (`leading`, by
    default where the command takes a shape)."""
    if shape:
        parser.add_argument("M", help="rows of A and D")
        parser.add_argument("N", help="columns of B and D")
        parser.add_argument("K", help="the reduction dimension")
    if shape if leading is None else leading:
        for flag, operand, what in (("--lda", "A", "K for row-major A, M for column-major"),
                                    ("--ldb", "B", "N for row-major B, K for column-major"),
                                    ("--ldc", "C and D", "N")):
            parser.add_argument(flag, type=int_arg(flag, 0), default=0, metavar="LD",
                                help=f"leading dimension of {operand} in elements, when it is a view into a wider "
                                     f"array (default 0: packed, {what}); the benchmark allocates it so, with NaN "
                                     "in the gaps")
    parser.add_argument("--dtype", default="bf16", type=text_arg("--dtype"),
                        help="A/B dtype: bf16 (default), f16, e4m3, e5m2, f32 (tf32 math); `gemmgen space` lists "
                             "each GPU's")
    parser.add_argument("--b-dtype", default=None, type=text_arg("--b-dtype"),
                        help="B's dtype when it differs from A's (--dtype, the default): fp8 pairs only, e.g. "
                             "--dtype e4m3 --b-dtype e5m2")
    parser.add_argument("--scaling", default=None, type=text_arg("--scaling"),
                        help="fp8 dequantization scales: tensor (default; one float32 per operand), rowcol "
                             "(one per row of A and one per column of B) or block (A per row and 128 of K, B per "
                             "128x128 block, as DeepGEMM)")
    parser.add_argument("--out-dtype", default=None, type=text_arg("--out-dtype"),
                        help="C/D/bias dtype: the inputs' (default; bf16 for fp8), or f32")
    parser.add_argument("--a", dest="a_layout", default="row", type=text_arg("--a"),
                        help="layout of A (M×K): row (default) or col")
    parser.add_argument("--b", dest="b_layout", default="row", type=text_arg("--b"),
                        help="layout of B (K×N): row (default) or col")
    parser.add_argument("--alpha", type=float_arg("--alpha"), default=1.0, help="D = alpha*A@B + beta*C (default 1)")
    parser.add_argument("--beta", type=float_arg("--beta"), default=0.0, help="default 0: C is not read")
    parser.add_argument("--bias", action="store_true", help="add a bias per column of D")
    parser.add_argument("--activation", default="none", type=text_arg("--activation"),
                        help="none (default), relu, gelu (tanh approximation) or silu")
    parser.add_argument("--row-sums", action="store_true",
                        help="also write the row sums of A (a Linear layer's bias gradient beside its weight "
                             "gradient): an (M,) output row_sums in D's dtype")
    parser.add_argument("--math", dest="fp32_math", default=None, type=text_arg("--math"),
                        help="fp32 inputs only: tf32 (default: one product, inputs truncated to tf32, ~1e-3 "
                             "error) or 3xtf32 (three tf32 products: fp32-class accuracy, about a third of the speed)")
    parser.add_argument("--accumulate", dest="fp8_accum", default=None, type=text_arg("--accumulate"),
                        help="fp8 inputs only: fast (default: wgmma's own reduced-precision accumulation, as "
                             "torch._scaled_mm's use_fast_accum=True) or fp32 (partial sums promoted into fp32 every "
                             "1-4 k-tiles: within 2%% of cuBLAS's default error, slower)")


def problem_from_args(args) -> Problem:
    return Problem.create(args.M, args.N, args.K, args.dtype, args.a_layout, args.b_layout,
                          getattr(args, "out_dtype", None), args.alpha, args.beta, args.bias, args.activation,
                          getattr(args, "b_dtype", None), getattr(args, "scaling", None),
                          getattr(args, "row_sums", False), getattr(args, "fp32_math", None),
                          getattr(args, "fp8_accum", None), getattr(args, "lda", 0), getattr(args, "ldb", 0),
                          getattr(args, "ldc", 0)).k_major_rows()


def check_problem(problem: Problem, gpu: Gpu, arch=None) -> "list[tuple[str, str]]":
    """InvalidInput naming the rule when no kernel family could run `problem` on `gpu` (a dtype, an A/B pair or an
    output dtype none takes, a dimension or leading dimension past every family's indexing), as tune and compile
    refuse it; else the families it rules out, each with why. Commands that only answer (roofline, lookup) ask
    it too, so they never answer for a problem the tuner refuses."""
    from ..rank.space import binding_rule, check_target, excluded_families, families_for

    arch = arch or gpu.arch
    check_target(gpu, arch, problem.a_dtype, problem.b_dtype)
    excluded = excluded_families(problem, gpu, arch)
    if len(excluded) >= len(families_for(arch)):  # nothing left to search: an error, not a note
        raise InvalidInput("no kernel family can run this problem", problem.label,
                           "; ".join(f"{family}: {binding_rule(family, problem, gpu, arch) or rule}"
                                     for family, rule in excluded))
    return excluded


def check_named(problem: Problem, gpu: Gpu, what: str) -> None:
    """check_problem for one of several products (a suite's shape, a bucket's top, a layer's product), its error
    naming which one (`what`): else a dimension no family can index reaches the search as an empty space."""
    try:
        check_problem(problem, gpu)
    except InvalidInput as exc:
        raise InvalidInput(f"{what}: {exc.rule}", exc.value, exc.hint) from None


def check_cache() -> None:
    """InvalidInput naming GEMMGEN_CACHE when the compile cache cannot be written: NVRTC's cubins are stored
    there, and a cache that is a file or read-only otherwise fails every compile as a misleading NVRTC error."""
    import os

    from ..model import paths
    from ..model.files import writable_dir

    rule = ("GEMMGEN_CACHE must name a folder gemmgen can create and write (the compile cache)"
            if os.environ.get("GEMMGEN_CACHE") else
            "the compile cache must be a folder gemmgen can create and write (set GEMMGEN_CACHE to move it)")
    writable_dir(rule, paths.cache_dir())


def progress_bar(total: int, desc: str, unit: str, initial: int = 0):
    """A tqdm bar on stderr for a terminal, or None where tqdm is not installed (progress lines still print)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


def add_gpu_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default=None, type=text_arg("--gpu"),
                        help="catalogue name (h100, h100-pcie, h200, a100, l40s, rtx4090, ...); default: the GPU found")


def resolve_gpu(name: "str | None") -> Gpu:
    """The named catalogue GPU, else the one the driver reports, else a one-line NoGpu error."""
    if name is not None:
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
