#!/usr/bin/env python3
"""Which kernels cuBLAS (torch.matmul) runs for a few shapes and leading dimensions, with their GPU times.

    python3 benchmarks/cublas_kernels.py [--shapes 3000x3000x3000,4096x4096x4096] [--pad 3008] [--layouts rr,rc]

For each shape and layout pair (A's then B's: r row-major, c column-major; `rc` is torch.nn.Linear's X @ W^T): A
(M x K) and B (K x N) bf16, once at their natural leading dimension and, for rr, once as views into buffers padded
to --pad columns (128-byte rows when pad * 2 % 128 == 0). torch.profiler names the kernels;
times are CUDA-event medians of 20 runs after warm-up. Prints one line per case.
"""
from __future__ import annotations

import argparse
import statistics

import torch


def timed(fn, reps=20):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        out.append(s.elapsed_time(e) * 1e3)
    return statistics.median(out)


def kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(); torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="3000x3000x3000,3008x3008x3008,4096x4096x4096")
    ap.add_argument("--pad", type=int, default=3008)
    ap.add_argument("--layouts", default="rr", help="comma-separated layout pairs of A and B: rr, rc, cr, cc")
    args = ap.parse_args()

    def operand(rows, cols, layout, ld):
        # A column-major rows x cols operand is the transpose of a row-major cols x rows buffer.
        if layout == "r":
            return torch.randn(rows, ld, device="cuda", dtype=torch.bfloat16)[:, :cols]
        return torch.randn(cols, rows, device="cuda", dtype=torch.bfloat16).t()

    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        for layouts in args.layouts.split(","):
            for padded in (False, True):
                if padded and (layouts != "rr" or k >= args.pad or n >= args.pad):
                    continue
                lda, ldb = (args.pad, args.pad) if padded else (k, n)
                a = operand(m, k, layouts[0], lda)
                b = operand(k, n, layouts[1], ldb)
                fn = lambda: torch.matmul(a, b)
                us = timed(fn)
                print(f"{shape} {layouts} lda={lda} ldb={ldb}: {us:7.1f} us {2 * m * n * k / us / 1e6:6.1f} TF/s  "
                      f"{kernels(fn)}")


if __name__ == "__main__":
    main()
