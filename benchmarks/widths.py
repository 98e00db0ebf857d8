#!/usr/bin/env python3
"""Tile widths that fit the waves: for each product, the model's pick from the space without the `widths` and
`widths_256` spaces, its pick with them, and the best-ranked configurations of the first
`--per-group` CTA tiles of each width group (128-, 192- and
256-row tiles whose N is not a multiple of 64), all timed interleaved beside cuBLAS on one GPU.

    PYTHONPATH=$PWD python3 benchmarks/widths.py --shapes benchmarks/suites/linear-tokens.yaml [--per-group 2] [--out DIR]

Public APIs only: the space (rank.space), the model (rank.predict, ranking), NVRTC (codegen.nvrtc) and a bundle
loaded with gemmgen.load. harness.time_contenders checks every kernel once on fresh inputs with D poisoned against an
fp32 product, then CUDA-graph times each contender (20 calls over 3 rotating input sets) in 5 interleaved passes,
median, beside cuBLAS (torch.matmul) in the same passes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import detected_gpu, run_main, write_report  # noqa: E402


def width_group(config) -> "str | None":
    """The width group a configuration belongs to (tiles of 128+ rows whose N is not a multiple of 64), or None."""
    if config.family != "sm90_wgmma" or config.swap_ab or config.cta.n % 64 == 0 or config.cta.m < 128:
        return None
    return f"w{config.cta.m}"


def contenders(problem, gpu, params, per_group: int) -> "list[tuple[str, object]]":
    """(label, ranked entry): the pick without widths, the pick with them, the best of `per_group` tiles a group."""
    ranked = harness.ranked_space(problem, gpu, params)
    out = [("pick without widths", next(r for r in ranked if width_group(r.config) is None)),
           ("pick", ranked[0])]
    for group in ("w128", "w192", "w256"):
        tiles = {}   # the best-ranked configuration of each CTA tile in the group, the first `per_group` tiles
        for r in ranked:
            if width_group(r.config) == group and len(tiles) < per_group:
                tiles.setdefault(str(r.config.cta), r)
        out += [(group, r) for r in tiles.values()]
    seen, unique = set(), []
    for label, r in out:
        if r.config.tag not in seen:
            seen.add(r.config.tag)
            unique.append((label, r))
    return unique


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", required=True, help="suite YAML files (name, M, N, K, a, b)")
    ap.add_argument("--only", default=None, help="comma-separated shape names")
    ap.add_argument("--per-group", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    from gemmgen.rank.calibration import params_for

    problems = harness.suite_problems(args.shapes, args.only)   # a bad file is named before the GPU is looked for
    gpu = detected_gpu()
    params, _ = params_for(gpu)
    plans = [(name, problem, contenders(problem, gpu, params, args.per_group)) for name, problem in problems]
    rows = harness.time_contenders(torch, gpu, plans, "gemmgen-widths-")
    print("\nshape        no widths  pick   best width group (x cuBLAS, graph-timed, interleaved)")
    nan = {"vs_cublas": float("nan")}
    for name, mine in harness.by_shape(rows).items():
        labelled = {r["label"]: r for r in mine}
        without = labelled.get("pick without widths", nan)
        best = max(mine, key=lambda r: r["vs_cublas"])
        print(f"{name:12s} {without['vs_cublas']:8.2f}  {labelled.get('pick', without)['vs_cublas']:5.2f}  "
              f"{best['vs_cublas']:.2f} {best['config'].replace('sm90_wgmma_', '')[:60]}")
    if args.out:
        print("written:", write_report(args.out, "widths.json", {"gpu": gpu.key, "rows": rows}))
    return 0


if __name__ == "__main__":
    run_main(main, "widths.py")
