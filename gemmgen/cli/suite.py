"""`gemmgen suite FILE.yaml [FILE.yaml ...]`: tune every shape in bf16 and f16, side by side with cuBLAS; several
suites in one table, several GPUs with --gpus."""
from __future__ import annotations

import sys

from ..model.arch import lookup_gpu
from ..model.errors import InvalidInput
from ._common import (COUNT_MAX, JOBS_MAX, SECONDS_MAX, SEED_MAX, add_gpu_arg, check_named, float_arg, given, int_arg,
                      progress_bar, refuse_together, resolve_gpu, table, text_arg)
from .tune import (MEASURING_FLAGS, Progress, add_timing_arg, add_worker_args, check_dry_run, check_outputs, gpus_plan,
                   measurer_for, options_from_args, sigterm_as_interrupt)


def register(subparsers) -> None:
    p = subparsers.add_parser("suite", help="tune every shape of YAML suites, side by side with cuBLAS",
                              description="Tune every shape of each FILE ([suite: NAME], shapes: [{name, M, N, K}]) "
                                          "in each dtype, with cuBLAS timed in the same run, and verify each winner "
                                          "at two other shapes it serves; write results/<gpu>/suite.md and .json "
                                          "and print one table with the geomean ratio per suite.")
    p.add_argument("file", metavar="FILE.yaml", type=text_arg("FILE.yaml"), nargs="+",
                   help="suite files, e.g. results/shapes.yaml results/hard.yaml (one table)")
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
                   help="export each winner (with --dry-run, the model's pick) to DIR/<problem>/")
    p.add_argument("--seed", type=int_arg("--seed", 0, SEED_MAX), default=None, help="sampler seed (0 to 2^32-1)")
    p.add_argument("--replay", default=None, metavar="FILE", type=text_arg("--replay"),
                   help="simulation mode: replay recorded timings")
    p.add_argument("--only", default=None, metavar="NAMES", type=text_arg("--only"),
                   help="tune only these shapes (comma-separated names)")
    p.add_argument("--from-results", action="store_true",
                   help="tune nothing: build the table from the records in results/<gpu>/ (e.g. after tuning in parts)")
    p.add_argument("--verify-winners", action="store_true",
                   help="with --from-results: build each stored winner and verify it on the GPU at two other "
                        "shapes it serves (a tuned suite always does)")
    p.add_argument("--retime", action="store_true",
                   help="with --from-results: build each stored winner and time it now at its own shape beside "
                        "cuBLAS; a winner whose ratio fell by more than 5%% is flagged and the exit status is 1")
    add_worker_args(p)
    p.add_argument("--dry-run", action="store_true", help="no GPU: the model's pick per shape, compiled, unmeasured")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..tune.results import gpu_dirs
    from ..tune.suite_file import load_suites, parse_dtypes, select
    from ..tune.suite import dry_run_suite, report_from_results, run_suite

    measuring = tuple(f for f in MEASURING_FLAGS if f != "--timeout") + ("--timeout-per-shape",)
    # --retime times the stored winners again, as --timing says; nothing else of a tune applies.
    refuse_together(args, "--from-results", ("--dry-run", "--out", "--top-k") + tuple(
        f for f in measuring if not (args.retime and f == "--timing")), "a table from the stored records tunes nothing")
    refuse_together(args, "--dry-run", measuring + ("--verify-winners", "--retime"), "a dry run measures nothing")
    if args.verify_winners and not args.from_results:
        raise InvalidInput("--verify-winners goes with --from-results (a tuned suite verifies its winners anyway)",
                           "--verify-winners")
    if args.retime and not args.from_results:
        raise InvalidInput("--retime goes with --from-results (it times the stored winners again)", "--retime")
    if args.jobs is not None and args.from_results and not (args.verify_winners or args.retime):
        raise InvalidInput("--from-results and --jobs cannot be used together (a table from the stored records "
                           "tunes nothing)", "--jobs")
    check_dry_run(args)
    source = ", ".join(args.file)
    shapes = select(load_suites(args.file), args.only, source)
    dtypes = parse_dtypes(args.dtypes)
    args.timeout = args.timeout_per_shape
    options = options_from_args(args)
    if not args.from_results or args.verify_winners or args.retime:  # what compiles, and what exports
        check_outputs(args)
    show = (lambda row: print(f"{row.name} {row.dtype}: " + (f"{row.tflops:.1f} TFLOP/s" if row.tflops else
                                                              (row.note or "-")), file=sys.stderr))
    if args.from_results:
        report = report_from_results(shapes, dtypes, resolve_gpu(args.gpu), source=source)
        if not any(r.tflops for r in report.rows):
            # Nothing to tabulate: writing would replace the table stored before (the shipped one among them)
            # with a page of "not tuned yet", and say so with exit status 0.
            raise InvalidInput(f"--from-results needs a stored winner for at least one shape of the suite on "
                               f"{report.gpu.key} (in {', '.join(map(str, gpu_dirs(report.gpu)))}); nothing written",
                               source,
                               "tune the shapes first, or set GEMMGEN_RESULTS to the records' folder")
        if args.verify_winners or args.retime:
            report = verify_winners(args, report, shapes, dtypes, options)
    elif args.dry_run:
        gpu = lookup_gpu(args.gpu)
        check_shapes(shapes, dtypes, gpu)
        # --top-k as a tune's dry run takes it; three candidates compiled per shape unless it is given.
        report = dry_run_suite(shapes, dtypes, gpu, source=source, jobs=options.jobs,
                               top_k=args.top_k if given(args, "--top-k") else 3, out=args.out,
                               on_row=None if args.no_progress else show)
    elif args.gpus:
        report = run_on_gpus(args, shapes, dtypes, options, source)
    else:
        gpu, measurer, device = measurer_for(args, args.gpu)
        try:
            check_shapes(shapes, dtypes, gpu)
        except InvalidInput:
            measurer.close()
            raise
        progress = Progress(not args.no_progress)
        try:
            with sigterm_as_interrupt():
                report = run_suite(shapes, dtypes, gpu, measurer, options, source=source, on_event=progress,
                                   device=device, out=args.out, on_row=None if args.no_progress else show)
        finally:
            progress.close()
            measurer.close()
    # A run of some shapes, timed sustained, or replayed (simulated timings) is not the suite's usual table: written
    # beside it, not over it (a replayed public suite replaced the shipped H100 table).
    timing = getattr(args, "timing", None)
    variants = (("replay",) if getattr(args, "replay", None) or report.simulated else ()) + (
        ("partial",) if args.only else ()) + (
        ("sustained",) if timing == "sustained" and not args.from_results else ()) + (
        ("stream",) if timing == "stream" and (args.retime or not args.from_results) else ()) + (
        ("retimed",) if args.retime else ())
    md, js = report.write(variants)
    cols = report.columns()
    print(table([[cell(r) for _, cell in cols] for r in report.rows], [h for h, _ in cols]))
    for line in report.geomean_lines():
        print(line[0].lower() + line[1:])
    print(f"written: {md}\n         {js}")
    if args.dry_run and args.out:
        print(f"exported (not measured): each pick in {args.out}/<problem>/")
    if args.retime:
        from ..tune.suite import RETIME_DROP, retimed_slower

        slower = retimed_slower(report)
        if slower:
            print(f"{len(slower)} stored winner(s) now more than {1 - RETIME_DROP:.0%} below their stored ratio to "
                  f"cuBLAS: {', '.join(f'{r.name} {r.dtype}' for r in slower)}")
            return 1
    return 0


