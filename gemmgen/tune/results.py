"""The tuning database: one JSON record per tuned problem under results/<gpu key>/.

A record holds the problem, the environment fingerprint, every trial, the winner and cuBLAS's
time. It is written atomically (temp file + rename) after every trial, so a crash or Ctrl-C
leaves the last complete state, never a half-written file. `lookup` answers from these records
without tuning: the exact problem, or else the nearest shape held, saying which.

This module imports neither Optuna nor cuda-python: the Optuna study is the search's working
store; these records are the durable, readable answer.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path

from ..model.atomic import atomic_write
from ..families import rules as constraints
from ..model import paths
from ..model.arch import Arch, Gpu, lookup_gpu
from ..model.errors import InvalidInput, UserError
from ..model.problem import Problem
from ..model.tiles import TileConfig

RECORD_FORMAT = "gemmgen-tune/1"


class NothingStored(UserError):
    """lookup found no record for this GPU."""

    def __init__(self, gpu_key: str, where: Path):
        self.gpu_key, self.where = gpu_key, where
        super().__init__(gpu_key, str(where))

    def __str__(self) -> str:
        return (f"no tuning results stored for {self.gpu_key} in {self.where} "
                f"(run `gemmgen tune M N K --gpu {self.gpu_key}` first)")


def results_root() -> Path:
    """Where new records go (model/paths.results_dir, read at call time: tests point it at a temp dir)."""
    return paths.results_dir()


def gpu_dir(gpu: "Gpu | str") -> Path:
    return results_root() / (gpu.key if isinstance(gpu, Gpu) else str(gpu))


def gpu_dirs(gpu: "Gpu | str") -> "list[Path]":
    """Every folder records of this GPU are read from: the writable one first, then the shipped records."""
    key = gpu.key if isinstance(gpu, Gpu) else str(gpu)
    return [root / key for root in paths.results_dirs()]


def problem_key(problem: Problem) -> str:
    """File stem of a problem's record: shape, dtypes, layouts and the compile-time epilogue."""
    key = f"{problem.label}_{problem.c_dtype.value}_{problem.epilogue.tag}"
    return key + ("_beta" if problem.epilogue.beta != 0 else "")


def record_path(gpu: "Gpu | str", problem: Problem, simulated: bool = False) -> Path:
    """results/<gpu>/tunes/<problem>.json; replayed tunes go to tunes-replay/, which lookup, suite and
    calibrate never read, so a simulation cannot overwrite or pass for a GPU measurement."""
    return gpu_dir(gpu) / ("tunes-replay" if simulated else "tunes") / f"{problem_key(problem)}.json"


def stored_record_path(gpu: "Gpu | str", problem: Problem) -> Path:
    """The record a table reads for `problem`, as load_records ranks them: a GPU-measured one (the writable
    folder's before the shipped records), else a replayed one; the writable folder's path when none is held."""
    for folder in ("tunes", "tunes-replay"):
        for base in gpu_dirs(gpu):
            path = base / folder / f"{problem_key(problem)}.json"
            if path.is_file():
                return path
    return record_path(gpu, problem)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def write_json_atomic(path: Path, payload) -> Path:
    """Write JSON so that readers see the old file or the new one, never a torn one."""
    text = json.dumps(payload, indent=2, default=str) + "\n"
    return atomic_write(path, text.encode(), durable=True)


def fingerprint(gpu: Gpu, device: "dict | None" = None, nvrtc_version: "str | None" = None) -> dict:
    """Environment fingerprint: which GPU, driver, NVRTC and gemmgen produced a figure."""
    from .. import __version__

    device = dict(device or {})
    try:
        import optuna

        optuna_version = optuna.__version__
    except ImportError:  # the record is still valid without it
        optuna_version = None
    return {
        "gpu_key": gpu.key,
        "gpu_name": device.get("name") or gpu.name,
        "gpu_detected": bool(device),
        "driver_version": device.get("driver_version") or device.get("driver"),
        "nvrtc_version": nvrtc_version,
        "gemmgen_version": __version__,
        "optuna_version": optuna_version,
        "python": platform.python_version(),
        "host": platform.node(),
        "device": device,
    }


# --- lookup ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    """What lookup found: the record, whether it is for the exact problem, and how far it is."""

    record: dict
    path: Path
    exact: bool
    distance: float  # log-distance over M, N, K (0 when exact)
    same_operands: bool  # dtypes, layouts, the rows' alignment and the epilogue kind match the question
    # Whether the held winner's configuration is feasible for the question (a swapped skinny-M winner is not for
    # a larger M, a K-major one not for another layout); when none held is, the first rule it breaks.
    fits: bool = True
    misfit: str = ""
    other_alignment: bool = False  # the same operands but for the rows' alignment (a view's leading dimensions)

    @property
    def problem(self) -> Problem:
        return Problem.from_dict(self.record["problem"])


def load_records(gpu: "Gpu | str") -> "list[tuple[Path, dict]]":
    """Every readable tuning record held for this GPU (unreadable files are skipped, not fatal). Replayed
    (simulated) records count only for problems with no GPU-measured record."""
    out, measured, seen = [], set(), set()
    for folder, base in [(f, b) for f in ("tunes", "tunes-replay") for b in gpu_dirs(gpu)]:
        root = base / folder
        for path in sorted(root.glob("*.json")) if root.is_dir() else ():
            if (folder, path.name) in seen:
                continue  # a record the user's own tunes hold shadows the shipped one
            seen.add((folder, path.name))
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not (isinstance(record, dict) and record.get("format") == RECORD_FORMAT and record.get("winner")
                    and _readable(record)):
                continue
            if folder == "tunes":
                measured.add(path.name)
            elif path.name in measured:
                continue
            out.append((path, record))
    return out


