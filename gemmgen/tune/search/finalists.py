"""Finalist re-measurement: the best few configurations timed again in interleaved rounds beside cuBLAS, (part of the search; see search/__init__.py)."""
from __future__ import annotations

import statistics
from concurrent.futures import Future

from ...model.tiles import Kernel, TileConfig
from ..worker import QUARANTINED_KINDS
from .options import Finalist



class FinalistRounds:
    """Finalist re-measurement: the best few configurations timed again in interleaved rounds beside cuBLAS,
    the winner the best median."""

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
