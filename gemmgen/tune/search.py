"""Optuna search over the tile space: the roofline model's top-k first, then a sampler.

How one tune runs:
  1. The space is every valid configuration of the GPU's kernel families (space.py); infeasible
     configurations are never compiled. The model (intensity.predict) ranks them all.
  2. The study lives in Optuna RDB storage (SQLite by default) under a name derived from the
     GPU, the problem and the space, so running the same command again resumes it.
  3. The model's top-k are enqueued (study.enqueue_trial), then the sampler explores. A trial's
     parameters are categorical per axis (CTA tile, warp arrangement, stages, swizzle, raster,
     decomposition, cluster...), named '<family>.<axis>', so TPE can learn per axis. A sampled
     point that is infeasible is PRUNED with the broken rule, without compiling.
  4. Trials are asked several ahead and compiled in a process pool while the GPU measures the
     current one, in a worker process that owns the CUDA context (worker.py). A failure (CUDA
     error, hang, crash, wrong result, compile error) FAILs that trial with its reason, and the
     kernel is quarantined in the same storage so it is never tried again.
  5. Stop at --trials (measured trials in the study; model picks no run has tried are still measured, up to
     --trials of them per run), --timeout, or --patience trials of this run without
     improvement. Then the top few are re-measured interleaved and the winner is the best median.

Only this module and the storage helpers here import Optuna; the model never does.
"""
from __future__ import annotations

import os
import socket
import statistics
import time
import warnings
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from ..model.arch import Arch, Gpu
from ..codegen.identity import kernel_code_digest
from ..families.rules import check
from ..model.errors import CompileError, InvalidInput
from ..calc.intensity import roofline
from ..model.problem import Problem
from .results import fingerprint, now, problem_key, record_path, write_json_atomic
from ..model.tiles import Kernel, TileConfig
from .worker import COMPILE, OTHER, QUARANTINED_KINDS, Outcome
# The search API stays importable from here: storage, ranking and engines are re-exported.
from .engines import Engines, InlineCompiler, PoolCompiler, default_engines  # noqa: F401
from ..rank.ranking import BASE_AXES, SPACE_FORMAT, Ranked, SearchSpace, axis_values, config_from_axes, model_top, rank_configs  # noqa: F401
from .storage import Quarantine, StorageError, default_storage_url, open_storage, safe_url, storage_errors  # noqa: F401

SAMPLERS = ("tpe", "random", "cmaes", "qmc", "grid")
SYSTEMIC_FAILURES = 5  # non-kernel measurement failures in a row that stop the tune
FALLBACK_AFTER = 3  # sampler proposals in a row that give nothing new before the model's next pick is queued
# Configurations re-measured first when the study's earlier trials timed older kernel code (the best by old time).
REMEASURE_STALE = 8
FINALIST_TIMINGS = ("burst", "sustained")  # bench.TIMINGS' names (search imports nothing from bench)

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

    def validate(self) -> "TuneOptions":
        if self.trials < 1:
            raise InvalidInput("--trials must be a positive integer", self.trials)
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise InvalidInput("--timeout must be a positive number of seconds", self.timeout_s)
        if self.patience is not None and self.patience < 1:
            raise InvalidInput("--patience must be a positive integer", self.patience)
        if self.top_k < 0:
            raise InvalidInput("--top-k must be zero or a positive integer", self.top_k)
        if self.sampler not in SAMPLERS:
            raise InvalidInput(f"--sampler must be one of {', '.join(SAMPLERS)}", self.sampler)
        if self.jobs < 0:
            raise InvalidInput("--jobs must be zero (compile inline) or a positive integer", self.jobs)
        if self.timing not in FINALIST_TIMINGS:
            raise InvalidInput(f"--timing must be one of {', '.join(FINALIST_TIMINGS)}", self.timing)
        return self


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

    def to_dict(self) -> dict:
        return {"number": self.number, "state": self.state, "config_tag": self.tag, "kernel": self.kernel,
                "config": self.config, "time_s": self.time_s, "tflops": self.tflops,
                "predicted_time_s": self.predicted_time_s, "reason": self.reason, "source": self.source,
                "measured": self.measured}


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


def study_name(gpu: Gpu, problem: Problem, space: SearchSpace) -> str:
    """Deterministic, so the same command finds (and resumes) the same study: one per search space and per
    version of the kernel code (templates and family modules), whose timings are the study's values."""
    return f"gemmgen/{gpu.key}/{problem_key(problem)}/space-{space.version}/code-{kernel_code_digest()}"


