"""`gemmgen tune M N K`: search the tile space on the GPU, export the winner; `--dry-run` without one."""
from __future__ import annotations

import signal
import sys
from contextlib import contextmanager

from ..model.arch import lookup_gpu
from ..model.errors import InvalidInput, NoGpu
from ._common import (COUNT_MAX, JOBS_MAX, SECONDS_MAX, SEED_MAX, add_gpu_arg, add_problem_args, check_cache,
                      check_problem, float_arg, given, int_arg, problem_from_args, progress_bar, refuse_together, table,
                      text_arg)
from ._tune_set import add_shape_set_args, is_shape_set, run_shape_set

# What each measuring command runs as without a GPU: its own dry run, not tune's.
DRY_RUN_HINTS = {
    "tune": "gemmgen tune M N K --gpu h100 --dry-run --out DIR",
    "suite": "gemmgen suite FILE.yaml --gpu h100 --dry-run --out DIR",
    "tune-linear": "gemmgen tune-linear IN OUT --tokens LO..HI --gpu h100 --dry-run",
}
DRY_RUN_HINT = "to rank by the model and compile without a GPU: " + DRY_RUN_HINTS["tune"]


def dry_run_hint(args) -> str:
    """The dry run of the command in `args` (tune's for any other)."""
    command = getattr(args, "command", None)
    return "to rank by the model and compile without a GPU: " + DRY_RUN_HINTS.get(command, DRY_RUN_HINTS["tune"])


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="tune a GEMM: model top-k, then an Optuna search, measured on the GPU",
                              description="Rank every valid configuration with the roofline model, enqueue the "
                                          "top-k, explore with an Optuna sampler, re-measure the best few "
                                          "interleaved and export the winner. Re-running the same command resumes.")
    p.add_argument("M", nargs="?", help="rows of A and D (or tune a shape set: --m RANGE --n N --k K, --shapes)")
    p.add_argument("N", nargs="?", help="columns of B and D")
    p.add_argument("K", nargs="?", help="the reduction dimension")
    add_problem_args(p, shape=False, leading=True)
    add_gpu_arg(p)
    add_shape_set_args(p)
    p.add_argument("--trials", type=int_arg("--trials", 1, COUNT_MAX), default=100,
                   help="measured trials in the study, counting resumed runs (default 100)")
    p.add_argument("--timeout", type=float_arg("--timeout", 0, SECONDS_MAX, lo_open=True), default=None, metavar="S",
                   help="stop searching after S seconds")
    p.add_argument("--patience", type=int_arg("--patience", 1, COUNT_MAX), default=40,
                   help="stop after this many measured trials without a 0.5%% improvement (default 40)")
    p.add_argument("--storage", default=None, metavar="URL", type=text_arg("--storage"),
                   help="Optuna storage, any SQLAlchemy URL (default: <per-user data dir>/studies/<gpu>/studies.db)")
    p.add_argument("--out", default=None, metavar="DIR", type=text_arg("--out"),
                   help="export the winner's .cubin, .cu and .json here")
    add_search_args(p, top_k=10)
    p.add_argument("--dry-run", action="store_true", help="no GPU: rank by the model, compile the top-k, "
                                                          "export the model's pick unmeasured (needs --gpu)")
    p.add_argument("--replay", default=None, metavar="FILE", type=text_arg("--replay"),
                   help="simulation mode: replay recorded timings (JSON keyed by config tag) instead of a GPU")
    add_worker_args(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def add_search_args(p, top_k: int) -> None:
    """The sampler, compile-ahead, finalist, timing, watchdog and seed flags every tuning command shares."""
    p.add_argument("--sampler", default="tpe", type=text_arg("--sampler"),
                   help="tpe (default), random, cmaes, qmc (needs scipy), "
                        "grid (every valid configuration, in model order)")
    p.add_argument("--top-k", type=int_arg("--top-k", 0, COUNT_MAX), default=top_k,
                   help=f"the model's best, measured (or, in a dry run, compiled) first (default {top_k})")
    p.add_argument("--jobs", type=int_arg("--jobs", 0, JOBS_MAX), default=None,
                   help="NVRTC processes compiling ahead (default: cores - 1)")
    p.add_argument("--finalists", type=int_arg("--finalists", 1, COUNT_MAX), default=3,
                   help="configurations re-measured interleaved (default 3)")
    p.add_argument("--rounds", type=int_arg("--rounds", 1, COUNT_MAX), default=5,
                   help="interleaved re-measurement rounds (default 5)")
    p.add_argument("--transfer", type=int_arg("--transfer", 0, COUNT_MAX), default=3, metavar="N",
                   help="measure the winners and finalists of the N nearest stored shapes (same GPU, dtypes, layouts; "
                        "log-space distance of M, N, K) early, in turn with the model's top-k (default 3; 0: none)")
    add_timing_arg(p)
    p.add_argument("--watchdog", type=float_arg("--watchdog", 0, SECONDS_MAX, lo_open=True), default=60.0,
                   metavar="S",
                   help="seconds one measurement may take before the worker is killed as hung (default 60)")
    p.add_argument("--seed", type=int_arg("--seed", 0, SEED_MAX), default=None, help="sampler seed (0 to 2^32-1)")


def add_worker_args(p) -> None:
    p.add_argument("--gpus", default=None, metavar="LIST", type=text_arg("--gpus"),
                   help="one measuring worker per GPU on one study: CUDA ordinals (0,1,3) or all; an ordinal given "
                        "twice is two workers on that GPU, measuring in turn (docs/distributed.md)")
    p.add_argument("--heartbeat", type=int_arg("--heartbeat", 1, SECONDS_MAX), default=10, metavar="S",
                   help="seconds between a worker's heartbeats in the study storage (default 10)")
    p.add_argument("--grace", type=int_arg("--grace", 1, SECONDS_MAX), default=60, metavar="S",
                   help="a worker silent this long has its running trials failed and queued again (default 60)")


def add_timing_arg(p) -> None:
    p.add_argument("--timing", default="burst", metavar="MODE", type=text_arg("--timing"),
                   help="how the finalists and cuBLAS are timed: burst (default; ~0.1 s each, near boost clock, "
                        "each run between its own events), sustained (1 s back to back first, then 0.5 s timed: "
                        "the power-limited clock of a training loop; ~4x longer) or stream (as burst, runs timed "
                        "ten at a time back to back, as a CUDA graph runs them: a kernel's start may overlap the "
                        "last one's end)")


def options_from_args(args, **override):
    import os

    from ..tune.search import TuneOptions

    jobs = args.jobs if args.jobs is not None else max(1, (os.cpu_count() or 2) - 1)
    fields = dict(trials=args.trials, timeout_s=args.timeout, patience=args.patience, top_k=args.top_k,
                  sampler=args.sampler, jobs=jobs, finalists=args.finalists, rounds=args.rounds,
                  seed=args.seed, storage=args.storage, transfer=getattr(args, "transfer", 0), out=args.out,
                  timing=getattr(args, "timing", "burst"),
                  heartbeat_s=getattr(args, "heartbeat", 10), grace_s=getattr(args, "grace", 60),
                  replay=str(args.replay) if getattr(args, "replay", None) else None)
    fields.update(override)
    if fields["storage"] is not None:
        from ..tune.storage import check_url

        check_url(fields["storage"])  # before any GPU is looked for or worker started
    return TuneOptions(**fields).validate()


def measurer_for(args, gpu_name: "str | None"):
    """(gpu, measurer, device props): the replay simulator, or the GPU worker; NoGpu says how to dry-run."""
    from ..tune.worker import WorkerBenchmark, gpu_benchmark, replay_factory

    if getattr(args, "replay", None):
        if not gpu_name:
            raise InvalidInput("--replay needs --gpu NAME (the GPU the timings were recorded on)", None)
        from ..tune.worker import ReplayBenchmark

        ReplayBenchmark(args.replay)  # a bad file is a one-line error here, not a dead worker later
        return lookup_gpu(gpu_name), WorkerBenchmark(replay_factory(args.replay), args.watchdog), {}
    from ..runtime.detect import detect_gpu

    found = detect_gpu()
    if not found.props.get("name"):
        raise NoGpu(found.reason, dry_run_hint(args))
    gpu = lookup_gpu(gpu_name) if gpu_name else found.gpu
    if gpu is None:
        raise NoGpu(found.reason, "pass --gpu NAME for the closest catalogue entry")
    if found.gpu is not None and found.gpu.key != gpu.key:
        print(f"note: the driver reports {found.props['name']} ({found.gpu.key}); tuning with the catalogue's "
              f"{gpu.key} model as --gpu asks", file=sys.stderr)
    return gpu, WorkerBenchmark(gpu_benchmark, args.watchdog), dict(found.props)


@contextmanager
def sigterm_as_interrupt():
    """SIGTERM (a batch system's time limit, `timeout`) ends a tune like Ctrl-C: the trials in flight
    are re-queued and the record is marked interrupted, instead of dying between two writes."""
    def _raise(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread (embedded use): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Progress:
    """Trials done and the best TFLOP/s: a tqdm bar on a terminal, one line per trial otherwise."""

    def __init__(self, enabled: bool, label: str = ""):
        self.enabled, self.label = enabled, label
        self.bar = None
        self.tty = sys.stderr.isatty()

    def __call__(self, kind: str, info: dict) -> None:
        if not self.enabled:
            return
        if kind == "start":
            resumed = f", resuming with {info['resumed']} measured" if info["resumed"] else ""
            print(f"{self.label}space {info['space']} valid configurations; study {info['study']}{resumed}",
                  file=sys.stderr)
            if info.get("transferred"):
                shapes = sorted({source.rpartition(" of ")[2] for source in info["transferred"].values()})
                print(f"{self.label}transfer: {len(info['transferred'])} winners/finalists of the nearest stored "
                      f"shapes ({', '.join(shapes)}) measured early, in turn with the model's picks", file=sys.stderr)
            if self.tty:
                self.bar = progress_bar(info["target"], "tune", "trial", min(info["resumed"], info["target"]))
        elif kind == "trial":
            best = f"best {info['best']:.1f} TFLOP/s"
            if self.bar is not None:
                self.bar.n = min(info["done"], self.bar.total)
                self.bar.set_postfix_str(best, refresh=True)
            else:
                what = f"{info['tflops']:.1f} TFLOP/s" if info["state"] == "COMPLETE" else f"FAIL {info['reason']}"
                print(f"{self.label}trial {info['done']}/{info['target']} #{info['number']} {info['tag']}: "
                      f"{what}; {best}", file=sys.stderr)
        elif kind == "workers":
            print(f"{self.label}{len(info['workers'])} workers on one study: {', '.join(info['workers'])}",
                  file=sys.stderr)
            self.target = info["target"]
            if self.tty:
                self.bar = progress_bar(info["target"], "tune", "trial")
        elif kind == "progress":
            per = " | ".join(f"{label.rpartition('/')[2]} {n} ({b:.0f})" for label, (n, b) in
                             sorted(info["workers"].items()))
            line = f"best {info['best']:.1f} TFLOP/s | {per}"
            if self.bar is not None:
                self.bar.n = min(info["done"], self.bar.total)
                self.bar.set_postfix_str(line, refresh=True)
            elif info["done"] != getattr(self, "_last_done", None):
                self._last_done = info["done"]
                print(f"{self.label}trials {info['done']}/{info['target']}; {line}", file=sys.stderr)
        elif kind == "finalists":
            self.close()
            timing = " (sustained timing, after one settling round)" if info.get("timing") == "sustained" else ""
            where = f" on {info['worker'].rpartition('/')[2]}" if info.get("worker") else ""  # a --gpus worker
            print(f"{self.label}re-measuring the best {info['count']} interleaved{where}, {info['rounds']} rounds"
                  f"{timing}", file=sys.stderr)
        elif kind == "finalist_round":
            lead = f"; leading {info['leader']} at {info['leader_s'] * 1e3:.4f} ms" if info.get("leader") else ""
            blas = f", cuBLAS {info['cublas_s'] * 1e3:.4f} ms" if info.get("cublas_s") else ""
            print(f"{self.label}  round {info['round']}/{info['rounds']}{lead}{blas}", file=sys.stderr)
        elif kind == "awaiting_leader":  # another process leads the finalist round: say why nothing moves
            print(f"{self.label}waiting for finalist round {info['round'] + 1}, which another worker leads (one that "
                  "is gone is replaced once its lease is older than --grace)", file=sys.stderr)
        elif kind == "awaiting_workers":
            print(f"{self.label}waiting for {info['running']} trials other workers are measuring before the "
                  "finalist round", file=sys.stderr)
        elif kind == "warning":
            print(f"{self.label}  warning: {info['message']}", file=sys.stderr)
        elif kind == "done":
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def other_shapes_line(manifest_path) -> str:
    """What the exported manifest says of the winner at the other shapes it serves."""
    import json
    from pathlib import Path

    try:
        checks = json.loads(Path(manifest_path).read_text()).get("verification", {}).get("other_shapes") or []
    except (OSError, ValueError):
        return "other shapes it serves: not recorded"
    if not checks:
        return "other shapes it serves: not checked"
    parts = [f"{c['shape']} " + ("ok" if c["ok"] else "not run" if c["ok"] is None else f"FAILED ({c['reason']})")
             for c in checks]
    return "verified at other shapes it serves: " + ", ".join(parts)


def say_calibration(gpu) -> None:
    """Say when the model ranks with a stored calibration (gemmgen calibrate --fit) rather than its defaults."""
    from ..rank.calibration import params_for

    path = params_for(gpu)[1]
    if path is not None:
        print(f"note: the model ranks with the calibration in {path}", file=sys.stderr)


# A product whose compute alone takes this long is timed over many back-to-back runs in a training loop, long enough
# for the card to settle at its power limit.
POWER_NOTE_MIN_S = 100e-6


def say_power(problem, gpu, timing: str) -> None:
    """Say when the product would run power-limited in a training loop while the tune times it in bursts: its
    energy at the model's figures (rank/predict.power_time, the least bytes it must move) needs about as long at
    the board limit as its FLOPs at the datasheet rate, so bursts near the boost clock may rank the finalists
    differently from what a training loop sees (docs/perf-notes.md, "The power ceiling")."""
    from ..rank.predict import power_time

    if timing != "burst":
        return
    compute_s = problem.flops / min(gpu.tensor_peak(problem.a_dtype), gpu.tensor_peak(problem.b_dtype))
    power_s = power_time(problem.flops, problem.min_bytes, 0.0, problem.a_dtype, gpu)
    if compute_s >= POWER_NOTE_MIN_S and power_s >= 0.8 * compute_s:
        print(f"note: at the {gpu.power_limit_w:.0f} W board limit this product's energy alone needs "
              f"{power_s * 1e6:.0f} us against {compute_s * 1e6:.0f} us of datasheet compute: run back to back it "
              f"is power-limited; --timing sustained times the finalists that way", file=sys.stderr)


def say_fallbacks(problem, gpu) -> None:
    """Say which kernel families this problem rules out and why (e.g. TMA needs 16-byte row strides, so
    such problems fall back to the sm80 family). Specialist families (few rows of D, ...) go unannounced."""
    from .. import families

    for family, rule in check_problem(problem, gpu):
        if families.get(family).specialist:
            continue
        print(f"note: family {family} cannot run this problem ({rule}); searching the others", file=sys.stderr)


# What a dry run (ranking and compiling only) would silently ignore: each is refused beside --dry-run.
MEASURING_FLAGS = ("--replay", "--storage", "--trials", "--timeout", "--patience", "--sampler", "--seed", "--transfer",
                   "--finalists", "--rounds", "--timing", "--watchdog", "--gpus", "--heartbeat", "--grace")


def run(args) -> int:
    from ..rank.space import check_target
    from ..tune.search import dry_run, tune

    refuse_together(args, "--dry-run", MEASURING_FLAGS, "a dry run measures nothing")
    check_dry_run(args)
    if is_shape_set(args):
        for flag in ("--lda", "--ldb", "--ldc"):
            if given(args, flag):
                raise InvalidInput(f"{flag} is for one shape (M N K), not a shape set: a dispatch table's kernels "
                                   "serve every leading dimension their alignment allows", getattr(args, flag[2:]))
        if args.gpus is not None:  # run_shape_set tunes its buckets in turn on one GPU: --gpus was ignored
            raise InvalidInput("--gpus is for one shape (M N K) or a suite, not a shape set: its buckets are tuned "
                               "in turn on one GPU (--gpu)", args.gpus)
        return run_shape_set(args)
    if None in (args.M, args.N, args.K):
        raise InvalidInput("tune needs M N K, or a shape set: --m LO..HI --n N --k K, or --shapes FILE",
                           " ".join(str(v) for v in (args.M, args.N, args.K) if v is not None) or "nothing")
    problem = problem_from_args(args)
    check_outputs(args)
    if args.dry_run:
        gpu = lookup_gpu(args.gpu)
        options = options_from_args(args)
        check_target(gpu, gpu.arch, problem.a_dtype, problem.b_dtype)
        say_fallbacks(problem, gpu)
        say_calibration(gpu)
        result = dry_run(problem, gpu, top_k=max(1, options.top_k), out=args.out, jobs=options.jobs)
        print_dry_run(result)
        return 0 if result.pick is not None else 1
    options = options_from_args(args)
    if args.gpus:
        if args.storage:  # a bad URL is one line here, not one per worker
            from ..tune.storage import open_storage

            open_storage(args.storage)
        return run_on_gpus(args, problem, options)
    gpu, measurer, device = measurer_for(args, args.gpu)
    try:
        check_target(gpu, gpu.arch, problem.a_dtype, problem.b_dtype)
        say_fallbacks(problem, gpu)
    except InvalidInput:
        measurer.close()
        raise
    say_calibration(gpu)
    say_power(problem, gpu, options.timing)
    progress = Progress(not args.no_progress)
    try:
        with sigterm_as_interrupt():
            result = tune(problem, gpu, measurer, options, on_event=progress, device=device)
    finally:
        progress.close()
        measurer.close()
    print_result(result)
    return 0 if result.winner is not None else 1


def check_dry_run(args) -> None:
    """What a dry run needs from its flags: the GPU to rank and compile for, and at least one pick to compile."""
    if not args.dry_run:
        return
    if args.gpu is None:
        raise InvalidInput("--dry-run needs --gpu NAME: the GPU to rank and compile for (no GPU is looked for)",
                           "--dry-run without --gpu")
    if getattr(args, "top_k", 1) < 1:  # the model's top-k are what a dry run compiles: 0 would silently mean 1
        raise InvalidInput("--top-k must be at least 1 with --dry-run (it compiles the model's top-k)", args.top_k)


def check_outputs(args) -> None:
    """--out and the compile cache checked before any note is printed or any work starts: a tune that could not
    export its winner, or compile anything, fails in a second, not at the end."""
    from ..model.files import writable_dir

    if getattr(args, "out", None):
        writable_dir("--out must be a directory gemmgen can create and write", args.out)
    check_cache()


def gpus_plan(args):
    """(gpu, worker specs, device props) for --gpus: the GPUs found (one model), or simulated ones in replay."""
    from ..tune.parallel import parse_gpus, physical_gpu, plan_workers

    if args.watchdog is not None and not args.watchdog > 0:
        raise InvalidInput("--watchdog must be a positive number of seconds", args.watchdog)
    if str(args.gpus).strip().lower() != "all":
        parse_gpus(args.gpus, None)  # a malformed list is bad input on any machine, refused before GPUs are looked for
    if getattr(args, "replay", None):
        if not args.gpu:
            raise InvalidInput("--replay needs --gpu NAME (the GPU the timings were recorded on)", None)
        from ..tune.worker import ReplayBenchmark

        ReplayBenchmark(args.replay)
        return lookup_gpu(args.gpu), plan_workers(parse_gpus(args.gpus, None), replay=True), {}
    from ..runtime.detect import read_props

    props, reason = read_props(0)
    if not props:
        raise NoGpu(reason, "--gpus needs GPUs; --replay FILE --gpu NAME simulates them")
    specs = plan_workers(parse_gpus(args.gpus, int(props.get("count", 1))), replay=False)
    if args.gpu:
        return lookup_gpu(args.gpu), specs, props
    _, model = physical_gpu(int(specs[0].device))
    try:
        return lookup_gpu(model), specs, props
    except InvalidInput:
        raise NoGpu(f"the catalogue has no entry for {model}", "pass --gpu NAME for the closest one") from None


def run_on_gpus(args, problem, options) -> int:
    import functools

    from ..tune.parallel import run_workers, worker_measurer

    gpu, specs, device = gpus_plan(args)
    say_fallbacks(problem, gpu)
    progress = Progress(not args.no_progress)
    measurer = functools.partial(worker_measurer, str(args.replay) if args.replay else None, args.watchdog)
    try:
        # SIGTERM (a batch system's time limit) stops the workers as Ctrl-C does: it killed this process outright
        # (exit 143, nothing said), while a one-GPU tune says 'interrupted' and keeps its record.
        with sigterm_as_interrupt():
            result = run_workers(problem, gpu, options, specs, measurer, on_event=progress, device=device)
    finally:
        progress.close()
    print_result(result)
    for label, how in (result.workers or {}).items():
        print(f"worker {label}: {how}")
    return 0 if result.winner is not None else 1


def print_dry_run(result) -> None:
    p, gpu = result.problem, result.gpu
    print(f"dry run: {p.label} on {gpu.key} ({gpu.arch.value}); {result.space_size} valid configurations, "
          f"the model's top {len(result.candidates)} compiled, nothing measured")
    rows = []
    for c in result.candidates:
        if c.ok:
            res = c.compiled.resources
            status = f"ok, {res.registers} regs, {getattr(c.compiled, 'spill_bytes', res.spill_bytes)} B spill"
        else:
            status = f"compile error: {str(c.compiled)[:60]}"
        rows.append([str(c.ranked.rank + 1), c.ranked.config.tag, f"{c.ranked.tflops:.1f}",
                     f"{c.ranked.time_s * 1e3:.3f}", c.ranked.bound, status])
    print(table(rows, ["rank", "config", "model TFLOP/s", "model ms", "bound", "compile"]))
    if result.pick is None:
        print("no candidate compiled: nothing exported")
        return
    print(f"model's pick: {result.pick.kernel.name}")
    if result.bundle is not None:
        print(f"exported (not measured): {result.bundle.manifest_path}")
        print(f"                         {result.bundle.cubin_path}")
        print(f"                         {result.bundle.source_path}")


def print_result(result) -> None:
    p, c = result.problem, result.counts
    print(f"tuned {p.label} on {result.gpu.key} in {result.elapsed_s:.1f}s: stopped because {result.stop_reason}")
    print(f"study {result.study_name} in {result.storage_url} (open with: optuna-dashboard {result.storage_url})")
    print(f"trials: {c['measured']} measured this run ({c['failed']} failed), {c['resumed']} from earlier runs, "
          f"{c['pruned']} pruned (infeasible or quarantined), {c['duplicates']} duplicates, "
          f"{c['cancelled']} cancelled; space {result.space_size}")
    if result.cublas_time_s:
        print(f"cuBLAS: {result.cublas_time_s * 1e3:.4f} ms = {p.flops / result.cublas_time_s / 1e12:.1f} TFLOP/s "
              "(same run)")
    elif result.winner is None:
        print("cuBLAS: not measured (it is timed beside the finalists, and no configuration got that far)")
    else:
        print("cuBLAS: not measured (no baseline for this product in the worker: torch is not importable there, "
              "or its cuBLAS does not run this product)")
    if result.top:
        rows = [[str(i + 1), r.tag, f"{r.tflops:.1f}" + ("" if r.remeasured else "*"), f"{r.predicted_tflops:.1f}",
                 f"{r.pct_of_prediction:.0f}%",
                 f"{r.pct_of_roofline:.0f}%" + (" (above the roofline: a measurement error?)"
                                                 if r.pct_of_roofline > 100 else ""),
                 f"{r.vs_cublas:.2f}x" if r.vs_cublas else "-"] for i, r in enumerate(result.top)]
        print(table(rows, ["#", "config", "TFLOP/s", "model TFLOP/s", "% of model", "% of roofline", "vs cuBLAS"]))
        print("* single search measurement; the others are medians of the interleaved re-measurement")
    for f in result.finalists:
        if f.failed:
            print(f"finalist {f.config.tag}: {f.failed}")
    w = result.winner
    if w is None:
        print("no configuration ran correctly: nothing to export")
        return
    q1, q3 = w.quartiles()
    print(f"winner: {w.kernel}")
    print(f"  median {w.median_s * 1e3:.4f} ms = {w.tflops:.1f} TFLOP/s over {len(w.times_s)} interleaved rounds "
          f"(min {min(w.times_s) * 1e3:.4f}, max {max(w.times_s) * 1e3:.4f}, IQR {q1 * 1e3:.4f}-{q3 * 1e3:.4f} ms)")
    print(f"record: {result.record_path}")
    if result.bundle is not None:
        print(f"exported: {result.bundle.manifest_path}")
        print(f"  {other_shapes_line(result.bundle.manifest_path)}")
