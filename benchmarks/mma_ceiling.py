#!/usr/bin/env python3
"""The tensor-core rate mma.sync can reach on this GPU: the ceiling of the sm80_mma family on Hopper.

    PYTHONPATH=$PWD python3 benchmarks/mma_ceiling.py [--arch sm_90a]

Two kernels. mma_loop, no memory traffic: every warp issues mma.sync.m16n8k16 (bf16 in, fp32 accumulate) on register
operands, CHAINS independent accumulators deep, ITERS times; grids of 1-4 CTAs of 4-8 warps per SM. Timed with
CUDA events through gemmgen.runtime.device, median of 7 launches after a warm-up; FLOP = warps x ITERS x CHAINS x 4096. The sums are
written out so nothing is dead code. Prints TFLOP/s per launch shape, and per SM and clock at the SM clock the
driver reports (a bound: under load the card clocks lower). The ldsm_mma_* kernels add the family's main-loop
mix step by step (ldmatrix, the k-tile barrier, cp.async fills in one burst or spread over the k16 steps, and the same fills
as cp.async.bulk row copies):
see the comment above ldsm_mma_body.
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
// separate 32 KB region) with commit / wait_group 1 before the barrier, as the template pipelines them;
// 3: the same bytes per thread as two 128-byte cp.async.bulk copies (sm_90: one per 64-element operand row,
// as a padded-layout stage would need), completing on one of two alternating mbarriers that every thread
// arrives on with expect_tx; the wait for the previous k-tile's barrier replaces wait_group 1. Mode 3 asks
// whether the family's 21% copy cost is the 16 LSU instructions per thread or the bytes. 4: mode 2's copies
// spread over the k-tile's four k16 steps (4 per step, one commit per k-tile), so LDGSTS does not queue in
// one burst ahead of the next step's ldmatrix (as CUTLASS interleaves them).
__device__ __forceinline__ void mbar_wait_parity(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
template <int MODE>
__device__ __forceinline__ void ldsm_mma_body(float* out, int iters, const char* src) {
    __shared__ __align__(128) unsigned short tile[4 * 4096 / 2];
    __shared__ __align__(128) unsigned char copies[32768];   // mode 3: 255 rows of 128 B, then its two mbarriers
    for (int i = threadIdx.x; i < 4 * 4096 / 2; i += blockDim.x) tile[i] = (unsigned short)(0x3f80 ^ (i & 7));
    __syncthreads();
    unsigned base, copy_base;
    asm("{ .reg .u64 p; cvta.to.shared.u64 p, %1; cvt.u32.u64 %0, p; }" : "=r"(base) : "l"(tile));
    asm("{ .reg .u64 p; cvta.to.shared.u64 p, %1; cvt.u32.u64 %0, p; }" : "=r"(copy_base) : "l"(copies));
    const unsigned bar_base = copy_base + 255 * 128;   // static shared memory is 48 KB at most: no room beside
    if (MODE == 3) {
        if (threadIdx.x == 0) {
            for (int j = 0; j < 2; ++j)
                asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar_base + 8 * j), "r"(blockDim.x) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
    }
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
            if (MODE == 4) {
                const int t = threadIdx.x % 128, q = (i & 3) + h;   // k16 step 0-3 of the k-tile
                const char* g = src + (size_t)(((blockIdx.x * 7 + i / 4) & 511) * 32768);
#pragma unroll
                for (int c = 0; c < 4; ++c)
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                                 :: "r"(copy_base + ((4 * q + c) * 128 + t) * 16), "l"(g + ((4 * q + c) * 128 + t) * 16)
                                 : "memory");
                if (q == 3) asm volatile("cp.async.commit_group;" ::: "memory");
            }
            if (MODE == 3 && h == 0 && (i & 3) == 0) {
                const int t = threadIdx.x % 128, kt = i / 4;
                const char* g = src + (size_t)(((blockIdx.x * 7 + kt) & 511) * 32768);
                const unsigned bar = bar_base + 8 * (kt & 1);
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 256;" :: "r"(bar) : "memory");
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 128, [%2];"
                                 :: "r"(copy_base + ((2 * t + r) % 255) * 128),   // row 255 lands on row 0
                                    "l"(g + (2 * t + r) * 128), "r"(bar) : "memory");
            }
            if (MODE >= 1 && h == 1 && (i & 3) == 2) {
                if (MODE == 2 || MODE == 4) asm volatile("cp.async.wait_group 1;" ::: "memory");
                if (MODE == 3 && i >= 4) mbar_wait_parity(bar_base + 8 * ((i / 4 - 1) & 1), ((i / 4 - 1) >> 1) & 1);
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
    if (MODE == 2 || MODE == 4) asm volatile("cp.async.wait_group 0;" ::: "memory");
    if (MODE == 3 && iters >= 4) {   // the last k-tile's copies land before the CTA's shared memory goes
        const int last = (iters - 1) / 4;
        mbar_wait_parity(bar_base + 8 * (last & 1), (last >> 1) & 1);
    }
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
extern "C" __global__ void __launch_bounds__(256) ldsm_mma_spread_bar(float* out, int iters, const char* src) {
    ldsm_mma_body<4>(out, iters, src);
}
extern "C" __global__ void __launch_bounds__(256) ldsm_mma_bulk_bar(float* out, int iters, const char* src) {
    ldsm_mma_body<3>(out, iters, src);
}
"""


