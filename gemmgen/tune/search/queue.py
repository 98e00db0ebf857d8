"""What to measure next: the model's ranked picks first, then the sampler's proposals (infeasible points (part of the search; see search/__init__.py)."""
from __future__ import annotations

from collections import deque

from ...model.tiles import Kernel, TileConfig
from ...rank.ranking import Ranked, model_top
from .options import FALLBACK_AFTER
from .study import _owner



class CandidateQueue:
    """What to measure next: the model's ranked picks first, then the sampler's proposals (infeasible points
    pruned with their rule, duplicates skipped), with compiles started ahead of the GPU."""

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
        self.seeded = [self.by_tag[tag] for tag in dict.fromkeys(self.options.seeds)
                       if tag in self.by_tag and tag not in skip | again]
        again |= {r.config.tag for r in self.seeded}
        model = [r for r in self.model_picks() if r.config.tag not in skip | again]
        # A configuration both transfer and the model pick is measured where the model puts it, as the model's.
        transferred = self._transfer_picks(skip | again | {r.config.tag for r in model})
        self.pending = deque(self.remeasure + self.seeded + _interleave(model, transferred))

    def _transfer_picks(self, skip: "set[str]") -> "list[Ranked]":
        """The nearest stored shapes' winners and finalists (--transfer) that this problem's space holds, not in
        `skip` nor quarantined, in transfer order; their trials' sources in self.transfer_sources."""
        self.transfer_sources: "dict[str, str]" = {}
        if not self.options.transfer:
            return []
        from ..transfer import transfer_seeds

        picks: "list[Ranked]" = []
        for seed in transfer_seeds(self.problem, self.gpu, self.options.transfer, simulated=bool(self.options.replay)):
            r = self.by_tag.get(seed.tag)
            if r is None or seed.tag in skip or self.quarantine.reason(
                    Kernel(self.arch, self.problem.operands, r.config).name):
                continue
            picks.append(r)
            self.transfer_sources[seed.tag] = seed.source
        return picks

    def _new_model_picks_due(self, inflight) -> bool:
        """Model picks never measured (a grown search space, or a better model) are measured on a re-run even
        when trials from earlier runs already fill --trials: up to --trials of them in this run."""
        this_run = self.counts["measured"] + self.counts["failed"] + len(inflight)
        taken = self.tried | self.running_tags  # by this worker or another
        if any(r.config.tag in taken for r in self.pending):
            self.pending = deque(r for r in self.pending if r.config.tag not in taken)
        return bool(self.pending or self.waiting) and this_run < self.options.trials

    def _next_pick(self) -> None:
        """Enqueue the next model pick if no enqueued trial is waiting (ask() takes waiting ones first)."""
        while self.pending and self.waiting == 0:
            r = self.pending.popleft()
            if r.config.tag in self.tried or r.config.tag in self.running_tags:
                continue  # measured, or being measured, by this worker or another
            source = ("re-measure: timed as another kernel identity (the code changed)" if r in self.remeasure
                      else "seed: a neighbouring bucket's finalist" if r in self.seeded
                      else self.transfer_sources.get(r.config.tag, self.pick_source))
            self.study.enqueue_trial(self.space.params(r.config), user_attrs={"source": source})
            self.waiting += 1

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
        self.mine.add(trial.number)
        self.heartbeat.add(trial._trial_id)
        self.waiting = max(0, self.waiting - 1)
        config, rule = self.space.suggest(trial)
        if config is None:
            self._finish(trial, None, "PRUNED", violation=f"infeasible: {rule}")
            return None
        kernel = Kernel(self.arch, self.problem.operands, config)
        # Every attribute is a round trip to the storage: the claim (config_tag) and who holds it first; the
        # rest only for a trial that is measured.
        trial.set_user_attr("config_tag", config.tag)
        trial.set_user_attr("owner", _owner())
        if self.options.worker:
            trial.set_user_attr("worker", self.options.worker)
        # config_tag is in the storage now: read every trial (and fold in what other workers finished).
        elsewhere = self._claimed_elsewhere(trial, config.tag)
        reason = self.quarantine.reason(kernel.name)
        if reason:
            self._finish(trial, config, "PRUNED", violation=f"quarantined: {reason}", kernel=kernel.name)
            return None
        if elsewhere is not None and config.tag not in self.best:
            self._finish(trial, config, "PRUNED", violation=f"duplicate of trial {elsewhere}, taken by another worker")
            self.counts["duplicates"] += 1
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
        ranked = self.by_tag[config.tag]
        for key, value in {"kernel": kernel.name, "config": config.to_dict(), "family": config.family,
                           "predicted_time_s": ranked.time_s, "predicted_tflops": ranked.tflops,
                           "bound": ranked.bound, "model_rank": ranked.rank}.items():
            trial.set_user_attr(key, value)
        if "source" not in trial.user_attrs:
            trial.set_user_attr("source", self.options.sampler)
        trial.set_user_attr("phase", "compiling")
        return trial, config, kernel, self.engines.compiler.submit(kernel)


def _interleave(model: "list[Ranked]", transferred: "list[Ranked]") -> "list[Ranked]":
    """The model's picks and the transferred ones taken in turn, the model's first, each list in its order."""
    out, seen = [], set()
    for i in range(max(len(model), len(transferred))):
        for source in (model, transferred):
            if i < len(source) and source[i].config.tag not in seen:
                seen.add(source[i].config.tag)
                out.append(source[i])
    return out
