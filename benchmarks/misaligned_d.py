#!/usr/bin/env python3
"""What a misaligned D costs: the same configurations on misaligned products and on the aligned ones next to them.

    PYTHONPATH=$PWD python3 benchmarks/misaligned_d.py [--only CASE ...] [--out DIR]

D's rows not on 16-byte boundaries rule out TMA stores; sm90_wgmma's kernels then write D with composed aligned
16-byte stores (launch.uses_composed_stores; until 2026-11-26 element by element, 33-36 µs more than TMA at
4096x4095x4096, docs/perf-notes.md). For each case and configuration the kernel is built for the misaligned product
and for the product rounded up to 64-multiples, exported and loaded (public APIs), the misaligned one verified at
the shape with D poisoned, then both timed interleaved in rounds on rotating input sets with cuBLAS
(torch.matmul on the misaligned operands). The d_only case has A and B aligned (no pack): its difference to the
aligned product is D's alone. Prints one table last.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import detected_gpu, interleaved_times, load_compiled, run_main, verify_shapes, write_report  # noqa: E402,E501
from benchmarks.misaligned import operand, rel_error, timed  # noqa: E402

CASES = {"sq4095_rr": (4095, 4095, 4095, "row", "row"), "rect3001x5003x4093": (3001, 5003, 4093, "row", "row"),
         # Only D misaligned (A row-major and B column-major have K = 4096 rows: no pack): D's own cost.
         "d_only_4096x4095x4096_rc": (4096, 4095, 4096, "row", "col")}
BASES = {
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
            config = TileConfig.from_dict({"family": "sm90_wgmma", "warp_specialized": True, "persistent": True,
                                           "raster": {"order": "row", "group": 8}, **fields})
            kernels.append((problem, Kernel(gpu.arch, problem.operands, config)))
            keys.append((base, "misaligned"))
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
            gemm = load_compiled(kern, prob, result, "gemmgen-misd-")
            which = "aligned" if key[1] == "aligned" else "mis"
            if which == "mis":
                ok, errors = verify_shapes(torch, gemm, [(m, n, k)], la, lb, operand, rel_error)
                print(f"  {case} {key}: {errors}", flush=True)
                if not ok:
                    continue
            calls[key] = (lambda g, w: (lambda s: g(*s[w])))(gemm, which)
        calls[("cuBLAS", "as is")] = lambda s: torch.matmul(s["mis"][0], s["mis"][1], out=s["mis"][2])
        times = interleaved_times(torch, calls, sets, timed)
        for key, v in times.items():
            t = statistics.median(v)
            flops = 2.0 * (up[0] * up[1] * up[2] if key[1] == "aligned" else m * n * k)
            rows.append({"case": case, "config": key[0], "stores": key[1], "us": t * 1e6, "tflops": flops / t / 1e12})
    device = torch.cuda.get_device_name()
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    if args.out:
        write_report(args.out, "misaligned_d.json", report)
    print(f"\n{device}, {report['date']}, bf16 (µs; gemmgen includes its pack launch)")
    print(f"{'case':26} {'config':18} {'misaligned':>10} {'aligned':>10} {'extra':>8} {'TFLOP/s':>8}")
    for case in cases:
        by = {(r["config"], r["stores"]): r for r in rows if r["case"] == case}
        for base in BASES:
            mis, al = by.get((base, "misaligned")), by.get((base, "aligned"))
            if not mis or not al:
                continue
            print(f"{case:26} {base:18} {mis['us']:10.1f} {al['us']:10.1f} {mis['us'] - al['us']:8.1f} "
                  f"{mis['tflops']:8.1f}")
        cub = by.get(("cuBLAS", "as is"))
        print(f"{case:26} {'cuBLAS as is':18} {cub['us']:10.1f} {'':10} {'':8} {cub['tflops']:8.1f}")
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