def study_code(name: str) -> "str | None":
    """The kernel-code digest a study's name carries (None for studies named before the digest existed)."""
    tail = name.rsplit("/", 1)[-1]
    return tail[len("code-"):] if tail.startswith("code-") else None


def make_sampler(name: str, seed: "int | None"):
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            # multivariate+group: axes are learned jointly, per family (the parameters are conditional);
            # constant_liar: trials asked ahead (being compiled) are not proposed twice.
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                              n_startup_trials=10)
        if name == "cmaes":
            # CMA-ES has no categorical support: Optuna samples these axes with its independent sampler.
            return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
        if name == "qmc":
            try:
                import scipy  # noqa: F401  (QMCSampler needs scipy.stats.qmc)
            except ImportError:
                raise InvalidInput("--sampler qmc needs scipy", "qmc", "pip install scipy, or use tpe/random") from None
            return optuna.samplers.QMCSampler(seed=seed, warn_independent_sampling=False)
        # random, and grid: an exhaustive sweep is every valid configuration enqueued in model order.
        return optuna.samplers.RandomSampler(seed=seed)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_gone(owner: "str | None", started, stale_after_s: float) -> bool:
    """Whether the process that started a RUNNING trial has ended (so the trial is orphaned)."""
    if not owner or ":" not in owner:
        return True
    host, _, pid = owner.rpartition(":")
    if host == socket.gethostname():
        if int(pid) == os.getpid():
            return True
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    age = time.time() - started.timestamp() if started else float("inf")
    return age > stale_after_s


