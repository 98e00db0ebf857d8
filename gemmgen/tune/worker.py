"""Measurement in a child process that owns the CUDA context, behind a watchdog.

A kernel that hits an illegal address leaves its CUDA context unusable for the rest of the
process, and one that never finishes blocks the thread that waits on it. So the tuner never
launches a kernel itself: a 'spawn' child holds the benchmark (and with it the only CUDA
context), requests travel over a Pipe, and the parent waits at most `watchdog_s` for each answer.
A failed measurement, a child that died, or one that missed its deadline fails that one trial;
the child is then killed and a fresh one started for the next request.

`ReplayBenchmark` is the simulation mode: it answers from recorded timings (a JSON file keyed
by configuration tag), so the search logic runs and is tested on machines without a GPU.
"""
from __future__ import annotations

import inspect
import json
import multiprocessing as mp
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..model.errors import InvalidInput, NoGpu
from ..model.files import load_json, read_text

# Failure kinds. A trial that fails with one of QUARANTINED_KINDS is quarantined: the same kernel
# would fail the same way again. OTHER (out of memory, a bad manifest, a missing library) is not the
# kernel's fault as far as we can tell, so it fails the trial without condemning the kernel.
HANG, CRASH, CUDA_ERROR, WRONG, COMPILE, OTHER = "hang", "crash", "cuda-error", "wrong-result", "compile-error", "other"
QUARANTINED_KINDS = frozenset({HANG, CRASH, CUDA_ERROR, WRONG, COMPILE})
# Driver errors a kernel causes by itself (bad addresses, traps, impossible launch resources).
KERNEL_FAULTS = ("ILLEGAL_ADDRESS", "LAUNCH_FAILED", "ILLEGAL_INSTRUCTION", "MISALIGNED_ADDRESS", "INVALID_PC",
                 "HARDWARE_STACK_ERROR", "ASSERT", "LAUNCH_OUT_OF_RESOURCES", "INVALID_ADDRESS_SPACE",
                 "LAUNCH_TIMEOUT")


@dataclass(frozen=True)
class Outcome:
    """What one measurement request produced, as the parent sees it."""

    ok: bool
    time_s: "float | None" = None
    times_s: "tuple[float, ...]" = ()
    rel_error: "float | None" = None
    reason: str = ""
    kind: str = "ok"  # ok, or one of the failure kinds above
    tflops: "float | None" = None

    def to_dict(self) -> dict:
        return {"ok": self.ok, "time_s": self.time_s, "times_s": list(self.times_s), "rel_error": self.rel_error,
                "reason": self.reason, "kind": self.kind, "tflops": self.tflops}


def classify(reason: str) -> str:
    """Failure kind from a benchmark's reason text (GpuBenchmark names CUDA errors, 'wrong result: ...')."""
    text = reason.upper()
    if "WRONG RESULT" in text:
        return WRONG
    if any(fault in text for fault in KERNEL_FAULTS):
        return CUDA_ERROR
    if "HANG" in text or "WATCHDOG" in text:
        return HANG
    return OTHER


def as_outcome(measurement) -> Outcome:
    """Normalise a bench.Measurement (or anything with the same fields) into an Outcome."""
    if isinstance(measurement, Outcome):
        return measurement
    ok = bool(getattr(measurement, "ok", False))
    reason = str(getattr(measurement, "reason", "") or "")
    times = tuple(float(t) for t in (getattr(measurement, "times_s", None) or ()))
    time_s = getattr(measurement, "time_s", None)
    rel = getattr(measurement, "rel_error", None)
    tflops = getattr(measurement, "tflops", None)
    if ok and (time_s is None or not time_s > 0):
        ok, reason = False, f"benchmark reported success without a positive time ({time_s!r})"
    return Outcome(ok, float(time_s) if time_s is not None else None, times,
                   float(rel) if rel is not None else None, reason, "ok" if ok else classify(reason),
                   float(tflops) if tflops is not None else None)