def check_shapes(shapes, dtypes, gpu) -> None:
    """Each dtype, then each shape in it, checked as `tune M N K` checks a problem, naming the shape: a dimension
    no family can index fails here in one line, not as an empty search space after the shapes before it."""
    from ..model.arch import DType
    from ..rank.space import check_target

    for dtype in dtypes:
        check_target(gpu, gpu.arch, DType.parse(dtype))
    seen = set()
    for shape in shapes:
        for dtype in dtypes:
            problem = shape.problem(dtype)
            if problem in seen:  # the same product under another name (llm_o is sq4096)
                continue
            seen.add(problem)
            check_named(problem, gpu, f"suite {shape.suite}, shape {shape.name} ({dtype})")


def run_on_gpus(args, shapes, dtypes, options, source):
    """The suite's shapes spread over --gpus, one worker per GPU (tune/suite_gpus.py)."""
    import functools

    from ..tune.parallel import worker_measurer
    from ..tune.suite_gpus import run_suite_on_gpus

    from dataclasses import replace

    gpu, specs, device = gpus_plan(args)
    check_shapes(shapes, dtypes, gpu)
    if args.jobs is None:  # the host's cores shared by the workers' compile pools, not each given all of them
        options = replace(options, jobs=max(1, options.jobs // len(specs)))
    measurer = functools.partial(worker_measurer, str(args.replay) if args.replay else None, args.watchdog)
    progress = SuiteProgress(not args.no_progress)
    try:
        # SIGTERM (a batch system's time limit) stops the workers as Ctrl-C does: it killed this process
        # outright (exit 143, nothing said), while a one-GPU suite says 'interrupted'.
        with sigterm_as_interrupt():
            return run_suite_on_gpus(shapes, dtypes, gpu, options, specs, measurer, source=source,
                                     on_event=progress, device=device, out=args.out)
    finally:
        progress.close()


def verify_winners(args, report, shapes, dtypes, options):
    """--from-results --verify-winners / --retime: the stored winners rebuilt and, on this GPU, verified at other
    shapes and/or timed again at their own beside cuBLAS."""
    from ..tune.search import default_engines
    from ..tune.suite import verify_stored_winners

    _, measurer, _ = measurer_for(args, args.gpu)
    set_timing = getattr(measurer, "set_timing", None)
    if args.retime and options.timing != "burst" and set_timing is not None:
        set_timing(options.timing)   # --retime --timing stream: the winners and cuBLAS timed back to back
    engines = default_engines(options.jobs)
    try:
        return verify_stored_winners(report, shapes, dtypes, measurer, engines, verify=args.verify_winners,
                                     retime=args.retime, on_row=None if args.no_progress else _show_checked)
    finally:
        engines.close()
        measurer.close()


def _show_checked(row) -> None:
    """One stderr line per stored winner checked (--verify-winners, --retime): what it found."""
    from ..tune.serve_check import summary
    from ..tune.suite import retime_change

    parts = [f"{row.name} {row.dtype}:"]
    if row.other_shapes:
        parts.append(f"other shapes {summary(row.other_shapes)}")
    if row.now_ratio is not None:
        parts.append(f"{row.now_ratio:.2f}x cuBLAS now, {row.ratio or 0:.2f}x stored ({retime_change(row)})")
    elif row.note:
        parts.append(row.note)
    print(" ".join(parts), file=sys.stderr, flush=True)


class SuiteProgress:
    """A suite on several GPUs: which shape each worker's GPU is tuning, its trials and best, and the rows done
    (a tqdm bar on a terminal, one line per event otherwise)."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar, self.tty = enabled, None, sys.stderr.isatty()
        self.current: "dict[str, str]" = {}  # worker label -> 'shape dtype n/target (best)'

    def __call__(self, kind: str, info: dict) -> None:
        if not self.enabled:
            return
        gpu = info.get("worker", "").rpartition("/")[2]
        if kind == "workers":
            print(f"{len(info['workers'])} workers, {info['jobs']} problems: {', '.join(info['workers'])}",
                  file=sys.stderr)
            if self.tty:
                self.bar = progress_bar(info["jobs"], "suite", "shape")
        elif kind == "shape_assigned":
            self.current[gpu] = f"{info['shape']} {info['dtype']}"
            self._say(f"[{gpu}] {info['shape']} {info['dtype']}: tuning")
        elif kind == "shape_trial":
            self.current[gpu] = (f"{info['shape']} {info['dtype']} {info['done']}/{info['target']} "
                                 f"({info['best']:.0f})")
            self._say(f"[{gpu}] {info['shape']} {info['dtype']}: trial {info['done']}/{info['target']}, "
                      f"best {info['best']:.1f} TFLOP/s", quiet=True)
        elif kind == "shape_finalists":
            self._say(f"[{gpu}] {info['shape']} {info['dtype']}: re-measuring the best {info['count']}")
        elif kind == "row":
            row = info["row"]
            self.current.pop(gpu, None)
            what = f"{row.tflops:.1f} TFLOP/s" if row.tflops else (row.note or "-")
            if self.bar is not None:
                self.bar.update(1)
            self._say(f"[{gpu}] {row.name} {row.dtype}: {what}")
        elif kind == "worker_died":
            self._say(f"[{gpu}] worker died (exit code {info['exit_code']}); its shape goes to another worker")
        elif kind == "done":
            self.close()

    def _say(self, line: str, quiet: bool = False) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(" | ".join(f"{g}: {what}" for g, what in sorted(self.current.items())),
                                     refresh=True)
            if not quiet:
                self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
