"""Optuna search over the tile space: the roofline model's top-k first, then a sampler.

How one tune runs:
  1. The space is every valid configuration of the GPU's kernel families (rank/space.py); infeasible
     configurations are never compiled. The model (rank/predict.py) ranks them all.
  2. The study lives in Optuna RDB storage (SQLite by default) under a name derived from the
     GPU, the problem and the space, so running the same command again resumes it.
  3. The model's top-k are enqueued (study.enqueue_trial), in turn with the winners and finalists of the nearest
     stored shapes (--transfer; tune/transfer.py), then the sampler explores. A trial's
     parameters are categorical per axis (CTA tile, warp arrangement, stages, swizzle, raster,
     decomposition, cluster...), named '<family>.<axis>', so TPE can learn per axis. A sampled
     point that is infeasible is PRUNED with the broken rule, without compiling.
  4. Trials are asked several ahead and compiled in a process pool while the GPU measures the
     current one, in a worker process that owns the CUDA context (tune/worker.py). A failure (CUDA
     error, hang, crash, wrong result, compile error) FAILs that trial with its reason, and the
     kernel is quarantined in the same storage so it is never tried again.
  5. Stop at --trials (measured trials in the study; model picks no run has tried are still measured, up to
     --trials of them per run), --timeout, or --patience trials of this run without
     improvement. Then the top few are re-measured interleaved and the winner is the best median.

The parts, one job each: study.py (the study, its naming, resuming and history), queue.py (what to measure next,
compiled ahead), trials.py (the trial loop with fault isolation), finalists.py (interleaved re-measurement and the
winner), record.py (the tuning record). Only the search and the storage helpers import Optuna; the model never does.
"""
from __future__ import annotations

import time

from ...model.arch import Arch, Gpu
from ...model.problem import Problem
from ..results import fingerprint, now
from ...model.tiles import Kernel
# The search API stays importable from here: storage, ranking and engines are re-exported.
from ..engines import Engines, InlineCompiler, PoolCompiler, default_engines  # noqa: F401
from ...rank.ranking import BASE_AXES, SPACE_FORMAT, Ranked, SearchSpace, axis_values, config_from_axes, model_top, rank_configs  # noqa: F401
from ..storage import Quarantine, StorageError, default_storage_url, open_storage, safe_url, storage_errors  # noqa: F401

from .finalists import FinalistRounds
from .leader import Leadership
from .options import (FALLBACK_AFTER, FINALIST_TIMINGS, REMEASURE_STALE, SAMPLERS, SYSTEMIC_FAILURES,  # noqa: F401
                      Finalist, Row, TrialSummary, TuneOptions, TuneResult)
from .queue import CandidateQueue
from .record import TuneRecord
from .study import StudyHistory, _age, make_sampler, study_name  # noqa: F401
from .trials import TrialLoop


class _Search(StudyHistory, CandidateQueue, TrialLoop, FinalistRounds, Leadership, TuneRecord):
    """One tune's state (set here) and its parts, one job each: the study and its history (study.py), the
    candidate queue (queue.py), the trial loop (trials.py), finalist rounds (finalists.py), the record (record.py).
    """

    def __init__(self, problem, gpu, arch, measurer, options: TuneOptions, engines: Engines, on_event, device):
        import optuna

        self.optuna = optuna
        self.problem, self.gpu, self.arch, self.measurer = problem, gpu, arch, measurer
        self.options, self.engines, self.device = options, engines, device
        self.emit = on_event or (lambda kind, info: None)
        self.t0 = time.monotonic()
        self.started = now()
        self.space, self.ranking = engines.ranked_space(problem, gpu, arch)
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
        self.remeasure: "list[Ranked]" = []  # best configurations of trials that timed another kernel identity
        self.stale: "dict[str, float]" = {}  # config tag -> best TFLOP/s it measured as another kernel identity
        self.identities: "dict[str, str]" = {}  # config tag -> the kernel identity it builds to now
        self.winner = None
        self.stop_reason = ""
        self._last_write = 0.0
        self.mine: "set[int]" = set()  # numbers of the trials this worker holds (asked, not yet told)
        self.running_tags: "set[str]" = set()  # configurations other workers are compiling or measuring
        self.heartbeat = None
        self.leading = False  # this worker re-measured the finalists
        self.adopted_from = None  # the worker whose finalist round this tune reports


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
            # Ctrl-C in the finalist rounds too: every finished trial is in the study and goes into the record.
            with storage_errors(search.storage_url):
                search.finish()
        except KeyboardInterrupt:
            search._write_record("interrupted", force=True)
            raise
        bundle = None
        if options.out and search.winner is not None and not options.publish_only:
            bundle = _export_winner(search, options.out)
        path = search._write_record("complete", force=True, bundle=bundle)
        search.emit("done", {"stop_reason": search.stop_reason})
        return TuneResult(problem, gpu, search.name, safe_url(search.storage_url), search.stop_reason,
                          search.elapsed(), len(search.space), dict(search.counts), tuple(search.top_rows()),
                          tuple(search.finalists), search.winner, search.cublas_time_s, path, bundle)
    finally:
        if search.heartbeat is not None:
            search.heartbeat.close()
        if own_engines:
            engines.close()


