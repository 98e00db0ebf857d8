"""The Optuna study this tune resumes or starts: opening it, carrying earlier best configurations over to a (part of the search; see search/__init__.py)."""
from __future__ import annotations

import os
import socket
import time
import warnings

from ...model.arch import Gpu
from ...model.errors import InvalidInput
from ...model.problem import Problem
from ..results import problem_key
from ...rank.ranking import SearchSpace
from ..liveness import HeartbeatThread, fail_stale, fail_trial, retry_callback, retry_copy, settle_trial
from ..storage import Heartbeat, Quarantine, is_journal, open_storage, storage_errors
from ...model.tiles import Kernel
from .options import REMEASURE_STALE, TrialSummary




def study_name(gpu: Gpu, problem: Problem, space: SearchSpace) -> str:
    """Deterministic, so the same command finds (and resumes) the same study: one per search space. Which kernel
    a trial timed is its own `kernel_id` (codegen/identity), checked when the study is resumed."""
    return f"gemmgen/{gpu.key}/{problem_key(problem)}/space-{space.version}"


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



def holds_claim(t) -> bool:
    """Whether a RUNNING trial holds its configuration: taken and not given way (a trial that gave way is told
    PRUNED after setting phase 'done'), or measured and being told (phase 'done' too, but its time is in)."""
    return t.user_attrs.get("phase") != "done" or bool(t.user_attrs.get("measured"))


def _age(t) -> float:
    """Seconds since a trial started (Optuna stamps it with the local clock)."""
    return time.time() - t.datetime_start.timestamp() if t.datetime_start else 0.0


def _stamp(when) -> "float | None":
    return when.timestamp() if when is not None else None


