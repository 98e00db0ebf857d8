"""`gemmgen suite ... --gpus 0,1,...|all`: the suite's shapes spread over GPUs, one measuring worker per GPU.

Each worker is a spawned process with its own measuring child pinned to its GPU (CUDA_VISIBLE_DEVICES) and its own
compile pool (the NVRTC cubin cache on disk is shared). Workers pull shapes from the parent one at a time, so a
long shape holds only its own GPU while the others take the rest. Each shape is tuned wholly on one GPU: its own
study, its trials, its finalist rounds and its cuBLAS timing, then its winner's check at other shapes
(suite.tune_row, as in a one-GPU suite), and the record is written by that worker under results/<gpu model>/.
All GPUs must be one model (tune/parallel.plan_workers refuses a mix): the records and studies are per GPU model.

A worker that dies (SIGKILL, a lost GPU) has its shape given once more to another worker; the shape's study
resumes there, and a trial the dead worker left RUNNING is failed at once (its process is gone: liveness.py).
"""
from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
from collections import deque
from dataclasses import replace
from pathlib import Path

from ..model.arch import Gpu
from ..model.errors import UserError
from .parallel import WorkerSpec, WorkersFailed, enter_worker, stop_workers
from .worker import sigint_held
from .results import now, problem_key
from .suite_file import Shape
from .suite import SuiteReport, SuiteRow, row_for, same_as, suite_jobs, tune_row

# Events a worker forwards to the parent's progress display (the rest stay in the worker).
FORWARDED = ("start", "trial", "finalists")


def _suite_worker(gpu, options, spec: WorkerSpec, measurer_factory, engines_factory, device, check_shapes,
                  inbox, outbox) -> None:
    """A worker process: take a job, tune it on this GPU, send its row; until the parent sends None."""
    from .search import default_engines

    enter_worker(options, spec)
    measurer = measurer_factory(spec)
    engines = None
    try:
        launch = getattr(measurer, "launch", None)
        if launch is not None:
            launch()  # the CUDA context opens while the first shape is ranked
        engines = engines_factory() if engines_factory is not None else default_engines(options.jobs)
        outbox.put(("ready", spec.index, None))
        while True:
            job = inbox.get()
            if job is None:
                break
            index, shape, dtype, out = job

            def forward(kind, info, _index=index):
                if kind in FORWARDED:
                    outbox.put(("event", spec.index, (_index, kind, dict(info))))

            row = tune_row(shape, dtype, gpu, measurer, replace(options, worker=spec.label), engines=engines,
                           on_event=forward, device=device, out=out, check_shapes=check_shapes)
            outbox.put(("row", spec.index, (index, row)))
    except UserError as exc:
        outbox.put(("error", spec.index, str(exc)))
    except KeyboardInterrupt:
        outbox.put(("interrupted", spec.index, None))
    except Exception as exc:  # noqa: BLE001 - the parent reports it as this worker's failure, in one line
        outbox.put(("error", spec.index, f"{type(exc).__name__}: {exc}"))
    finally:
        measurer.close()
        if engines is not None:
            engines.close(wait=True)


class _Dispatch:
    """The parent's book of jobs: pending, in flight per worker, and rows received."""

    def __init__(self, jobs, retries: int = 1):
        self.pending = deque(jobs)
        self.inflight: "dict[int, tuple]" = {}  # worker index -> job
        self.tries: "dict[int, int]" = {}  # job index -> times handed out
        self.rows: "dict[int, SuiteRow]" = {}
        self.retries = retries

    def next_for(self, worker: int):
        if not self.pending:
            return None
        job = self.pending.popleft()
        self.inflight[worker] = job
        self.tries[job[0]] = self.tries.get(job[0], 0) + 1
        return job

    def lost(self, worker: int) -> "tuple | None":
        """The job a dead worker held: queued again once; the second time returned as lost for good."""
        job = self.inflight.pop(worker, None)
        if job is None:
            return None
        if self.tries[job[0]] <= self.retries:
            self.pending.appendleft(job)
            return None
        return job


