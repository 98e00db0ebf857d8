"""`gemmgen tune --m LO..HI --n N --k K` / `gemmgen tune --shapes FILE`: a shape set tuned bucket by bucket
into one dispatch folder (tune/dispatch.py; buckets and the merge rule in tune/buckets.py)."""
from __future__ import annotations

import sys

from ..model.errors import InvalidInput
from ._common import table, text_arg


def add_shape_set_args(p) -> None:
    p.add_argument("--m", dest="m_range", default=None, metavar="LO..HI", type=text_arg("--m"),
                   help="tune a range of M at fixed --n and --k, bucketed (see --buckets), into one dispatch folder")
    p.add_argument("--n", dest="n_fixed", default=None, metavar="N", type=text_arg("--n"), help="N of a --m range")
    p.add_argument("--k", dest="k_fixed", default=None, metavar="K", type=text_arg("--k"), help="K of a --m range")
    p.add_argument("--shapes", default=None, metavar="FILE", type=text_arg("--shapes"),
                   help="tune a shape set: a JSON/YAML list of [M, N, K]; per N x K, the listed M values are the "
                        "buckets' upper bounds")
    p.add_argument("--buckets", default="pow2", metavar="RULE", type=text_arg("--buckets"),
                   help="pow2 (default: a bucket per power of two of M, each tuned at its upper bound) or auto "
                        "(then merged upwards where a bucket measured the kernel below it within 1%% of its own "
                        "winner)")


def is_shape_set(args) -> bool:
    return any(getattr(args, name, None) is not None for name in ("m_range", "n_fixed", "k_fixed", "shapes"))


def buckets_from_args(args):
    from ..model.problem import parse_dim
    from ..tune.buckets import BUCKETINGS, point_buckets, pow2_buckets, read_shape_file

    if args.buckets not in BUCKETINGS:
        raise InvalidInput(f"--buckets must be one of {', '.join(BUCKETINGS)}", args.buckets)
    if any(v is not None for v in (args.M, args.N, args.K)):
        raise InvalidInput("give either M N K or a shape set (--m/--n/--k, --shapes), not both",
                           " ".join(str(v) for v in (args.M, args.N, args.K) if v is not None))
    if args.shapes is not None:
        if any(v is not None for v in (args.m_range, args.n_fixed, args.k_fixed)):
            raise InvalidInput("--shapes takes the whole set: leave out --m, --n and --k", args.shapes)
        return point_buckets(read_shape_file(args.shapes))
    if None in (args.m_range, args.n_fixed, args.k_fixed):
        raise InvalidInput("a range needs all three: --m LO..HI --n N --k K (only M is bucketed)",
                           " ".join(f"{flag} {value}" for flag, value in (("--m", args.m_range), ("--n", args.n_fixed),
                                                                         ("--k", args.k_fixed)) if value is not None))
    from ..tune.buckets import parse_range

    lo, hi = parse_range(args.m_range)
    for flag, value in (("--n", args.n_fixed), ("--k", args.k_fixed)):
        if ".." in str(value):
            raise InvalidInput(f"{flag} must be one value: only M is bucketed (a shape file lists other N x K)",
                               value)
    return pow2_buckets(lo, hi, parse_dim("N", args.n_fixed), parse_dim("K", args.k_fixed))


def check_buckets(base, buckets, gpu) -> None:
    """Each bucket's top shape (the one it is tuned at, and the hardest for a family's limits) checked as
    `tune M N K` checks its problem, naming the shape: else a shape no family can index would reach the search
    as an empty space, naming neither the shape nor the rule."""
    from ._common import check_named

    for shape in dict.fromkeys((b.m_max, b.n, b.k) for b in buckets):
        check_named(base.with_shape(*shape), gpu, f"shape {'x'.join(map(str, shape))}")


