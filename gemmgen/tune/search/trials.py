"""The trial loop: ask ahead, compile in the pool, measure one kernel at a time in the worker, and record (part of the search; see search/__init__.py)."""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future

from ...model.errors import CompileError
from ...model.tiles import Kernel, TileConfig
from ..worker import COMPILE, OTHER, QUARANTINED_KINDS, Outcome
from ..storage import safe_url, storage_errors
from .options import FALLBACK_AFTER, SYSTEMIC_FAILURES



class TrialLoop:
    """The trial loop: ask ahead, compile in the pool, measure one kernel at a time in the worker, and record
    each outcome (a kernel's failure fails its trial and quarantines it; failures of the machinery stop the tune)."""

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
                            "resumed": self.counts["resumed"], "target": opts.trials, "best": self.best_tflops,
                            "transferred": dict(self.transfer_sources)})
        with storage_errors(self.storage_url):
            try:
                self._loop(inflight, lookahead)
            except KeyboardInterrupt:
                # Ctrl-C or SIGTERM: the trials in flight are not the kernels' fault; fail them and
                # queue them again, so the next run measures them first.
                for trial, *_ in ([self.current] if self.current else []) + list(inflight):
                    params = dict(trial.params)
                    try:
                        # Ctrl-C may land between a measurement's attributes and its tell: a FAIL still saying
                        # measured would claim its configuration for good and prune the requeued twin.
                        if trial.user_attrs.get("measured"):
                            for key in ("measured", "time_s", "rel_error", "fail_reason", "fail_kind"):
                                trial.set_user_attr(key, None)
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
            self._reap_due()
            self._sync()  # (each ask syncs again, in its claim)
            while not self.stop_reason and len(inflight) < lookahead:
                # --trials is the study's: other workers' trials in flight count against it too.
                if self.measured_total + len(inflight) + len(self.running_tags) >= opts.trials and \
                        not self._new_model_picks_due(inflight):
                    break
                if self._time_up():
                    self.stop_reason = f"timeout ({opts.timeout_s:g}s)"
                    break
                # Nothing left to ask for: stop asking, but the trials already in flight (compiled ahead) are
                # still measured; the search ends once they are. (A space no larger than the lookahead, e.g.
                # fp8 block scaling's 4 configurations, is wholly in flight before any is measured.)
                if len(self.tried) + len(inflight) + len(self.quarantine.entries) >= len(self.space) and \
                        all(self._unavailable(r.config, inflight) for r in self.ranking):
                    if not inflight:
                        self.stop_reason = "every configuration of the space was tried"
                    break
                if idle >= opts.max_idle_asks:
                    if not inflight:
                        self.stop_reason = (f"the sampler proposed {idle} points in a row that were infeasible, "
                                            "quarantined or tried already")
                    idle = 0
                    break
                try:
                    entry = self._ask(inflight)
                except self.optuna.exceptions.UpdateFinishedTrialError:
                    entry = None  # another worker judged this one dead and took its trial: ask again
                if entry is None:
                    idle += 1
                    if idle % FALLBACK_AFTER == 0 and not self._enqueue_fallback(inflight):
                        if not inflight:
                            self.stop_reason = "every configuration of the space was tried"
                        break
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
            try:
                self._measure(*self.current)
            except self.optuna.exceptions.UpdateFinishedTrialError:
                # Another worker failed this trial as stale (this one was silent past --grace: a stalled host)
                # and queued it again: its outcome is that worker's to record now.
                self.counts["lost"] = self.counts.get("lost", 0) + 1
                self.mine.discard(self.current[0].number)
                self.heartbeat.discard(self.current[0]._trial_id)
            self.current = None
            if not self.stop_reason and opts.patience and self.since_improvement >= opts.patience \
                    and self.best_tflops > 0:
                self.stop_reason = f"no improvement in {opts.patience} trials (--patience)"
            self._write_record()

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
        trial.set_user_attr("kernel_id", self.current_identity(config.tag))  # what this time is a time of
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
        self.mine.discard(frozen.number)
        self.heartbeat.discard(frozen._trial_id)
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
