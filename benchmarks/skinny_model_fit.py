#!/usr/bin/env python3
"""How well the model ranks sm80_skinny configurations, from the skinny benchmark's stored runs (no GPU).

    PYTHONPATH=$PWD python3 benchmarks/skinny_model_fit.py [--detail CASE ...]

For each case of docs/lab-data/h100-sxm/skinny-*.json: the Spearman correlation between predicted and measured
time across the configurations measured, and the measured time of the model's pick against the best. The model's
skinny terms (families/sm80_skinny: bytes in flight, the per-warp load rate) were fitted to the best kernels of
m16_k4095, m1_mis, m1_rr and m16_rr_mis from these same runs: those rows are in-sample.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def ranks(values):
    import numpy as np

    return np.argsort(np.argsort(values))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--detail", nargs="*", default=[], help="cases whose four best measured and predicted to list")
    args = parser.parse_args(argv)
    import numpy as np

    from gemmgen.model.arch import lookup_gpu
    from gemmgen.model.problem import Problem
    from gemmgen.model.tiles import TileConfig
    from gemmgen.rank.predict import predict

    gpu = lookup_gpu("h100")
    picks, rhos = [], []   # the model's pick over the measured best, and the rank correlation, per case
    for path in sorted((ROOT / "docs/lab-data/h100-sxm").glob("skinny-*2026*.json")):
        if "events" in path.name:   # timed with host time included: not comparable
            continue
        report = json.loads(path.read_text())
        cases: "dict[str, list]" = {}
        for row in report["rows"]:
            if row.get("family") == "sm80_skinny" and row.get("us"):
                cases.setdefault(row["case"], []).append(row)
        for case, rows in cases.items():
            m, n, k = map(int, rows[0]["shape"].split()[0].split("x"))
            problem = Problem.create(m, n, k, "bf16", "row", "row" if rows[0]["shape"].endswith("rr") else "col")
            scored = []
            for row in rows:
                config = TileConfig.from_dict(_config(row["config"]))
                try:
                    scored.append((row["us"], predict(problem, config, gpu).time_s * 1e6, row["config"]))
                except Exception:   # a configuration today's rules refuse (e.g. over the register estimate)
                    continue
            measured = np.array([s[0] for s in scored])
            predicted = np.array([s[1] for s in scored])
            rho = np.corrcoef(ranks(measured), ranks(predicted))[0, 1]
            pick = scored[int(np.argmin(predicted))][0]
            picks.append(pick / measured.min())
            rhos.append(rho)
            print(f"{path.name[:30]:30} {case:12} n={len(scored):3} spearman={rho:5.2f} model's pick {pick:6.1f} us, "
                  f"best {measured.min():6.1f} us")
            if case in args.detail:
                for label, key in (("measured best", 0), ("model's best", 1)):
                    print(f"  {label}:")
                    for s in sorted(scored, key=lambda s: s[key])[:4]:
                        print(f"    measured {s[0]:6.1f} us, predicted {s[1]:6.1f} us  {s[2]}")
    if picks:
        print(f"geomean of the model's pick over the best, {len(picks)} cases: "
              f"{float(np.exp(np.mean(np.log(picks)))):.3f}; mean spearman {float(np.mean(rhos)):.2f}")
    return 0


def _config(tag: str) -> dict:
    """A skinny configuration's dict from its tag (the benchmark's JSON stores tags)."""
    import re

    m = re.match(r"sm80_skinny_cta(\d+x\d+x\d+)_w(\d+x\d+x\d+)_mma16x8x16_s(\d)_swizzle_rr1_(dp|splitk(\d+))_cl1x1"
                 r"(_kw(\d))?$", tag)
    cta, warp, stages, _, splits, _, k_warps = m.groups()
    out = {"family": "sm80_skinny", "cta": cta, "warp": warp, "mma": "16x8x16", "stages": int(stages),
           "k_warps": int(k_warps or 1)}
    if splits:
        out["decomposition"] = {"kind": "splitk", "splits": int(splits)}
    return out


if __name__ == "__main__":
    sys.exit(main())