def run_shape_set(args) -> int:
    from ..model.problem import Problem
    from ..tune.dispatch import tune_buckets
    from .tune import (Progress, check_outputs, measurer_for, options_from_args, say_calibration, say_fallbacks,
                       sigterm_as_interrupt)

    buckets = buckets_from_args(args)
    check_outputs(args)
    # Every operand option `tune M N K` takes (problem_from_args), so none is dropped for a shape set: --math and
    # --accumulate once were, and --m ... --dtype f32 --math 3xtf32 exported tf32 kernels.
    # Built at the largest M and N of the set: every bucket's problem is this one at its own shape, and k_major_rows
    # reads a single row of A (column of B) as K-major, which is the caller's layout only where every bucket has it.
    base = Problem.create(max(b.m_max for b in buckets), max(b.n for b in buckets), buckets[0].k, args.dtype,
                          args.a_layout, args.b_layout,
                          getattr(args, "out_dtype", None), args.alpha, args.beta, args.bias, args.activation,
                          getattr(args, "b_dtype", None), getattr(args, "scaling", None),
                          getattr(args, "row_sums", False), getattr(args, "fp32_math", None),
                          getattr(args, "fp8_accum", None)).k_major_rows()
    options = options_from_args(args)
    if args.dry_run:
        return dry_run_shape_set(args, base, buckets, options)
    gpu, measurer, device = measurer_for(args, args.gpu)
    try:
        check_buckets(base, buckets, gpu)
    except InvalidInput:
        measurer.close()
        raise
    say_fallbacks(base, gpu)
    say_calibration(gpu)
    progress = Progress(not args.no_progress)

    def on_event(kind, info):
        if kind == "split":
            if not args.no_progress:
                print(f"--buckets auto: the model splits {info['before']} buckets into {info['after']} (where the "
                      "kernel it picks at a bucket's top is predicted slower at its middle)", file=sys.stderr)
            return
        if kind == "bucket":
            b = info["bucket"]
            progress.label = f"[{b.label} @ {b.n}x{b.k}] "
            if not args.no_progress:
                seeded = f", seeded with {len(info['seeds'])} finalists of the bucket below" if info["seeds"] else ""
                print(f"bucket {info['index']}/{info['count']}: {b.label} at N x K {b.n}x{b.k}, tuned at "
                      f"M = {b.m_max}{seeded}", file=sys.stderr)
            return
        progress(kind, info)

    try:
        with sigterm_as_interrupt():
            result = tune_buckets(base, buckets, gpu, measurer, options, on_event=on_event, device=device,
                                  bucketing=args.buckets, out=args.out)
    finally:
        progress.close()
        measurer.close()
    print_dispatch(result)
    return 0


def print_dispatch(result) -> None:
    runs = {(r.bucket.n, r.bucket.k, r.bucket.m_max): r for r in result.runs}
    rows = []
    for t in result.tables:
        for e in t["buckets"]:
            run = runs[(t["n"], t["k"], e["tuned_at"][0])]
            w = run.result.winner
            merged = e.get("merged", [])
            note = "; ".join(f"M {m['tuned_at']}: {m['slowdown']:.3f}x of its own winner" for m in merged)
            vs = f"{run.result.cublas_time_s / w.median_s:.2f}x" if run.result.cublas_time_s else "-"
            rows.append([f"{e['m_min']}..{e['m_max']}", f"{t['n']}x{t['k']}",
                         ",".join(str(m) for m in e["tuned_at"]), w.config.tag, f"{w.tflops:.1f}", vs,
                         note or "-"])
    secs = sum(r.result.elapsed_s for r in result.runs)
    print(f"tuned {len(result.runs)} buckets of {result.base.dtype_label} "
          f"{result.base.a_layout.letter}{result.base.b_layout.letter} on {result.gpu.key} in {secs:.1f}s; "
          f"{len(result.kernels)} distinct kernels")
    print(table(rows, ["M", "N x K", "tuned at M", "kernel (config)", "TFLOP/s", "vs cuBLAS", "merged"]))
    if result.folder is not None:
        print(f"exported: {result.folder / 'dispatch.json'} (gemmgen.load(\"{result.folder}\") dispatches by shape)")


def dry_run_shape_set(args, base, buckets, options) -> int:
    """The model's pick per bucket, compiled and exported unmeasured as a dispatch folder (needs --gpu)."""
    from ..model.arch import lookup_gpu
    from ..tune.dispatch import model_buckets

    gpu = lookup_gpu(args.gpu)
    check_buckets(base, buckets, gpu)
    result = model_buckets(base, buckets, gpu, jobs=options.jobs, bucketing=args.buckets, out=args.out)
    rows = [[f"{e['m_min']}..{e['m_max']}", f"{t['n']}x{t['k']}", ",".join(str(m) for m in e["tuned_at"]),
             e["kernel"]] for t in result.tables for e in t["buckets"]]
    picked = sum(len(e["tuned_at"]) for t in result.tables for e in t["buckets"])
    print(f"dry run: {picked} buckets on {gpu.key}, the model's pick for each (compiled, not measured); "
          f"{len(result.kernels)} distinct kernels")
    print(table(rows, ["M", "N x K", "picked at M", "kernel"]))
    if result.folder is not None:
        print(f"exported (not measured): {result.folder / 'dispatch.json'}")
    return 0
