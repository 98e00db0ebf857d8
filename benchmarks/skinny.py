#!/usr/bin/env python3
"""Few rows of D (decoding, skinny M): every configuration of one family against cuBLAS and the other families.

    PYTHONPATH=$PWD python3 benchmarks/skinny.py [--only NAME ...] [--top 3] [--out DIR]
    PYTHONPATH=$PWD python3 benchmarks/skinny.py --family sm80_gemv --tight-rows --only m1_rr m1_rr_mis m16_rr_mis
    PYTHONPATH=$PWD python3 benchmarks/skinny.py --family sm80_gemv --tight-rows --family-top 24 --only m1_rr_mis

--family (default sm80_skinny) is the family whose whole space is run; --tight-rows keeps only its configurations
whose CTA tile M is the smallest that covers the case's M (the larger ones compute rows of zeros); --family-top N
keeps the model's N best of them (a run of minutes instead of one of about a minute per case).

For each case (A row-major, B column-major as in a Linear layer's x @ W^T unless the case says rr; aligned and
unaligned rows), every configuration of the --family space (sm80_skinny by default) that its rules accept and the
model's top --top of the other families are compiled, exported and loaded with gemmgen.load (public APIs only). Each
is verified on fresh random inputs with D poisoned (NaN) first, against a float32 reference (TF32 off), at the
case's shape and at another shape it claims to serve. Then each is timed as the tuner times it (GpuBenchmark:
launches queued behind a stream-holding kernel, so host time is not counted; inputs rotated over sets larger than
L2), and the best --finalists with cuBLAS (torch.matmul) in two more interleaved passes. Prints, per case, the best
kernel of each family, its ratio to cuBLAS and the fraction of the HBM copy rate it reaches reading B (and A, D)
once.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import detected_gpu, load_compiled, run_main, verify_shapes, write_report  # noqa: E402
from benchmarks.misaligned import candidates, operand, rel_error  # noqa: E402

CASES = {  # name: (M, N, K[, B layout]); B column-major unless named (A always row-major)
    "m1": (1, 4096, 4096),
    "m1_rr": (1, 4096, 4096, "row"),
    "m16_rr": (16, 4096, 4096, "row"),
    "m16_rr_mis": (16, 4095, 4095, "row"),
    "m8": (8, 4096, 4096),
    "m16": (16, 4096, 4096),
    "m16_k4095": (16, 4096, 4095),
    "m1_mis": (1, 4095, 4095),
    "m13_up": (13, 11008, 4096),
    "m32": (32, 4096, 4096),
    "m64": (64, 4096, 4096),
    "m1_wide": (1, 65536, 4096),
    "m1_rr_mis": (1, 4095, 4095, "row"),
    "m8_rr": (8, 4096, 4096, "row"),
    "m4_vocab_rr": (4, 50257, 768, "row"),     # 537 MB of B: fixed costs (launch, ramp, tail) amortised
    "m16_wide": (16, 65536, 4096),
}
HBM_COPY_BPS = 3.02e12   # measured on the H100 (brief): read + write bytes per second of a device copy


def read_floor_s(torch, rows: int, cols: int, copies: int = 3, reps: int = 10) -> float:
    """Seconds to read a rows x cols bf16 array once (torch's sum over it), timed as CUDA-graph replays over
    `copies` arrays (together larger than L2), so neither host time nor L2 serves it: the bandwidth floor a
    B-streaming kernel is judged against."""
    arrays = [torch.randn(rows, cols, device="cuda", dtype=torch.float32).to(torch.bfloat16) for _ in range(copies)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for a in arrays:
            torch.sum(a, dtype=torch.float32)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            for a in arrays:
                torch.sum(a, dtype=torch.float32)
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / (reps * copies))
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    parser.add_argument("--top", type=int, default=3, help="model picks of each other family (default 3)")
    parser.add_argument("--out", default=None, help="write skinny.json here")
    parser.add_argument("--finalists", type=int, default=6, help="kernels re-timed beside cuBLAS (default 6)")
    parser.add_argument("--family", default="sm80_skinny", help="the family whose every configuration is run")
    parser.add_argument("--family-top", type=int, default=None, metavar="N",
                        help="only the model's top N of that family's configurations (default: all of them)")
    parser.add_argument("--tight-rows", action="store_true",
                        help="only that family's configurations with the smallest CTA tile M covering M")
    args = parser.parse_args(argv)
    import torch

    import gemmgen
    from gemmgen import Kernel, Problem
    from gemmgen.codegen.nvrtc import compile_many
    from gemmgen.rank.predict import predict
    from gemmgen.rank.ranking import rank_configs
    from gemmgen.rank.space import enumerate_space, heuristic_time
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.tune.bench import GpuBenchmark

    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = detected_gpu()
    device = torch.cuda.get_device_name()
    studied = gemmgen.families.get(args.family)
    rows, summary = [], []
    for name, (m, n, k, *layout) in CASES.items():
        if args.only and name not in args.only:
            continue
        lb = layout[0] if layout else "col"
        problem = Problem.create(m, n, k, "bf16", "row", lb)
        configs = list(enumerate_space(studied, gpu, problem=problem))
        if args.tight_rows and configs:
            rows_needed = min(c.cta.m for c in configs)
            configs = [c for c in configs if c.cta.m == rows_needed]
        if args.family_top:
            ranked = rank_configs(configs, problem, gpu, predict, heuristic_time)
            configs = [r.config for r in ranked[:args.family_top]]
        others = [r.config for r in candidates(problem, gpu, args.top) if r.config.family != studied.name]
        kernels = [Kernel(gpu.arch, problem.operands, c) for c in configs + others]
        t0 = time.time()
        built = compile_many(kernels)
        print(f"{name}: {len(kernels)} kernels compiled in {time.time() - t0:.1f} s", flush=True)
        loaded = []
        for kernel, result in zip(kernels, built):
            row = {"case": name, "shape": f"{m}x{n}x{k}", "config": kernel.config.tag, "family": kernel.config.family}
            if isinstance(result, Exception):
                row.update(ok=False, error=f"compile: {str(result)[:200]}")
                rows.append(row)
                print(f"  FAIL compile {kernel.config.tag}: {str(result)[:200]}", flush=True)
                continue
            row["spill_bytes"] = result.spill_bytes
            gemm = load_compiled(kernel, problem, result, "gemmgen-skinny-")
            other = (max(1, m - 1), n - 8 + (n % 2), k + 16 + (k % 2))   # same alignment class, M below the tile
            ok, errors = verify_shapes(torch, gemm, [(m, n, k), other], "row", lb, operand, rel_error)
            row.update(ok=ok, rel_errors=errors)
            rows.append(row)
            if not ok:
                print(f"  FAIL {kernel.config.tag}: errors {errors}", flush=True)
                gemm.close()
                continue
            row["_built"] = (kernel, result)
            loaded.append((row, gemm))

        bench = GpuBenchmark(seed=len(rows))
        try:
            cub = [bench.cublas_time(problem, fresh=True)]
            first = {}
            for row, _ in loaded:
                kernel, result = row.pop("_built")
                measured = bench.measure(make_manifest(kernel, problem, result), result.cubin, problem)
                first[row["config"]] = (measured.time_s, kernel, result) if measured.ok else None
                if not measured.ok:
                    row.update(ok=False, error=f"measure: {measured.reason[:200]}")
            ranked = sorted((v[0], key) for key, v in first.items() if v)
            times = {key: [t] for t, key in ranked}
            for _ in range(2):
                cub.append(bench.cublas_time(problem, fresh=True))
                for _, key in ranked[:args.finalists]:
                    _, kernel, result = first[key]
                    measured = bench.measure(make_manifest(kernel, problem, result), result.cubin, problem)
                    if measured.ok:
                        times[key].append(measured.time_s)
        finally:
            bench.close()
        bytes_once = (m * k + k * n + m * n) * 2
        cub = statistics.median(cub)
        floor = read_floor_s(torch, n if lb == "col" else k, k if lb == "col" else n)
        loaded = [(row, g) for row, g in loaded if row["config"] in times]
        for row, _ in loaded:
            t = statistics.median(times[row["config"]])
            row.update(us=t * 1e6, vs_cublas=cub / t, hbm_fraction=bytes_once / t / HBM_COPY_BPS,
                       passes=len(times[row["config"]]))
        for family in sorted({row["family"] for row, _ in loaded}):
            best = min((row for row, _ in loaded if row["family"] == family), key=lambda r: r["us"])
            summary.append({"case": name, "shape": f"{m}x{n}x{k}{'' if lb == 'col' else ' rr'}", "family": family, "best": best["config"],
                            "us": best["us"], "cublas_us": cub * 1e6, "vs_cublas": best["vs_cublas"],
                            "hbm_fraction": best["hbm_fraction"], "rel_error": best["rel_errors"][0],
                            "verified": sum(1 for r, _ in loaded if r["family"] == family),
                            "read_floor_us": floor * 1e6})
        for _, g in loaded:
            g.close()
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows,
              "summary": summary, "timing": "GpuBenchmark (burst policy, launches behind a stream hold, "
                                            "rotating inputs); finalists and cuBLAS: median of 3 passes"}
    if args.out:
        write_report(args.out, "skinny.json", report)
    failed = [r for r in rows if not r.get("ok")]
    print(f"\n{device}, {report['date']}, bf16, A row / B col (rr: B row); {len(rows)} kernels, {len(failed)} failed")
    print("read B: torch.sum over B's bytes, CUDA-graph timed (the bandwidth floor); HBM: bytes once / time / 3.02 TB/s")
    print(f"{'case':10} {'shape':16} {'family':12} {'us':>7} {'cuBLAS':>7} {'read B':>7} {'x cuB':>6} {'HBM':>5} "
          f"{'err':>8} {'n':>3}  best")
    for s in summary:
        print(f"{s['case']:10} {s['shape']:16} {s['family']:12} {s['us']:7.2f} {s['cublas_us']:7.2f} "
              f"{s['read_floor_us']:7.2f} {s['vs_cublas']:6.2f} {s['hbm_fraction']:5.2f} {s['rel_error']:8.1e} {s['verified']:3}  "
              f"{s['best'][:70]}")
    return 0 if not failed else 1


if __name__ == "__main__":
    run_main(main, __file__)
