"""`gemmgen suite FILE.yaml`: tune every shape in bf16 and f16, side by side with cuBLAS."""
from __future__ import annotations

import sys

from ..model.arch import lookup_gpu
from ..model.errors import InvalidInput
from ._common import (COUNT_MAX, JOBS_MAX, SECONDS_MAX, SEED_MAX, add_gpu_arg, float_arg, int_arg, refuse_together,
                      resolve_gpu, table, text_arg)
from .tune import MEASURING_FLAGS, Progress, add_timing_arg, measurer_for, options_from_args, sigterm_as_interrupt


def register(subparsers) -> None:
    p = subparsers.add_parser("suite", help="tune every shape of a YAML suite, side by side with cuBLAS",
                              description="Tune every shape of FILE (shapes: [{name, M, N, K}]) in each dtype, "
                                          "with cuBLAS timed in the same run; write results/<gpu>/suite.md "
                                          "and .json and print the table with the geomean ratio.")
    p.add_argument("file", metavar="FILE.yaml", type=text_arg("FILE.yaml"),
                   help="suite file, e.g. ../shared/shapes.yaml")
    add_gpu_arg(p)
    p.add_argument("--dtypes", default="bf16,f16", type=text_arg("--dtypes"), help="comma-separated (default bf16,f16)")
    p.add_argument("--trials", type=int_arg("--trials", 1, COUNT_MAX), default=60,
                   help="measured trials per shape and dtype (default 60)")
    p.add_argument("--timeout-per-shape", type=float_arg("--timeout-per-shape", 0, SECONDS_MAX, lo_open=True),
                   default=120.0, metavar="S",
                   help="search time per shape and dtype, before the finalists' re-measurement (default 120)")
    p.add_argument("--patience", type=int_arg("--patience", 1, COUNT_MAX), default=25,
                   help="stop a shape after this many trials without improvement")
    p.add_argument("--top-k", type=int_arg("--top-k", 0, COUNT_MAX), default=10,
                   help="the model's best, measured first (default 10)")
    p.add_argument("--sampler", default="tpe", type=text_arg("--sampler"),
                   help="tpe (default), random, cmaes, qmc, grid")
    p.add_argument("--jobs", type=int_arg("--jobs", 0, JOBS_MAX), default=None,
                   help="NVRTC processes (default: cores - 1)")
    p.add_argument("--finalists", type=int_arg("--finalists", 1, COUNT_MAX), default=3,
                   help="re-measured interleaved per shape (default 3)")
    p.add_argument("--rounds", type=int_arg("--rounds", 1, COUNT_MAX), default=5, help="interleaved rounds (default 5)")
    add_timing_arg(p)
    p.add_argument("--watchdog", type=float_arg("--watchdog", 0, SECONDS_MAX, lo_open=True), default=60.0, metavar="S",
                   help="per-measurement watchdog (default 60)")
    p.add_argument("--storage", default=None, metavar="URL", type=text_arg("--storage"), 
                   help="Optuna storage (default: <per-user data dir>/studies/<gpu>/studies.db)")
    p.add_argument("--out", default=None, metavar="DIR", type=text_arg("--out"),
                   help="export each winner to DIR/<problem>/")
    p.add_argument("--seed", type=int_arg("--seed", 0, SEED_MAX), default=None, help="sampler seed (0 to 2^32-1)")
    p.add_argument("--replay", default=None, metavar="FILE", type=text_arg("--replay"),
                   help="simulation mode: replay recorded timings")
    p.add_argument("--only", default=None, metavar="NAMES", type=text_arg("--only"),
                   help="tune only these shapes (comma-separated names)")
    p.add_argument("--from-results", action="store_true",
                   help="tune nothing: build the table from the records in results/<gpu>/ (e.g. after tuning in parts)")
    p.add_argument("--dry-run", action="store_true", help="no GPU: the model's pick per shape, compiled, unmeasured")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..model.arch import DType
    from ..rank.space import check_target
    from ..tune.suite import dry_run_suite, load_shapes, parse_dtypes, report_from_results, run_suite, select

    measuring = tuple(f for f in MEASURING_FLAGS if f != "--timeout") + ("--timeout-per-shape",)
    refuse_together(args, "--from-results", ("--dry-run", "--out", "--jobs", "--top-k") + measuring,
                    "a table from the stored records tunes nothing")
    refuse_together(args, "--dry-run", measuring, "a dry run measures nothing")
    shapes = select(load_shapes(args.file), args.only, args.file)
    dtypes = parse_dtypes(args.dtypes)
    args.timeout = args.timeout_per_shape
    options = options_from_args(args)
    show = (lambda row: print(f"{row.name} {row.dtype}: " + (f"{row.tflops:.1f} TFLOP/s" if row.tflops else
                                                              (row.note or "-")), file=sys.stderr))
    if args.from_results:
        report = report_from_results(shapes, dtypes, resolve_gpu(args.gpu), source=args.file)
    elif args.dry_run:
        if args.gpu is None:
            raise InvalidInput("--dry-run needs --gpu NAME: the GPU to rank and compile for", None)
        gpu = lookup_gpu(args.gpu)
        for dtype in dtypes:
            check_target(gpu, gpu.arch, DType.parse(dtype))
        report = dry_run_suite(shapes, dtypes, gpu, source=args.file, jobs=options.jobs,
                               on_row=None if args.no_progress else show)
    else:
        gpu, measurer, device = measurer_for(args, args.gpu)
        try:
            for dtype in dtypes:
                check_target(gpu, gpu.arch, DType.parse(dtype))
        except InvalidInput:
            measurer.close()
            raise
        progress = Progress(not args.no_progress)
        try:
            with sigterm_as_interrupt():
                report = run_suite(shapes, dtypes, gpu, measurer, options, source=args.file, on_event=progress,
                                   device=device, out=args.out, on_row=None if args.no_progress else show)
        finally:
            progress.close()
            measurer.close()
    md, js = report.write()
    rows = [[r.name, f"{r.m}x{r.n}x{r.k}", r.dtype,
             _f(r.predicted_tflops if report.dry_run else r.tflops), _f(r.cublas_tflops),
             _f(r.ratio, "{:.2f}x"), f"{r.tuning_s:.1f}", r.note] for r in report.rows]
    best = "model TFLOP/s" if report.dry_run else "best TFLOP/s"
    print(table(rows, ["shape", "MxNxK", "dtype", best, "cuBLAS TFLOP/s", "ratio", "tuning s", "note"]))
    print("geomean ratio to cuBLAS: " + ", ".join(f"{k} {_f(v, '{:.3f}x')}" for k, v in report.geomeans().items()))
    print(f"written: {md}\n         {js}")
    return 0


def _f(value, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)