class StudyHistory:
    """The Optuna study this tune resumes or starts: opening it, carrying earlier best configurations over to a
    new kernel code, recovering trials a killed run left RUNNING, and accounting every trial it holds."""

    # -- storage ---------------------------------------------------------------------------
    def open(self) -> None:
        optuna = self.optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        self.journal = is_journal(self.storage_url)
        self.retry = retry_callback()
        self.storage = open_storage(self.storage_url, Heartbeat(self.options.heartbeat_s, self.options.grace_s),
                                    on_stale=self._requeue_stale, create_folder=self.options.storage is None)
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
            self.heartbeat = HeartbeatThread(self.study._storage, self.options.heartbeat_s, self.journal)
            self._last_reap = 0.0
            self._recover_interrupted()
            self._load_history()
            self._enqueue_model_picks()

    def current_identity(self, tag: str) -> str:
        """The kernel identity configuration `tag` builds to now (cached: rendering is the cost)."""
        if tag not in self.identities:
            self.identities[tag] = self.engines.identity(Kernel(self.arch, self.problem.operands,
                                                                self.by_tag[tag].config))
        return self.identities[tag]

    def timed_current_kernel(self, t) -> bool:
        """Whether a stored trial timed the kernel its configuration builds to now."""
        tag = t.user_attrs.get("config_tag")
        return tag in self.by_tag and t.user_attrs.get("kernel_id") == self.current_identity(tag)

    def _carry_over(self) -> None:
        """Measured trials of this problem under an earlier space version stay valid when they timed the kernel
        their configuration builds to now: copy them in. Trials of another kernel identity are not copied (their
        times describe kernels that are no longer built); their best configurations are measured again first,
        ahead of the model's picks (self.remeasure)."""
        optuna = self.optuna
        prefix = self.name.rsplit("/space-", 1)[0] + "/space-"
        stale: "dict[str, float]" = {}
        for summary in optuna.study.get_all_study_summaries(self.storage):
            if not summary.study_name.startswith(prefix) or summary.study_name == self.name:
                continue
            old = optuna.load_study(study_name=summary.study_name, storage=self.storage)
            for t in old.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
                if not t.user_attrs.get("measured") or t.user_attrs.get("config_tag") not in self.by_tag:
                    continue
                if not self.timed_current_kernel(t):
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
        self.stale.update(stale)

    def _recover_interrupted(self) -> None:
        """Trials left RUNNING by a worker that stopped: FAIL them and queue them again (once; a kernel whose
        measurement took its worker down twice is quarantined). A worker of this host that is gone is seen at
        once (its process id); another host's, when its heartbeat has been silent for --grace seconds."""
        TrialState = self.optuna.trial.TrialState
        self._last_reap = time.monotonic()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = t.user_attrs.get("owner")
            if not owner and _age(t) > self.options.grace_s:
                # Asked and never claimed: a live worker writes its owner moments after asking, so this one's
                # worker died in between, maybe before its first heartbeat (then fail_stale_trials never sees it).
                if fail_trial(self.study, t._trial_id):
                    self._requeue_stale(self.study, self.study._storage.get_trial(t._trial_id))
                continue
            if not owner or owner.rpartition(":")[0] != socket.gethostname():
                continue  # another host's (or just asked): its heartbeat says whether it is alive (fail_stale)
            if owner == _owner() and t.number in self.mine:
                continue  # this worker's own, in flight
            if not _owner_gone(owner, t.datetime_start, self.options.stale_after_s):
                continue  # another live tuner is working on this study: leave its trial alone
            if t.user_attrs.get("measured"):
                # Killed while telling a finished measurement (its time is in its attributes): record it as it
                # was measured. Failing it would lose the time, and measuring it again would time it twice.
                self.settle_measured(t)
                continue
            phase = t.user_attrs.get("phase", "asked")
            reason = f"interrupted: the tuning process {owner or '?'} ended while {phase}"
            try:
                self.study._storage.set_trial_user_attr(t._trial_id, "fail_reason", reason)
            except Exception:  # noqa: BLE001 - another worker reaped it first
                continue
            if fail_trial(self.study, t._trial_id):
                self._requeue_stale(self.study, self.study._storage.get_trial(t._trial_id))
        fail_stale(self.study, self.journal, self.options.grace_s, self._requeue_stale)

    def settle_measured(self, t) -> bool:
        """COMPLETE an orphaned RUNNING trial whose measurement is in its attributes with that result (FAIL it
        when the measurement failed); False when another worker settled it first."""
        a = t.user_attrs
        value = a.get("tflops")
        if value is None and a.get("time_s") and not a.get("fail_reason"):
            value = self.problem.flops / a["time_s"] / 1e12  # killed between its time and its TFLOP/s
        return settle_trial(self.study, t._trial_id, value)

    def _reap_due(self) -> None:
        if time.monotonic() - self._last_reap >= self.options.heartbeat_s:
            self._recover_interrupted()

    def _requeue_stale(self, study, trial) -> None:
        """A stale trial was failed (by this worker): queue it again through Optuna's retry callback, once."""
        if trial.user_attrs.get("measured"):
            return  # measured (its worker died telling it): a FAIL with a time is a claim, a retry would give way
        history = trial.system_attrs.get("retry_history") or []
        kernel = trial.user_attrs.get("kernel")
        if history and trial.user_attrs.get("phase") == "measuring" and kernel:
            # Died twice measuring this kernel: it takes the tuner down with it (hang, driver crash).
            self.quarantine.add(kernel, "the tuner died twice while measuring it", "crash", self.problem)
            return
        if trial.params:
            self.retry(study, retry_copy(trial))
            self.counts["requeued"] += 1

    # -- other workers of the same study -----------------------------------------------------
    def _sync(self, trials=None) -> None:
        """Fold in the trials other workers finished, and count their RUNNING claims (for the shared budget)."""
        TrialState = self.optuna.trial.TrialState
        if trials is None:
            trials = self.study.get_trials(deepcopy=False)
        mine = set(self.mine)
        running = set()
        for t in trials:
            if t.state == TrialState.RUNNING:
                if t.number not in mine and t.user_attrs.get("config_tag") and holds_claim(t):
                    running.add(t.user_attrs["config_tag"])
                continue
            if t.state == TrialState.WAITING or t.number in self.summaries:
                continue
            s = self._summary_of(t)
            self.summaries[t.number] = s
            if s.measured and s.state == "COMPLETE" and s.tag in self.by_tag and not self.timed_current_kernel(t):
                continue
            self._account(s, resumed=True)
        self.running_tags = running

    def _claimed_elsewhere(self, trial, tag: str) -> "int | None":
        """The number of another trial that holds `tag`, or None. This trial's config_tag is written first,
        then every trial is read: of two workers that take the same configuration at once, at least one sees
        the other and gives way (both may; never neither), so no configuration is measured twice."""
        TrialState = self.optuna.trial.TrialState
        # Past Optuna's RDB cache: it fetches only trials numbered above the last finished one it has seen, so a
        # trial whose insert committed late (PostgreSQL hands out ids before commit) would never be read.
        # (Only a cached RDB storage's backend is a storage; JournalStorage's _backend is its log file.)
        backend = getattr(self.study._storage, "_backend", None)
        if backend is not None and hasattr(backend, "get_all_trials"):
            trials = backend.get_all_trials(self.study._study_id, deepcopy=False)
        else:
            trials = self.study.get_trials(deepcopy=False)
        self._sync(trials)
        for t in trials:
            if t.number == trial.number or t.user_attrs.get("config_tag") != tag:
                continue
            if t.state == TrialState.RUNNING and holds_claim(t):
                return t.number
            if t.state in (TrialState.COMPLETE, TrialState.FAIL) and t.user_attrs.get("measured") and \
                    (t.state == TrialState.FAIL or self.timed_current_kernel(t)):
                return t.number  # (a time of another kernel identity is measured again: not a claim)
        return None

    def _load_history(self) -> None:
        """Fold the study's finished trials in. A measured trial that timed another kernel identity than its
        configuration builds to now (the code changed since) is not served: its configuration is re-measured."""
        for t in self.study.get_trials(deepcopy=False):
            s = self._summary_of(t)
            if s.state in ("WAITING", "RUNNING"):
                continue
            self.summaries[t.number] = s
            if s.measured and s.state == "COMPLETE" and s.tag in self.by_tag and not self.timed_current_kernel(t):
                self.stale[s.tag] = max(self.stale.get(s.tag, 0.0), s.tflops or 0.0)
                continue
            self._account(s, resumed=True)
        self.counts["resumed"] = sum(1 for s in self.summaries.values() if s.measured)
        for tag in self.best:
            self.stale.pop(tag, None)  # measured again since with the current kernel
        self.study.set_user_attr("remeasure", sorted(self.stale, key=lambda tag: -self.stale[tag])[:REMEASURE_STALE])

    def _summary_of(self, t) -> TrialSummary:
        a = t.user_attrs
        value = t.value if t.state == self.optuna.trial.TrialState.COMPLETE else None
        reason = a.get("fail_reason") or a.get("violation") or ""
        if not reason and t.state == self.optuna.trial.TrialState.FAIL:
            reason = f"abandoned: its worker {a.get('owner', '?')} stopped beating (heartbeat), queued again"
        return TrialSummary(t.number, t.state.name, a.get("config_tag"), a.get("kernel"), a.get("config"),
                            a.get("time_s"), value, a.get("predicted_time_s"), str(reason),
                            str(a.get("source", "")), bool(a.get("measured")), a.get("worker"),
                            _stamp(t.datetime_start), _stamp(t.datetime_complete))

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
