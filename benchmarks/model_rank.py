#!/usr/bin/env python3
"""Does the model rank one shape's configurations as the GPU does? A random sample of the space, measured (GPU).

    PYTHONPATH=$PWD python3 benchmarks/model_rank.py [--shape 4096x4096x4096 ...] [--sample 40] [--passes 2]
                                                      [--family sm90_wgmma] [--seed 0] [--out DIR]

The stored tunes hold what a search chose to measure, near-best configurations within 10-25% of each other,
where even two timings of the same configurations agree only to Spearman 0.3-0.7 (docs/dispatch.md). The issue's
question is about the space: across one shape's configurations, does predicted time order them as measured time
does? For each shape, --sample configurations are drawn at random (seeded) from the family's valid space, ranked
by the model the tuner uses (rank.calibration's stored calibration for the GPU, else the defaults), compiled,
verified and timed as the tuner times them (GpuBenchmark, --passes interleaved passes, median), and Spearman's rho
between predicted and measured time is printed beside the measurement's own repeatability (rho between two passes)
and the model's top pick among the sample against the sample's measured best.

With --hold S each configuration is instead exported, loaded (gemmgen.load), verified once with D poisoned, and
timed sustained: --warm seconds back to back, then S seconds timed (benchmarks/power_limit.py's method), in a
fresh random order per pass. Large products drive the H100 into its power limit within a second, and a burst
timing then depends on what ran just before it; the sustained time is the one a training job sees.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import detected_gpu, run_main, write_report  # noqa: E402

SHAPES = ("4096x4096x4096", "8192x8192x8192", "4096x14336x4096")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", default=None, metavar="MxNxK")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--family", default="sm90_wgmma")
    parser.add_argument("--sample", type=int, default=40)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=14)
    parser.add_argument("--hold", type=float, default=0.0,
                        help="time each configuration sustained for this many seconds (0: the tuner's bursts)")
    parser.add_argument("--warm", type=float, default=0.6, help="with --hold: seconds back to back before timing")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from gemmgen import Kernel, Problem
    from gemmgen.codegen.nvrtc import compile_many
    from gemmgen.rank.calibration import params_for
    from gemmgen.rank.predict import predict
    from gemmgen.rank.space import enumerate_space
    from gemmgen.runtime.detect import detect_gpu
    from gemmgen.tune.calibrate import spearman

    gpu = detected_gpu()
    params, source = params_for(gpu)
    rng = random.Random(args.seed)
    rows = []
    for shape in args.shape or SHAPES:
        m, n, k = (int(v) for v in shape.split("x"))
        problem = Problem.create(m, n, k, args.dtype, "row", "col")
        space = enumerate_space(args.family, gpu, problem=problem)
        sample = rng.sample(space, min(args.sample, len(space)))
        predicted = {c.tag: predict(problem, c, gpu, params).time_s for c in sample}
        kernels = [Kernel(gpu.arch, problem.operands, c) for c in sample]
        t0 = time.time()
        built = compile_many(kernels, jobs=args.jobs)
        print(f"{shape}: {len(sample)} of {len(space)} configurations compiled in {time.time() - t0:.0f} s",
              flush=True)
        if args.hold > 0:
            times, failed, cublas = time_sustained(problem, kernels, built, args, rng)
        else:
            times, failed, cublas = time_bursts(problem, kernels, built, args)
        ok = [tag for tag, t in times.items() if len(t) == args.passes]
        pred = [predicted[tag] for tag in ok]
        meas = [statistics.median(times[tag]) for tag in ok]
        rho = spearman(pred, meas)
        repeat = spearman([times[tag][0] for tag in ok], [times[tag][1] for tag in ok]) if args.passes > 1 else None
        pick = min(ok, key=lambda tag: predicted[tag])
        best = min(meas)
        row = {"shape": shape, "dtype": args.dtype, "family": args.family, "space": len(space), "sampled": len(sample),
               "measured": len(ok), "failed": failed, "spearman": rho, "repeatability": repeat,
               "timing": f"sustained {args.warm}+{args.hold} s" if args.hold > 0 else "bursts",
               "pick_vs_best": best / statistics.median(times[pick]), "best_tflops": problem.flops / best / 1e12,
               "cublas_tflops": problem.flops / statistics.median(cublas) / 1e12,
               "configs": [{"config": tag, "predicted_s": predicted[tag], "measured_s": times[tag]} for tag in ok]}
        rows.append(row)
    detected = detect_gpu()
    device = (detected.props or {}).get("name", gpu.name)
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "calibration": source,
              "seed": args.seed, "rows": rows}
    if args.out:
        write_report(args.out, "model_rank.json", report)
    print(f"\n{device}, {report['date']}, model calibration: {source}; random sample of the {args.family} space")
    print(f"{'shape':18} {'sampled':>8} {'measured':>8} {'rho(pred,meas)':>15} {'rho(pass1,pass2)':>17} "
          f"{'pick/best':>9} {'best TF':>8} {'cuBLAS TF':>9}")
    for r in rows:
        fmt = lambda v: "-" if v is None else f"{v:+.2f}"  # noqa: E731
        print(f"{r['shape']:18} {r['sampled']:8} {r['measured']:8} {fmt(r['spearman']):>15} "
              f"{fmt(r['repeatability']):>17} {r['pick_vs_best']:9.3f} {r['best_tflops']:8.0f} {r['cublas_tflops']:9.0f}")
    return 0


def time_bursts(problem, kernels, built, args):
    """The tuner's timing (GpuBenchmark: warm-up, rotated inputs, median of bursts), --passes passes in order."""
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.tune.bench import GpuBenchmark

    bench = GpuBenchmark(seed=args.seed)
    times: "dict[str, list[float]]" = {}
    failed: "dict[str, str]" = {}
    cublas = []
    try:
        for _ in range(args.passes):
            cublas.append(bench.cublas_time(problem, fresh=True))
            for kernel, result in zip(kernels, built):
                tag = kernel.config.tag
                if isinstance(result, Exception) or tag in failed:
                    failed.setdefault(tag, f"compile: {str(result)[:120]}")
                    continue
                measured = bench.measure(make_manifest(kernel, problem, result), result.cubin, problem)
                if not measured.ok:
                    failed[tag] = measured.reason[:160]
                    continue
                times.setdefault(tag, []).append(measured.time_s)
    finally:
        bench.close()
    return times, failed, cublas


