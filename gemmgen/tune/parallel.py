"""One measuring worker per GPU, all on one Optuna study: `gemmgen tune ... --gpus 0,1,...|all`.

Each worker is a spawned process running the ordinary search (tune/search) with its own measuring child pinned
to its GPU (CUDA_VISIBLE_DEVICES), so every trial is timed on one GPU. The workers share: the study (which
configuration each takes is claimed in the storage, so none is measured twice), the NVRTC cubin cache on disk
(codegen/nvrtc: content-addressed by source, options and toolkit, written atomically, so a kernel compiled by
one worker is a cache hit for the others), and the finalist round (one worker leads it: search/leader.py). The
parent compiles nothing and measures nothing: it shows progress from the study, then writes the record and
exports the winner from what the study holds.

Two workers on one physical GPU serialize their measurements with an exclusive lock on a file named by the
GPU's PCI bus id (fcntl.flock, taken by the worker around each request to its measuring child, before the
watchdog starts): two kernels timed at once on one GPU share its SMs and both times would be wrong, while the
compiles, the storage traffic and the sampler of the second worker still overlap the first one's measurements.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import socket
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..model.arch import Gpu
from ..model.errors import InvalidInput, NoGpu, UserError
from ..model.problem import Problem
from .worker import sigint_held

# Events a worker forwards to the parent's progress display: the finalist round, which only the leading worker sees
# (the parent's study poll shows the search's trials, and nothing moves in it while the finalists are re-measured).
FORWARDED = ("awaiting_workers", "finalists", "finalist_round")


@dataclass(frozen=True)
class WorkerSpec:
    """One worker: its GPU (a CUDA ordinal, or a label in replay), its label in the study, its GPU lock."""

    index: int
    device: str
    label: str
    lock_path: "str | None"


def parse_gpus(text: str, count: "int | None") -> "list[str]":
    """--gpus '0,1,3' or 'all' -> CUDA ordinals as strings; `count` is the devices the driver sees (None in
    replay, where the ordinals are only labels). A repeated ordinal is two workers on that GPU."""
    text = str(text).strip().lower()
    if text == "all":
        if count is None:
            raise InvalidInput("--gpus all needs GPUs; with --replay give simulated ordinals, e.g. --gpus 0,1", text)
        return [str(i) for i in range(count)]
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise InvalidInput("--gpus must be 'all' or comma-separated CUDA ordinals such as 0,1,2", text)
        if count is not None and int(part) >= count:
            raise InvalidInput(f"--gpus names a GPU the driver does not have ({count} found: 0..{count - 1})", text)
        out.append(str(int(part)))
    if not out:
        raise InvalidInput("--gpus must be 'all' or comma-separated CUDA ordinals such as 0,1,2", text)
    return out


def gpu_lock_path(key: str) -> str:
    """The lock file of one physical GPU (shared by every user of the host: /tmp, not a home directory)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return str(Path(tempfile.gettempdir()) / f"gemmgen-gpu-{safe}.lock")


def physical_gpu(ordinal: int) -> "tuple[str, str]":
    """(PCI bus id, catalogue key or driver name) of CUDA device `ordinal`, read from the driver without a
    context. NoGpu when there is no driver or device."""
    from ..runtime.detect import match_name, read_props

    props, reason = read_props(ordinal)
    if not props:
        raise NoGpu(reason, "--gpus needs GPUs; pass --replay FILE --gpu NAME to simulate them")
    from cuda.bindings import driver as cu

    err, dev = cu.cuDeviceGet(ordinal)
    bus = f"ordinal{ordinal}"
    if err == cu.CUresult.CUDA_SUCCESS:
        err, raw = cu.cuDeviceGetPCIBusId(32, dev)
        if err == cu.CUresult.CUDA_SUCCESS:
            bus = raw.split(b"\0", 1)[0].decode() if isinstance(raw, bytes) else str(raw).split("\0", 1)[0]
    found = match_name(props["name"], props.get("sm_count"))
    return bus, found.key if found is not None else props["name"]