def collect(problem: Problem, gpu: Gpu, options: TuneOptions = TuneOptions(), *, engines: "Engines | None" = None,
            counts: "dict | None" = None, stop_reason: str = "", device: "dict | None" = None,
            workers: "dict | None" = None, started: "float | None" = None,
            gone_workers: "frozenset[str]" = frozenset()) -> TuneResult:
    """The result a study holds (its trials and its last finalist round), recorded and exported here; measures
    nothing. The parent of several workers (tune/parallel.py) reports through this once they are done."""
    options = options.validate()
    own_engines = engines is None
    engines = engines or default_engines(options.jobs)
    search = _Search(problem, gpu, gpu.arch, None, options, engines, None, device)
    search.t0 = started if started is not None else search.t0  # the workers' start: the tune's elapsed time
    try:
        search.open()
        with storage_errors(search.storage_url):
            if gone_workers:
                # Every worker of this parent has exited: a trial one of them left RUNNING (killed before any
                # other worker's heartbeat check saw it go stale) is failed now, so none stays RUNNING forever.
                from ..liveness import fail_trial

                running = search.optuna.trial.TrialState.RUNNING
                for t in search.study.get_trials(deepcopy=False, states=(running,)):
                    ownerless = not t.user_attrs.get("owner") and _age(t) > options.heartbeat_s
                    if t.user_attrs.get("worker") not in gone_workers and not ownerless:
                        continue  # (ownerless: a worker killed between asking a trial and claiming it)
                    if t.user_attrs.get("measured"):
                        search.settle_measured(t)  # killed while telling its measurement: record it
                    else:
                        fail_trial(search.study, t._trial_id)
            search._sync()
            rounds = search.rounds()
            if rounds:
                search._adopt(rounds[-1])
        search.counts.update(counts or {})
        search.counts["resumed"] = 0
        search.stop_reason = stop_reason
        bundle = _export_winner(search, options.out) if options.out and search.winner is not None else None
        path = search._write_record("complete", force=True, bundle=bundle)
        return TuneResult(problem, gpu, search.name, safe_url(search.storage_url), search.stop_reason,
                          search.elapsed(), len(search.space), dict(search.counts), tuple(search.top_rows()),
                          tuple(search.finalists), search.winner, search.cublas_time_s, path, bundle, workers)
    finally:
        if search.heartbeat is not None:
            search.heartbeat.close()
        if own_engines:
            engines.close()


def study_progress(problem: Problem, gpu: Gpu, options: TuneOptions):
    """A callable returning the study's progress now ({done, target, best, workers: {label: [n, best]}}), or None
    while the study does not exist yet. Read-only: for a parent showing its workers' progress."""
    return _Progress(problem, gpu, options)


class _Progress:
    """The newest study of this GPU and problem, read for its measured trials per worker."""

    def __init__(self, problem, gpu, options):
        self.problem, self.gpu, self.options = problem, gpu, options
        self.name = None
        self.storage = None

    def __call__(self):
        import optuna

        if self.storage is None:
            url = self.options.storage or default_storage_url(self.gpu, simulated=bool(self.options.replay))
            self.storage = open_storage(url)
        if self.name is None:
            prefix = f"gemmgen/{self.gpu.key}/"
            from ..results import problem_key

            prefix += problem_key(self.problem) + "/space-"
            names = [s.study_name for s in optuna.get_all_study_summaries(self.storage)
                     if s.study_name.startswith(prefix) and "/finalists-" not in s.study_name]
            if not names:
                return None
            self.name = max(names)
        try:
            trials = self.storage.get_all_trials(self.storage.get_study_id_from_name(self.name), deepcopy=False)
        except Exception:  # noqa: BLE001 - progress is best effort; the workers report real failures
            return None
        workers: "dict[str, list]" = {}
        done, best = 0, 0.0
        for t in trials:
            if not t.user_attrs.get("measured") or not t.state.is_finished():
                continue
            done += 1
            label = t.user_attrs.get("worker") or "?"
            entry = workers.setdefault(label, [0, 0.0])
            entry[0] += 1
            if t.value:
                entry[1] = max(entry[1], t.value)
                best = max(best, t.value)
        return {"done": done, "target": self.options.trials, "best": best, "workers": workers}


def _export_winner(search: _Search, out: str):
    from ..export import export_bundle
    from ..serve_check import summary, verify_other_shapes

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
    compiled = search.compiled.get(w.config.tag)
    if compiled is None:  # another worker measured it: build it here (the compile cache makes it quick)
        compiled = search.engines.compiler.submit(kernel).result()
        if isinstance(compiled, Exception):
            raise compiled
    # A bundle serves more than its own shape (the manifest's `serves`): the winner is also verified, fresh
    # inputs and D poisoned, at two other shapes it claims, and the bundle says how that went.
    checks = verify_other_shapes(search.engines.manifest(kernel, search.problem, compiled), compiled.cubin,
                                 search.measurer, 2)
    verification["other_shapes"] = [{"shape": c.label, "ok": c.ok, "rel_error": c.rel_error, "reason": c.reason}
                                    for c in checks]
    if any(c.ok is False for c in checks):
        verification["ok"] = False
        search.emit("warning", {"message": "the winner failed at another shape it serves: " + summary(checks)})
    return export_bundle(out, kernel, search.problem, compiled, measured=measured,
                         verification=verification, environment=env, manifest_fn=search.engines.manifest,
                         extra={"simulated": True, "replay": search.options.replay} if search.options.replay else None)


# --- dry run: the model's pick, compiled but not measured ---------------------------------------


from ..dryrun import Candidate, DryRunResult, dry_run  # noqa: E402,F401 - re-exported
