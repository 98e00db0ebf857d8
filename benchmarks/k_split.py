#!/usr/bin/env python3
"""Two warpgroups on alternate k-tiles of one tile (sm90_wgmma's k_split) against one, on skinny products.

    PYTHONPATH=$PWD python3 benchmarks/k_split.py [--m 16 32 64 128] [--out DIR]

The swapped skinny tiles run one consumer warpgroup per CTA and, by the stored tunes, are bound by that warpgroup's
k-loop (~300 ns per k-tile at M = 64, whatever the ring depth). With k_split 2 a second warpgroup takes every other
k-tile into its own accumulators and hands its partial to the first through shared memory. For each M (N = K =
4096, A row-major, B column-major, bf16) and configuration, both kernels are built, exported and loaded (public
APIs), verified at the shape and at an odd one with D poisoned, then timed interleaved in rounds on rotating input
sets with cuBLAS (torch.matmul). Prints one table last.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import detected_gpu, load_compiled, run_main, verify_shapes, write_report  # noqa: E402
from benchmarks.misaligned import operand, rel_error, timed  # noqa: E402

CONFIGS = {   # the swapped tile whose N' holds all of M, at the stage counts the tunes chose
    16: dict(cta="64x16x64", warp="64x16x64", mma="64x16x16", stages=12, swap_ab=True),
    32: dict(cta="64x32x64", warp="64x32x64", mma="64x32x16", stages=12, swap_ab=True),
    64: dict(cta="64x64x64", warp="64x64x64", mma="64x64x16", stages=10, swap_ab=True),
    128: dict(cta="64x128x64", warp="64x128x64", mma="64x128x16", stages=6),
}
SETS = 3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="*", default=sorted(CONFIGS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch

    from gemmgen import Kernel, Problem, TileConfig
    from gemmgen.codegen.nvrtc import compile_many

    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = detected_gpu()
    rows = []
    for m in args.m:
        n = k = 4096
        problem = Problem.create(m, n, k, "bf16", "row", "col")
        kernels = [Kernel(gpu.arch, problem.operands, TileConfig.from_dict(
            {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True,
             "raster": {"order": "row", "group": 8}, **CONFIGS[m], "k_split": ks})) for ks in (1, 2)]
        built = compile_many(kernels)
        sets = [(operand(torch, m, k, "row", torch.bfloat16), operand(torch, k, n, "col", torch.bfloat16),
                 torch.empty(m, n, device="cuda", dtype=torch.bfloat16)) for _ in range(SETS)]
        calls = {}
        for ks, kernel, result in zip((1, 2), kernels, built):
            if isinstance(result, Exception):
                print(f"  M={m} k_split {ks}: compile failed: {str(result)[:200]}", flush=True)
                continue
            gemm = load_compiled(kernel, problem, result, "gemmgen-ks-")
            ok, errors = verify_shapes(torch, gemm, [(m, n, k), (m - 1, n - 8, k - 72)], "row", "col", operand,
                                       rel_error)
            print(f"  M={m} k_split {ks}: {errors}", flush=True)
            if ok:
                calls[f"k_split {ks}"] = (lambda g: (lambda s: g(*s)))(gemm)
        calls["cuBLAS"] = lambda s: torch.matmul(s[0], s[1], out=s[2])
        for fn in calls.values():
            for s in sets:
                fn(s)
        torch.cuda.synchronize()
        times = {key: [] for key in calls}
        for _ in range(3):
            for key, fn in calls.items():
                times[key].append(timed(torch, fn, sets))
        for key, v in times.items():
            rows.append({"m": m, "kernel": key, "us": statistics.median(v) * 1e6})
    device = torch.cuda.get_device_name()
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    if args.out:
        write_report(args.out, "k_split.json", report)
    print(f"\n{device}, {report['date']}, bf16 M x 4096 x 4096 rc, µs")
    print(f"{'M':>4} {'k_split 1':>10} {'k_split 2':>10} {'cuBLAS':>8} {'ks2 x cuBLAS':>13}")
    for m in args.m:
        by = {r["kernel"]: r["us"] for r in rows if r["m"] == m}
        one, two, cub = by.get("k_split 1"), by.get("k_split 2"), by.get("cuBLAS")
        fmt = lambda x: f"{x:10.1f}" if x else f"{'-':>10}"  # noqa: E731
        print(f"{m:4} {fmt(one)} {fmt(two)} {cub:8.1f} {cub / two if two else float('nan'):13.2f}")
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