def time_sustained(problem, kernels, built, args, rng):
    """Each kernel through gemmgen.load, verified once (D poisoned, fp32 reference), then timed at the power limit
    (power_limit.sustained) in a shuffled order per pass; cuBLAS (torch.matmul) the same way."""
    import torch

    from benchmarks.harness import load_compiled, verify_shapes
    from benchmarks.misaligned import operand, rel_error
    from benchmarks.power_limit import SETS, sustained

    torch.backends.cuda.matmul.allow_tf32 = False
    m, n, k = problem.m, problem.n, problem.k
    a_layout, b_layout = problem.operands.a_layout.value, problem.operands.b_layout.value
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[problem.operands.a_dtype.value]
    sets = [(operand(torch, m, k, a_layout, dtype), operand(torch, k, n, b_layout, dtype),
             torch.empty(m, n, device="cuda", dtype=dtype)) for _ in range(SETS)]
    calls, failed = {}, {}
    for kernel, result in zip(kernels, built):
        tag = kernel.config.tag
        if isinstance(result, Exception):
            failed[tag] = f"compile: {str(result)[:120]}"
            continue
        gemm = load_compiled(kernel, problem, result, "gemmgen-rank-")
        ok, errors = verify_shapes(torch, gemm, [(m, n, k)], a_layout, b_layout, operand, rel_error)
        if not ok:
            failed[tag] = f"verify: {errors}"[:160]
            continue
        calls[tag] = (lambda g: (lambda s: g(*s)))(gemm)
    times: "dict[str, list[float]]" = {}
    cublas = []
    for _ in range(args.passes):
        order = list(calls)
        rng.shuffle(order)
        cublas.append(sustained(torch, lambda s: torch.matmul(s[0], s[1], out=s[2]), sets, args.warm, args.hold))
        for tag in order:
            times.setdefault(tag, []).append(sustained(torch, calls[tag], sets, args.warm, args.hold))
    return times, failed, cublas


if __name__ == "__main__":
    run_main(main, __file__)
