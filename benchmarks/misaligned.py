#!/usr/bin/env python3
"""Misaligned products on Hopper: the packing sm90_wgmma kernels against cuBLAS as is and pad + cuBLAS.

    PYTHONPATH=$PWD python3 benchmarks/misaligned.py [--top 3] [--out DIR] [--only NAME ...]

For each case (leading dimensions that are not 16-byte multiples, all four layouts, small M), the model's top
configurations of every family are compiled, exported and loaded with gemmgen.load (public APIs only). Each is
verified on fresh random inputs with D poisoned (NaN) first, against a float32 cuBLAS reference with TF32 off, at
the case's shape and at two other shapes its bundle claims to serve. Then, interleaved in rounds on rotating input
sets (so L2 does not serve the operands): the gemmgen kernel (its pack launches included), torch.matmul on the
same tensors (cuBLAS as is), and pad + cuBLAS (copy A and B into zero-padded aligned buffers, then matmul: the
two lines a user would write). Prints one row per kernel and a summary table last; --out writes the JSON record.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import detected_gpu, load_compiled, run_main, verify_shapes, write_report  # noqa: E402

CASES = {  # name: (M, N, K, A layout, B layout)
    "sq4095_rr": (4095, 4095, 4095, "row", "row"),
    "sq4095_rc": (4095, 4095, 4095, "row", "col"),
    "sq4095_cr": (4095, 4095, 4095, "col", "row"),
    "sq4095_cc": (4095, 4095, 4095, "col", "col"),
    "rect3001x5003x4093": (3001, 5003, 4093, "row", "row"),
    "m1_k4095": (1, 4095, 4095, "row", "row"),
    "m16_k4095": (16, 4095, 4095, "row", "col"),
    "m64_k4095": (64, 4095, 4095, "row", "row"),
}
SETS = 3      # rotating input sets (4095^2 bf16 is 33.5 MB: three of A and B exceed the 50 MB L2)
ROUNDS, CALLS = 7, 10


def operand(torch, rows, cols, layout, dtype):
    """A rows x cols operand in `layout`: a column-major one is the transposed view of a contiguous array."""
    if layout == "row":
        return torch.randn(rows, cols, device="cuda", dtype=torch.float32).to(dtype)
    return torch.randn(cols, rows, device="cuda", dtype=torch.float32).to(dtype).t()


def rel_error(torch, out, ref) -> float:
    if not bool(torch.isfinite(out).all()):
        return float("nan")
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def timed(torch, fn, sets) -> float:
    """Median over ROUNDS of the mean time per call of CALLS calls (CUDA events), cycling through the input sets."""
    return harness.timed(torch, fn, sets, ROUNDS, CALLS)


def breakdown(torch, gemm, sets, problem, gpu, row, built, kernels) -> dict:
    """Microseconds of the pack launches alone, the GEMM (and reduction) launches alone, the whole sequence, and
    the same configuration compiled for the aligned shape rounded up to multiples of 8 (no pack, TMA stores)."""
    from gemmgen import Kernel, Problem
    from gemmgen.codegen.nvrtc import compile_kernel
    from gemmgen.runtime.launch import LaunchSequence

    bound = [gemm.bind(*s) for s in sets]
    npack = sum(l.function.name.endswith("_pack") for l in bound[0].launches)
    parts = {"pack": [LaunchSequence(b.launches[:npack], b.workspace, "pack", 0) for b in bound],
             "gemm": [LaunchSequence(b.launches[npack:], b.workspace, "gemm", 0) for b in bound],
             "all": bound}
    out = {}
    for key, seqs in parts.items():
        if seqs[0].launches:
            out[key + "_us"] = timed(torch, lambda i_s, q=seqs: q[i_s].run(torch.cuda.current_stream().cuda_stream),
                                     list(range(len(seqs)))) * 1e6
    m8, n8, k8 = (-(-x // 8) * 8 for x in (problem.m, problem.n, problem.k))
    aligned = Problem.create(m8, n8, k8, "bf16", problem.a_layout.value, problem.b_layout.value)
    config = next(k.config for k in kernels if k.config.tag == row["config"])
    kernel = Kernel(gpu.arch, aligned.operands, config)
    g = load_compiled(kernel, aligned, compile_kernel(kernel), "gemmgen-aligned-")
    asets = []
    for _ in range(SETS):
        asets.append((operand(torch, m8, k8, problem.a_layout.value, torch.bfloat16),
                      operand(torch, k8, n8, problem.b_layout.value, torch.bfloat16),
                      torch.empty(m8, n8, device="cuda", dtype=torch.bfloat16)))
    for s in asets:
        g(*s)
    out["aligned_us"] = timed(torch, lambda s: g(*s), asets) * 1e6
    out["aligned_shape"] = f"{m8}x{n8}x{k8}"
    moved = sum(x.numel() * 2 * 2 for x in (sets[0][0], sets[0][1]))
    if "pack_us" in out:
        out["pack_GBps"] = moved / (out["pack_us"] * 1e-6) / 1e9
    print(f"  breakdown {row['config'][:50]}: {out}", flush=True)
    g.close()
    return out


def candidates(problem, gpu, top: int):
    """The model's top configurations of each family for `problem` (public rank APIs)."""
    from gemmgen.rank.predict import predict
    from gemmgen.rank.ranking import model_top, rank_configs
    from gemmgen.rank.space import enumerate_space, families_for, heuristic_time

    picks = []
    for family in families_for(gpu.arch):
        ranked = rank_configs(enumerate_space(family, gpu, problem=problem), problem, gpu, predict, heuristic_time)
        picks += model_top(ranked, top)
    return sorted(picks, key=lambda r: r.time_s)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=3, help="model picks per family (default 3)")
    parser.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    parser.add_argument("--out", default=None, help="write misaligned.json here")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time the best kernel's pack launches and GEMM launch apart, and the same "
                             "configuration on the next aligned shape (no pack)")
    args = parser.parse_args(argv)
    import torch

    from gemmgen import Kernel, Problem
    from gemmgen.codegen.nvrtc import compile_many

    torch.backends.cuda.matmul.allow_tf32 = False   # the reference accumulates in true fp32
    gpu = detected_gpu()
    device = torch.cuda.get_device_name()
    rows, summary = [], []
    for name, (m, n, k, la, lb) in CASES.items():
        if args.only and name not in args.only:
            continue
        problem = Problem.create(m, n, k, "bf16", la, lb)
        ranked = candidates(problem, gpu, args.top)
        kernels = [Kernel(gpu.arch, problem.operands, r.config) for r in ranked]
        t0 = time.time()
        built = compile_many(kernels)
        print(f"{name}: {len(kernels)} candidates compiled in {time.time() - t0:.1f} s", flush=True)
        sets = []
        for _ in range(SETS):
            A, B = operand(torch, m, k, la, torch.bfloat16), operand(torch, k, n, lb, torch.bfloat16)
            sets.append((A, B, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)))
        # pad + cuBLAS: aligned, zero-padded copies (pad to 8 elements = 16 bytes), made inside the timed call.
        m8, n8, k8 = (-(-x // 8) * 8 for x in (m, n, k))
        Ap = torch.zeros(m8, k8, device="cuda", dtype=torch.bfloat16)
        Bp = torch.zeros(k8, n8, device="cuda", dtype=torch.bfloat16)
        Dp = torch.empty(m8, n8, device="cuda", dtype=torch.bfloat16)

        def padded(s):
            Ap[:m, :k].copy_(s[0])
            Bp[:k, :n].copy_(s[1])
            torch.matmul(Ap, Bp, out=Dp)

        def cublas(s):
            torch.matmul(s[0], s[1], out=s[2])

        loaded = []
        for r, kernel, result in zip(ranked, kernels, built):
            row = {"case": name, "shape": f"{m}x{n}x{k}", "layouts": la[0] + lb[0], "config": r.config.tag,
                   "family": r.config.family, "model_tflops": r.tflops}
            if isinstance(result, Exception):
                row.update(ok=False, error=f"compile: {str(result)[:200]}")
                rows.append(row)
                continue
            gemm = load_compiled(kernel, problem, result, "gemmgen-misaligned-")
            errors = []
            # The case's shape, then two others the bundle serves (same operand alignment class: odd dims stay odd).
            # Skinny cases keep M (a swapped kernel's tile bounds it: the manifest's serves.m_max).
            others = [(m, (n + 6) | 1, (k - 2) | 1), (m, (n - 64) | 1, (k + 40) | 1)] if m <= 64 else \
                [((m - 38) | 1, (n + 6) | 1, (k - 2) | 1), ((m + 2) | 1, (n - 64) | 1, (k + 40) | 1)]
            ok, errors = verify_shapes(torch, gemm, [(m, n, k)] + others, la, lb, operand, rel_error)
            row.update(ok=ok, rel_errors=errors)
            rows.append(row)
            print(f"  {r.config.tag}: errors {errors}", flush=True)
            if ok:
                gemm(*sets[0])
                loaded.append((row, gemm))
        if not loaded:
            summary.append({"case": name, "best": None})
            continue
        torch.cuda.synchronize()
        contenders = {"cublas": cublas, "padded": padded,
                      **{row["config"]: (lambda s, g=gemm: g(*s)) for row, gemm in loaded}}
        times = harness.interleaved_times(torch, contenders, sets, timed)   # every contender in each pass
        flops = 2.0 * m * n * k
        tf = {key: flops / statistics.median(v) / 1e12 for key, v in times.items()}
        for row, _ in loaded:
            row.update(tflops=tf[row["config"]], vs_cublas=tf[row["config"]] / tf["cublas"],
                       vs_padded=tf[row["config"]] / tf["padded"])
        best_row = max((row for row, _ in loaded), key=lambda r: r["tflops"])
        if args.breakdown:
            best_gemm = next(g for row, g in loaded if row is best_row)
            best_row["breakdown"] = breakdown(torch, best_gemm, sets, problem, gpu, best_row, built, kernels)
        summary.append({"case": name, "shape": best_row["shape"], "layouts": best_row["layouts"],
                        "best": best_row["config"], "family": best_row["family"], "tflops": best_row["tflops"],
                        "cublas_tflops": tf["cublas"], "padded_tflops": tf["padded"],
                        "vs_cublas": best_row["vs_cublas"], "vs_padded": best_row["vs_padded"],
                        "rel_error": best_row["rel_errors"][0]})
        for _, gemm in loaded:
            gemm.close()
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows,
              "summary": summary, "timing": f"CUDA events, {ROUNDS} rounds x {CALLS} calls over {SETS} input sets, "
                                            "median of 3 interleaved passes"}
    if args.out:
        write_report(args.out, "misaligned.json", report)
    print(f"\n{device}, {report['date']}, bf16, TFLOP/s (gemmgen includes its pack launches)")
    print(f"{'case':20} {'shape':16} {'lay':3} {'gemmgen':>8} {'cuBLAS':>7} {'pad+cuB':>8} {'x cuBLAS':>8} "
          f"{'x pad':>6} {'rel.err':>8}  best")
    for s in summary:
        if s["best"] is None:
            print(f"{s['case']:20} no verified kernel")
            continue
        print(f"{s['case']:20} {s['shape']:16} {s['layouts']:3} {s['tflops']:8.1f} {s['cublas_tflops']:7.1f} "
              f"{s['padded_tflops']:8.1f} {s['vs_cublas']:8.2f} {s['vs_padded']:6.2f} {s['rel_error']:8.1e}  "
              f"{s['family']}:{s['best'][:60]}")
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    run_main(main, __file__)
