"""The search's options, summaries and result types, and its constants."""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from ...model.arch import Gpu
from ...model import parse
from ...model.errors import InvalidInput
from ...model.problem import Problem
from ...model.tiles import TileConfig


SAMPLERS = ("tpe", "random", "cmaes", "qmc", "grid")
SYSTEMIC_FAILURES = 5  # non-kernel measurement failures in a row that stop the tune
FALLBACK_AFTER = 3  # sampler proposals in a row that give nothing new before the model's next pick is queued
# Configurations re-measured first when the study's earlier trials timed older kernel code (the best by old time).
REMEASURE_STALE = 8
FINALIST_TIMINGS = ("burst", "sustained", "stream")  # bench.TIMINGS' names (search imports nothing from bench)

@dataclass(frozen=True)
class TuneOptions:
    trials: int = 100  # measured trials in the study, counting earlier (resumed) runs
    timeout_s: "float | None" = None
    patience: "int | None" = 40  # measured trials without improvement before stopping
    top_k: int = 10  # the model's best, enqueued before the sampler explores
    sampler: str = "tpe"
    jobs: int = max(1, (os.cpu_count() or 2) - 1)
    finalists: int = 3
    rounds: int = 5  # interleaved re-measurement rounds of the finalists
    seed: "int | None" = None
    min_improvement: float = 0.005  # relative gain that counts as an improvement for patience
    storage: "str | None" = None
    out: "str | None" = None
    lookahead: "int | None" = None  # trials compiled ahead of measurement; default jobs + 1
    max_idle_asks: int = 300  # sampler proposals in a row that yield nothing new before giving up
    stale_after_s: float = 3600.0  # a RUNNING trial of another host older than this is abandoned
    replay: "str | None" = None  # simulation mode: recorded in the record so nobody mistakes it
    timing: str = "burst"  # how the finalist rounds time the finalists and cuBLAS: a bench.TIMINGS name
    # Configuration tags measured first, before the model's picks (a neighbouring bucket's finalists when a
    # shape set is tuned); tags this problem's space does not hold are skipped.
    seeds: "tuple[str, ...]" = ()
    # Stored records of the nearest other shapes (same GPU, dtypes, layouts, epilogue) whose winners and finalists
    # are measured early, interleaved with the model's picks (tune/transfer.py); 0: none.
    transfer: int = 0
    heartbeat_s: int = 10  # how often a worker tells the storage it is alive
    grace_s: int = 60  # a worker silent this long has its RUNNING trials failed and queued again
    worker: str = ""  # this worker's label in the study (host/gpuN), shown per trial and in plots
    publish_only: bool = False  # one of several workers a parent started: no record, no export (the parent's)

    def validate(self) -> "TuneOptions":
        """Every option within its range (the same rules as the flags: model/parse), or InvalidInput."""
        parse.integer("--trials", self.trials, 1, parse.COUNT_MAX)
        if self.timeout_s is not None:
            parse.real("--timeout", self.timeout_s, 0, parse.SECONDS_MAX, lo_open=True)
        if self.patience is not None:
            parse.integer("--patience", self.patience, 1, parse.COUNT_MAX)
        parse.integer("--top-k", self.top_k, 0, parse.COUNT_MAX)
        parse.integer("--transfer", self.transfer, 0, parse.COUNT_MAX)
        parse.integer("--finalists", self.finalists, 1, parse.COUNT_MAX)
        parse.integer("--rounds", self.rounds, 1, parse.COUNT_MAX)
        parse.integer("--jobs", self.jobs, 0, parse.JOBS_MAX)
        if self.seed is not None:
            parse.integer("--seed", self.seed, 0, parse.SEED_MAX)
        parse.integer("--heartbeat", self.heartbeat_s, 1, parse.SECONDS_MAX)
        if self.grace_s <= self.heartbeat_s:
            raise InvalidInput("--heartbeat must be a positive number of seconds below --grace",
                               (self.heartbeat_s, self.grace_s))
        return replace(self, sampler=parse.name("--sampler", self.sampler, SAMPLERS),
                       timing=parse.name("--timing", self.timing, FINALIST_TIMINGS))


@dataclass(frozen=True)
class TrialSummary:
    """One trial as the record and the tables see it."""

    number: int
    state: str  # COMPLETE, FAIL, PRUNED, RUNNING, WAITING
    tag: "str | None"
    kernel: "str | None"
    config: "dict | None"
    time_s: "float | None"
    tflops: "float | None"
    predicted_time_s: "float | None"
    reason: str
    source: str
    measured: bool
    worker: "str | None" = None  # host/gpuN of the worker that ran it
    started: "float | None" = None  # POSIX seconds
    finished: "float | None" = None

    def to_dict(self) -> dict:
        return {"number": self.number, "state": self.state, "config_tag": self.tag, "kernel": self.kernel,
                "config": self.config, "time_s": self.time_s, "tflops": self.tflops,
                "predicted_time_s": self.predicted_time_s, "reason": self.reason, "source": self.source,
                "measured": self.measured, "worker": self.worker, "started": self.started,
                "finished": self.finished}


@dataclass(frozen=True)
class Finalist:
    """A top configuration re-measured in interleaved rounds."""

    kernel: str
    config: TileConfig
    times_s: "tuple[float, ...]"
    predicted_time_s: float
    flops: int
    rel_error: "float | None" = None
    failed: str = ""

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def tflops(self) -> float:
        return self.flops / self.median_s / 1e12

    def quartiles(self) -> "tuple[float, float]":
        if len(self.times_s) < 2:
            return self.times_s[0], self.times_s[0]
        q = statistics.quantiles(self.times_s, n=4, method="inclusive")
        return q[0], q[2]

    def to_dict(self) -> dict:
        q1, q3 = self.quartiles() if self.times_s else (None, None)
        return {"kernel": self.kernel, "config": self.config.to_dict(), "config_tag": self.config.tag,
                "rounds": len(self.times_s), "times_s": list(self.times_s),
                "median_time_s": self.median_s if self.times_s else None,
                "min_time_s": min(self.times_s) if self.times_s else None,
                "max_time_s": max(self.times_s) if self.times_s else None,
                "q1_time_s": q1, "q3_time_s": q3, "tflops": self.tflops if self.times_s else None,
                "predicted_time_s": self.predicted_time_s,
                "pct_of_prediction": 100.0 * self.predicted_time_s / self.median_s if self.times_s else None,
                "rel_error": self.rel_error, "failed": self.failed or None}


@dataclass(frozen=True)
class Row:
    """One line of the top-five table."""

    kernel: str
    tag: str
    tflops: float
    predicted_tflops: float  # the model's prediction for this configuration
    pct_of_prediction: float
    pct_of_roofline: float  # of the problem's hard roofline: min(peak, minimum-traffic intensity x bandwidth)
    vs_cublas: "float | None"
    remeasured: bool


@dataclass(frozen=True)
class TuneResult:
    problem: Problem
    gpu: Gpu
    study_name: str
    storage_url: str
    stop_reason: str
    elapsed_s: float
    space_size: int
    counts: dict
    top: "tuple[Row, ...]"
    finalists: "tuple[Finalist, ...]"
    winner: "Finalist | None"
    cublas_time_s: "float | None"
    record_path: Path
    bundle: object = None
    workers: "dict | None" = None  # label -> how each worker ended (several workers: tune/parallel.py)
