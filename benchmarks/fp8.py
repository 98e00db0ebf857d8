#!/usr/bin/env python3
"""fp8 (e4m3, e5m2) sm90_wgmma kernels against cuBLAS fp8 (torch._scaled_mm), with errors.

    PYTHONPATH=$PWD python3 benchmarks/fp8.py [--top 3] [--dtype e4m3] [--b-dtype e5m2] [--out DIR] [--only NAME]
                                              [--layouts rc cr rr cc]

For each shape, the model's top fp8 configurations are compiled, exported and loaded with gemmgen.load (public
APIs only). Each is verified on fresh random inputs (per-tensor scales passed as GPU scalars) with D poisoned
first, at the shape and at a shape that is not a tile multiple, against an fp32 reference of the same fp8
values; cuBLAS's own error against that reference is printed beside it. Then the best are timed interleaved with
torch._scaled_mm (per-tensor scales, bf16 out) on rotating input sets. --layouts picks A's and B's storage (rc, the
default: A row-major, B column-major, the K-major layouts both wgmma and cuBLAS fp8 take). In the others gemmgen's
pack launch transposes the MN-major operands into K-major copies first, inside the timed call; torch._scaled_mm
takes K-major operands only, so its timed call includes the same copies made by torch (A.contiguous(),
B.t().contiguous().t()): both sides pay for the layout. --b-dtype gives B another fp8 type than A's (the gradient GEMMs:
e4m3 x e5m2 or e5m2 x e4m3; cuBLAS takes those pairs too, but not e5m2 x e5m2). Prints a summary table last.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import load_compiled, run_main, write_report  # noqa: E402
from benchmarks.misaligned import candidates, rel_error, timed  # noqa: E402

SHAPES = {"sq4096": (4096, 4096, 4096), "sq8192": (8192, 8192, 8192),
          "llm_qkv": (4096, 6144, 4096), "llm_up": (4096, 28672, 4096)}
SETS = 3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--dtype", default="e4m3", choices=["e4m3", "e5m2"], help="A's fp8 type (and B's by default)")
    parser.add_argument("--b-dtype", default=None, choices=["e4m3", "e5m2"], help="B's fp8 type (default: --dtype)")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--layouts", nargs="*", default=["rc"], choices=["rc", "cr", "rr", "cc"],
                        help="A and B storage: r row-major, c column-major (default rc, both K-major)")
    parser.add_argument("--promote", type=int, default=0, metavar="N",
                        help="also the model's top N configurations that promote partial sums into fp32")
    args = parser.parse_args(argv)
    import torch

    import gemmgen
    from gemmgen import Kernel, Problem
    from gemmgen.codegen.nvrtc import compile_many
    from gemmgen.runtime.detect import detect_gpu

    torch.backends.cuda.matmul.allow_tf32 = False
    b_dtype = args.b_dtype or args.dtype
    pair = args.dtype if b_dtype == args.dtype else f"{args.dtype}{b_dtype}"
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    fp8_a, fp8_b = fp8[args.dtype], fp8[b_dtype]
    gpu = detect_gpu().gpu
    device = torch.cuda.get_device_name()

    def operands(m, n, k, layout="rc"):
        # Values spread over fp8's range (scaled normals), quantized with per-tensor scales as a user would, then
        # stored in the layout asked for (a column-major A, a row-major B: copies holding the same values).
        a, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
        sa, sb = a.abs().max() / 240.0, b.abs().max() / 240.0
        A, B = (a / sa).to(fp8_a), (b / sb).to(fp8_b).t()
        A = A if layout[0] == "r" else A.t().contiguous().t()
        B = B if layout[1] == "c" else B.contiguous()
        return A, B, sa.float().reshape(()), sb.float().reshape(())

    def kmajor(A, B):
        """What torch._scaled_mm takes: A row-major and B column-major (copies where they are not)."""
        return (A if A.stride(1) == 1 else A.contiguous()), (B if B.stride(0) == 1 else B.t().contiguous().t())

    def reference(A, B, sa, sb):
        return (A.float() @ B.float()) * (sa * sb)

    rows, summary = [], []
    for layout, name in [(lay, name) for lay in args.layouts for name in SHAPES]:
        m, n, k = SHAPES[name]
        if args.only and name not in args.only:
            continue
        a_layout, b_layout = ("row" if layout[0] == "r" else "col"), ("row" if layout[1] == "r" else "col")
        problem = Problem.create(m, n, k, args.dtype, a_layout, b_layout, b_dtype=b_dtype)
        ranked = candidates(problem, gpu, args.top)
        if args.promote:
            from gemmgen.rank.predict import predict
            from gemmgen.rank.ranking import model_top, rank_configs
            from gemmgen.rank.space import enumerate_space, heuristic_time

            promoted = [c for c in enumerate_space("sm90_wgmma", gpu, problem=problem) if getattr(c, "promote", 0)]
            ranked += model_top(rank_configs(promoted, problem, gpu, predict, heuristic_time), args.promote)
        kernels = [Kernel(gpu.arch, problem.operands, r.config) for r in ranked]
        built = compile_many(kernels)
        sets = []
        for _ in range(SETS):
            A, B, sa, sb = operands(m, n, k, layout)
            sets.append((A, B, torch.empty(m, n, device="cuda", dtype=torch.bfloat16), sa, sb))
        # cuBLAS's own error on the first set, against the same fp32 reference.
        A, B, _, sa, sb = sets[0]
        ref = reference(A, B, sa, sb)
        cublas_err = rel_error(torch, torch._scaled_mm(*kmajor(A, B), sa, sb, out_dtype=torch.bfloat16), ref)

        def cublas(s):   # the K-major copies (none for rc) are part of cuBLAS's call, as the pack is of gemmgen's
            torch._scaled_mm(*kmajor(s[0], s[1]), s[3], s[4], out_dtype=torch.bfloat16, out=s[2])

        loaded = []
        for r, kernel, result in zip(ranked, kernels, built):
            row = {"case": name, "layout": layout, "shape": f"{m}x{n}x{k}", "config": r.config.tag,
                   "model_tflops": r.tflops}
            if isinstance(result, Exception):
                row.update(ok=False, error=f"compile: {str(result)[:200]}")
                rows.append(row)
                print(f"  {r.config.tag}: {row['error']}", flush=True)
                continue
            gemm = load_compiled(kernel, problem, result, "gemmgen-fp8-")
            errors = []
            # A shape that is not a tile multiple, with the bundle's alignments (a column-major A's rows are M long).
            for mm, nn, kk in ((m, n, k), (m - (77 if layout[0] == "r" else 80), n + 48, k - 144)):
                A, B, sa, sb = operands(mm, nn, kk, layout)
                D = torch.full((mm, nn), float("nan"), device="cuda", dtype=torch.bfloat16)
                try:
                    gemm(A, B, D, scale_a=sa, scale_b=sb)
                    torch.cuda.synchronize()
                    errors.append(rel_error(torch, D, reference(A, B, sa, sb)))
                except gemmgen.UserError as exc:
                    errors.append(f"refused: {exc}")
            ok = all(isinstance(e, float) and e < 2e-2 for e in errors)
            row.update(ok=ok, rel_errors=errors, cublas_rel_error=cublas_err)
            rows.append(row)
            print(f"  {r.config.tag}: errors {errors} (cuBLAS {cublas_err:.2e})", flush=True)
            if ok:
                loaded.append((row, gemm))
        if not loaded:
            summary.append({"case": name, "layout": layout, "best": None})
            continue
        call = lambda g: (lambda s: g(s[0], s[1], s[2], scale_a=s[3], scale_b=s[4]))  # noqa: E731
        for fn in [cublas] + [call(g) for _, g in loaded]:
            for s in sets:
                fn(s)
        torch.cuda.synchronize()
        times = {"cublas": [], **{row["config"]: [] for row, _ in loaded}}
        for _ in range(3):
            times["cublas"].append(timed(torch, cublas, sets))
            for row, g in loaded:
                times[row["config"]].append(timed(torch, call(g), sets))
        flops = 2.0 * m * n * k
        tf = {key: flops / statistics.median(v) / 1e12 for key, v in times.items()}
        for row, _ in loaded:
            row.update(tflops=tf[row["config"]], vs_cublas=tf[row["config"]] / tf["cublas"])
        best = max((row for row, _ in loaded), key=lambda r: r["tflops"])
        promoted = [row for row, _ in loaded if "_pr" in row["config"]]
        best_promoted = max(promoted, key=lambda r: r["tflops"]) if promoted else None
        summary.append({"case": name, "layout": layout, "shape": best["shape"], "best": best["config"],
                        "tflops": best["tflops"],
                        "promoted": best_promoted and {k: best_promoted[k] for k in ("config", "tflops", "vs_cublas",
                                                                                      "rel_errors")},
                        "cublas_tflops": tf["cublas"], "vs_cublas": best["vs_cublas"],
                        "rel_error": best["rel_errors"][0], "cublas_rel_error": cublas_err})
        for _, g in loaded:
            g.close()
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dtype": args.dtype,
              "b_dtype": b_dtype, "rows": rows, "summary": summary}
    if args.out:
        layouts = "" if args.layouts == ["rc"] else "-" + "-".join(args.layouts)
        write_report(args.out, f"fp8-{pair}{layouts}.json", report)
    print(f"\n{device}, {report['date']}, {args.dtype} x {b_dtype} -> bf16, per-tensor scales, TFLOP/s; outside rc "
          "both sides' times include making the K-major copies (gemmgen's pack launch, torch's .contiguous())")
    print(f"{'case':10} {'lay':3} {'shape':18} {'gemmgen':>8} {'cuBLAS':>8} {'x cuBLAS':>8} {'err':>8} {'cuB err':>8}  best")
    for s in summary:
        if s["best"] is None:
            print(f"{s['case']:10} {s['layout']:3} no verified kernel")
            continue
        print(f"{s['case']:10} {s['layout']:3} {s['shape']:18} {s['tflops']:8.1f} {s['cublas_tflops']:8.1f} {s['vs_cublas']:8.3f} "
              f"{s['rel_error']:8.1e} {s['cublas_rel_error']:8.1e}  {s['best'][:70]}")
        if s.get("promoted"):
            p = s["promoted"]
            print(f"{'  promoted':10} {'':3} {'':18} {p['tflops']:8.1f} {'':8} {p['vs_cublas']:8.3f} {p['rel_errors'][0]:8.1e} "
                  f"{'':8}  {p['config'][:70]}")
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    run_main(main, __file__)
