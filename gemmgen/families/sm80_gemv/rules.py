"""sm80_gemv's feasibility rules and resource estimates (row-major B streamed along N, CUDA-core FMAs)."""
from __future__ import annotations

from ...model.arch import Arch, Gpu
from ...model.problem import Layout, Operands, Problem
from ..base import Rule, pow2
from .config import GemvConfig

VEC = 8            # columns per thread: one 16-byte vector of 16-bit elements per row of B
WARP_N = 32 * VEC  # columns per warp
ROWS = (1, 2, 4, 8, 16)  # rows of D a CTA covers: every thread keeps rows x 8 fp32 sums
A_CHUNK = 128      # rows of K whose A values one CTA stages in shared memory at a time (fp32, [k][m])


def check(config: GemvConfig, gpu: Gpu, arch: Arch, problem: "Problem | None", operands: "Operands | None",
          rule: Rule) -> None:
    cta, warp, mma = config.cta, config.warp, config.mma
    rule((mma.m, mma.n, mma.k) == (1, 1, 1), "sm80_gemv multiplies on CUDA cores: mma must be", str(mma), "1x1x1")
    rule(cta.m in ROWS, "sm80_gemv CTA tile M (rows of D every CTA covers) must be 1, 2, 4, 8 or 16", cta.m,
         "1,2,4,8,16")
    rule(warp.m == cta.m, "sm80_gemv warps hold every row of the CTA tile: warp tile M must equal CTA tile M",
         warp.m, cta.m)
    rule(warp.n == WARP_N, "sm80_gemv warp tile N must be 256 (32 lanes x one 16-byte vector)", warp.n, WARP_N)
    rule(cta.k in (1, 2, 4, 8), "sm80_gemv CTA tile K (rows of B each thread loads per iteration) must be 1, 2, 4 "
         "or 8", cta.k, "1,2,4,8")
    rule(pow2(config.k_warps) and config.k_warps <= 8, "k_warps must be 1, 2, 4 or 8", config.k_warps, "1,2,4,8")
    rule(config.stages == 1, "sm80_gemv stages must be 1 (loads in flight come from cta.k rows per thread)",
         config.stages, 1)
    rule(config.cluster.size == 1, "sm80_gemv runs without thread-block clusters", str(config.cluster), "1x1")
    # 512 threads get 128 registers each, and ptxas spilled 8-16 bytes there in configurations the estimate below
    # puts at 92-112 (1 row with the fused split-K's reduction, 4 rows with N's end masked): none of them was
    # among the fastest measured (docs/lab-data/h100-sxm/gemv-ragged-*), so CTAs keep to 256 threads.
    rule(config.threads <= 256, "sm80_gemv CTAs must have at most 256 threads (warps across N x k_warps <= 8)",
         config.threads, 256)
    if operands is not None:
        rule(operands.c_dtype is operands.a_dtype, "sm80_gemv writes D in the inputs' dtype",
             operands.c_dtype.value, operands.a_dtype.value)
        # B's rows are read along N, eight contiguous elements per thread: column-major B (K contiguous) is what
        # sm80_skinny streams.
        rule(operands.b_layout is Layout.ROW, "sm80_gemv reads B's rows along N (row-major B)",
             operands.b_layout.value, Layout.ROW.value)
        if operands.align_b < VEC:
            rule(_regs(config, aligned=False) <= 255, "estimated registers per thread must be at most 255 (rows of "
                 "B off 16-byte boundaries hold two vectors each)", _regs(config, aligned=False), 255)
    if problem is not None:
        rule(problem.m <= cta.m, "sm80_gemv covers every row of D in one CTA tile: M must be at most CTA tile M",
             problem.m, cta.m)


def a_chunk(config: GemvConfig) -> int:
    """Rows of A staged per chunk: A_CHUNK, a whole number of the CTA's iterations (k_warps x cta.k rows)."""
    step = max(1, config.k_warps * config.cta.k)  # a broken config (k_warps 0) is reported by the rules, not here
    return max(A_CHUNK, step) // step * step


def smem_bytes(config: GemvConfig, operands: "Operands | None" = None) -> int:
    """The staged A chunk (fp32 [k][m]) during the main loop, then, in the same bytes, the K-split warps' meeting
    place (with k_warps > 1 every K group parks its rows x 8 sums per lane)."""
    staged = a_chunk(config) * config.cta.m * 4
    park = config.k_warps * config.cta.m * config.cta.n * 4 if config.k_warps > 1 else 0
    return max(staged, park)


def regs_estimate(config: GemvConfig) -> int:
    """rows x 8 fp32 sums (the estimate for aligned rows of B; the rules check unaligned ones' with the operands);
    per row of B in flight its vector (4 words) and the rows' A values, which ptxas loads
    from shared memory for every row of the iteration at once; 8 converted B values, ~16 for a shifted pair's
    words, ~40 for addresses and loop state. (16 rows x 4 rows of B was estimated at 184 this way without the A
    values and spilled 12 bytes at 255 registers.)"""
    return _regs(config, aligned=True)


def _regs(config: GemvConfig, aligned: bool) -> int:
    # An unaligned row keeps a second vector per row of the iteration (lane 31's next one, or the ragged end's
    # elements), loaded with the first.
    vectors = 4 if aligned else 8
    return config.cta.m * VEC + config.cta.k * (vectors + config.cta.m) + VEC + 16 + 40


__all__ = ["A_CHUNK", "ROWS", "VEC", "WARP_N", "a_chunk", "check", "regs_estimate", "smem_bytes"]
