#!/usr/bin/env python3
"""The tensor-core rate mma.sync can reach on this GPU: the ceiling of the sm80_mma family on Hopper.

    PYTHONPATH=$PWD python3 scripts/mma_ceiling.py [--arch sm_90a]

One kernel, no memory traffic: every warp issues mma.sync.m16n8k16 (bf16 in, fp32 accumulate) on register
operands, CHAINS independent accumulators deep, ITERS times; grids of 1-4 CTAs of 4-8 warps per SM. Timed with
CUDA events (driver API), median of 7 launches after a warm-up; FLOP = warps x ITERS x CHAINS x 4096. The sums are
written out so nothing is dead code. Prints TFLOP/s per launch shape, and per SM and clock at the SM clock the
driver reports (a bound: under load the card clocks lower).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHAINS = 8
ITERS = 4096

SOURCE = r"""
extern "C" __global__ void mma_loop(float* out, int iters) {
    const unsigned t = threadIdx.x;
    // Operands derived from the thread index, so the compiler cannot fold them (values are irrelevant).
    const unsigned a0 = 0x3f803f80u ^ t, a1 = 0x3f003f00u ^ t, a2 = 0x3e803e80u ^ (t << 1), a3 = 0x3f403f40u ^ t;
    const unsigned b0 = 0x3f803f00u ^ (t >> 1), b1 = 0x3e003e80u ^ t;
    float acc[CHAINS][4];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[c][e] = 0.0f;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                         "{%8, %9}, {%0, %1, %2, %3};"
                         : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    out[blockIdx.x * blockDim.x + t] = s;
}
"""


def check(result):
    """A driver call's value(s), or exit naming the error: cuda.bindings returns (CUresult, values...)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(getattr(err, "value", err)) != 0:
        raise SystemExit(f"mma_ceiling: CUDA error {err}")
    return values[0] if len(values) == 1 else (values or None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args()
    import numpy as np
    from cuda.bindings import driver as cu

    from gemmgen.nvrtc import compile_source

    cubin, log = compile_source("mma_loop", f"#define CHAINS {CHAINS}\n" + SOURCE,
                                (f"--gpu-architecture={args.arch}", "-std=c++17", "--ptxas-options=-v"))
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(0))
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    sms = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    clock_khz = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev))
    module = check(cu.cuModuleLoadData(cubin))
    func = check(cu.cuModuleGetFunction(module, b"mma_loop"))
    out = check(cu.cuMemAlloc(4 * sms * 4 * 256 * 4))
    start, stop = check(cu.cuEventCreate(0)), check(cu.cuEventCreate(0))
    rows = []
    for ctas_per_sm in (1, 2, 4):
        for warps in (4, 8):
            grid, block = sms * ctas_per_sm, warps * 32
            p_out = np.array([int(out)], dtype=np.uint64)
            p_iters = np.array([ITERS], dtype=np.int32)
            params = np.array([p_out.ctypes.data, p_iters.ctypes.data], dtype=np.uint64)
            times = []
            for rep in range(8):
                check(cu.cuEventRecord(start, 0))
                check(cu.cuLaunchKernel(func, grid, 1, 1, block, 1, 1, 0, 0, params.ctypes.data, 0))
                check(cu.cuEventRecord(stop, 0))
                check(cu.cuEventSynchronize(stop))
                ms = check(cu.cuEventElapsedTime(start, stop))
                if rep:
                    times.append(ms / 1e3)
            t = statistics.median(times)
            flop = grid * warps * ITERS * CHAINS * 4096
            tflops = flop / t / 1e12
            rows.append((ctas_per_sm, warps, t * 1e6, tflops, flop / t / sms / (clock_khz * 1e3)))
    print(log.strip().splitlines()[-1] if log.strip() else "")
    print(f"{sms} SMs, reported SM clock {clock_khz / 1e6:.2f} GHz; mma.sync.m16n8k16 bf16->f32, {CHAINS} chains")
    print(f"{'CTAs/SM':>7s} {'warps':>5s} {'us':>9s} {'TFLOP/s':>8s} {'FLOP/clk/SM':>12s}")
    for ctas, warps, us, tf, per in rows:
        print(f"{ctas:7d} {warps:5d} {us:9.1f} {tf:8.1f} {per:12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