def run_suite_on_gpus(shapes: "list[Shape]", dtypes: "list[str]", gpu: Gpu, options, specs: "list[WorkerSpec]",
                      measurer_factory, *, source: str, engines_factory=None, on_event=None,
                      device: "dict | None" = None, out: "str | None" = None, check_shapes: int = 2,
                      poll_s: float = 0.5) -> SuiteReport:
    """Tune every shape in every dtype, each wholly on one of `specs`' GPUs, pulled from one queue."""
    emit = on_event or (lambda kind, info: None)
    plan = suite_jobs(shapes, dtypes)
    jobs = [(i, shape, dtype, str(Path(out) / problem_key(shape.problem(dtype))) if out else None)
            for i, (shape, dtype, same) in enumerate(plan) if same is None]
    if options.storage:
        # Create the storage's tables once, here: workers creating them at once on a fresh PostgreSQL database
        # race in CREATE TABLE (a unique-constraint violation in pg_type).
        from .storage import open_storage

        open_storage(options.storage)
    ctx = mp.get_context("spawn")  # never fork a process holding DB connections or CUDA
    outbox = ctx.Queue()
    inboxes = [ctx.Queue() for _ in specs]
    procs = []
    for spec in specs:
        proc = ctx.Process(target=_suite_worker, name=f"gemmgen-suite-{spec.label}",
                           args=(gpu, options, spec, measurer_factory, engines_factory, device, check_shapes,
                                 inboxes[spec.index], outbox))
        with sigint_held():  # Ctrl-C is this process's: it stops the workers (stop_workers), each once
            proc.start()
        procs.append(proc)
    emit("workers", {"workers": [s.label for s in specs], "jobs": len(jobs), "rows": len(plan)})
    book = _Dispatch(jobs)
    idle: "set[int]" = set()
    gone: "dict[int, str]" = {}  # worker index -> why it stopped
    try:
        while len(book.rows) < len(jobs) and len(gone) < len(specs):
            try:
                kind, index, detail = outbox.get(timeout=poll_s)
            except queue_mod.Empty:
                kind = None
            if kind in ("ready", "row"):
                if kind == "row":
                    job_index, row = detail
                    book.inflight.pop(index, None)
                    book.rows[job_index] = row
                    emit("row", {"worker": specs[index].label, "row": row})
                idle.add(index)
            elif kind == "event":
                job_index, what, info = detail
                shape, dtype, _ = plan[job_index]
                emit("shape_" + what, dict(info, worker=specs[index].label, shape=shape.name, dtype=dtype))
            elif kind in ("error", "interrupted"):
                gone[index] = detail or kind
                if kind == "error":
                    raise WorkersFailed(detail, 1)  # a storage or input problem: every shape would meet it
            for i, proc in enumerate(procs):  # a worker that died without a word (SIGKILL, a lost GPU)
                if i not in gone and not proc.is_alive() and outbox.empty():
                    gone[i] = f"died (exit code {proc.exitcode})"
                    idle.discard(i)
                    lost = book.lost(i)
                    if lost is not None:
                        book.rows[lost[0]] = _failed_row(lost, f"its worker died twice (last: {specs[i].label})")
                    emit("worker_died", {"worker": specs[i].label, "exit_code": proc.exitcode})
            for i in sorted(idle - set(gone)):
                job = book.next_for(i)
                if job is None:
                    break
                idle.discard(i)
                inboxes[i].put(job)
                shape, dtype = job[1], job[2]
                emit("shape_assigned", {"worker": specs[i].label, "shape": shape.name, "dtype": dtype})
    except BaseException:
        stop_workers(procs)
        raise
    for i in range(len(specs)):
        if i not in gone:
            inboxes[i].put(None)
    for proc in procs:
        proc.join()
    for job in list(book.pending) + list(book.inflight.values()):
        book.rows.setdefault(job[0], _failed_row(job, "not tuned: every worker stopped"))
    emit("done", {})
    rows: "list[SuiteRow]" = []
    first: "dict[str, SuiteRow]" = {}
    for i, (shape, dtype, same) in enumerate(plan):
        key = problem_key(shape.problem(dtype))
        row = same_as(first[same], shape) if same is not None else book.rows[i]
        first.setdefault(key, row)
        rows.append(row)
    return SuiteReport(gpu, source, now(), tuple(rows), False, (device or {}).get("name", ""))


def _failed_row(job, why: str) -> SuiteRow:
    _, shape, dtype, _ = job
    return row_for(shape, dtype, tflops=None, cublas_tflops=None, ratio=None, tuning_s=0.0, note=why)


__all__ = ["run_suite_on_gpus"]