def _call_measure(bench, manifest: dict, cubin: bytes, problem):
    """bench.measure takes (manifest, cubin, problem); an older draft took (compiled, manifest, problem)."""
    params = list(inspect.signature(bench.measure).parameters)
    if params and params[0] == "compiled":
        from types import SimpleNamespace

        return bench.measure(SimpleNamespace(name=manifest.get("name"), cubin=cubin), manifest, problem)
    return bench.measure(manifest, cubin, problem)


def gpu_benchmark():
    """The real benchmark; called inside the child, so the CUDA context is created there."""
    from .bench import GpuBenchmark

    return GpuBenchmark()


@contextmanager
def sigint_held():
    """Ctrl-C held back (blocked, not lost: delivered when the block ends) while child processes start. A child
    inherits the blocked SIGINT and keeps it for life, so the terminal's Ctrl-C, which reaches the whole process
    group, is the starting process's alone, and it stops its children. A child starting (importing gemmgen) when
    Ctrl-C came printed a KeyboardInterrupt traceback under the tune's 'interrupted' line, and a --gpus worker
    hit by Ctrl-C and then by its parent's SIGTERM printed one while winding up. (multiprocessing starts its
    resource tracker the same way.)"""
    import signal

    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _serve(conn, factory: Callable[[], object]) -> None:
    """Child main loop: build the benchmark, then answer requests until told to stop.

    Ctrl-C is the parent's: it reaches the whole process group, and in here it raised KeyboardInterrupt inside
    the measurement, which multiprocessing printed as a traceback under 'interrupted; results already stored
    are kept'. The parent stops this process (stop, then SIGTERM) when it winds up. A parent that is gone
    (killed outright) gets no answer and no traceback either: a BrokenPipeError here printed one."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _serve_requests(conn, factory)
    except (BrokenPipeError, ConnectionResetError):
        return


def _serve_requests(conn, factory: Callable[[], object]) -> None:
    try:
        bench = factory()
        # GpuBenchmark opens its context (and imports torch first) on first use: do it now, while the
        # parent compiles, so the first measurement does not spend its watchdog on start-up.
        getattr(bench, "device", None)
    except Exception as exc:  # reported to the parent, which decides what it means
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        op = request[0]
        if op == "stop":
            close = getattr(bench, "close", None)
            if close is not None:
                close()
            return
        try:
            if op == "measure":
                _, manifest, cubin, problem = request
                answer = as_outcome(_call_measure(bench, manifest, cubin, problem))
            elif op == "verify":
                _, manifest, cubin, problem = request
                answer = _verify(bench, manifest, cubin, problem)
            elif op == "cublas":
                answer = bench.cublas_time(request[1], *request[2:])
            elif op == "timing":
                setter = getattr(bench, "set_timing", None)  # a replay has no clock to heat: it ignores this
                answer = setter(request[1]) if setter is not None else None
            else:
                raise ValueError(f"unknown request {op!r}")
            reply = ("ok", answer)
        except Exception as exc:  # the benchmark should not raise; if it does, that trial fails
            reply = ("error", f"{type(exc).__name__}: {exc}")
        conn.send(reply)


def _verify(bench, manifest: dict, cubin: bytes, problem) -> "Outcome | None":
    """bench.verify as an Outcome (no time: verification only), or None for a benchmark without a GPU."""
    verify = getattr(bench, "verify", None)
    if verify is None:
        return None  # the replay: nothing runs, so nothing can be verified
    m = verify(manifest, cubin, problem)
    ok, reason = bool(getattr(m, "ok", False)), str(getattr(m, "reason", "") or "")
    rel = getattr(m, "rel_error", None)
    return Outcome(ok, rel_error=float(rel) if rel is not None else None, reason=reason,
                   kind="ok" if ok else classify(reason))


@dataclass
class WorkerBenchmark:
    """The parent's handle on the measuring child: same measure()/cublas_time() as GpuBenchmark.

    measure() never raises: a hang, a dead child or an error becomes a failed Outcome, and the
    child is replaced before the next request. `restarts` counts replacements.
    """

    factory: Callable[[], object] = gpu_benchmark
    watchdog_s: float = 60.0
    start_timeout_s: float = 180.0
    restarts: int = 0
    timing: "str | None" = None  # a bench.TIMINGS name, or None for the factory's own policy
    # A file locked (fcntl.flock) around every request: workers sharing one GPU measure one at a time. Taken
    # before the watchdog's clock starts, so waiting for another worker's measurement is never a hang.
    lock_path: "str | None" = None
    _child_timing: "str | None" = field(default=None, repr=False)
    _proc: object = field(default=None, repr=False)
    _conn: object = field(default=None, repr=False)
    _ready: bool = field(default=False, repr=False)

    def launch(self) -> None:
        """Start the child without waiting: it opens its CUDA context while the parent does other work."""
        if self._proc is not None:
            return
        ctx = mp.get_context("spawn")  # never fork a process that may hold CUDA or DB handles
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, self.factory), daemon=True, name="gemmgen-measure")
        with sigint_held():
            proc.start()
        child.close()
        self._proc, self._conn, self._ready = proc, parent, False

    def start(self) -> None:
        """Start the child (if launch() did not) and wait until its benchmark and CUDA context are ready."""
        if self._proc is not None and self._ready and self._proc.is_alive():
            return
        if self._proc is not None and not self._proc.is_alive() and self._ready:
            self._kill()
        self.launch()
        parent, proc = self._conn, self._proc
        if not parent.poll(self.start_timeout_s):
            self._kill()
            raise NoGpu(f"the measuring process did not start within {self.start_timeout_s:.0f}s")
        try:
            status, detail = parent.recv()
        except EOFError:
            code = proc.exitcode
            self._kill()
            raise NoGpu(f"the measuring process died while starting (exit code {code})") from None
        if status != "ready":
            self._kill()
            raise NoGpu(f"the measuring process could not start its benchmark: {detail}",
                        "pass --dry-run --gpu NAME to rank and compile without measuring")
        self._ready = True

    def measure(self, manifest: dict, cubin: bytes, problem) -> Outcome:
        name = manifest.get("name", "?")
        answer = self._request(("measure", manifest, cubin, problem), f"measuring {name}")
        if not isinstance(answer, Outcome):
            answer = Outcome(False, reason=f"the benchmark answered {answer!r}, not a measurement", kind=OTHER)
        if not answer.ok and self._proc is not None:
            # The context may be poisoned (sticky error) or memory scribbled on: start clean.
            self._replace()
        return answer

    def verify(self, manifest: dict, cubin: bytes, problem) -> "Outcome | None":
        """Verification only (fresh inputs, D poisoned first) on the child's GPU; None where the child's
        benchmark has no GPU (the replay). Never raises, like measure()."""
        answer = self._request(("verify", manifest, cubin, problem), f"verifying {manifest.get('name', '?')}")
        if answer is not None and not isinstance(answer, Outcome):
            answer = Outcome(False, reason=f"the benchmark answered {answer!r}, not a verification", kind=OTHER)
        if answer is not None and not answer.ok and self._proc is not None:
            self._replace()  # as after a failed measurement: the context may be poisoned
        return answer

    def cublas_time(self, problem, fresh: bool = False) -> "float | None":
        answer = self._request(("cublas", problem, fresh), "timing cuBLAS")
        return answer if isinstance(answer, (int, float)) and not isinstance(answer, bool) else None

    def set_timing(self, name: "str | None") -> None:
        """Time with bench.TIMINGS[name] from the next request on, or with the factory's own policy again
        (None). The child is told lazily, and again after every replacement (a new child starts with its own)."""
        from .bench import timing_policy

        if name is not None:
            timing_policy(name)  # a bad name fails here, in the parent, with the rule
        self.timing = name

    def _request(self, request: tuple, what: str):
        """Send one request; a failed Outcome if the child errs, dies or misses the watchdog."""
        if self.lock_path is None:
            return self._request_unlocked(request, what)
        import fcntl

        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
            try:
                return self._request_unlocked(request, what)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _request_unlocked(self, request: tuple, what: str):
        if self.timing != self._child_timing:
            answer = self._send(("timing", self.timing), "setting the timing policy")
            if isinstance(answer, Outcome):
                return answer
            self._child_timing = self.timing
        return self._send(request, what)

    def _send(self, request: tuple, what: str):
        try:
            self.start()
            self._conn.send(request)
        except NoGpu:
            raise
        except (OSError, EOFError, BrokenPipeError) as exc:
            self._replace()
            return Outcome(False, reason=f"could not reach the measuring process: {exc}", kind=CRASH)
        if not self._conn.poll(self.watchdog_s):
            self._replace()
            return Outcome(False, reason=f"hang: no answer within {self.watchdog_s:g}s while {what} (watchdog)",
                           kind=HANG)
        try:
            status, answer = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(1.0)
            code = self._proc.exitcode
            self._replace()
            return Outcome(False, reason=f"crash: the measuring process died while {what} (exit code {code})",
                           kind=CRASH)
        if status == "error":
            self._replace()
            return Outcome(False, reason=str(answer), kind=classify(str(answer)))
        return answer

    def _replace(self) -> None:
        self._kill()
        self.restarts += 1

    def _kill(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        self._ready = False
        self._child_timing = None  # the next child starts with its factory's policy
        if conn is not None:
            conn.close()
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()  # a kernel spinning on the GPU can ignore SIGTERM's default grace
                proc.join(2.0)

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(("stop",))
                self._proc.join(2.0)
            except (OSError, BrokenPipeError):
                pass
        self._kill()

    def __enter__(self) -> "WorkerBenchmark":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- simulation mode ---------------------------------------------------------------------------

class ReplayBenchmark:
    """Answers measure() from recorded timings instead of a GPU (simulation mode).

    The file maps configuration tags (TileConfig.tag) to an entry:
      a number                         the kernel's time in seconds
      a list of numbers                successive measurements of it (cycled)
      {"error": "CUDA_ERROR_..."}      the launch fails with that error
      {"rel_error": 0.3}               the kernel runs but its result is wrong
      {"hang": true}                   the kernel never finishes (the watchdog must catch it)
      {"crash": true}                  the process dies, as on a segfault in the driver
    A top-level "delay_s" makes each measurement take that long (simulated GPU time). An optional "shapes"
    mapping holds timings per problem shape, {"MxNxK": {"timings": {...}, "cublas_time_s": ...}}: a problem
    found there is answered from its own timings (a shape set's buckets each have their winner), others from
    "timings".
    Tags missing from the file fail with a reason naming the tag. If `log_path` is given, each
    measure() appends the tag to it, so tests can count what was measured across processes.
    """

    def __init__(self, path: "str | os.PathLike", log_path: "str | os.PathLike | None" = None):
        self.path = Path(path)
        try:
            data = load_json("a replay file", read_text("a replay file", path), str(path))
        except InvalidInput as exc:
            raise InvalidInput("a replay file must be readable JSON with a 'timings' mapping", str(path),
                               exc.hint or exc.rule) from None
        if not isinstance(data, dict) or not isinstance(data.get("timings"), dict):
            raise InvalidInput("a replay file must be readable JSON with a 'timings' mapping", str(path))
        where = str(path)
        self.timings: dict = {tag: _replay_entry(tag, entry, where) for tag, entry in data["timings"].items()}
        cublas = data.get("cublas_time_s")
        self.cublas_s = None if cublas is None else _replay_real("cublas_time_s", cublas, where)
        self.shapes: dict = data.get("shapes") or {}
        if not isinstance(self.shapes, dict) or not all(isinstance(v, dict) and isinstance(v.get("timings"), dict)
                                                        for v in self.shapes.values()):
            raise InvalidInput("a replay file's 'shapes' must map 'MxNxK' to {'timings': {...}}", where)
        for shape in self.shapes.values():
            shape["timings"] = {tag: _replay_entry(tag, e, where) for tag, e in shape["timings"].items()}
            if shape.get("cublas_time_s") is not None:
                _replay_real("cublas_time_s", shape["cublas_time_s"], where)
        # Simulated GPU time per measurement.
        self.delay_s = _replay_real("delay_s", data.get("delay_s", 0.0), where, open_lo=False)
        self.log_path = Path(log_path) if log_path else None
        self._calls: "dict[str, int]" = {}

    def measure(self, manifest: dict, cubin: bytes, problem) -> Outcome:
        from ..model.tiles import TileConfig

        tag = TileConfig.from_dict(manifest["config"]).tag
        if self.log_path is not None:
            with open(self.log_path, "a") as log:
                log.write(tag + "\n")
        entry = self._for(problem)[0].get(tag)
        count = self._calls.get(tag, 0)
        self._calls[tag] = count + 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if entry is None:
            return Outcome(False, reason=f"no recorded timing for {tag}", kind=OTHER)
        if isinstance(entry, dict):
            if entry.get("hang"):
                time.sleep(1e6)
            if entry.get("crash"):
                os._exit(139)
            if "error" in entry:
                return Outcome(False, reason=str(entry["error"]), kind=CUDA_ERROR)
            if "rel_error" in entry:
                return Outcome(False, rel_error=float(entry["rel_error"]), kind=WRONG,
                               reason=f"wrong result: relative error {float(entry['rel_error']):.3e}")
            entry = entry.get("time_s")
        times = [float(t) for t in entry] if isinstance(entry, list) else [float(entry)]
        time_s = times[count % len(times)]
        return Outcome(True, time_s, (time_s,), 0.0, "", "ok", problem.flops / time_s / 1e12)

    def _for(self, problem) -> "tuple[dict, object]":
        """(timings, cuBLAS time) of `problem`'s shape, else the file's own."""
        shape = self.shapes.get(f"{problem.m}x{problem.n}x{problem.k}")
        if shape is None:
            return self.timings, self.cublas_s
        return shape["timings"], shape.get("cublas_time_s", self.cublas_s)

    def cublas_time(self, problem, fresh: bool = False) -> "float | None":
        cublas = self._for(problem)[1]
        return float(cublas) if cublas else None


_REPLAY_KEYS = {"time_s", "error", "rel_error", "hang", "crash"}


def _replay_real(what: str, value, path: str, lo: float = 0.0, open_lo: bool = True) -> float:
    from ..model import parse

    try:
        return parse.real(f"a replay file's {what}", value, lo, 3600.0, lo_open=open_lo)
    except InvalidInput as exc:
        raise InvalidInput(exc.rule, exc.value, path) from None


def _replay_entry(tag: str, entry, path: str):
    """One recorded timing, checked when the file is read (a bad one would kill the measuring worker later)."""
    if isinstance(entry, dict):
        unknown = sorted(set(map(str, entry)) - _REPLAY_KEYS)
        if unknown:
            raise InvalidInput(f"a replay file's timings[{tag!r}] keys must be among {sorted(_REPLAY_KEYS)}",
                               unknown[0], path)
        if "rel_error" in entry:
            _replay_real(f"timings[{tag!r}].rel_error", entry["rel_error"], path, lo=0.0, open_lo=False)
        if "time_s" in entry:
            _replay_entry(tag, entry["time_s"], path)
        elif not {"error", "rel_error", "hang", "crash"} & set(entry):
            raise InvalidInput(f"a replay file's timings[{tag!r}] must give time_s or a failure", entry, path)
        return entry
    for t in entry if isinstance(entry, list) and entry else [entry]:
        _replay_real(f"timings[{tag!r}]", t, path)
    return entry


def replay_factory(path: str, log_path: "str | None" = None) -> Callable[[], ReplayBenchmark]:
    """A picklable factory for WorkerBenchmark: the child builds its ReplayBenchmark itself."""
    import functools

    return functools.partial(ReplayBenchmark, str(path), log_path)