class _Search:
    """One tune's state: the study, the in-flight trials, the counters and the record."""

    def __init__(self, problem, gpu, arch, measurer, options: TuneOptions, engines: Engines, on_event, device):
        import optuna

        self.optuna = optuna
        self.problem, self.gpu, self.arch, self.measurer = problem, gpu, arch, measurer
        self.options, self.engines, self.device = options, engines, device
        self.emit = on_event or (lambda kind, info: None)
        self.t0 = time.monotonic()
        self.started = now()
        configs = engines.enumerate(problem, gpu, arch)
        self.space = SearchSpace(configs, lambda c: check(c, gpu, arch, problem))
        self.ranking = rank_configs(self.space.configs, problem, gpu, engines.predict, engines.tiebreak)
        self.by_tag = {r.config.tag: r for r in self.ranking}
        self.storage_url = options.storage or default_storage_url(gpu, simulated=bool(options.replay))
        self.name = study_name(gpu, problem, self.space)
        self.summaries: "dict[int, TrialSummary]" = {}
        self.best: "dict[str, TrialSummary]" = {}  # config tag -> its best measured trial
        self.tried: "set[str]" = set()  # tags measured or failed in this study
        self.best_tflops = 0.0
        self.since_improvement = 0
        self.compiled: "dict[str, object]" = {}
        self.counts = {"measured": 0, "failed": 0, "pruned": 0, "duplicates": 0, "cancelled": 0, "resumed": 0,
                       "carried": 0, "requeued": 0}
        self.cublas_time_s = None
        self.cublas_times_s: "tuple[float, ...]" = ()
        self.systemic = 0  # measurements failed in a row for reasons that are not the kernel's
        self.current = None  # the in-flight entry being measured
        self.finalists: "list[Finalist]" = []
        self.remeasure: "list[Ranked]" = []  # best configurations of trials that timed older kernel code
        self.winner = None
        self.stop_reason = ""
        self._last_write = 0.0

    # -- storage ---------------------------------------------------------------------------
    def open(self) -> None:
        optuna = self.optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.storage = open_storage(self.storage_url)
        with storage_errors(self.storage_url):
            self.quarantine = Quarantine(self.storage, self.gpu)
            fresh = self.name not in {s.study_name for s in optuna.study.get_all_study_summaries(self.storage)}
            self.study = optuna.create_study(storage=self.storage, study_name=self.name, direction="maximize",
                                             sampler=make_sampler(self.options.sampler, self.options.seed),
                                             load_if_exists=True)
            if fresh:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    self.study.set_metric_names(["TFLOP/s"])
                self.study.set_user_attr("problem", self.problem.to_dict())
                self.study.set_user_attr("gpu", self.gpu.key)
                self.study.set_user_attr("space_size", len(self.space))
                self._carry_over()
            self._recover_interrupted()
            self._load_history()
            self._enqueue_model_picks()

    def _carry_over(self) -> None:
        """Measured trials of this problem under an earlier space version stay valid when the kernel code is the
        same: copy them in. Trials that timed older kernel code are not copied (their times describe kernels
        that are no longer built); their best configurations are measured again first, ahead of the model's
        picks (self.remeasure)."""
        optuna = self.optuna
        prefix = self.name.rsplit("/space-", 1)[0] + "/space-"
        code = study_code(self.name)
        stale: "dict[str, float]" = {}
        for summary in optuna.study.get_all_study_summaries(self.storage):
            if not summary.study_name.startswith(prefix) or summary.study_name == self.name:
                continue
            old = optuna.load_study(study_name=summary.study_name, storage=self.storage)
            same_code = study_code(summary.study_name) == code
            for t in old.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
                if not t.user_attrs.get("measured") or t.user_attrs.get("config_tag") not in self.by_tag:
                    continue
                if not same_code:
                    tag = t.user_attrs["config_tag"]
                    stale[tag] = max(stale.get(tag, 0.0), t.value or 0.0)
                    continue
                ranked = self.by_tag[t.user_attrs["config_tag"]]
                attrs = dict(t.user_attrs, carried_from=f"{summary.study_name}#{t.number}",
                             predicted_time_s=ranked.time_s, model_rank=ranked.rank)
                self.study.add_trial(optuna.trial.create_trial(
                    params=self.space.params(ranked.config), distributions=self.space.distributions(
                        ranked.config.family), value=t.value, user_attrs=attrs))
                self.counts["carried"] += 1
        best_stale = sorted(stale, key=lambda tag: -stale[tag])[:REMEASURE_STALE]
        self.study.set_user_attr("remeasure", best_stale)

    def _recover_interrupted(self) -> None:
        """Trials left RUNNING by a tuner that died: FAIL them; re-queue, or quarantine a repeat offender."""
        TrialState = self.optuna.trial.TrialState
        storage = self.study._storage
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if not _owner_gone(t.user_attrs.get("owner"), t.datetime_start, self.options.stale_after_s):
                continue  # another live tuner is working on this study: leave its trial alone
            phase = t.user_attrs.get("phase", "asked")
            reason = f"interrupted: the tuning process {t.user_attrs.get('owner', '?')} ended while {phase}"
            storage.set_trial_user_attr(t._trial_id, "fail_reason", reason)
            self.study.tell(t.number, state=TrialState.FAIL)
            kernel = t.user_attrs.get("kernel")
            if phase == "measuring" and t.user_attrs.get("requeued_from") is not None and kernel:
                # Died twice measuring this kernel: it takes the tuner down with it (hang, driver crash).
                self.quarantine.add(kernel, "the tuner died twice while measuring it", "crash", self.problem)
            elif t.params:
                self.study.enqueue_trial(t.params, user_attrs={"requeued_from": t.number}, skip_if_exists=False)
                self.counts["requeued"] += 1

    def _load_history(self) -> None:
        for t in self.study.get_trials(deepcopy=False):
            s = self._summary_of(t)
            if s.state in ("WAITING", "RUNNING"):
                continue
            self.summaries[t.number] = s
            self._account(s, resumed=True)
        self.counts["resumed"] = sum(1 for s in self.summaries.values() if s.measured)

    def _summary_of(self, t) -> TrialSummary:
        a = t.user_attrs
        value = t.value if t.state == self.optuna.trial.TrialState.COMPLETE else None
        return TrialSummary(t.number, t.state.name, a.get("config_tag"), a.get("kernel"), a.get("config"),
                            a.get("time_s"), value, a.get("predicted_time_s"),
                            str(a.get("fail_reason") or a.get("violation") or ""), str(a.get("source", "")),
                            bool(a.get("measured")))

    def _account(self, s: TrialSummary, resumed: bool = False) -> None:
        """Fold one finished trial into the counters, the best-so-far and the patience window."""
        if s.measured:
            self.counts["measured"] += 0 if resumed else 1
            if s.tag:
                self.tried.add(s.tag)
            improved = False
            if s.state == "COMPLETE" and s.tflops:
                if s.tag and (s.tag not in self.best or s.tflops > (self.best[s.tag].tflops or 0)):
                    self.best[s.tag] = s
                if s.tflops > self.best_tflops * (1 + self.options.min_improvement):
                    improved = True
                self.best_tflops = max(self.best_tflops, s.tflops)
            else:
                self.counts["failed"] += 0 if resumed else 1
            if not resumed:
                # --patience counts this run's trials: with trials from earlier runs (or carried from an older
                # space) in the window, a re-run would stop before measuring anything new.
                self.since_improvement = 0 if improved else self.since_improvement + 1
        elif s.state == "COMPLETE" and s.tag and s.tflops and s.tag not in self.best:
            self.best[s.tag] = s  # carried over from an earlier space version
            self.tried.add(s.tag)
            self.best_tflops = max(self.best_tflops, s.tflops)

    @property
    def measured_total(self) -> int:
        return sum(1 for s in self.summaries.values() if s.measured)

    def model_picks(self) -> "list[Ranked]":
        grid = self.options.sampler == "grid"
        return model_top(self.ranking, len(self.ranking) if grid else self.options.top_k, diverse=not grid,
                         skip=lambda r: bool(self.quarantine.reason(
                             Kernel(self.arch, self.problem.operands, r.config).name)))

    def _enqueue_model_picks(self) -> None:
        """Queue the model's picks not yet tried; they are enqueued one at a time, just before each ask.

        Enqueueing a whole sweep up front (grid: every configuration) costs a DB round trip per trial
        and per duplicate check; just in time, the queue in storage stays short and resumes the same.
        """
        TrialState = self.optuna.trial.TrialState
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        self.waiting = len(waiting)
        queued = set()
        for t in waiting:
            config = self.space.decode(t.system_attrs.get("fixed_params", {}))
            if config is not None:
                queued.add(config.tag)
        k = len(self.ranking) if self.options.sampler == "grid" else self.options.top_k
        self.pick_source = f"model top-{k}"
        skip = self.tried | queued
        self.remeasure = [self.by_tag[tag] for tag in self.study.user_attrs.get("remeasure", ())
                          if tag in self.by_tag and tag not in skip]
        again = {r.config.tag for r in self.remeasure}
        self.pending = deque(self.remeasure + [r for r in self.model_picks() if r.config.tag not in skip | again])

    def _new_model_picks_due(self, inflight) -> bool:
        """Model picks never measured (a grown search space, or a better model) are measured on a re-run even
        when trials from earlier runs already fill --trials: up to --trials of them in this run."""
        this_run = self.counts["measured"] + self.counts["failed"] + len(inflight)
        return bool(self.pending or self.waiting) and this_run < self.options.trials

    def _next_pick(self) -> None:
        """Enqueue the next model pick if no enqueued trial is waiting (ask() takes waiting ones first)."""
        while self.pending and self.waiting == 0:
            r = self.pending.popleft()
            if r.config.tag in self.tried:
                continue
            source = "re-measure: timed with older kernel code" if r in self.remeasure else self.pick_source
            self.study.enqueue_trial(self.space.params(r.config), user_attrs={"source": source})
            self.waiting += 1

    # -- the loop --------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _time_up(self) -> bool:
        """--timeout bounds the search proper (not opening storage, nor the finalists' re-measurement)."""
        return self.options.timeout_s is not None and time.monotonic() - self.search_t0 >= self.options.timeout_s

    def run(self) -> None:
        opts = self.options
        lookahead = opts.lookahead or (getattr(self.engines.compiler, "jobs", 1) + 1)
        inflight: deque = deque()
        self.search_t0 = time.monotonic()
        self.emit("start", {"study": self.name, "storage": safe_url(self.storage_url), "space": len(self.space),
                            "resumed": self.counts["resumed"], "target": opts.trials, "best": self.best_tflops})
        with storage_errors(self.storage_url):
            try:
                self._loop(inflight, lookahead)
            except KeyboardInterrupt:
                # Ctrl-C or SIGTERM: the trials in flight are not the kernels' fault; fail them and
                # queue them again, so the next run measures them first.
                for trial, *_ in ([self.current] if self.current else []) + list(inflight):
                    params = dict(trial.params)
                    try:
                        self._finish(trial, None, "FAIL", fail_reason="interrupted before it was measured",
                                     cancelled=True)
                    except (RuntimeError, ValueError):
                        continue  # told already, just before the interruption
                    if params:
                        self.study.enqueue_trial(params, user_attrs={"source": "requeued after an interruption"})
                self.stop_reason = "interrupted"
                raise

    def _loop(self, inflight: deque, lookahead: int) -> None:
        opts = self.options
        idle = 0
        while True:
            while not self.stop_reason and len(inflight) < lookahead:
                if self.measured_total + len(inflight) >= opts.trials and not self._new_model_picks_due(inflight):
                    break
                if self._time_up():
                    self.stop_reason = f"timeout ({opts.timeout_s:g}s)"
                    break
                if len(self.tried) + len(inflight) + len(self.quarantine.entries) >= len(self.space) and \
                        all(self._unavailable(r.config, inflight) for r in self.ranking):
                    self.stop_reason = "every configuration of the space was tried"
                    break
                if idle >= opts.max_idle_asks:
                    self.stop_reason = (f"the sampler proposed {idle} points in a row that were infeasible, "
                                        "quarantined or tried already")
                    break
                entry = self._ask(inflight)
                if entry is None:
                    idle += 1
                    if idle % FALLBACK_AFTER == 0 and not self._enqueue_fallback(inflight):
                        self.stop_reason = "every configuration of the space was tried"
                    continue
                idle = 0
                inflight.append(entry)
            if not inflight:
                if not self.stop_reason:
                    self.stop_reason = f"reached --trials {opts.trials}"
                break
            if self._time_up() and not self.stop_reason:
                self.stop_reason = f"timeout ({opts.timeout_s:g}s)"
            if self.stop_reason:
                for trial, *_ in inflight:
                    self._finish(trial, None, "FAIL", fail_reason=f"cancelled: the search stopped "
                                 f"({self.stop_reason}) before it was measured", cancelled=True)
                inflight.clear()
                break
            self.current = inflight.popleft()
            self._measure(*self.current)
            self.current = None
            if not self.stop_reason and opts.patience and self.since_improvement >= opts.patience \
                    and self.best_tflops > 0:
                self.stop_reason = f"no improvement in {opts.patience} trials (--patience)"
            self._write_record()

    def _enqueue_fallback(self, inflight) -> bool:
        """The sampler keeps proposing points that are infeasible or tried: queue the model's best
        untried configuration instead, so the GPU is not left waiting on proposals. False if none is left."""
        queued = {r.config.tag for r in self.pending}
        for r in self.ranking:
            if r.config.tag not in queued and not self._unavailable(r.config, inflight):
                self.study.enqueue_trial(self.space.params(r.config),
                                         user_attrs={"source": f"model order (after {FALLBACK_AFTER} "
                                                               "sampler proposals gave nothing new)"})
                self.waiting += 1
                return True
        return bool(self.pending)

    def _unavailable(self, config: TileConfig, inflight) -> bool:
        if config.tag in self.tried or any(e[1].tag == config.tag for e in inflight):
            return True
        return self.quarantine.reason(Kernel(self.arch, self.problem.operands, config).name) is not None

    def _ask(self, inflight):
        """Ask one trial; return (trial, config, kernel, future) if it is to be measured, else None."""
        self._next_pick()
        trial = self.study.ask()
        self.waiting = max(0, self.waiting - 1)
        config, rule = self.space.suggest(trial)
        trial.set_user_attr("owner", _owner())
        if config is None:
            self._finish(trial, None, "PRUNED", violation=f"infeasible: {rule}")
            return None
        kernel = Kernel(self.arch, self.problem.operands, config)
        ranked = self.by_tag[config.tag]
        for key, value in {"kernel": kernel.name, "config_tag": config.tag, "config": config.to_dict(),
                           "family": config.family, "predicted_time_s": ranked.time_s,
                           "predicted_tflops": ranked.tflops, "bound": ranked.bound,
                           "model_rank": ranked.rank}.items():
            trial.set_user_attr(key, value)
        reason = self.quarantine.reason(kernel.name)
        if reason:
            self._finish(trial, config, "PRUNED", violation=f"quarantined: {reason}")
            return None
        if config.tag in self.best or config.tag in self.tried or any(e[1].tag == config.tag for e in inflight):
            prior = self.best.get(config.tag)
            if prior is not None:
                # Tell the sampler what this point scored rather than measuring it again.
                self._finish(trial, config, "COMPLETE", value=prior.tflops, duplicate_of=prior.number,
                             time_s=prior.time_s)
            else:
                self._finish(trial, config, "PRUNED", violation="duplicate of a failed or in-flight trial")
            self.counts["duplicates"] += 1
            return None
        if "source" not in trial.user_attrs:
            trial.set_user_attr("source", self.options.sampler)
        trial.set_user_attr("phase", "compiling")
        return trial, config, kernel, self.engines.compiler.submit(kernel)

    def _measure(self, trial, config: TileConfig, kernel: Kernel, future: Future) -> None:
        try:
            compiled = future.result()
        except Exception as exc:  # the pool task itself died
            compiled = CompileError(kernel.name, (), f"{type(exc).__name__}: {exc}")
        if isinstance(compiled, Exception):
            reason = f"compile error: {compiled}"
            self.quarantine.add(kernel.name, reason, COMPILE, self.problem)
            self._finish(trial, config, "FAIL", fail_reason=reason, fail_kind=COMPILE, measured=True)
            return
        self.compiled[config.tag] = compiled
        resources = getattr(compiled, "resources", None)
        for key in ("registers", "spill_bytes"):
            if resources is not None and getattr(resources, key, None) is not None:
                trial.set_user_attr(key, getattr(resources, key))
        manifest = self.engines.manifest(kernel, self.problem, compiled)
        trial.set_user_attr("phase", "measuring")
        outcome: Outcome = self.measurer.measure(manifest, compiled.cubin, self.problem)
        self.systemic = self.systemic + 1 if (not outcome.ok and outcome.kind == OTHER) else 0
        if self.systemic >= SYSTEMIC_FAILURES:
            # Not the kernels: the benchmark itself is failing (out of memory, a missing library...).
            self.stop_reason = (f"{self.systemic} measurements in a row failed for reasons outside the kernels; "
                                f"the last: {outcome.reason}")
        if outcome.ok:
            tflops = self.problem.flops / outcome.time_s / 1e12
            self._finish(trial, config, "COMPLETE", value=tflops, time_s=outcome.time_s,
                         rel_error=outcome.rel_error, measured=True)
        else:
            if outcome.kind in QUARANTINED_KINDS:
                self.quarantine.add(kernel.name, outcome.reason, outcome.kind, self.problem)
            self._finish(trial, config, "FAIL", fail_reason=outcome.reason or "measurement failed",
                         fail_kind=outcome.kind, rel_error=outcome.rel_error, measured=True)

    def _finish(self, trial, config, state: str, value: "float | None" = None, **attrs) -> None:
        """Record attrs, tell Optuna, and fold the trial into the counters and the progress stream."""
        TrialState = self.optuna.trial.TrialState
        for key, v in attrs.items():
            if v is not None:
                trial.set_user_attr(key, v)
        if value is not None:
            trial.set_user_attr("tflops", value)
        trial.set_user_attr("phase", "done")
        if state == "COMPLETE":
            frozen = self.study.tell(trial, value)
        else:
            frozen = self.study.tell(trial, state=TrialState[state])
        s = self._summary_of(frozen)
        self.summaries[s.number] = s
        self._account(s)
        if state == "PRUNED":
            self.counts["pruned"] += 1
        if attrs.get("cancelled"):
            self.counts["cancelled"] += 1
        if s.measured:
            self.emit("trial", {"number": s.number, "state": s.state, "tag": s.tag, "tflops": s.tflops,
                                "reason": s.reason, "best": self.best_tflops, "done": self.measured_total,
                                "target": self.options.trials})

    # -- choosing the winner ---------------------------------------------------------------
    def choose(self) -> None:
        """Re-measure the best few interleaved (A B C A B C ...); the winner has the best median."""
        leaders = sorted(self.best.values(), key=lambda s: -(s.tflops or 0))[: self.options.finalists]
        leaders = [s for s in leaders if s.tflops]
        if not leaders:
            return
        entries, pending = [], []
        for s in leaders:
            config = TileConfig.from_dict(s.config)
            kernel = Kernel(self.arch, self.problem.operands, config)
            compiled = self.compiled.get(config.tag)
            # Measured in an earlier run: compile again (in parallel; the disk cache makes it quick).
            pending.append((s, config, kernel, compiled or self.engines.compiler.submit(kernel)))
        for s, config, kernel, compiled in pending:
            if isinstance(compiled, Future):
                try:
                    compiled = compiled.result()
                except Exception:  # the pool task died: this finalist drops out
                    continue
                if isinstance(compiled, Exception):
                    continue
                self.compiled[config.tag] = compiled
            entries.append((s, config, kernel, compiled, self.engines.manifest(kernel, self.problem, compiled)))
        times: "dict[str, list]" = {e[1].tag: [] for e in entries}
        errors: "dict[str, float]" = {}
        failed: "dict[str, str]" = {}
        cublas = []
        self.emit("finalists", {"count": len(entries), "rounds": self.options.rounds, "timing": self.options.timing})
        # The search's trials are screened in bursts; the finalists and cuBLAS are timed as --timing says.
        set_timing = getattr(self.measurer, "set_timing", None) if self.options.timing != "burst" else None
        if set_timing is not None:
            set_timing(self.options.timing)
        try:
            self._finalist_rounds(entries, times, errors, failed, cublas)
        finally:
            if set_timing is not None:
                set_timing(None)
        self.cublas_time_s = statistics.median(cublas) if cublas else None
        self.cublas_times_s = tuple(cublas)
        self._finalists_from(entries, times, errors, failed)

    def _finalist_rounds(self, entries, times, errors, failed, cublas) -> None:
        if self.options.timing == "sustained":
            # One round first whose times are dropped (its checks and failures count): the card comes from the
            # search's short bursts, and the first sustained round ran 2-8% off the rest on the H100
            # (docs/perf-notes.md, "Sustained timing").
            self._finalist_round(entries, {tag: [] for tag in times}, errors, failed, [])
        for r in range(self.options.rounds):
            self._finalist_round(entries, times, errors, failed, cublas)
            # Progress: a sustained round takes ~2 s per finalist, seven of them most of a minute.
            medians = {tag: statistics.median(v) for tag, v in times.items() if v and tag not in failed}
            leader = min(medians, key=medians.get) if medians else None
            self.emit("finalist_round", {"round": r + 1, "rounds": self.options.rounds, "leader": leader,
                                         "leader_s": medians.get(leader), "cublas_s": statistics.median(cublas)
                                         if cublas else None})

    def _finalist_round(self, entries, times, errors, failed, cublas) -> None:
        for s, config, kernel, compiled, manifest in entries:
            if config.tag in failed:
                continue
            outcome = self.measurer.measure(manifest, compiled.cubin, self.problem)
            if outcome.ok:
                times[config.tag].append(outcome.time_s)
                if outcome.rel_error is not None:
                    errors[config.tag] = max(errors.get(config.tag, 0.0), outcome.rel_error)
            else:
                failed[config.tag] = f"failed on re-measurement: {outcome.reason}"
                if outcome.kind in QUARANTINED_KINDS:
                    self.quarantine.add(kernel.name, failed[config.tag], outcome.kind, self.problem)
        # cuBLAS again in every round, beside the finalists: a figure taken minutes earlier, at other
        # clocks (the H100 slows as it heats towards its power limit), would skew the ratio either way.
        t = self.measurer.cublas_time(self.problem, fresh=True)
        if t:
            cublas.append(t)

    def _finalists_from(self, entries, times, errors, failed) -> None:
        for s, config, kernel, compiled, manifest in entries:
            self.finalists.append(Finalist(kernel.name, config, tuple(times[config.tag]),
                                           self.by_tag[config.tag].time_s, self.problem.flops,
                                           errors.get(config.tag), failed.get(config.tag, "")))
        ok = [f for f in self.finalists if f.times_s and not f.failed]
        self.winner = min(ok, key=lambda f: f.median_s) if ok else None

    def top_rows(self, n: int = 5) -> "list[Row]":
        remeasured = {f.config.tag: f for f in self.finalists if f.times_s and not f.failed}
        roof_tflops = roofline(self.problem, self.gpu).attainable_flops / 1e12
        rows = []
        for s in self.best.values():
            f = remeasured.get(s.tag)
            tflops = f.tflops if f else s.tflops
            ranked = self.by_tag.get(s.tag)
            if not tflops or ranked is None:
                continue
            vs = (self.cublas_time_s * tflops * 1e12 / self.problem.flops) if self.cublas_time_s else None
            rows.append(Row(s.kernel or "", s.tag, tflops, ranked.tflops, 100.0 * tflops / ranked.tflops,
                            100.0 * tflops / roof_tflops, vs,
                            f is not None))
        # Finalists first, by their re-measured medians: a single search measurement of another config
        # is an optimistic draw (the finalists were chosen on theirs, then regressed on re-measurement),
        # so ranking the two kinds together would put unconfirmed figures above the winner.
        rows.sort(key=lambda r: (not r.remeasured, -r.tflops))
        return rows[:n]

    # -- the record ------------------------------------------------------------------------
    def record(self, status: str, bundle=None) -> dict:
        env = fingerprint(self.gpu, self.device, self.engines.nvrtc_version())
        cublas = None
        if self.cublas_time_s:
            cublas = {"time_s": self.cublas_time_s, "tflops": self.problem.flops / self.cublas_time_s / 1e12,
                      "times_s": list(self.cublas_times_s)}
        winner = None
        if self.winner is not None:
            winner = self.winner.to_dict()
            if cublas:
                winner["vs_cublas"] = cublas["time_s"] / self.winner.median_s
                if len(self.cublas_times_s) == len(self.winner.times_s):
                    # Round by round (each round times the winner, then cuBLAS): the median of the ratios.
                    winner["vs_cublas_paired"] = statistics.median(
                        c / t for c, t in zip(self.cublas_times_s, self.winner.times_s))
            if bundle is not None:
                winner["bundle"] = str(bundle.manifest_path)
        return {
            "format": "gemmgen-tune/1", "status": status, "date": self.started, "updated": now(),
            "simulated": bool(self.options.replay), "replay": self.options.replay,
            "problem": self.problem.to_dict(), "gpu": self.gpu.key, "arch": self.arch.value, "environment": env,
            "study": {"name": self.name, "storage": safe_url(self.storage_url)},
            "search": {"sampler": self.options.sampler, "trials": self.options.trials,
                       "timeout_s": self.options.timeout_s, "patience": self.options.patience,
                       "top_k": self.options.top_k, "space_size": len(self.space), "space_version": self.space.version,
                       "finalist_timing": self.options.timing},
            "elapsed_s": round(self.elapsed(), 3), "stop_reason": self.stop_reason, "counts": self.counts,
            "model_top": [{"rank": r.rank, "config_tag": r.config.tag, "predicted_time_s": r.time_s,
                           "predicted_tflops": r.tflops, "bound": r.bound} for r in self.ranking[:10]],
            "trials": [s.to_dict() for _, s in sorted(self.summaries.items())],
            "finalists": [f.to_dict() for f in self.finalists],
            "winner": winner, "cublas": cublas,
        }

    def _write_record(self, status: str = "running", force: bool = False, bundle=None) -> Path:
        path = record_path(self.gpu, self.problem, simulated=bool(self.options.replay))
        if force or time.monotonic() - self._last_write >= 1.0:
            write_json_atomic(path, self.record(status, bundle))
            self._last_write = time.monotonic()
        return path