def manifest(entry: str, grid: int, block: int, iters: int) -> dict:
    """A one-launch manifest for gemmgen.runtime.device: out as D, the copy source as B, iters as a scalar."""
    return {"name": entry, "launches": [{
        "entry": entry, "grid": [grid, 1, 1], "block": [block, 1, 1], "cluster": [1, 1, 1], "dynamic_smem": 0,
        "params": [{"name": "out", "kind": "tensor", "tensor": "D"},
                   {"name": "iters", "kind": "scalar", "ctype": "int", "value": iters},
                   {"name": "src", "kind": "tensor", "tensor": "B"}]}]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args()
    from gemmgen.runtime.device import Device
    from gemmgen.codegen.nvrtc import compile_source

    cubin, log = compile_source("mma_loop", f"#define CHAINS {CHAINS}\n" + SOURCE,
                                (f"--gpu-architecture={args.arch}", "-std=c++17", "--ptxas-options=-v"))
    with Device() as dev:
        sms, clock_hz = dev.props.sm_count, dev.props.clock_mhz * 1e6
        module = dev.load(cubin)
        out = dev.alloc(4 * sms * 4 * 256 * 4)
        src = dev.alloc(512 * 32768)   # 16 MB: stays in the 50 MB L2, as a GEMM's re-read tiles mostly do
        dev.memset(src, 0x3c)
        start, stop = dev.event(), dev.event()

        def timed(entry: str, grid: int, block: int, iters: int) -> float:
            run = dev.prepare(manifest(entry, grid, block, iters), module, {"D": out.ptr, "B": src.ptr})
            times = []
            for rep in range(8):
                start.record()
                run.run()
                stop.record()
                dev.synchronize(entry)
                if rep:   # the first launch warms up
                    times.append(stop.elapsed_s(start))
            return statistics.median(times)

        print(log.strip().splitlines()[-1] if log.strip() else "")
        print(f"{dev.props.name}, {sms} SMs, reported SM clock {clock_hz / 1e9:.2f} GHz; mma.sync.m16n8k16 bf16->f32")
        print(f"{'kernel':>17s} {'CTAs/SM':>7s} {'warps':>5s} {'us':>9s} {'TFLOP/s':>8s} {'FLOP/clk/SM':>12s}")
        # mma_loop: CHAINS mma per iteration per warp; the ldsm kernels: 32 (one k16 step of a 64x64 warp tile).
        for entry, mmas, iters in (("mma_loop", CHAINS, ITERS), ("ldsm_mma_loop", 32, ITERS // 4),
                                   ("ldsm_mma_bar", 32, ITERS // 4), ("ldsm_mma_copy_bar", 32, ITERS // 4),
                                   ("ldsm_mma_spread_bar", 32, ITERS // 4), ("ldsm_mma_bulk_bar", 32, ITERS // 4)):
            for ctas_per_sm, warps in ((1, 4), (1, 8), (2, 4), (2, 8)):
                grid, block = sms * ctas_per_sm, warps * 32
                t = timed(entry, grid, block, iters)
                flop = grid * warps * iters * mmas * 4096
                print(f"{entry:>17s} {ctas_per_sm:7d} {warps:5d} {t * 1e6:9.1f} {flop / t / 1e12:8.1f} "
                      f"{flop / t / sms / clock_hz:12.0f}")
    return 0


if __name__ == "__main__":
    from harness import run_main

    run_main(main, __file__)   # no GPU, a bad argument: one line, exit 2
