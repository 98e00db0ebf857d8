#!/usr/bin/env python3
"""Does the store warp pay where D's rows are not 16-byte aligned? The same configurations with and without it.

    PYTHONPATH=$PWD python3 benchmarks/store_warp.py [--out DIR]

Without a store warp, the consumers of a misaligned D store it themselves, element by element from their staging
tile, while the tensor cores wait; with one (launch.uses_warp_stores) they fill the store boxes as for TMA stores
and the producer warpgroup's warp 1 writes the elements. For each case and base configuration both kernels are
built, exported and loaded (public APIs), verified at the shape with D poisoned, then timed interleaved in rounds
on rotating input sets with cuBLAS (torch.matmul) and the aligned product of the next size up (the same
configuration on 4096-multiples: what the pack and the epilogue cost together). Prints one table last.
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

CASES = {"sq4095_rr": (4095, 4095, 4095, "row", "row"), "rect3001x5003x4093": (3001, 5003, 4093, "row", "row"),
         # Only D misaligned (A row-major and B column-major have K = 4096 rows: no pack): D's own cost.
         "d_only_4096x4095x4096_rc": (4096, 4095, 4096, "row", "col")}
BASES = {   # cooperative 128x256 and 256x128 tiles: the store warp's configurations
    "128x256_s3": dict(cta="128x256x64", warp="64x256x64", mma="64x256x16", stages=3),
    "128x256_s4_cl2x1": dict(cta="128x256x64", warp="64x256x64", mma="64x256x16", stages=4, cluster="2x1"),
    "256x128_s3": dict(cta="256x128x64", warp="128x128x64", mma="64x128x16", stages=3),
    # The 4095³ tune's winner (ping-pong: no store warp; its other warpgroup's main loop hides the epilogue).
    "64x256_s5_pp": dict(cta="64x256x64", warp="64x256x64", mma="64x256x16", stages=5, schedule="pingpong"),
}
SETS = 3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    args = parser.parse_args(argv)
    import torch

    from gemmgen import Kernel, Problem, TileConfig
    from gemmgen.codegen.nvrtc import compile_many

    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = detected_gpu()
    rows = []
    cases = {name: c for name, c in CASES.items() if not args.only or name in args.only}
    for case, (m, n, k, la, lb) in cases.items():
        problem = Problem.create(m, n, k, "bf16", la, lb)
        up = [(-(-x // 64)) * 64 for x in (m, n, k)]
        aligned = Problem.create(*up, "bf16", la, lb)
        kernels, keys = [], []
        for base, fields in BASES.items():
            pingpong = fields.get("schedule") == "pingpong"
            for sw in ((False,) if pingpong else (False, True)):
                config = TileConfig.from_dict({"family": "sm90_wgmma", "warp_specialized": True, "persistent": True,
                                               "raster": {"order": "row", "group": 8}, **fields, "store_warp": sw})
                kernels.append((problem, Kernel(gpu.arch, problem.operands, config)))
                keys.append((base, "sw" if sw else "consumers"))
            config = TileConfig.from_dict({"family": "sm90_wgmma", "warp_specialized": True, "persistent": True,
                                           "raster": {"order": "row", "group": 8}, **fields,
                                           "store_warp": not pingpong})
            kernels.append((aligned, Kernel(gpu.arch, aligned.operands, config)))
            keys.append((base, "aligned"))
        built = compile_many([kern for _, kern in kernels])
        sets = []
        for i in range(SETS):
            sets.append({"mis": (operand(torch, m, k, la, torch.bfloat16), operand(torch, k, n, lb, torch.bfloat16),
                                 torch.empty(m, n, device="cuda", dtype=torch.bfloat16)),
                         "aligned": (operand(torch, up[0], up[2], la, torch.bfloat16),
                                     operand(torch, up[2], up[1], lb, torch.bfloat16),
                                     torch.empty(up[0], up[1], device="cuda", dtype=torch.bfloat16))})
        calls = {}
        for key, (prob, kern), result in zip(keys, kernels, built):
            if isinstance(result, Exception):
                print(f"  {case} {key}: compile failed: {str(result)[:200]}", flush=True)
                continue
            gemm = load_compiled(kern, prob, result, "gemmgen-sw-")
            which = "aligned" if key[1] == "aligned" else "mis"
            if which == "mis":
                ok, errors = verify_shapes(torch, gemm, [(m, n, k)], la, lb, operand, rel_error)
                print(f"  {case} {key}: {errors}", flush=True)
                if not ok:
                    continue
            calls[key] = (lambda g, w: (lambda s: g(*s[w])))(gemm, which)
        calls[("cuBLAS", "as is")] = lambda s: torch.matmul(s["mis"][0], s["mis"][1], out=s["mis"][2])
        setlist = sets
        for fn in calls.values():
            for s in setlist:
                fn(s)
        torch.cuda.synchronize()
        times = {key: [] for key in calls}
        for _ in range(3):
            for key, fn in calls.items():
                times[key].append(timed(torch, fn, setlist))
        for key, v in times.items():
            t = statistics.median(v)
            flops = 2.0 * (up[0] * up[1] * up[2] if key[1] == "aligned" else m * n * k)
            rows.append({"case": case, "config": key[0], "stores": key[1], "us": t * 1e6, "tflops": flops / t / 1e12})
    device = torch.cuda.get_device_name()
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    if args.out:
        write_report(args.out, "store_warp.json", report)
    print(f"\n{device}, {report['date']}, bf16 (µs; gemmgen includes its pack launch)")
    print(f"{'case':20} {'config':18} {'consumers':>10} {'store warp':>10} {'aligned':>10} {'sw gain':>8}")
    for case in cases:
        by = {(r["config"], r["stores"]): r["us"] for r in rows if r["case"] == case}
        for base in BASES:
            c, s, a = by.get((base, "consumers")), by.get((base, "sw")), by.get((base, "aligned"))
            fmt = lambda x: f"{x:10.1f}" if x else f"{'-':>10}"  # noqa: E731
            gain = f"{c / s:8.3f}" if c and s else f"{'-':>8}"
            print(f"{case:20} {base:18} {fmt(c)} {fmt(s)} {fmt(a)} {gain}")
        print(f"{case:20} {'cuBLAS as is':18} {by.get(('cuBLAS', 'as is'), 0):10.1f}")
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
