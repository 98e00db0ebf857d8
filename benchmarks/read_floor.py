#!/usr/bin/env python3
"""How fast can one launch read B? The floor under a decode-sized product (M = 1..16), measured the way the
products are timed: a streaming read kernel (16-byte non-allocating loads, U loads in flight per thread) over
the bytes of B, CUDA-graph timed over input sets that rotate past L2, beside cuBLAS on the products themselves.

    PYTHONPATH=$PWD python3 benchmarks/read_floor.py [--mb 33.5] [--out DIR]

Each row is one grid (CTAs x threads, U, and whether a CTA reads one contiguous chunk, as a GEMM tile row does,
or strides over the whole array): graph-timed µs per read and the rate, so "90% of HBM" has a measured meaning on
this card. Needs CuPy for the read kernel (a benchmark only; the product code never uses it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import run_main, write_report  # noqa: E402

SOURCE = r"""
template <int U, bool CHUNKED>
__global__ void read_floor(const uint4* __restrict__ p, unsigned long long n16, unsigned* out) {
  unsigned acc = 0;
  unsigned long long begin, end, step;
  if (CHUNKED) {  // CTA b reads its own contiguous chunk, as one tile row of B is read by one CTA
    unsigned long long chunk = (n16 + gridDim.x - 1) / gridDim.x;
    begin = blockIdx.x * chunk + threadIdx.x;
    end = min(n16, (unsigned long long)(blockIdx.x + 1) * chunk);
    step = blockDim.x;
  } else {
    begin = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    end = n16;
    step = (unsigned long long)gridDim.x * blockDim.x;
  }
  unsigned long long i = begin;
  for (; i + (U - 1) * step < end; i += U * step) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + i + u * step));
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < end; i += step) { uint4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x9e3779b9u) out[0] = acc;  // never true for the random data: keeps the loads alive
}

// A GEMM tile's pattern: CTA b owns 64 rows of a (rows x row_bytes) matrix and a 1/splits share of their bytes, and
// reads W bytes of each of its rows per step (a k-tile of 128 bytes per row is W = 128), U steps in flight.
template <int W, int U>
__global__ void read_rows(const char* __restrict__ p, int row_bytes, int splits, unsigned* out) {
  constexpr int VPR = W / 16, VPT = 64 * VPR / 256;  // vectors per row per step, per thread per step (256 threads)
  const int tile = blockIdx.x / splits, part = blockIdx.x % splits;
  const int share = row_bytes / splits, steps = share / W;
  const char* base = p + (size_t)tile * 64 * row_bytes + (size_t)part * share;
  unsigned acc = 0;
  for (int s = 0; s < steps; s += U) {
    uint4 v[U][VPT];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        const int vec = threadIdx.x + j * 256, row = vec / VPR, col = vec % VPR;
        const char* q = base + (size_t)row * row_bytes + (size_t)(s + u) * W + col * 16;
        if (s + u < steps)
          asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                       : "=r"(v[u][j].x), "=r"(v[u][j].y), "=r"(v[u][j].z), "=r"(v[u][j].w) : "l"(q));
        else v[u][j] = make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < VPT; ++j) acc ^= v[u][j].x ^ v[u][j].y ^ v[u][j].z ^ v[u][j].w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}
"""

GRIDS = [(64, 256, 8, True), (128, 256, 8, True), (132, 512, 4, False), (132, 512, 8, False), (132, 1024, 4, False),
         (264, 512, 4, False), (264, 512, 8, False), (528, 256, 8, False), (1056, 256, 4, False),
         (132, 512, 8, True), (264, 512, 8, True)]
ROWS = [(128, 8, 1), (256, 4, 1), (512, 2, 1), (128, 8, 2), (256, 4, 2), (512, 2, 2)]  # (W, U, splits) at 4096 rows
PRODUCTS = ("1,4096,4096,rc", "16,4096,4096,rr", "16,4096,4096,rc", "8,4096,4096,rc", "1,4096,14336,rc",
            "16,14336,4096,rc")
SETS = 4


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=33.554432, help="bytes read per call, in MB (default: 4096x4096 bf16)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    n16 = int(args.mb * 1e6) // 16
    bufs = [torch.randint(0, 2**31 - 1, (n16 * 4,), dtype=torch.int32, device="cuda") for _ in range(SETS)]
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    module = cp.RawModule(code=SOURCE, options=("-std=c++17",),
                          name_expressions=[f"read_floor<{u}, {'true' if c else 'false'}>"
                                            for u in (4, 8) for c in (True, False)]
                          + [f"read_rows<{w}, {u}>" for w, u, _ in ROWS])
    rows = []
    for ctas, threads, u, chunked in GRIDS:
        fn_k = module.get_function(f"read_floor<{u}, {'true' if chunked else 'false'}>")

        def read(s, fn_k=fn_k, ctas=ctas, threads=threads):
            with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                fn_k((ctas,), (threads,), (s[0].data_ptr(), cp.uint64(n16), out.data_ptr()))

        sets = [(b,) for b in bufs]
        us = statistics.median(harness.graph_timed(torch, read, sets, 40, 7) * 1e6 for _ in range(3))
        rate = n16 * 16 / us / 1e6
        rows.append({"kind": "read", "ctas": ctas, "threads": threads, "loads_in_flight": u, "chunked": chunked,
                     "graph_us": us, "tb_per_s": rate})
        print(f"read {args.mb:.1f} MB  {ctas:5d} CTAs x {threads:4d}  U={u}  {'chunked' if chunked else 'strided'}"
              f"  {us:6.2f} us  {rate:5.2f} TB/s", flush=True)
    row_bytes = n16 * 16 // 4096
    for w, u, splits in ROWS:
        fn_k = module.get_function(f"read_rows<{w}, {u}>")

        def read(s, fn_k=fn_k, splits=splits):
            with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                fn_k((64 * splits,), (256,), (s[0].data_ptr(), cp.int32(row_bytes), cp.int32(splits), out.data_ptr()))

        us = statistics.median(harness.graph_timed(torch, read, [(b,) for b in bufs], 40, 7) * 1e6 for _ in range(3))
        rate = n16 * 16 / us / 1e6
        rows.append({"kind": "rows", "ctas": 64 * splits, "row_step_bytes": w, "steps_in_flight": u, "graph_us": us,
                     "tb_per_s": rate})
        print(f"rows 4096 x {row_bytes} B  {64 * splits:4d} CTAs  {w:4d} B a row a step, {u} steps in flight"
              f"  {us:6.2f} us  {rate:5.2f} TB/s", flush=True)
    del bufs
    for text in PRODUCTS:
        problem = harness.shape_problem(text)
        n, k = problem.n, problem.k
        sets = [harness.layout_operands(torch, problem, torch.bfloat16) for _ in range(SETS)]

        def cublas(s):
            torch.matmul(s[0], s[1], out=s[2])

        us = statistics.median(harness.graph_timed(torch, cublas, sets, 40, 7) * 1e6 for _ in range(3))
        mb = n * k * 2 / 1e6
        rows.append({"kind": "cublas", "shape": problem.label, "graph_us": us, "b_tb_per_s": mb / us})
        print(f"cuBLAS {problem.label:24s} {us:6.2f} us  B read at {mb / us:5.2f} TB/s", flush=True)
        del sets
    if args.out:
        print("written:", write_report(args.out, "read_floor.json", {"gpu": torch.cuda.get_device_name(), "rows": rows}))
    return 0


if __name__ == "__main__":
    run_main(main, "read_floor.py")