def tune(problem: Problem, gpu: Gpu, measurer, options: TuneOptions = TuneOptions(), *,
         engines: "Engines | None" = None, arch: "Arch | None" = None, on_event=None,
         device: "dict | None" = None) -> TuneResult:
    """Tune `problem` on `gpu`, measuring through `measurer` (a WorkerBenchmark or a fake).

    The study, the quarantine and the JSON record are updated after every trial, so a tune
    killed at any point resumes where it was when the same call is made again.
    """
    options = options.validate()
    own_engines = engines is None
    engines = engines or default_engines(options.jobs)
    arch = arch or gpu.arch
    launch = getattr(measurer, "launch", None)
    if launch is not None:
        launch()  # the measuring process starts its CUDA context while the model ranks and NVRTC compiles
    search = _Search(problem, gpu, arch, measurer, options, engines, on_event, device)
    try:
        search.open()
        try:
            search.run()
        except KeyboardInterrupt:
            search._write_record("interrupted", force=True)
            raise
        with storage_errors(search.storage_url):
            search.choose()
        bundle = None
        if options.out and search.winner is not None:
            bundle = _export_winner(search, options.out)
        path = search._write_record("complete", force=True, bundle=bundle)
        search.emit("done", {"stop_reason": search.stop_reason})
        return TuneResult(problem, gpu, search.name, safe_url(search.storage_url), search.stop_reason,
                          search.elapsed(), len(search.space), dict(search.counts), tuple(search.top_rows()),
                          tuple(search.finalists), search.winner, search.cublas_time_s, path, bundle)
    finally:
        if own_engines:
            engines.close()


