#!/usr/bin/env python3
"""A Linear layer's bias gradient fused into its weight-gradient kernel, against a separate reduction (GPU).

    PYTHONPATH=$PWD python3 benchmarks/row_sums.py [--case T,IN,OUT ...] [--top 4] [--out DIR]

For each case the weight gradient dW = dZᵀ·X (M = OUT, N = IN, K = T tokens; dZᵀ column-major, X row-major) is
built twice from each of the model's top --top configurations that can write row sums: plain, and with the row
sums of dZᵀ (the bias gradient) written by two producer warps as its tiles pass through shared memory. Both are
verified and timed the way the tuner does it (GpuBenchmark: fresh random inputs, D and the row sums poisoned
first, D and the sums compared with a float64-summed reference; launches queued behind a stream hold, inputs
rotated past L2), beside cuBLAS alone and cuBLAS followed by torch's reduction of dZ (what torch.nn.Linear runs).
Prints per configuration: plain µs, fused µs, what the fusion costs, and fused against plain + torch's reduction.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import detected_gpu, run_main, write_report  # noqa: E402
from benchmarks.misaligned import candidates  # noqa: E402

CASES = ((8192, 4096, 4096), (4096, 4096, 14336), (16, 4096, 4096), (777, 1000, 333))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", default=None, metavar="T,IN,OUT")
    parser.add_argument("--top", type=int, default=4, help="model picks that take row sums (default 4)")
    parser.add_argument("--passes", type=int, default=3, help="timing passes, interleaved (default 3)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch

    from gemmgen import Kernel
    from gemmgen.codegen.nvrtc import compile_many
    from gemmgen.model.linear import LinearLayer
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.tune.bench import GpuBenchmark

    gpu = detected_gpu()
    device = torch.cuda.get_device_name()
    cases = [tuple(int(v) for v in c.split(",")) for c in args.case] if args.case else list(CASES)
    rows, failed = [], 0
    for tokens, in_f, out_f in cases:
        fused_problem = LinearLayer.create(in_f, out_f, "bf16", True, "none", tokens).problems()["wgrad"]
        plain_problem = replace(fused_problem, epilogue=replace(fused_problem.epilogue, row_sums=False))
        configs = [r.config for r in candidates(fused_problem, gpu, args.top)][:args.top]
        pairs = [(Kernel(gpu.arch, p.operands, c), p) for c in configs for p in (plain_problem, fused_problem)]
        t0 = time.time()
        built = compile_many([k for k, _ in pairs])
        print(f"{tokens}x{in_f}->{out_f}: {len(pairs)} kernels compiled in {time.time() - t0:.1f} s", flush=True)
        bench = GpuBenchmark(seed=tokens)
        times = {}
        try:
            cub = {"plain": [], "fused": []}
            for _ in range(args.passes):
                cub["plain"].append(bench.cublas_time(plain_problem, fresh=True))
                cub["fused"].append(bench.cublas_time(fused_problem, fresh=True))
                for (kernel, problem), result in zip(pairs, built):
                    key = (kernel.config.tag, problem.epilogue.row_sums)
                    if isinstance(result, Exception):
                        times[key] = f"compile: {str(result)[:160]}"
                        continue
                    if isinstance(times.get(key), str):
                        continue
                    m = bench.measure(make_manifest(kernel, problem, result), result.cubin, problem)
                    if not m.ok:
                        times[key] = f"measure: {m.reason[:200]}"
                        continue
                    times.setdefault(key, []).append(m.time_s)
        finally:
            bench.close()
        cub_plain, cub_fused = statistics.median(cub["plain"]), statistics.median(cub["fused"])
        for config in configs:
            plain, fused = times.get((config.tag, False)), times.get((config.tag, True))
            row = {"case": f"{tokens}x{in_f}->{out_f}", "config": config.tag, "cublas_us": cub_plain * 1e6,
                   "cublas_reduce_us": cub_fused * 1e6}
            if not isinstance(plain, list) or not isinstance(fused, list):
                failed += 1
                row["error"] = plain if isinstance(plain, str) else fused if isinstance(fused, str) else "not run"
                print(f"  FAIL {config.tag}: {row['error']}", flush=True)
            else:
                p, f = statistics.median(plain), statistics.median(fused)
                reduce_s = cub_fused - cub_plain
                row.update(plain_us=p * 1e6, fused_us=f * 1e6, fusion_cost=f / p - 1,
                           vs_plain_plus_reduce=(p + reduce_s) / f, vs_cublas_reduce=cub_fused / f)
            rows.append(row)
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    if args.out:
        write_report(args.out, "row_sums.json", report)
    print(f"\n{device}, {report['date']}, bf16 weight gradient dZᵀ·X (cr), µs (GpuBenchmark, median of "
          f"{args.passes} interleaved passes)")
    print(f"{'case':18} {'plain':>8} {'fused':>8} {'cost':>6} {'cuBLAS':>8} {'+reduce':>8} "
          f"{'x(plain+red)':>12} {'x(cuB+red)':>10}  config")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:18} FAILED: {r['error'][:100]}  {r['config']}")
            continue
        print(f"{r['case']:18} {r['plain_us']:8.1f} {r['fused_us']:8.1f} {100 * r['fusion_cost']:5.1f}% "
              f"{r['cublas_us']:8.1f} {r['cublas_reduce_us']:8.1f} {r['vs_plain_plus_reduce']:12.3f} "
              f"{r['vs_cublas_reduce']:10.3f}  {r['config'][:60]}")
    return 1 if failed else 0


if __name__ == "__main__":
    run_main(main, __file__)