def plan_workers(devices: "list[str]", replay: bool) -> "list[WorkerSpec]":
    """A WorkerSpec per entry of --gpus. Real GPUs must all be one model: records and studies are per model."""
    host = socket.gethostname()
    models, specs = {}, []
    for i, dev in enumerate(devices):
        if replay:
            bus, model = f"replay-{dev}", None
        else:
            bus, model = physical_gpu(int(dev))
            models.setdefault(model, dev)
        label = f"{host}/gpu{dev}" + (f"#{devices[:i].count(dev)}" if devices.count(dev) > 1 else "")
        specs.append(WorkerSpec(i, dev, label, gpu_lock_path(bus)))
    if len(models) > 1:
        names = ", ".join(f"{dev} is {model}" for model, dev in models.items())
        raise InvalidInput("--gpus must name GPUs of one model (studies and records are per GPU model); "
                           "run one tune per model", names)
    return specs


def stop_workers(procs) -> None:
    """SIGTERM to every live worker (each fails and re-queues its trials in flight), then wait for them."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(30)


def enter_worker(options, spec: WorkerSpec) -> None:
    """What a worker process does first: see only its GPU (the measuring child inherits it as its device 0) and
    turn SIGTERM into KeyboardInterrupt, so a stopped worker records what it finished; and stop so when the
    parent is gone."""
    import signal

    if not options.replay:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.device

    def _interrupt(signum, frame):
        # The stop may land inside SQLAlchemy's fetch of a storage call, which then logs the KeyboardInterrupt
        # with its traceback ("Error closing cursor") before letting it through: the stop is deliberate, so
        # the storage's error log is silenced for the rest of this worker (seen in CI under load, 2026-11-28).
        import logging

        logging.getLogger("sqlalchemy").setLevel(logging.CRITICAL + 1)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    redeliver_swallowed_stops(signal.SIGTERM)
    parent = mp.parent_process()
    stop_when_orphaned(parent.pid if parent is not None else os.getppid())


def redeliver_swallowed_stops(signum: int, delay_s: float = 0.05) -> None:
    """Send `signum` to the main thread again whenever the KeyboardInterrupt its handler raised was swallowed in a
    finalizer. A signal's handler runs wherever the main thread is, and Python ignores an exception raised in a
    weakref callback or __del__ ("Exception ignored in: ...", printed with its traceback): a worker stopped while
    the garbage collector ran SQLAlchemy's cleanup of a pooled connection (pool._finalize_fairy, which logs the
    KeyboardInterrupt and re-raises it into the collector) went on tuning until its watchdog ended it. The stop
    comes again `delay_s` later from a thread of its own, when the finalizer is done; nothing is printed. (A worker
    holds SIGINT blocked (worker.sigint_held), so a KeyboardInterrupt in it is always its stop.)"""
    import signal
    import sys
    import threading

    previous = sys.unraisablehook
    main = threading.main_thread().ident

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous(unraisable)
            return
        again = threading.Timer(delay_s, signal.pthread_kill, (main, signum))
        again.daemon = True
        again.start()

    sys.unraisablehook = hook


def stop_when_orphaned(parent_pid: int, poll_s: float = 1.0, grace_s: float = 60.0) -> None:
    """SIGTERM this worker (it winds up as on Ctrl-C: trials in flight re-queued, what it finished kept) once
    `parent_pid` is gone, and end it outright `grace_s` later if that hangs. After a kill -9 of `tune --gpus`
    the workers went on tuning, holding their GPUs, until --trials were done, with no one left to write the
    record; a `suite --gpus` worker waited for its next shape for good."""
    import signal
    import threading

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(1)

    threading.Thread(target=watch, name="gemmgen-stop-when-orphaned", daemon=True).start()


def _worker_main(problem, gpu, options, spec: WorkerSpec, measurer_factory, engines_factory, results) -> None:
    """A worker process: the search on its GPU, then its counts (or its one-line error) to the parent."""
    from .search import tune

    enter_worker(options, spec)
    measurer = measurer_factory(spec)

    def forward(kind, info):
        if kind in FORWARDED:
            results.put((spec.index, "event", (kind, dict(info)), ""))

    try:
        engines = engines_factory() if engines_factory is not None else None
        result = tune(problem, gpu, measurer, options, engines=engines, on_event=forward)
        results.put((spec.index, "ok", dict(result.counts), result.stop_reason))
    except UserError as exc:
        results.put((spec.index, "error", str(exc), ""))
    except KeyboardInterrupt:
        results.put((spec.index, "interrupted", "", "interrupted"))
    except Exception as exc:  # noqa: BLE001 - reported by the parent as this worker's failure, in one line
        results.put((spec.index, "error", f"{type(exc).__name__}: {exc}", ""))
    finally:
        measurer.close()


def run_workers(problem: Problem, gpu: Gpu, options, specs: "list[WorkerSpec]", measurer_factory, *,
                engines_factory=None, on_event=None, device: "dict | None" = None, poll_s: float = 1.0):
    """Start a worker per spec on one study, show progress from the study, and return the TuneResult the
    study holds when they are done (record written and winner exported here, once)."""
    from .search import collect, study_progress

    emit = on_event or (lambda kind, info: None)
    started = time.monotonic()
    if options.storage:
        # Create the storage's tables once, here: workers creating them at once on a fresh PostgreSQL database
        # race in CREATE TABLE (a unique-constraint violation in pg_type).
        from .storage import open_storage

        open_storage(options.storage)
    ctx = mp.get_context("spawn")  # never fork a process holding DB connections or CUDA
    results = ctx.Queue()
    procs = []
    for spec in specs:
        worker_options = replace(options, worker=spec.label, publish_only=True)
        proc = ctx.Process(target=_worker_main, name=f"gemmgen-worker-{spec.label}",
                           args=(problem, gpu, worker_options, spec, measurer_factory, engines_factory, results))
        with sigint_held():  # Ctrl-C is this process's: it stops the workers (stop_workers), each once
            proc.start()
        procs.append(proc)
    emit("workers", {"workers": [s.label for s in specs], "target": options.trials})
    reports: "dict[int, tuple]" = {}
    watch = study_progress(problem, gpu, options)
    try:
        while any(p.is_alive() for p in procs) or not results.empty():
            try:
                index, status, detail, stop = results.get(timeout=poll_s)
                if status == "event":
                    kind, info = detail
                    snapshot = watch() if kind == "finalists" else None
                    if snapshot is not None:  # the search's last trials, said before the round that follows them
                        emit("progress", snapshot)
                    emit(kind, dict(info, worker=specs[index].label))
                else:
                    reports[index] = (status, detail, stop)
            except queue_mod.Empty:
                pass
            snapshot = watch()
            if snapshot is not None:
                emit("progress", snapshot)
    except KeyboardInterrupt:
        stop_workers(procs)
        raise
    for proc in procs:
        proc.join()
    for spec, proc in zip(specs, procs):
        if spec.index not in reports:
            reports[spec.index] = ("died", f"exit code {proc.exitcode}", "")
    errors = [detail if status == "error" else f"worker died ({detail})"
              for status, detail, _ in reports.values() if status in ("error", "died")]
    if len(errors) == len(specs):
        raise WorkersFailed(errors[0], len(specs))
    counts: dict = {}
    for status, detail, _ in reports.values():
        if status == "ok":
            for key, value in detail.items():
                counts[key] = counts.get(key, 0) + value
    stops = sorted({stop for status, _, stop in reports.values() if stop})
    emit("done", {})
    workers = {specs[i].label: (status if status != "ok" else stop) + (f": {detail}" if status in ("error", "died")
                                                                       else "")
               for i, (status, detail, stop) in sorted(reports.items())}
    engines = engines_factory() if engines_factory is not None else None
    try:
        return collect(problem, gpu, options, engines=engines, counts=counts,
                       stop_reason="; ".join(stops) or "workers ended", device=device, workers=workers,
                       started=started, gone_workers=frozenset(s.label for s in specs))
    finally:
        if engines is not None:
            engines.close()


class WorkersFailed(UserError):
    """Every worker stopped with an error (the same one, as a rule: a bad storage, no GPU)."""

    def __init__(self, first: str, n: int):
        self.first, self.n = first, n
        super().__init__(first, n)

    def __str__(self) -> str:
        return f"all {self.n} workers failed; the first said: {self.first}"


__all__ = ["WorkerSpec", "WorkersFailed", "gpu_lock_path", "parse_gpus", "plan_workers", "run_workers"]


def worker_measurer(replay: "str | None", watchdog_s: float, spec: WorkerSpec):
    """The measurer of one worker (picklable through functools.partial): its GPU's benchmark, or the replay."""
    from .worker import WorkerBenchmark, gpu_benchmark, replay_factory

    return WorkerBenchmark(replay_factory(replay) if replay else gpu_benchmark, watchdog_s, lock_path=spec.lock_path)