def _readable(record: dict) -> bool:
    """Whether a record holds what every reader of it takes for granted: a problem that parses, and trials as a
    list of mappings. A record edited or cut short without them made `gemmgen calibrate` end in a KeyError."""
    try:
        Problem.from_dict(record.get("problem"))
    except InvalidInput:
        return False
    trials = record.get("trials", [])
    return isinstance(trials, list) and all(isinstance(trial, dict) for trial in trials)


def unanswerable(record: dict) -> str:
    """'' when lookup can answer with a record (the GPU, the winner's kernel, configuration and times, cuBLAS's
    times), else the first field that is wrong: such a record ended lookup in KeyError and ValueError tracebacks."""
    if not isinstance(record.get("gpu"), str):
        return "gpu must be the catalogue name of the GPU"
    winner = record.get("winner")
    if not isinstance(winner, dict) or not isinstance(winner.get("kernel"), str) \
            or not isinstance(winner.get("config"), dict):
        return "winner must give its kernel (text) and config (a mapping)"
    for key, needed in (("median_time_s", True), ("tflops", True), ("min_time_s", False), ("max_time_s", False)):
        if not positive_number(winner.get(key), needed):
            return f"winner.{key} must be a positive number"
    if winner.get("min_time_s") is not None and not positive_number(winner.get("rounds"), True):
        return "winner.rounds must be a positive number"
    cublas = record.get("cublas")
    if cublas is not None and not (isinstance(cublas, dict) and positive_number(cublas.get("time_s"), False)
                                   and positive_number(cublas.get("tflops"), cublas.get("time_s") is not None)):
        return "cublas must be a mapping of positive time_s and tflops"
    return ""


def positive_number(value, needed: bool) -> bool:
    """Whether a record's field is a finite number above 0, or absent (None) where not `needed`."""
    if value is None:
        return not needed
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _operands_key(problem: Problem, alignment: bool = True) -> tuple:
    """What a winner's kernel is compiled for besides the shape: dtypes, layouts, the epilogue, and (`alignment`)
    the rows' alignment, which the leading dimensions decide (a view with odd ones needs another kernel than its
    packed shape)."""
    ops = problem.operands
    aligns = (ops.align_a, ops.align_b, ops.align_c) if alignment else ()
    return (ops.a_dtype, ops.b_dtype, ops.c_dtype, ops.a_layout, ops.b_layout, problem.epilogue.bias,
            problem.epilogue.activation, problem.epilogue.beta != 0, problem.scaling, problem.epilogue.row_sums,
            *aligns)


def log_distance(a: Problem, b: Problem) -> float:
    """Euclidean distance between shapes in log space: 2x in one dimension is ln 2 away."""
    return math.sqrt(sum(math.log(x / y) ** 2 for x, y in ((a.m, b.m), (a.n, b.n), (a.k, b.k))))


def lookup(problem: Problem, gpu: "Gpu | str") -> Answer:
    """The stored winner for `problem` on `gpu`, or the nearest shape held (same operands preferred)."""
    records = load_records(gpu)
    if not records:
        raise NothingStored(gpu.key if isinstance(gpu, Gpu) else str(gpu), gpu_dir(gpu) / "tunes")
    want, like = _operands_key(problem), _operands_key(problem, alignment=False)
    best = None
    for path, record in records:
        if unanswerable(record):
            continue
        held = Problem.from_dict(record["problem"])
        same = _operands_key(held) == want
        similar = same or _operands_key(held, alignment=False) == like
        distance = log_distance(problem, held)
        misfit = "" if distance == 0.0 and same else _misfit(record, problem, gpu)
        # A winner that can run the question first, then same operands (then the same but for the rows'
        # alignment), nearest shape, the most recent record.
        rank = (bool(misfit), not same, not similar, distance, -_timestamp(record))
        if best is None or rank < best[0]:
            # Exact: the very problem tuned, its leading dimensions included (a view of the same alignment runs
            # the same kernel, but was not what was measured).
            exact = same and distance == 0.0 and held.label == problem.label
            best = (rank, Answer(record, path, exact, distance, same, not misfit, misfit, similar and not same))
    if best is None:
        raise NothingStored(gpu.key if isinstance(gpu, Gpu) else str(gpu), gpu_dir(gpu) / "tunes")
    return best[1]


def _misfit(record: dict, problem: Problem, gpu: "Gpu | str") -> str:
    """'' when the record's winning configuration passes the feasibility check for `problem`, else the first rule
    it breaks (as 'rule: value')."""
    try:
        config = TileConfig.from_dict(record["winner"]["config"])
        target = gpu if isinstance(gpu, Gpu) else lookup_gpu(str(record.get("gpu") or gpu))
        arch = Arch.parse(record["arch"]) if record.get("arch") else None
    except (UserError, KeyError, TypeError, ValueError):
        return "the record's configuration cannot be read"
    broken = constraints.check(config, target, arch, problem)
    return f"{broken[0].rule}: {broken[0].value}" if broken else ""


def _timestamp(record: dict) -> float:
    try:
        return _dt.datetime.fromisoformat(str(record.get("updated") or record.get("date"))).timestamp()
    except ValueError:
        return 0.0
