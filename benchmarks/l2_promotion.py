#!/usr/bin/env python3
"""The tensor maps' L2 promotion (sm90_wgmma's launch.L2_PROMOTION: 128B since 2026-11-22) against 256B and none, on
the model's picks: each kernel built once, bound with each promotion (the maps are encoded at bind), verified with D
poisoned, then CUDA-graph timed in interleaved passes beside cuBLAS.

    PYTHONPATH=$PWD python3 benchmarks/l2_promotion.py [--shape M,N,K,LAYOUTS ...] [--top 2] [--out DIR]

The promotion is the size of the L2 fetch a TMA request of 128 bytes per row turns into: 256B brings the next
k-tile's 128 bytes of each row along with this one's (one DRAM access where a streamed operand's rows are read
128 bytes per k-tile, as at a few rows of D). The constant is patched for the binding only (an experiment, not a
switch in the product); the maps then keep the promotion they were encoded with.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import run_main, write_report  # noqa: E402

SHAPES = ("1,4096,4096,rc", "8,4096,4096,rc", "16,4096,4096,rc", "16,4096,4096,rr", "1,4096,4096,rr",
          "16,14336,4096,rc", "16,4096,14336,rc", "64,4096,4096,rc", "128,8192,8192,rr", "513,4096,4096,rc",
          "4096,4096,4096,rr")
PROMOTIONS = ("128B", "256B", "NONE")
SETS, CALLS, REPLAYS, PASSES = 4, 40, 5, 3


@contextlib.contextmanager
def promotion(value: str):
    from gemmgen.families.sm90_wgmma import launch

    old = launch.L2_PROMOTION
    launch.L2_PROMOTION = value
    try:
        yield
    finally:
        launch.L2_PROMOTION = old


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, metavar="M,N,K,LAYOUTS")
    ap.add_argument("--top", type=int, default=1, help="the model's best configurations per shape (sm90 only)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    gpu, ranked_by_shape = harness.ranked_shapes(args.shape or SHAPES)
    plans = [(problem, [r for r in ranked if r.config.family == "sm90_wgmma"][:args.top])
             for problem, ranked in ranked_by_shape]
    rows = []
    for problem, built in harness.compile_plans(plans, gpu.arch):
        sets = [harness.layout_operands(torch, problem, torch.bfloat16) for _ in range(SETS)]
        contenders = {"cuBLAS": lambda s: torch.matmul(s[0], s[1], out=s[2])}
        for _, kernel, compiled in built:
            for value in PROMOTIONS:
                with promotion(value):
                    gemm, err = harness.checked_load(torch, kernel, problem, compiled, sets[0], "gemmgen-l2p-")
                    if gemm is None:
                        continue
                    bound = {id(s): gemm.bind(*s) for s in sets}

                def run(s, bound=bound):
                    bound[id(s)].run(torch.cuda.current_stream().cuda_stream)

                contenders[f"{kernel.config.tag} l2={value}"] = run
        times = {name: [] for name in contenders}
        for _ in range(PASSES):
            for name, fn in contenders.items():
                times[name].append(harness.graph_timed(torch, fn, sets, CALLS, REPLAYS) * 1e6)
        base = statistics.median(times["cuBLAS"])
        for name, ts in times.items():
            us = statistics.median(ts)
            rows.append({"shape": problem.label, "kernel": name, "graph_us": us, "passes_us": ts,
                         "x_cublas": base / us})
            print(f"{problem.label:26s} {name[-64:]:64s} {us:7.2f} us  {base / us:5.3f}x cuBLAS", flush=True)
        del sets
    if args.out:
        print("written:", write_report(args.out, "l2_promotion.json", {"gpu": gpu.key, "rows": rows}))
    return 0


if __name__ == "__main__":
    run_main(main, "l2_promotion.py")
