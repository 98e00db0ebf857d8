#!/usr/bin/env python3
"""Where an unaligned row-major B costs sm80_gemv its time (GPU): the same kernels on B with different leading
dimensions, so that only the rows' alignment changes.

    PYTHONPATH=$PWD python3 benchmarks/gemv_ldb.py [--m 1] [--n 4095] [--k 4095] [--top 3] [--out DIR]

The model's top --top sm80_gemv configurations for M x N x K (bf16, A row-major, B row-major, B's rows
unaligned) are compiled twice, for unaligned and for aligned rows of B, exported and loaded (gemmgen.load). Each
runs with B as a view of a K x ldb array for ldb in {N rounded up to 8 (every row on a 16-byte boundary, the
unaligned kernel's shift-free path), N itself (unaligned for odd N), N + 4 (rows alternately 8 bytes off)}; the
aligned kernel only where ldb allows it. Every run is checked against a float32 product first (D poisoned), then
timed in CUDA graphs (40 calls per replay, median of 9) over input sets larger than L2, beside cuBLAS
(torch.matmul) on the same views.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import detected_gpu, load_compiled, run_main, write_report  # noqa: E402

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=1)
    parser.add_argument("--n", type=int, default=4095)
    parser.add_argument("--k", type=int, default=4095)
    parser.add_argument("--top", type=int, default=3, help="the model's top configurations (default 3)")
    parser.add_argument("--out", default=None, help="write gemv_ldb.json here")
    args = parser.parse_args(argv)
    import torch

    import gemmgen
    from gemmgen import Kernel, Problem
    from gemmgen.codegen.nvrtc import compile_many
    from gemmgen.rank.predict import predict
    from gemmgen.rank.ranking import rank_configs
    from gemmgen.rank.space import enumerate_space, heuristic_time

    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = detected_gpu()
    m, n, k = args.m, args.n, args.k
    family = gemmgen.families.get("sm80_gemv")
    wide = -(-n // 8) * 8
    # A Problem's leading dimensions are its widths: the unaligned kernel is built for an odd N (it serves any
    # ldb), the aligned one for N rounded up to 8 (it serves N with ldb and ldd multiples of 8). D is always a view
    # of an M x wide array, so only B's rows change between runs.
    problem_u = Problem.create(m, n | 1, k, "bf16", "row", "row")
    problem_a = Problem.create(m, wide, k, "bf16", "row", "row")
    ranked = rank_configs(enumerate_space(family, gpu, problem=problem_u), problem_u, gpu, predict, heuristic_time)
    configs = [r.config for r in ranked[:args.top]]
    kernels = [(c, "unaligned", Kernel(gpu.arch, problem_u.operands, c)) for c in configs]
    kernels += [(c, "aligned", Kernel(gpu.arch, problem_a.operands, c)) for c in configs]
    built = compile_many([kn for _, _, kn in kernels])
    ldbs = sorted({wide, n, n + 4})
    sets_count = max(2, int(3 * 50e6 // (k * max(ldbs) * 2)) + 1)
    rows = []
    for ldb in ldbs:
        full = [torch.randn(k, ldb, device="cuda").to(torch.bfloat16) for _ in range(sets_count)]
        sets = [(torch.randn(m, k, device="cuda").to(torch.bfloat16), f[:, :n],
                 torch.empty(m, wide, device="cuda", dtype=torch.bfloat16)[:, :n]) for f in full]
        ref = (sets[0][0].float() @ sets[0][1].float())
        cub = harness.graph_timed(torch, lambda s: torch.matmul(s[0], s[1], out=s[2]), sets)
        rows.append({"ldb": ldb, "kernel": "cuBLAS", "us": cub * 1e6})
        for (config, kind, kernel), compiled in zip(kernels, built):
            if isinstance(compiled, Exception):
                print(f"compile failed {config.tag} {kind}: {str(compiled)[:200]}")
                continue
            if kind == "aligned" and (ldb * 2) % 16:
                continue
            problem = problem_u if kind == "unaligned" else problem_a
            gemm = load_compiled(kernel, problem, compiled, "gemmgen-gemv-ldb-")
            try:
                sets[0][2].fill_(float("nan"))
                gemm(*sets[0])
                torch.cuda.synchronize()
                err = float((sets[0][2].double() - ref.double()).norm() / ref.double().norm())
                if not err < 1e-2:
                    rows.append({"ldb": ldb, "kernel": f"{config.tag} ({kind})", "error": err})
                    print(f"  WRONG ldb {ldb} {config.tag} {kind}: {err}")
                    continue
                t = harness.graph_timed(torch, lambda s, g=gemm: g(*s), sets)
                rows.append({"ldb": ldb, "kernel": f"{config.tag} ({kind})", "us": t * 1e6, "error": err})
            finally:
                gemm.close()
    print(f"\n{torch.cuda.get_device_name()}, {m}x{n}x{k} bf16 rr, µs (CUDA graphs, {sets_count} input sets)")
    print(f"{'ldb':>6} {'us':>8}  kernel")
    for r in rows:
        if "us" in r:
            print(f"{r['ldb']:6d} {r['us']:8.2f}  {r['kernel'].replace('sm80_gemv_', '').replace('_mma1x1x1_s1_swizzle_rr1', '')}")
    write_report(args.out, "gemv_ldb.json", {"device": torch.cuda.get_device_name(), "shape": [m, n, k], "rows": rows})
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
