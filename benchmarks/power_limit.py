#!/usr/bin/env python3
"""Which kernels keep their speed at the card's power limit? Large products timed sustained, beside cuBLAS.

    PYTHONPATH=$PWD python3 benchmarks/power_limit.py [--shape 8192 8192 8192] [--rounds 3] [--out DIR]

The tuner screens candidates in short bursts, near the boost clock; a long product (8192³ bf16 takes ~1.5 ms) run
back to back drives the H100 into its power limit, where the clock drops and kernels can rank differently. For a
fixed list of sm90_wgmma configurations (wide 128x256 / 256x128 tiles, the 128x128 cooperative and ping-pong ones)
each kernel is built, exported and loaded (public APIs), verified once with D poisoned, then timed in rounds: per
round and kernel (and cuBLAS, torch.matmul), `--warm` seconds back to back, then `--hold` seconds timed with CUDA
events over rotating input sets. Also a burst figure (10 calls after an idle second) per kernel. Prints one table.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import detected_gpu, event_time, load_compiled, run_main, verify_shapes, write_report  # noqa: E402
from benchmarks.misaligned import operand, rel_error  # noqa: E402

CONFIGS = {
    "128x256 s3 cl2x1": dict(cta="128x256x64", warp="64x256x64", mma="64x256x16", stages=3, cluster="2x1"),
    "128x256 s4 sw": dict(cta="128x256x64", warp="64x256x64", mma="64x256x16", stages=4, store_warp=True),
    "256x128 s4": dict(cta="256x128x64", warp="128x128x64", mma="64x128x16", stages=4),
    "128x128 s5 coop": dict(cta="128x128x64", warp="64x128x64", mma="64x128x16", stages=5),
    "128x128 s6 coop": dict(cta="128x128x64", warp="64x128x64", mma="64x128x16", stages=6),
    "128x128 s5 pp": dict(cta="128x128x64", warp="128x128x64", mma="64x128x16", stages=5, schedule="pingpong"),
}
SETS = 3


def sustained(torch, fn, sets, warm_s: float, hold_s: float) -> float:
    """Seconds per call after `warm_s` of back-to-back calls, over about `hold_s` of timed calls."""
    i, start = 0, time.perf_counter()
    while time.perf_counter() - start < warm_s:
        for _ in range(10):
            fn(sets[i % len(sets)])
            i += 1
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(sets[0])
    torch.cuda.synchronize()
    return event_time(torch, fn, sets, max(5, int(hold_s / max(time.perf_counter() - t0, 1e-6))))


def burst(torch, fn, sets) -> float:
    time.sleep(1.0)
    return event_time(torch, fn, sets, 10)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, default=[8192, 8192, 8192])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", type=float, default=1.0)
    parser.add_argument("--hold", type=float, default=0.5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch

    from gemmgen import Kernel, Problem, TileConfig
    from gemmgen.codegen.nvrtc import compile_many

    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = detected_gpu()
    m, n, k = args.shape
    problem = Problem.create(m, n, k, "bf16", "row", "row")
    kernels = [Kernel(gpu.arch, problem.operands, TileConfig.from_dict(
        {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True,
         "raster": {"order": "row", "group": 8}, **fields})) for fields in CONFIGS.values()]
    built = compile_many(kernels)
    sets = [(operand(torch, m, k, "row", torch.bfloat16), operand(torch, k, n, "row", torch.bfloat16),
             torch.empty(m, n, device="cuda", dtype=torch.bfloat16)) for _ in range(SETS)]
    calls = {}
    for name, kernel, result in zip(CONFIGS, kernels, built):
        if isinstance(result, Exception):
            print(f"  {name}: compile failed: {str(result)[:200]}", flush=True)
            continue
        gemm = load_compiled(kernel, problem, result, "gemmgen-power-")
        ok, errors = verify_shapes(torch, gemm, [(m, n, k)], "row", "row", operand, rel_error)
        print(f"  {name}: {errors}", flush=True)
        if ok:
            calls[name] = (lambda g: (lambda s: g(*s)))(gemm)
    calls["cuBLAS"] = lambda s: torch.matmul(s[0], s[1], out=s[2])
    flops = 2.0 * m * n * k
    held = {name: [] for name in calls}
    bursts = {name: burst(torch, fn, sets) for name, fn in calls.items()}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            held[name].append(sustained(torch, fn, sets, args.warm, args.hold))
    rows = [{"kernel": name, "burst_tflops": flops / bursts[name] / 1e12,
             "sustained_tflops": flops / statistics.median(v) / 1e12,
             "sustained_rounds_tflops": [flops / t / 1e12 for t in v]} for name, v in held.items()]
    cublas = next(r for r in rows if r["kernel"] == "cuBLAS")
    device = torch.cuda.get_device_name()
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "shape": [m, n, k],
              "warm_s": args.warm, "hold_s": args.hold, "rows": rows}
    if args.out:
        write_report(args.out, "power_limit.json", report)
    print(f"\n{device}, {report['date']}, bf16 {m}x{n}x{k}, TFLOP/s (sustained: median of {args.rounds} rounds)")
    print(f"{'kernel':18} {'burst':>8} {'sustained':>10} {'x cuBLAS':>9}  rounds")
    for r in sorted(rows, key=lambda r: -r["sustained_tflops"]):
        print(f"{r['kernel']:18} {r['burst_tflops']:8.1f} {r['sustained_tflops']:10.1f} "
              f"{r['sustained_tflops'] / cublas['sustained_tflops']:9.3f}  "
              + " ".join(f"{x:.0f}" for x in r["sustained_rounds_tflops"]))
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
