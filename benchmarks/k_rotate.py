#!/usr/bin/env python3
"""Do CTAs that read their operands at the same K offset at the same time cost DRAM bandwidth? The model's picks
with each tile's k-loop rotated, at packed and padded leading dimensions, graph-timed beside cuBLAS.

    PYTHONPATH=$PWD python3 benchmarks/k_rotate.py [--shape M,N,K,LAYOUTS ...] [--pad 64] [--top 1] [--out DIR]

A decode-sized product (16x4096x4096, B K-major) streams B's 4096 rows of 8 KB from 64 CTAs; every CTA walks K
from 0, so at any moment the requests in flight share their low 13 address bits (rows are a power of two apart)
and differ only above them. If the memory system maps those bits to channels, the requests crowd a few channels
while a plain read striding over the whole array (benchmarks/read_floor.py) spreads over all of them: 11.4 us for
33.5 MB against the GEMM's 13.6-13.8. Two ways to tell: the same kernel on views whose rows are padded (`--pad`
elements more per leading dimension, rows no longer a power of two apart), and the same kernel with its k-loop
rotated per tile (the edit `k_rotate` of benchmarks/ncu_kernels.py: tile t starts at k-tile t mod K-tiles, its
own sum in a different order), each at packed rows. Every kernel is verified once with D poisoned. Prints one row
per (shape, leading dimension, kernel); --out also writes k_rotate.json.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import run_main, write_report  # noqa: E402
from benchmarks.ncu_kernels import edited  # noqa: E402

SHAPES = ("1,4096,4096,rc", "16,4096,4096,rc", "16,4096,4096,rr", "16,14336,4096,rc", "64,4096,4096,rc",
          "128,8192,8192,rc", "100,5000,3000,rc", "4096,4096,4096,rc")
SETS = 4


def operand(torch, rows: int, cols: int, major: str, ld: int):
    """A rows x cols bf16 operand, row- or column-major, as a view into a buffer whose leading dimension is ld."""
    if major == "row":
        return torch.randn(rows, ld, device="cuda").to(torch.bfloat16)[:, :cols]
    return torch.randn(cols, ld, device="cuda").to(torch.bfloat16)[:, :rows].t()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, metavar="M,N,K,LAYOUTS")
    ap.add_argument("--pad", type=int, default=64, help="elements added to A's and B's leading dimension")
    ap.add_argument("--top", type=int, default=1, help="model-ranked configurations per shape")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    from gemmgen.codegen.nvrtc import compile_many

    gpu, ranked_by_shape = harness.ranked_shapes(args.shape or SHAPES)
    rows = []
    for problem, ranked in ranked_by_shape:
        padded = problem.with_leading(problem.lda + args.pad, problem.ldb + args.pad, 0)
        configs = [r.config for r in ranked[:args.top]]
        cases = [(p, c) for p in (problem, padded) for c in configs]
        kernels = [harness.kernel_for(p, c, gpu.arch) for p, c in cases]
        built = compile_many(kernels, None)
        for view in (problem, padded):
            sets = []
            for _ in range(SETS):
                a = operand(torch, view.m, view.k, view.a_layout.value, view.lda)
                b = operand(torch, view.k, view.n, view.b_layout.value, view.ldb)
                sets.append((a, b, torch.empty(view.m, view.n, device="cuda", dtype=torch.bfloat16)))
            fns = {"cuBLAS": lambda s: torch.matmul(s[0], s[1], out=s[2])}
            for (p, config), kernel, compiled in zip(cases, kernels, built):
                if p is not view:
                    continue
                gemm, _ = harness.checked_load(torch, kernel, p, compiled, sets[0], "gemmgen-krot-")
                if gemm is None:
                    continue
                fns[config.tag] = lambda s, g=gemm: g(*s)
                variant = edited(kernel, p, compiled, "k_rotate")
                err = variant and harness.poisoned_error(torch, variant, *sets[0])
                if variant is None or not err < 1e-2:
                    print(f"  {config.tag} +k_rotate: {'does not apply' if variant is None else err}", flush=True)
                    continue
                fns[config.tag + " +k_rotate"] = lambda s, g=variant: g(*s)
            seconds = harness.interleaved_times(torch, fns, sets, harness.graph_timed, args.passes, alternate=True)
            cublas = statistics.median(seconds["cuBLAS"])
            b_bytes = view.k * view.n * 2
            for name, ts in seconds.items():
                t = statistics.median(ts)
                row = {"shape": problem.label, "lda": view.lda, "ldb": view.ldb, "kernel": name, "us": t * 1e6,
                       "b_tb_s": b_bytes / t / 1e12, "vs_cublas": cublas / t}
                rows.append(row)
                print(f"{problem.label:26} ldb {view.ldb:6d} {t * 1e6:9.2f} us  B {row['b_tb_s']:5.2f} TB/s  "
                      f"{row['vs_cublas']:5.2f}x  {name.replace('sm90_wgmma_', '')[:80]}", flush=True)
            del sets
    if args.out:
        write_report(args.out, "k_rotate.json", {"gpu": torch.cuda.get_device_name(), "rows": rows})
    return 0


if __name__ == "__main__":
    run_main(main, "k_rotate.py")
