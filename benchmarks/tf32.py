#!/usr/bin/env python3
"""fp32 inputs on Hopper's tensor cores as tf32 (sm90_wgmma, wgmma m64nNk8, fp32 D) against cuBLAS tf32.

    PYTHONPATH=$PWD python3 benchmarks/tf32.py [--top 3] [--out DIR] [--only NAME ...] [--layouts rc cr rr cc]

For each shape, the model's top configurations are compiled, exported and loaded with gemmgen.load (public APIs).
Each is verified on fresh random inputs with D poisoned first, at the shape and at one that is not a tile
multiple, against a float64 reference; cuBLAS tf32's own error is printed beside it. Then the best are timed
interleaved with torch.mm under allow_tf32 (cuBLAS tf32) and with TF32 off (cuBLAS fp32), on rotating input sets.
--layouts picks A's and B's storage (rc, the default: A row-major, B column-major, both K-major, which tf32 wgmma
reads); in the others gemmgen's pack launch transposes the MN-major operands into K-major copies inside the timed
call, and torch.mm takes the operands as they are (cuBLAS handles every layout itself, with no copy). Prints a
summary table last.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import detected_gpu, interleaved_times, load_compiled, run_main, write_report  # noqa: E402
from benchmarks.harness import configs_for_shape, product_shape  # noqa: E402
from benchmarks.misaligned import candidates, rel_error, timed  # noqa: E402

SHAPES = {"sq4096": (4096, 4096, 4096), "sq8192": (8192, 8192, 8192), "llm_qkv": (4096, 6144, 4096)}
SETS = 3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--shape", action="append", default=[], metavar="MxNxK",
                        help="products to run instead of the built-in list (repeatable; named by their shape)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--configs", default=None, metavar="FILE",
                        help="also these configurations: a JSON object mapping a shape 'MxNxK' to a list of "
                             "configuration dicts (e.g. another tree's picks, to time both in one process)")
    parser.add_argument("--layouts", nargs="*", default=["rc"], choices=["rc", "cr", "rr", "cc"],
                        help="A and B storage: r row-major, c column-major (default rc, both K-major)")
    parser.add_argument("--x3", action="store_true",
                        help="3xTF32 kernels (split3: fp32 accuracy from three tf32 products) instead of plain tf32")
    args = parser.parse_args(argv)
    import torch

    from gemmgen import Kernel, Problem
    from gemmgen.codegen.nvrtc import compile_many

    gpu = detected_gpu()
    device = torch.cuda.get_device_name()

    def cublas_mm(a, b, out, tf32: bool):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.mm(a, b, out=out)

    def operand(rows, cols, layout: str):
        """rows x cols fp32, row-major ("r") or column-major ("c")."""
        return torch.randn(rows, cols, device="cuda") if layout == "r" else torch.randn(cols, rows, device="cuda").t()

    rows, summary = [], []
    shapes = {text: product_shape(text) for text in args.shape} or SHAPES
    for layout, name in [(lay, name) for lay in args.layouts for name in shapes]:
        m, n, k = shapes[name]
        if args.only and name not in args.only:
            continue
        problem = Problem.create(m, n, k, "f32", "row" if layout[0] == "r" else "col",
                                 "row" if layout[1] == "r" else "col", fp32_math="3xtf32" if args.x3 else None)
        if args.x3:
            from gemmgen.rank.predict import predict
            from gemmgen.rank.ranking import model_top, rank_configs
            from gemmgen.rank.space import enumerate_space, heuristic_time

            split = [c for c in enumerate_space("sm90_wgmma", gpu, problem=problem) if getattr(c, "split3", False)]
            ranked = model_top(rank_configs(split, problem, gpu, predict, heuristic_time), args.top)
        else:
            ranked = [r for r in candidates(problem, gpu, args.top) if not getattr(r.config, "split3", False)]
        ranked = [r for r in ranked if r.config.family == "sm90_wgmma"]
        ranked += configs_for_shape(args.configs, problem, gpu, ranked)
        kernels = [Kernel(gpu.arch, problem.operands, r.config) for r in ranked]
        built = compile_many(kernels)
        sets = [(operand(m, k, layout[0]), operand(k, n, layout[1]), torch.empty(m, n, device="cuda"))
                for _ in range(SETS)]
        A, B, _ = sets[0]
        ref = A.double() @ B.double()
        out = torch.empty(m, n, device="cuda")
        cublas_mm(A, B, out, not args.x3)   # the cuBLAS of the same accuracy class: tf32, or fp32 for 3xTF32
        cublas_err = rel_error(torch, out, ref)
        limit = 1e-5 if args.x3 else 5e-3
        loaded = []
        for r, kernel, result in zip(ranked, kernels, built):
            row = {"case": name, "layout": layout, "shape": f"{m}x{n}x{k}", "config": r.config.tag,
                   "model_tflops": r.tflops}
            if isinstance(result, Exception):
                row.update(ok=False, error=f"compile: {str(result)[:200]}")
                rows.append(row)
                continue
            gemm = load_compiled(kernel, problem, result, "gemmgen-tf32-")
            errors = []
            # Not a tile multiple, with the bundle's alignments (a column-major A's rows are M long).
            for mm, nn, kk in ((m, n, k), (m - (77 if layout[0] == "r" else 80), n + 52, k - 36)):
                a, b = operand(mm, kk, layout[0]), operand(kk, nn, layout[1])
                d = torch.full((mm, nn), float("nan"), device="cuda")
                gemm(a, b, d)
                torch.cuda.synchronize()
                errors.append(rel_error(torch, d, a.double() @ b.double()))
            ok = all(e < limit for e in errors)   # NaN compares False
            row.update(ok=ok, rel_errors=errors, cublas_tf32_rel_error=cublas_err)
            rows.append(row)
            print(f"  {r.config.tag}: errors {errors} (cuBLAS tf32 {cublas_err:.2e})", flush=True)
            if ok:
                loaded.append((row, gemm))
        if not loaded:
            summary.append({"case": name, "layout": layout, "best": None})
            continue
        contenders = {"cublas_tf32": lambda s: cublas_mm(s[0], s[1], s[2], True),
                      "cublas_fp32": lambda s: cublas_mm(s[0], s[1], s[2], False)}
        contenders.update({row["config"]: (lambda s, g=g: g(*s)) for row, g in loaded})
        times = interleaved_times(torch, contenders, sets, timed)
        flops = 2.0 * m * n * k
        tf = {key: flops / statistics.median(v) / 1e12 for key, v in times.items()}
        for row, _ in loaded:   # every verified kernel's figure, not only the best's
            row.update(tflops=tf[row["config"]], vs_cublas_tf32=tf[row["config"]] / tf["cublas_tf32"])
        best = max((row for row, _ in loaded), key=lambda r: tf[r["config"]])
        summary.append({"case": name, "layout": layout, "shape": best["shape"], "best": best["config"], "tflops": tf[best["config"]],
                        "cublas_tf32_tflops": tf["cublas_tf32"], "cublas_fp32_tflops": tf["cublas_fp32"],
                        "vs_cublas_tf32": tf[best["config"]] / tf["cublas_tf32"],
                        "vs_cublas_fp32": tf[best["config"]] / tf["cublas_fp32"], "rel_error": best["rel_errors"][0],
                        "cublas_tf32_rel_error": cublas_err})
        for _, g in loaded:
            g.close()
    torch.backends.cuda.matmul.allow_tf32 = False
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows,
              "summary": summary}
    if args.out:
        layouts = "" if args.layouts == ["rc"] else "-" + "-".join(args.layouts)
        write_report(args.out, ("tf32x3" if args.x3 else "tf32") + layouts + ".json", report)
    math = "3xTF32" if args.x3 else "tf32"
    print(f"\n{device}, {report['date']}, fp32 in ({math} math) -> fp32, TFLOP/s; cuB err is cuBLAS "
          f"{'fp32' if args.x3 else 'tf32'}'s")
    print(f"{'case':8} {'lay':3} {'shape':16} {'gemmgen':>8} {'cuB tf32':>8} {'cuB fp32':>8} {'x tf32':>7} {'x fp32':>7} "
          f"{'err':>8} {'cuB err':>8}  best")
    for s in summary:
        if s["best"] is None:
            print(f"{s['case']:8} {s['layout']:3} no verified kernel")
            continue
        print(f"{s['case']:8} {s['layout']:3} {s['shape']:16} {s['tflops']:8.1f} {s['cublas_tf32_tflops']:8.1f} "
              f"{s['cublas_fp32_tflops']:8.1f} {s['vs_cublas_tf32']:7.3f} {s['vs_cublas_fp32']:7.3f} {s['rel_error']:8.1e} "
              f"{s['cublas_tf32_rel_error']:8.1e}  {s['best'][:64]}")
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    run_main(main, __file__)
