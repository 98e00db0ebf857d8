#!/usr/bin/env python3
"""What a cluster costs or saves where the model picks one: for each product whose zero-shot pick runs 2-CTA clusters,
the pick and its twins with every other cluster shape the rules accept (1x1, 2x1, 1x2; the rest of the configuration
unchanged), timed interleaved beside cuBLAS on one GPU.

    PYTHONPATH=$PWD python3 benchmarks/cluster_twins.py --shapes results/shapes.yaml benchmarks/suites/*.yaml [--out DIR]

The model credits multicast nothing (rank/predict.py MULTICAST_REALIZED) and charges a cluster nothing beyond the
padded tiles it runs, so where twins differ by more than the runs' spread the model has a term to learn. Public
APIs only; harness.time_contenders verifies each kernel with D poisoned before it is timed.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import detected_gpu, run_main, write_report  # noqa: E402

SHAPES = ((1, 1), (2, 1), (1, 2))


def twins(problem, gpu, params) -> "list[tuple[str, object]]":
    """(label, ranked entry): the model's pick and its feasible cluster twins, or [] where the pick has no cluster."""
    from gemmgen.families import rules as constraints
    from gemmgen.model.tiles import Cluster
    from gemmgen.rank.predict import predict
    from gemmgen.rank.ranking import rank_configs
    from gemmgen.rank.space import heuristic_time

    pick = harness.ranked_space(problem, gpu, params)[0]
    if pick.config.cluster.size == 1:
        return []
    out = [("pick", pick)]
    for m, n in SHAPES:
        twin = dataclasses.replace(pick.config, cluster=Cluster(m, n))
        if twin != pick.config and not constraints.check(twin, gpu, gpu.arch, problem):
            out.append((f"twin {m}x{n}", rank_configs([twin], problem, gpu, lambda p, c, g: predict(p, c, g, params),
                                                      heuristic_time)[0]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", required=True, help="suite YAML files (name, M, N, K, a, b)")
    ap.add_argument("--only", default=None, help="comma-separated shape names")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    from gemmgen.rank.calibration import params_for

    problems = harness.suite_problems(args.shapes, args.only)   # a bad file is named before the GPU is looked for
    gpu = detected_gpu()
    params, _ = params_for(gpu)
    seen, plans = set(), []
    for name, problem in problems:
        if problem.label not in seen and (chosen := twins(problem, gpu, params)):
            seen.add(problem.label)
            plans.append((name, problem, chosen))
    rows = harness.time_contenders(torch, gpu, plans, "gemmgen-twins-")
    print("\nshape        pick cluster  pick x cuBLAS  1x1 twin  (x cuBLAS, graph-timed, interleaved)")
    for name, mine in harness.by_shape(rows).items():
        labelled = {r["label"]: r for r in mine}
        if "pick" in labelled:
            pick, plain = labelled["pick"], labelled.get("twin 1x1", {"vs_cublas": float("nan")})
            cluster = pick["config"].split("_cl")[1].split("_")[0]
            print(f"{name:12s} {cluster:12s} {pick['vs_cublas']:13.2f}  {plain['vs_cublas']:8.2f}")
    if args.out:
        print("written:", write_report(args.out, "cluster_twins.json", {"gpu": gpu.key, "rows": rows}))
    return 0


if __name__ == "__main__":
    run_main(main, "cluster_twins.py")
