#!/usr/bin/env python3
"""The tensor-core rate mma.sync can reach on this GPU: the ceiling of the sm80_mma family on Hopper.

    PYTHONPATH=$PWD python3 scripts/mma_ceiling.py [--arch sm_90a]

Two kernels. mma_loop, no memory traffic: every warp issues mma.sync.m16n8k16 (bf16 in, fp32 accumulate) on register
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
extern "C" __global__ void mma_loop(float* out, int iters, const char* src) {
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

// The sm80_mma main loop's instruction mix without its global traffic: a 64x64 warp tile per k16 step is
// 4 ldmatrix.x4 for A and 4 for B (conflict-free addresses, 512 contiguous bytes each) and 4 x 8 mma.sync,
// fragments double-buffered across steps as the template does.
__device__ __forceinline__ void ldsm4(unsigned (&r)[4], unsigned addr) {
    asm("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void load_frags(unsigned (&a)[4][4], unsigned (&b)[4][4], unsigned base, int step) {
    const unsigned at = base + (threadIdx.x % 32) * 16 + (step & 3) * 4096;
#pragma unroll
    for (int i = 0; i < 4; ++i) ldsm4(a[i], at + i * 512);
#pragma unroll
    for (int i = 0; i < 4; ++i) ldsm4(b[i], at + 2048 + i * 512);
}
// MODE 0: ldmatrix + mma only; 1: plus a __syncthreads every 4 k16 steps (one 64-deep k-tile); 2: plus, per
// k-tile, the 16 16-byte cp.async per thread of a 128x128x64 CTA's stage (from an L2-resident buffer into a
// separate 32 KB region) with commit / wait_group 1 before the barrier, as the template pipelines them.
template <int MODE>
__device__ __forceinline__ void ldsm_mma_body(float* out, int iters, const char* src) {
    __shared__ __align__(128) unsigned short tile[4 * 4096 / 2];
    __shared__ __align__(128) unsigned char copies[32768];
    for (int i = threadIdx.x; i < 4 * 4096 / 2; i += blockDim.x) tile[i] = (unsigned short)(0x3f80 ^ (i & 7));
    __syncthreads();
    unsigned base, copy_base;
    asm("{ .reg .u64 p; cvta.to.shared.u64 p, %1; cvt.u32.u64 %0, p; }" : "=r"(base) : "l"(tile));
    asm("{ .reg .u64 p; cvta.to.shared.u64 p, %1; cvt.u32.u64 %0, p; }" : "=r"(copy_base) : "l"(copies));
    float acc[4][8][4];
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.0f;
    unsigned a[2][4][4], b[2][4][4];
    load_frags(a[0], b[0], base, 0);
    for (int i = 0; i < iters; i += 2) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (MODE == 2 && h == 0 && (i & 3) == 0) {
                const int t = threadIdx.x % 128;
                const char* g = src + (size_t)(((blockIdx.x * 7 + i / 4) & 511) * 32768);
#pragma unroll
                for (int c = 0; c < 16; ++c)
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                                 :: "r"(copy_base + (c * 128 + t) * 16), "l"(g + (c * 128 + t) * 16) : "memory");
                asm volatile("cp.async.commit_group;" ::: "memory");
            }
            if (MODE >= 1 && h == 1 && (i & 3) == 2) {
                if (MODE == 2) asm volatile("cp.async.wait_group 1;" ::: "memory");
                __syncthreads();
            }
            load_frags(a[h ^ 1], b[h ^ 1], base, i + h + 1);
#pragma unroll
            for (int m = 0; m < 4; ++m)
#pragma unroll
                for (int n = 0; n < 8; ++n)
                    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                        "{%8, %9}, {%0, %1, %2, %3};"
                        : "+f"(acc[m][n][0]), "+f"(acc[m][n][1]), "+f"(acc[m][n][2]), "+f"(acc[m][n][3])
                        : "r"(a[h][m][0]), "r"(a[h][m][1]), "r"(a[h][m][2]), "r"(a[h][m][3]),
                          "r"(b[h][n / 2][2 * (n % 2)]), "r"(b[h][n / 2][2 * (n % 2) + 1]));
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int n = 0; n < 8; ++n) s += acc[m][n][0] + acc[m][n][1] + acc[m][n][2] + acc[m][n][3];
    if (MODE == 2) asm volatile("cp.async.wait_group 0;" ::: "memory");
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
extern "C" __global__ void __launch_bounds__(256) ldsm_mma_loop(float* out, int iters, const char* src) {
    ldsm_mma_body<0>(out, iters, src);
}
extern "C" __global__ void __launch_bounds__(256) ldsm_mma_bar(float* out, int iters, const char* src) {
    ldsm_mma_body<1>(out, iters, src);
}
extern "C" __global__ void __launch_bounds__(256) ldsm_mma_copy_bar(float* out, int iters, const char* src) {
    ldsm_mma_body<2>(out, iters, src);
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
    out = check(cu.cuMemAlloc(4 * sms * 4 * 256 * 4))
    src = check(cu.cuMemAlloc(512 * 32768))   # 16 MB: stays in the 50 MB L2, as a GEMM's re-read tiles mostly do
    check(cu.cuMemsetD8(src, 0x3c, 512 * 32768))
    start, stop = check(cu.cuEventCreate(0)), check(cu.cuEventCreate(0))

    def timed(func, grid: int, block: int, iters: int) -> float:
        p_out = np.array([int(out)], dtype=np.uint64)
        p_iters = np.array([iters], dtype=np.int32)
        p_src = np.array([int(src)], dtype=np.uint64)
        params = np.array([p_out.ctypes.data, p_iters.ctypes.data, p_src.ctypes.data], dtype=np.uint64)
        times = []
        for rep in range(8):
            check(cu.cuEventRecord(start, 0))
            check(cu.cuLaunchKernel(func, grid, 1, 1, block, 1, 1, 0, 0, params.ctypes.data, 0))
            check(cu.cuEventRecord(stop, 0))
            check(cu.cuEventSynchronize(stop))
            if rep:
                times.append(check(cu.cuEventElapsedTime(start, stop)) / 1e3)
        return statistics.median(times)

    print(log.strip().splitlines()[-1] if log.strip() else "")
    print(f"{sms} SMs, reported SM clock {clock_khz / 1e6:.2f} GHz; mma.sync.m16n8k16 bf16->f32")
    print(f"{'kernel':>14s} {'CTAs/SM':>7s} {'warps':>5s} {'us':>9s} {'TFLOP/s':>8s} {'FLOP/clk/SM':>12s}")
    # mma_loop: CHAINS mma per iteration per warp; ldsm_mma_loop: 32 mma (one k16 step of a 64x64 warp tile).
    for name, mmas, iters in ((b"mma_loop", CHAINS, ITERS), (b"ldsm_mma_loop", 32, ITERS // 4),
                              (b"ldsm_mma_bar", 32, ITERS // 4), (b"ldsm_mma_copy_bar", 32, ITERS // 4)):
        func = check(cu.cuModuleGetFunction(module, name))
        for ctas_per_sm, warps in ((1, 4), (1, 8), (2, 4), (2, 8)):
            grid, block = sms * ctas_per_sm, warps * 32
            t = timed(func, grid, block, iters)
            flop = grid * warps * iters * mmas * 4096
            print(f"{name.decode():>14s} {ctas_per_sm:7d} {warps:5d} {t * 1e6:9.1f} {flop / t / 1e12:8.1f} "
                  f"{flop / t / sms / (clock_khz * 1e3):12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