def _export_winner(search: _Search, out: str):
    from .export import export_bundle

    w = search.winner
    kernel = Kernel(search.arch, search.problem.operands, w.config)
    d = w.to_dict()
    measured = {k: d[k] for k in ("median_time_s", "min_time_s", "max_time_s", "q1_time_s", "q3_time_s", "rounds",
                                  "times_s", "tflops")}
    measured["time_s"] = w.median_s
    measured["predicted_time_s"] = w.predicted_time_s
    if search.cublas_time_s:
        measured["cublas_time_s"] = search.cublas_time_s
        measured["vs_cublas"] = search.cublas_time_s / w.median_s
    verification = {"ok": True, "rel_error": w.rel_error, "rounds": len(w.times_s),
                    "reference": "checked by the benchmark on every measurement"}
    env = fingerprint(search.gpu, search.device, search.engines.nvrtc_version())
    return export_bundle(out, kernel, search.problem, search.compiled[w.config.tag], measured=measured,
                         verification=verification, environment=env, manifest_fn=search.engines.manifest,
                         extra={"simulated": True, "replay": search.options.replay} if search.options.replay else None)


# --- dry run: the model's pick, compiled but not measured ---------------------------------------


from .dryrun import Candidate, DryRunResult, dry_run  # noqa: E402,F401 - re-exported
