#!/usr/bin/env python3
"""fp8 (e4m3, e5m2) sm90_wgmma kernels against cuBLAS fp8 (torch._scaled_mm), with errors.

    PYTHONPATH=$PWD python3 benchmarks/fp8.py [--top 3] [--dtype e4m3] [--b-dtype e5m2] [--out DIR] [--only NAME]
                                              [--scaling tensor,rowcol,block] [--layouts rc cr rr cc]

For each shape, the model's top fp8 configurations are compiled, exported and loaded with gemmgen.load (public
APIs only). Each is verified on fresh random inputs (per-tensor scales passed as GPU scalars) with D poisoned
first, at the shape and at a shape that is not a tile multiple, against an fp32 reference of the same fp8
values; cuBLAS's own error against that reference is printed beside it. Then the best are timed interleaved with
torch._scaled_mm (per-tensor scales, bf16 out) on rotating input sets. --layouts picks A's and B's storage (rc, the
default: A row-major, B column-major, the K-major layouts both wgmma and cuBLAS fp8 take). In the others gemmgen's
pack launch transposes the MN-major operands into K-major copies first, inside the timed call; torch._scaled_mm
takes K-major operands only, so its timed call includes the same copies made by torch (A.contiguous(),
B.t().contiguous().t()): both sides pay for the layout. Scales belong to the logical rows and columns (and 128-K
blocks), so every scaling runs in every layout with the same scale tensors. --b-dtype gives B another fp8 type than
A's (the gradient GEMMs:
e4m3 x e5m2 or e5m2 x e4m3; cuBLAS takes those pairs too, but not e5m2 x e5m2). --scaling lists the scalings to
run, each in the same run: tensor (per-tensor scales, against _scaled_mm's per-tensor scaling) and rowcol (a scale
per row of A and per column of B, quantized row by row, against _scaled_mm's rowwise scaling: scale_a (M, 1),
scale_b (1, N)), and block (DeepGEMM's: A per row and 128 of K, B per 128 x 128 block; verified against a float64
reference of the same values and scales; cuBLAS is timed with its rowwise scaling on the same fp8 values and unit
scales, the nearest fp8 product torch._scaled_mm runs everywhere, and its error is that product's against float64).
Every scaling runs with every layout and shape; a combination gemmgen refuses (no configuration passes its rules)
is skipped with a printed note. --change adds the model's first pick with some fields changed (a tile the model
ranks low, timed beside the picks); --configs adds configurations given per shape in a JSON file (another tree's
picks, so both are timed in one process, where clocks drift alike). Prints one summary table last, with a row per shape, scaling and layout.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import detected_gpu, interleaved_times, load_compiled, run_main, write_report  # noqa: E402
from benchmarks.harness import configs_for_shape, product_shape  # noqa: E402
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
    parser.add_argument("--shape", action="append", default=[], metavar="MxNxK",
                        help="products to run instead of the built-in list (repeatable; named by their shape)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--scaling", default="tensor",
                        help="comma-separated scalings to run in the same run: tensor, rowcol, block")
    parser.add_argument("--layouts", nargs="*", default=["rc"], choices=["rc", "cr", "rr", "cc"],
                        help="A and B storage: r row-major, c column-major (default rc, both K-major)")
    parser.add_argument("--change", action="append", default=[], metavar="KNOB=VALUE[,KNOB=VALUE]",
                        help="also the model's first pick with these fields changed, where the rules allow "
                             "(repeatable), e.g. cta=128x320x128,warp=64x320x128,mma=64x320x32,stages=3")
    parser.add_argument("--configs", default=None, metavar="FILE",
                        help="also these configurations: a JSON object mapping a shape 'MxNxK' to a list of "
                             "configuration dicts (e.g. another tree's picks, to time both in one process)")
    parser.add_argument("--promote", type=int, default=0, metavar="N",
                        help="also the model's top N configurations that promote partial sums into fp32")
    args = parser.parse_args(argv)
    import torch

    import gemmgen
    from gemmgen import Kernel, Problem
    from gemmgen.codegen.nvrtc import compile_many

    torch.backends.cuda.matmul.allow_tf32 = False
    b_dtype = args.b_dtype or args.dtype
    pair = args.dtype if b_dtype == args.dtype else f"{args.dtype}{b_dtype}"
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    fp8_a, fp8_b = fp8[args.dtype], fp8[b_dtype]
    gpu = detected_gpu()
    device = torch.cuda.get_device_name()

    scalings = [x for x in args.scaling.split(",") if x]
    for scaling in scalings:
        if scaling not in ("tensor", "rowcol", "block"):
            parser.error(f"--scaling must list tensor, rowcol or block, but got {scaling!r}")

    def blockwise(x, rows_per_block, fp8):
        """x (rows x K) quantized per rows_per_block rows x 128 of K: fp8 values and float32 scales."""
        rows, k = x.shape
        kb, rb = -(-k // 128), -(-rows // rows_per_block)
        padded = torch.nn.functional.pad(x, (0, kb * 128 - k, 0, rb * rows_per_block - rows))
        scale = (padded.reshape(rb, rows_per_block, kb, 128).abs().amax(dim=(1, 3)).clamp(min=1e-12) / 240.0).float()
        expand = scale.repeat_interleave(rows_per_block, dim=0).repeat_interleave(128, dim=1)[:rows, :k]
        return (x / expand).to(fp8).contiguous(), scale.contiguous()

    def dequantized(q, scale, rows_per_block):
        expand = scale.double().repeat_interleave(rows_per_block, dim=0).repeat_interleave(128, dim=1)
        return q.double() * expand[:q.shape[0], :q.shape[1]]

    def quantized(m, n, k, scaling):
        # Values spread over fp8's range (scaled normals), quantized as a user would: one scale per tensor, or
        # (rowcol) one per row of A and per column of B, over rows of unlike magnitude so the scales matter.
        a, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
        if scaling == "tensor":
            sa, sb = a.abs().max() / 240.0, b.abs().max() / 240.0
            A, Bt = (a / sa).to(fp8_a), (b / sb).to(fp8_b)
            return A, Bt.t(), sa.float().reshape(()), sb.float().reshape(())
        a = a * torch.rand(m, 1, device="cuda").mul(8).exp2()
        b = b * torch.rand(n, 1, device="cuda").mul(8).exp2()
        if scaling == "block":
            (A, sa), (Bt, sb) = blockwise(a, 1, fp8_a), blockwise(b, 128, fp8_b)
            return A, Bt.t(), sa, sb
        sa, sb = a.abs().amax(dim=1) / 240.0, b.abs().amax(dim=1) / 240.0
        A, Bt = (a / sa[:, None]).to(fp8_a), (b / sb[:, None]).to(fp8_b)
        return A, Bt.t(), sa.float().contiguous(), sb.float().contiguous()

    def operands(m, n, k, scaling, layout="rc"):
        # Quantized as above, then stored in the layout asked for (a column-major A, a row-major B: copies holding
        # the same values; the scales are the logical rows' and columns', whatever the storage).
        A, B, sa, sb = quantized(m, n, k, scaling)
        A = A if layout[0] == "r" else A.t().contiguous().t()
        B = B if layout[1] == "c" else B.contiguous()
        return A, B, sa, sb

    def kmajor(A, B):
        """What torch._scaled_mm takes: A row-major and B column-major (copies where they are not)."""
        return (A if A.stride(1) == 1 else A.contiguous()), (B if B.stride(0) == 1 else B.t().contiguous().t())

    def reference(A, B, sa, sb):
        if sa.dim() == 0:
            return (A.float() @ B.float()) * (sa * sb)
        if sa.dim() == 2:   # block scales
            return dequantized(A, sa, 1) @ dequantized(B.t(), sb, 128).t()
        return (A.double() @ B.double()) * sa.double()[:, None] * sb.double()[None, :]

    def cublas_scales(A, B, sa, sb):
        """_scaled_mm's scale arguments: the scalars, the rowwise shapes (M, 1) and (1, N), or for block scales
        unit rowwise ones (cuBLAS's stand-in)."""
        if sa.dim() == 2:
            return (torch.ones(A.shape[0], 1, device="cuda"), torch.ones(1, B.shape[1], device="cuda"))
        return (sa, sb) if sa.dim() == 0 else (sa[:, None], sb[None, :])

    rows, summary = [], []
    shapes = {text: product_shape(text) for text in args.shape} or SHAPES
    cases = [(name, shape, scaling, layout) for name, shape in shapes.items() for scaling in scalings
             for layout in args.layouts if not args.only or name in args.only]
    for name, (m, n, k), scaling, layout in cases:
        a_layout, b_layout = ("row" if layout[0] == "r" else "col"), ("row" if layout[1] == "r" else "col")
        try:
            problem = Problem.create(m, n, k, args.dtype, a_layout, b_layout, b_dtype=b_dtype, scaling=scaling)
            ranked = candidates(problem, gpu, args.top)
        except gemmgen.UserError as exc:
            ranked, why = [], str(exc)
        else:
            why = "no configuration passes the family rules"
        if not ranked:
            # The rules refuse this scaling in this layout (or the problem itself): a note, not a crash.
            print(f"  note: {name} {scaling} {layout} skipped: {why}", flush=True)
            summary.append({"case": name, "scaling": scaling, "layout": layout, "best": None, "skipped": why})
            continue
        ranked += configs_for_shape(args.configs, problem, gpu, ranked)
        if args.change:
            from benchmarks.small_latency import changed

            ranked += [v for v in changed(ranked[0], args.change, problem, gpu) if v.config not in
                       {r.config for r in ranked}]
        if args.promote:
            from gemmgen.rank.predict import predict
            from gemmgen.rank.ranking import model_top, rank_configs
            from gemmgen.rank.space import enumerate_space, heuristic_time

            # The model's top N at each promotion interval, plain and staggered, so each one's cost and accuracy
            # can be read apart.
            promoted = [c for c in enumerate_space("sm90_wgmma", gpu, problem=problem) if getattr(c, "promote", 0)]
            for key in sorted({(c.promote, c.promote_stagger) for c in promoted}):
                same = [c for c in promoted if (c.promote, c.promote_stagger) == key]
                ranked += model_top(rank_configs(same, problem, gpu, predict, heuristic_time), args.promote)
        kernels = [Kernel(gpu.arch, problem.operands, r.config) for r in ranked]
        built = compile_many(kernels)
        sets = []
        for _ in range(SETS):
            A, B, sa, sb = operands(m, n, k, scaling, layout)
            sets.append((A, B, torch.empty(m, n, device="cuda", dtype=torch.bfloat16), sa, sb, len(sets)))
        # cuBLAS's own error on the first set, against the same reference (fp32; float64 for rowcol and block,
        # where cuBLAS's unit-scaled product is held to the unscaled float64 product of the same fp8 values).
        A, B, _, sa, sb, _ = sets[0]
        scales = [cublas_scales(*s[:2], *s[3:5]) for s in sets]
        ref = reference(A, B, sa, sb) if scaling != "block" else A.double() @ B.double()
        cublas_err = rel_error(torch, torch._scaled_mm(*kmajor(A, B), *scales[0], out_dtype=torch.bfloat16), ref)

        # cuBLAS's fast accumulation (use_fast_accum: wgmma's reduced-precision adds, no promotion), for the
        # unpromoted kernels' like-for-like comparison; per-tensor scaling only (its rowwise path ignores it).
        fast = scaling == "tensor"
        fast_err = rel_error(torch, torch._scaled_mm(*kmajor(A, B), *scales[0], out_dtype=torch.bfloat16,
                                                     use_fast_accum=True), ref) if fast else None

        def cublas(s, fast_accum=False):   # the K-major copies (none for rc) are part of cuBLAS's call, as the
            torch._scaled_mm(*kmajor(s[0], s[1]), *scales[s[5]], out_dtype=torch.bfloat16, out=s[2],  # pack is
                             use_fast_accum=fast_accum)                                               # gemmgen's

        loaded = []
        for r, kernel, result in zip(ranked, kernels, built):
            row = {"case": name, "scaling": scaling, "layout": layout, "shape": f"{m}x{n}x{k}",
                   "config": r.config.tag, "model_tflops": r.tflops}
            if isinstance(result, Exception):
                row.update(ok=False, error=f"compile: {str(result)[:200]}")
                rows.append(row)
                print(f"  {r.config.tag}: {row['error']}", flush=True)
                continue
            gemm = load_compiled(kernel, problem, result, "gemmgen-fp8-")
            errors = []
            # A shape that is not a tile multiple, with the bundle's alignments (a column-major A's rows are M long).
            for mm, nn, kk in ((m, n, k), (m - (77 if layout[0] == "r" else 80), n + 48, k - 144)):
                A, B, sa, sb = operands(mm, nn, kk, scaling, layout)
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
            summary.append({"case": name, "scaling": scaling, "layout": layout, "best": None})
            continue
        call = lambda g: (lambda s: g(s[0], s[1], s[2], scale_a=s[3], scale_b=s[4]))  # noqa: E731
        cublas_fast = lambda s: cublas(s, fast_accum=True)  # noqa: E731
        contenders = {"cublas": cublas, **({"cublas_fast": cublas_fast} if fast else {}),
                      **{row["config"]: call(g) for row, g in loaded}}
        times = interleaved_times(torch, contenders, sets, timed)
        flops = 2.0 * m * n * k
        tf = {key: flops / statistics.median(v) / 1e12 for key, v in times.items()}
        for row, _ in loaded:
            row.update(tflops=tf[row["config"]], vs_cublas=tf[row["config"]] / tf["cublas"])
        best = max((row for row, _ in loaded), key=lambda r: r["tflops"])
        by_interval = {}
        for row, _ in loaded:
            interval = re.search(r"_pr(\d+)(_ps)?", row["config"])   # each interval, plain and staggered
            if interval:
                key = (int(interval.group(1)), bool(interval.group(2)))
                if key not in by_interval or row["tflops"] > by_interval[key]["tflops"]:
                    by_interval[key] = row
        summary.append({"case": name, "scaling": scaling, "layout": layout, "shape": best["shape"],
                        "best": best["config"], "tflops": best["tflops"],
                        "promoted": [{k: row[k] for k in ("config", "tflops", "vs_cublas", "rel_errors")}
                                     for _, row in sorted(by_interval.items())],
                        "cublas_fast_tflops": tf.get("cublas_fast"), "cublas_fast_rel_error": fast_err,
                        "cublas_tflops": tf["cublas"], "vs_cublas": best["vs_cublas"],
                        "rel_error": best["rel_errors"][0], "cublas_rel_error": cublas_err})
        for _, g in loaded:
            g.close()
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dtype": args.dtype,
              "b_dtype": b_dtype, "scalings": scalings, "layouts": args.layouts, "rows": rows, "summary": summary}
    if args.out:
        layouts = "" if args.layouts == ["rc"] else "-" + "-".join(args.layouts)
        write_report(args.out, f"fp8-{pair}{layouts}.json", report)
    print(f"\n{device}, {report['date']}, {args.dtype} x {b_dtype} -> bf16, TFLOP/s (cuBLAS: torch._scaled_mm with "
          "the same scaling: per-tensor, or rowwise for rowcol; unit rowwise scales for block); outside rc both "
          "sides' times include making the K-major copies (gemmgen's pack launch, torch's .contiguous())")
    print(f"{'case':10} {'scaling':7} {'lay':3} {'shape':18} {'gemmgen':>8} {'cuBLAS':>8} {'x cuBLAS':>8} {'err':>8} "
          f"{'cuB err':>8}  best")
    for s in summary:
        if s["best"] is None:
            print(f"{s['case']:10} {s['scaling']:7} {s['layout']:3} "
                  + (f"skipped: {s['skipped'][:90]}" if s.get("skipped") else "no verified kernel"))
            continue
        print(f"{s['case']:10} {s['scaling']:7} {s['layout']:3} {s['shape']:18} {s['tflops']:8.1f} "
              f"{s['cublas_tflops']:8.1f} {s['vs_cublas']:8.3f} {s['rel_error']:8.1e} {s['cublas_rel_error']:8.1e}  "
              f"{s['best'][:70]}")
        if s.get("cublas_fast_tflops"):
            print(f"{'  cuBLAS fast accumulation':48} {s['cublas_fast_tflops']:8.1f} {'':8} "
                  f"{s['cublas_fast_rel_error']:8.1e}  (use_fast_accum=True)")
        for p in s.get("promoted") or []:
            print(f"{'  promoted':10} {'':7} {'':3} {'':18} {p['tflops']:8.1f} {'':8} {p['vs_cublas']:8.3f} "
                  f"{p['rel_errors'][0]:8.1e} {'':8}  {p['config'][:70]}")
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    run_main(main, __file__)
