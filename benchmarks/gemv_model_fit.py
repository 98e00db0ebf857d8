#!/usr/bin/env python3
"""How well the model ranks sm80_gemv configurations, from the benchmark's stored runs, and a refit of its load
rates (no GPU).

    PYTHONPATH=$PWD python3 benchmarks/gemv_model_fit.py [--fit] [--records 'gemv-ragged-*/skinny.json']

Reads docs/lab-data/h100-sxm/gemv-*.json (benchmarks/skinny.py --family sm80_gemv --tight-rows: every
configuration of the tightest row count measured per case). Per case: Spearman between predicted and measured time
across the measured configurations, and the measured time of the model's pick against the best. With --fit, the
family's load-rate figures (SM_LOAD_RATE: bytes per second per resident warp and a cap per SM, for aligned and
unaligned rows of B) are chosen on a grid to minimise the squared log error over every measured configuration,
and the table is printed again with them. The fit is in-sample: every case it is judged on was used to fit it.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GRID_PER_WARP = [0.3e9, 0.5e9, 0.65e9, 0.8e9, 1.0e9, 1.3e9, 1.6e9, 2e9, 3e9, 4e9, 6e9]
GRID_CAP = [6e9, 8e9, 11e9, 14e9, 17e9, 20e9, 24e9, 28e9, 34e9]


def cases(pattern: str = "gemv-*.json"):
    """(case, problem, [(config, measured us)]) per case and file matching `pattern` under docs/lab-data/h100-sxm."""
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.model.problem import Problem
    from gemmgen.rank.space import enumerate_space

    gpu = lookup_gpu("h100")
    for path in sorted((ROOT / "docs/lab-data/h100-sxm").glob(pattern)):
        rows: "dict[tuple, list]" = {}
        for row in json.loads(path.read_text())["rows"]:
            if row.get("family") == "sm80_gemv" and row.get("us"):
                rows.setdefault((row["case"], row["shape"]), []).append(row)
        for (case, shape), measured in rows.items():
            m, n, k = (int(v) for v in shape.split("x"))
            problem = Problem.create(m, n, k, "bf16", "row", "row")
            space = {c.tag: c for c in enumerate_space("sm80_gemv", gpu, problem=problem)}
            yield f"{path.parent.name[5:] if path.stem == 'skinny' else path.stem[5:]}:{case}", problem, [(space[r["config"]], r["us"]) for r in measured
                                                      if r["config"] in space]


def table(data, gpu) -> float:
    """Prints Spearman and pick/best per case; returns the rms log error over all configurations."""
    from gemmgen.rank.calibration import params_for
    from gemmgen.rank.predict import predict
    from gemmgen.tune.calibrate import spearman

    params = params_for(gpu)[0]
    errors = []
    for name, problem, rows in data:
        predicted = [predict(problem, c, gpu, params).time_s * 1e6 for c, _ in rows]
        measured = [t for _, t in rows]
        pick = min(range(len(rows)), key=predicted.__getitem__)
        errors += [math.log(p / t) for p, t in zip(predicted, measured)]
        print(f"{name:32} n={len(rows):3} rho {spearman(predicted, measured):+.2f}  pick {measured[pick]:6.1f} us "
              f"(predicted {predicted[pick]:6.1f}), best {min(measured):6.1f} us: pick/best "
              f"{min(measured) / measured[pick]:.3f}")
    rms = math.sqrt(statistics.mean(e * e for e in errors))
    print(f"rms log error {rms:.3f} over {len(errors)} configurations")
    return rms


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit SM_LOAD_RATE on a grid and print the table again")
    parser.add_argument("--records", default="gemv-*.json",
                        help="which records under docs/lab-data/h100-sxm (a glob; default gemv-*.json, the runs of "
                             "the kernel before its ragged-end fix; gemv-ragged-*/skinny.json after it)")
    args = parser.parse_args(argv)
    from gemmgen.families import sm80_gemv
    from gemmgen.model.arch import lookup_gpu

    gpu = lookup_gpu("h100")
    data = list(cases(args.records))
    print("as shipped:", sm80_gemv.SM_LOAD_RATE)
    table(data, gpu)
    if not args.fit:
        return 0
    from gemmgen.rank.calibration import params_for
    from gemmgen.rank.predict import predict

    params = params_for(gpu)[0]
    shipped = dict(sm80_gemv.SM_LOAD_RATE)
    fitted = {}
    try:
        for aligned in (True, False):
            part = [(p, rows) for _, p, rows in data if (p.operands.align_b == 8) == aligned]
            best = None
            for rate in itertools.product(GRID_PER_WARP, GRID_CAP):
                sm80_gemv.SM_LOAD_RATE[aligned] = rate
                sse = sum(math.log(predict(p, c, gpu, params).time_s * 1e6 / t) ** 2 for p, rows in part
                          for c, t in rows)
                if best is None or sse < best[0]:
                    best = (sse, rate)
            sm80_gemv.SM_LOAD_RATE[aligned] = fitted[aligned] = best[1]
        print("\nfitted (in-sample):", fitted)
        table(data, gpu)
    finally:
        sm80_gemv.SM_LOAD_RATE.update(shipped)
    return 0


if __name__ == "__main__":
    from benchmarks.harness import run_main

    run_main(main, __file__)
