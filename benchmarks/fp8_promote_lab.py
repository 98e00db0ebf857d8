#!/usr/bin/env python3
"""Where fp8 promotion's time goes: one promoted configuration against itself with parts of the promotion taken out.

    PYTHONPATH=$PWD python3 benchmarks/fp8_promote_lab.py [--shape 4096,4096,4096] [--tile CTA[:WARP][:STAGES] ...]
                                                            [--stages 5] [--edits] [--out DIR]

fp8 e4m3 (A row-major, B column-major, per-tensor scales). The kernels: each tile unpromoted, promoted every 1, 2
and 4 k-tiles where the rules allow (gemmgen's own renders, through the public API), and with --edits variants of
the promote-1 kernel made by editing its rendered source here (never switches in the templates):
  - noadd: the partial sums are not added into the fp32 accumulators (wrong results; the drain alone);
  - dephase, dephase600: the second consumer warpgroup starts each tile's main loop ~0.25 (0.6) us after the
    first, so their interval ends (drains) fall apart in time (correct results; is the cost the two drains in step?).
(Removing the wait before the adds instead makes ptxas serialize every wgmma (C7514): not a measurement.)
Each is timed CUDA-graph (40 calls per replay over rotating input sets, median of replays) beside
torch._scaled_mm with and without fast accumulation; the correct ones are also checked against the fp32 product
of the same fp8 values. Prints one table.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import detected_gpu, load_compiled, run_main, write_report  # noqa: E402

SETS = 3

# Source edits of the promote-1 kernel: (marker that must occur, replacement). Each names what it removes.
ADD_LINE = "acc[mi][i] = kt < 1 ? part[mi][i] : acc[mi][i] + part[mi][i];"
EDITS = {
    "noadd": [(ADD_LINE, "(void)0;")],
    "dephase": [("            int prev = -1;\n",
                 "            int prev = -1;\n            if (cw == 1) __nanosleep(250);\n")],
    "dephase600": [("            int prev = -1;\n",
                    "            int prev = -1;\n            if (cw == 1) __nanosleep(600);\n")],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096,4096,4096")
    ap.add_argument("--tile", action="append", default=None, metavar="CTA[:WARP][:STAGES]",
                    help="CTA tile M x N, optionally one consumer warpgroup's tile (default: two stacked in M) and "
                         "the stages (default --stages); repeatable, e.g. 128x192:128x96 (two m64 wgmma chains "
                         "per warpgroup, side by side in N)")
    ap.add_argument("--stages", type=int, default=5)
    ap.add_argument("--edits", action="store_true", help="also the promote-1 variants edited in the source")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    from gemmgen import Kernel, Problem, TileConfig
    from gemmgen.codegen.nvrtc import compile_many, compile_source, options_for
    from gemmgen.families.rules import check

    gpu = detected_gpu()
    m, n, k = (int(x) for x in args.shape.split(","))
    problem = Problem.create(m, n, k, "e4m3", "row", "col")

    def config(tile, **knobs):
        parts = tile.split(":")
        tm, tn = (int(x) for x in parts[0].split("x"))
        wm, wn = (int(x) for x in parts[1].split("x")) if len(parts) > 1 and parts[1] else (tm // 2, tn)
        stages = int(parts[2]) if len(parts) > 2 else args.stages
        return TileConfig.from_dict({"family": "sm90_wgmma", "cta": f"{tm}x{tn}x128", "warp": f"{wm}x{wn}x128",
                                     "mma": f"64x{wn}x32", "stages": stages, "warp_specialized": True,
                                     "persistent": True, **knobs})

    variants = []
    for tile in args.tile or ["128x128"]:
        for label, knobs in (("unpromoted", {}), ("promote 1", {"promote": 1}), ("promote 2", {"promote": 2}),
                             ("promote 4", {"promote": 4})):
            cfg = config(tile, **knobs)
            broken = check(cfg, gpu, gpu.arch, problem)
            if broken:
                print(f"  {tile} {label}: {broken[0]}")
                continue
            variants.append((f"{tile} {label}", cfg, None))
        if args.edits:
            variants += [(f"{tile} promote 1 {name}", config(tile, promote=1), name) for name in EDITS]

    sets = []
    for _ in range(SETS):
        a, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
        sa, sb = a.abs().max() / 240.0, b.abs().max() / 240.0
        A, Bt = (a / sa).to(torch.float8_e4m3fn), (b / sb).to(torch.float8_e4m3fn)
        sets.append((A, Bt.t(), torch.empty(m, n, device="cuda", dtype=torch.bfloat16), sa.float().reshape(()),
                     sb.float().reshape(())))
    A, B, _, sa, sb = sets[0]
    ref = (A.float() @ B.float()) * (sa * sb)

    def rel(out):
        if not bool(torch.isfinite(out).all()):
            return float("nan")
        return float((out.double() - ref.double()).norm() / ref.double().norm())

    rows = []
    for fast in (False, True):
        def cublas(s, fast=fast):
            torch._scaled_mm(s[0], s[1], s[3], s[4], out_dtype=torch.bfloat16, out=s[2], use_fast_accum=fast)
        err = rel(torch._scaled_mm(A, B, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast))
        rows.append({"kernel": f"cuBLAS{' fast' if fast else ''}", "us": harness.graph_timed(torch, cublas, sets) * 1e6,
                     "error": err})
    kernels = [Kernel(gpu.arch, problem.operands, cfg) for _, cfg, _ in variants]
    built = compile_many(kernels)
    for (name, cfg, edit), kernel, compiled in zip(variants, kernels, built):
        if isinstance(compiled, Exception):
            print(f"  {name}: {compiled}")
            continue
        if edit:
            source = compiled.source
            for marker, replacement in EDITS[edit]:
                if marker not in source:
                    print(f"  {name}: the rendered source no longer has the marker {marker[:50]!r}; skipped")
                    source = None
                    break
                source = source.replace(marker, replacement)
            if source is None:
                continue
            cubin, log = compile_source(compiled.name, source, options_for(kernel))
            compiled = dataclasses.replace(compiled, cubin=cubin, source=source, log=log)
        gemm = load_compiled(kernel, problem, compiled, "gemmgen-fp8lab-")
        D = sets[0][2]
        D.fill_(float("nan"))
        gemm(A, B, D, scale_a=sa, scale_b=sb)
        torch.cuda.synchronize()
        err = rel(D)
        us = harness.graph_timed(torch, lambda s, g=gemm: g(s[0], s[1], s[2], scale_a=s[3], scale_b=s[4]), sets) * 1e6
        rows.append({"kernel": name, "config": cfg.tag, "us": us, "error": err})
    flops = 2.0 * m * n * k
    print(f"\nfp8 e4m3 {m}x{n}x{k} rc, {torch.cuda.get_device_name()}")
    print(f"{'kernel':36s} {'us':>8s} {'TFLOP/s':>8s} {'x cuBLAS':>9s} {'rel. error':>10s}")
    base = rows[0]["us"]
    for r in rows:
        print(f"{r['kernel']:36s} {r['us']:8.1f} {flops / r['us'] / 1e6:8.1f} {base / r['us']:9.3f} {r['error']:10.2e}")
    if args.out:
        print("written:", write_report(args.out, "fp8_promote_lab.json", {"gpu": gpu.key, "shape": [m, n, k],
                                                                          "tiles": args.tile, "rows": rows}))
    return 0


if __name__ == "__main__":
    run_main(main, "fp8_promote_lab.py")
