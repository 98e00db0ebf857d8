"""sm80_skinny's feasibility rules and resource estimates (streamed B, mma.sync, no operand staging)."""
from __future__ import annotations

from ...model.arch import Arch, Gpu
from ...model.problem import Layout, Operands, Problem
from ..base import Rule, pow2
from .config import SkinnyConfig

MMA_SHAPES = {(16, 8, 16)}
K_STEP = 32  # K one warp covers per pair of m16n8k16 MMAs: 4 threads x 8 contiguous elements
MAX_ROWS = 64  # m16 tiles held per thread: beyond four the A fragments crowd out the loads in flight


def check(config: SkinnyConfig, gpu: Gpu, arch: Arch, problem: "Problem | None", operands: "Operands | None",
          rule: Rule) -> None:
    cta, warp, mma = config.cta, config.warp, config.mma
    rule((mma.m, mma.n, mma.k) in MMA_SHAPES, "mma.sync shape for 16-bit inputs must be", str(mma), "16x8x16")
    rule(warp.m == cta.m, "sm80_skinny warps hold every row of the CTA tile: warp tile M must equal CTA tile M",
         warp.m, cta.m)
    rule(cta.m % 16 == 0 and cta.m <= MAX_ROWS, "sm80_skinny CTA tile M must be 16, 32, 48 or 64", cta.m,
         f"16..{MAX_ROWS}")
    rule(warp.n % 8 == 0 and warp.n <= 64, "sm80_skinny warp tile N must be a multiple of 8 up to 64", warp.n, "8..64")
    rule(cta.k % K_STEP == 0 and cta.k <= 4 * K_STEP, "sm80_skinny CTA tile K must be 32, 64, 96 or 128", cta.k,
         "32..128")
    # Stages are register buffers of one iteration's loads: with 2, the next iteration's loads are in flight
    # while this one's MMAs run.
    rule(config.stages in (1, 2), "sm80_skinny stages (register buffers of loads) must be 1 or 2", config.stages,
         "1,2")
    rule(config.cluster.size == 1, "sm80_skinny runs without thread-block clusters", str(config.cluster), "1x1")
    rule(pow2(config.k_warps) and config.k_warps <= 4, "k_warps must be 1, 2 or 4", config.k_warps, "1,2,4")
    if operands is not None:
        rule(operands.c_dtype is operands.a_dtype, "sm80_skinny writes D in the inputs' dtype",
             operands.c_dtype.value, operands.a_dtype.value)
        # Each thread streams 8 contiguous elements along K of two rows of A, and of one column of B (column-major)
        # or along N of one row of B (row-major: a warp reads 64 columns, 128-byte rows, through shared memory).
        rule(operands.a_layout is Layout.ROW, "sm80_skinny reads A with K contiguous (row-major A)",
             operands.a_layout.value, Layout.ROW.value)
        if operands.b_layout is Layout.ROW:
            rule(config.warp.n == 64, "sm80_skinny with row-major B needs warp tile N 64 (128-byte rows of B)",
                 config.warp.n, 64)
    if problem is not None:
        rule(problem.m <= cta.m, "sm80_skinny covers every row of D in one CTA tile: M must be at most CTA tile M",
             problem.m, cta.m)


def smem_bytes(config: SkinnyConfig, operands: "Operands | None" = None) -> int:
    """The K-split warps' meeting place (each warp group beyond the first parks its accumulators there) and, for
    row-major B, every warp's staging tile (32 rows of 128 bytes per 32-wide K step)."""
    park = (config.k_warps - 1) * config.warps_n * 32 * accumulators(config) * 4
    staged = operands is not None and operands.b_layout is Layout.ROW
    return park + (config.threads // 32 * (config.cta.k // K_STEP) * 32 * 128 if staged else 0)


def accumulators(config: SkinnyConfig) -> int:
    """fp32 accumulators per thread: 4 per m16n8 tile."""
    return (config.cta.m // 16) * (config.warp.n // 8) * 4


def regs_estimate(config: SkinnyConfig) -> int:
    """Accumulators, the iterations' loads held in flight (B: 4 words per n8 group, A: 8 per m16 tile, per
    32-wide K step, per stage), ~40 for addresses and loop state."""
    steps = config.cta.k // K_STEP
    loads = config.stages * steps * ((config.warp.n // 8) * 4 + (config.cta.m // 16) * 8)
    # 64-column warps (row-major B's) add staging addresses and fragment temporaries per K step: 16x128x128 with
    # 16x64 warps (4 steps) was estimated at 232 and spilled 152 bytes; 16x128x64 at 2 stages (2 steps) fit in 254.
    # Warps that split K along with narrow warp tiles (n <= 32: column-major B only) compiled 14-18 fewer than
    # the 40 (16x64x64 with 16x16 warps: 64 registers at 2 and 4 warps along K, 79 at 1; ptxas on sm_90a, 2026-11-
    # 27): at 512 threads that is 2 CTAs a SM, not 1, and the model priced those grids at half their warps.
    overhead = 24 if config.k_warps > 1 and config.warp.n <= 32 else 40
    return accumulators(config) + loads + overhead + (8 * steps if config.warp.n == 64 else 0)


__all__ = ["K_STEP", "MAX_ROWS", "MMA_SHAPES", "accumulators", "check", "regs_estimate", "smem_bytes"]
