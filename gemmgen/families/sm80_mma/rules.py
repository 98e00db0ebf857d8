"""sm80_mma's feasibility rules and resource estimates (mma.sync, ldmatrix, cp.async)."""
from __future__ import annotations

from ...model.arch import Arch, Gpu
from ...model.problem import Operands, Problem
from ...model.tiles import SmemLayout
from ..base import REG_LIMIT, Rule, elt_bytes, pow2
from .config import Sm80Config

MMA_SHAPES = {(16, 8, 16)}  # mma.sync for 16-bit inputs
PAD_BYTES = 16  # padding per shared-memory row in the PAD layout: one 16-byte vector, shifts rows by 4 banks
# Registers the copies take when both operands' rows are copied in pieces under 8 bytes (each piece's address and
# predicate): NVRTC 13.5 for sm_80 built 64x64 warp tiles (232 estimated) at 255 registers with 32-160 B spilled on
# a1x1 and a2x2 operands (4095^3, 4094^3 bf16), at 234-254 without spills when either operand's rows allow 8-byte
# pieces; 32x64 warp tiles built at 166 (2026-11-27, CPU).
NARROW_COPY_REGS = 24


def check(config: Sm80Config, gpu: Gpu, arch: Arch, problem: "Problem | None", operands: "Operands | None",
          rule: Rule) -> None:
    cta, warp, mma = config.cta, config.warp, config.mma
    rule((mma.m, mma.n, mma.k) in MMA_SHAPES, "mma.sync shape for 16-bit inputs must be", str(mma), "16x8x16")
    rule(warp.m % 16 == 0 and warp.n % 16 == 0, "warp tile M and N must be multiples of 16 (ldmatrix x4)",
         f"{warp.m}x{warp.n}", 16)
    rule(cta.k in (16, 32, 64, 128), "CTA tile K must be 16, 32, 64 or 128", cta.k, "16..128")
    # The template double-buffers MMA fragments over k16 steps, alternating two buffers: an odd
    # number of steps per CTA tile would hand the next tile's first step the wrong buffer.
    rule(cta.k % 32 == 0, "sm80_mma CTA tile K must be a multiple of 32 (even k16 steps for fragment double-buffering)",
         cta.k, 32)
    # The XOR swizzle permutes 16-byte chunks inside 8-chunk groups and copy rounds must cover whole
    # swizzle groups: both hold only for power-of-two tile widths and thread counts.
    rule(pow2(cta.m) and pow2(cta.n), "sm80_mma CTA tile M and N must be powers of two (swizzle groups)",
         f"{cta.m}x{cta.n}", "2^k")
    rule(pow2(config.threads), "sm80_mma threads per block must be a power of two (whole copy rounds)",
         config.threads, "2^k")
    rule(2 <= config.stages <= 5, "pipeline stages must be 2..5 for cp.async", config.stages, "2..5")
    rule(config.cluster.size == 1, "sm80_mma runs without thread-block clusters", str(config.cluster), "1x1")
    elt = elt_bytes(operands)
    if operands is not None:
        # The template's C, D and bias share A's element type.
        rule(operands.c_dtype is operands.a_dtype, "sm80_mma writes D in the inputs' dtype",
             operands.c_dtype.value, operands.a_dtype.value)
        if operands.align_a * elt < 8 and operands.align_b * elt < 8:
            regs = regs_estimate(config) + NARROW_COPY_REGS
            rule(regs <= REG_LIMIT, "sm80_mma copying both operands' rows in pieces under 8 bytes needs registers "
                 f"for the copies: the warp tile's estimate plus {NARROW_COPY_REGS} must be at most {REG_LIMIT}",
                 regs, REG_LIMIT)
    loads = max(16, config.threads * 16)  # a tile wider than the CTA leaves no warps: that rule fires already
    rule((cta.m * cta.k * elt) % loads == 0,
         "A tile bytes must be a multiple of threads*16 (whole cp.async rounds)", cta.m * cta.k * elt, loads)
    rule((cta.n * cta.k * elt) % loads == 0,
         "B tile bytes must be a multiple of threads*16 (whole cp.async rounds)", cta.n * cta.k * elt, loads)


def smem_bytes(config: Sm80Config, operands: "Operands | None" = None) -> int:
    """The operand ring: each operand tile stored with its contiguous dimension as the row, as it lies in
    global memory; PAD adds one 16-byte vector per row. D is stored straight from registers."""
    elt = elt_bytes(operands)
    cta = config.cta
    pad = PAD_BYTES if config.smem_layout is SmemLayout.PAD else 0
    a_rows = cta.m if (operands is None or operands.a_layout.value == "row") else cta.k
    b_rows = cta.k if (operands is None or operands.b_layout.value == "row") else cta.n
    a_stage = cta.m * cta.k * elt + a_rows * pad
    b_stage = cta.n * cta.k * elt + b_rows * pad
    return config.stages * (a_stage + b_stage)


def regs_estimate(config: Sm80Config) -> int:
    """fp32 accumulators (warp.m*warp.n/32), double-buffered A and B fragments, ~40 for addresses."""
    w = config.warp
    acc = w.m * w.n // 32
    frag_a = 2 * (w.m // 16) * 4
    frag_b = 2 * (w.n // 8) * 2
    return acc + frag_a + frag_b + 40


__all__ = ["MMA_SHAPES", "NARROW_COPY_REGS", "PAD_BYTES", "check", "regs_estimate", "smem_bytes"]
