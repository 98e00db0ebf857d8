"""The tuning record (results/<gpu>/tunes/<problem>.json), rewritten atomically as the tune goes. (part of the search; see search/__init__.py)."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from ...calc.intensity import roofline
from ..results import fingerprint, now, record_path, write_json_atomic
from ..storage import safe_url
from .options import Row



class TuneRecord:
    """The tuning record (results/<gpu>/tunes/<problem>.json), rewritten atomically as the tune goes."""

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
            "study": {"name": self.name, "storage": safe_url(self.storage_url),
                      "finalists_by": "this worker" if self.leading else self.adopted_from},
            "search": {"sampler": self.options.sampler, "trials": self.options.trials,
                       "timeout_s": self.options.timeout_s, "patience": self.options.patience,
                       "top_k": self.options.top_k, "transfer": self.options.transfer, "space_size": len(self.space),
                       "space_version": self.space.version,
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
        if self.options.publish_only:
            return path  # one of a parent's workers: the parent writes the record
        if force or time.monotonic() - self._last_write >= 1.0:
            write_json_atomic(path, self.record(status, bundle))
            self._last_write = time.monotonic()
        return path
