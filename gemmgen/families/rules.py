"""The one home of feasibility: check(config, gpu, ...) lists every rule a configuration breaks.

Rules carry the offending value and the limit, so a rejected configuration explains itself.
Resource estimates (threads, shared memory, registers) live here too, because the rules use them
and so do the model's ranking and the templates' launch manifests.
"""
from __future__ import annotations

import math

from ..model.arch import Arch, DType, Gpu, catalogue
from ..model.errors import InvalidConfig, Violation
from ..model.problem import Operands, Problem
from ..model.tiles import DecompKind, Family, Kernel, Schedule, SmemLayout, TileConfig

# What each template implements. A configuration asking for more is rejected here, not by NVRTC.
FAMILY_DECOMPOSITIONS = {
    Family.SM80_MMA: {DecompKind.DATA_PARALLEL, DecompKind.SPLIT_K},
    Family.SM90_WGMMA: {DecompKind.DATA_PARALLEL, DecompKind.SPLIT_K, DecompKind.STREAM_K},
}
FAMILY_DTYPES = {
    Family.SM80_MMA: {DType.BF16, DType.F16},
    Family.SM90_WGMMA: {DType.BF16, DType.F16},
}
MMA_SHAPES_SM80 = {(16, 8, 16)}
PAD_BYTES = 16  # padding per shared-memory row in the PAD layout: one 16-byte vector, shifts rows by 4 banks
REG_LIMIT = 255
REG_ALLOC_UNIT = 8  # registers are allocated per thread in multiples of 8 (256 per warp)
BARRIER_BYTES = 1024  # mbarriers and scheduler state, rounded to a swizzle atom
SM90_EPI_WARP_BYTES = 16 * 40 * 4  # sm90 epilogue staging per consumer warp: 16 rows x 40 fp32
SM90_EPI_BOX_BYTES = 16 * 32 * 2   # one TMA-store box of the sm90 epilogue: 16 rows x 32 16-bit columns


def _pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _ab_bytes(operands: "Operands | None") -> int:
    return operands.a_dtype.bytes if operands else 2


def smem_bytes(config: TileConfig, operands: "Operands | None" = None) -> int:
    """Dynamic shared memory one CTA needs: the operand ring, plus epilogue staging where it is separate."""
    elt = _ab_bytes(operands)
    cta = config.cta
    if config.family is Family.SM80_MMA:
        # Each operand tile is stored with its contiguous dimension as the row, as it lies in global
        # memory; PAD adds one 16-byte vector per row. D is stored straight from registers, so the
        # operand ring is the whole footprint.
        pad = PAD_BYTES if config.smem_layout is SmemLayout.PAD else 0
        a_rows = cta.m if (operands is None or operands.a_layout.value == "row") else cta.k
        b_rows = cta.k if (operands is None or operands.b_layout.value == "row") else cta.n
        a_stage = cta.m * cta.k * elt + a_rows * pad
        b_stage = cta.n * cta.k * elt + b_rows * pad
        return config.stages * (a_stage + b_stage)
    # sm90: 1024-byte aligned stages for the 128B swizzle, plus the epilogue's per-warp staging (sm90_epi_boxes);
    # one BARRIER_BYTES holds the mbarriers, another aligns the ring to 1024 B.
    return _sm90_ring_bytes(config, elt) + config.math_threads // 32 * sm90_epi_warp_bytes(config, operands) \
        + 2 * BARRIER_BYTES


def _sm90_ring_bytes(config: TileConfig, elt: int) -> int:
    stage = (config.cta.m * config.cta.k + config.cta.n * config.cta.k) * elt
    return config.stages * math.ceil(stage / 1024) * 1024


def sm90_epi_boxes(config: TileConfig, operands: "Operands | None" = None) -> int:
    """TMA-store boxes (16 x 32, 1 KB) each sm90 consumer warp stages D in.

    Two boxes alternate unless shared memory left over by the operand ring holds more: the warp then fills
    its whole share of the tile (MI x WN/32 boxes) before any store, so it never waits for the TMA unit to
    read a box mid-epilogue, and hands them over behind one proxy fence. Halving steps from the whole share
    down to 2 (groups that divide the share), taking the largest that fits without lowering the CTAs resident
    per SM. Non-TMA-store kernels (split-K, unaligned ldc) get the same region and use 2.5 KB of it.
    Stream-K kernels get the same (they kept two until 2026-11-23, when the template stopped keeping the tile
    origin live across the main loop, which had made the 128x256 tile spill with more)."""
    warps = config.math_threads // 32
    ring = _sm90_ring_bytes(config, _ab_bytes(operands)) + 2 * BARRIER_BYTES
    base = ring + warps * SM90_EPI_WARP_BYTES
    per_sm, optin = _sm90_smem()
    resident = max(1, per_sm // (base + 1024))   # the driver reserves 1 KB per CTA
    budget = min(optin, per_sm // resident - 1024)
    share = max(2, (config.warp.m // 64) * (config.warp.n // 32))
    # The whole share, else two alternating groups of boxes/2 that divide the share evenly.
    options = [share] + [b for b in (16, 8, 4) if b < share and share % (b // 2) == 0]
    for boxes in options:
        if ring + warps * max(SM90_EPI_WARP_BYTES, boxes * SM90_EPI_BOX_BYTES) <= budget:
            return boxes
    return 2


def _sm90_smem() -> "tuple[int, int]":
    """Shared memory per SM and per block on every sm_90a GPU of the catalogue (the smallest, so a kernel's
    footprint does not depend on which Hopper it is rendered for)."""
    hoppers = [g for g in catalogue().values() if g.arch is Arch.SM90A]
    return min(g.smem_per_sm for g in hoppers), min(g.smem_per_block_optin for g in hoppers)


def sm90_epi_warp_bytes(config: TileConfig, operands: "Operands | None" = None) -> int:
    """Epilogue staging per sm90 consumer warp: the fp32 tile of the st.global path (16 rows x 40 fp32) or the
    TMA-store boxes, whichever is larger (both paths use one region)."""
    return max(SM90_EPI_WARP_BYTES, sm90_epi_boxes(config, operands) * SM90_EPI_BOX_BYTES)


def regs_estimate(config: TileConfig) -> int:
    """Registers per thread the kernel needs, estimated from fragments and accumulators.

    sm80: fp32 accumulators (warp.m*warp.n/32), double-buffered A and B fragments, ~40 for addresses.
    sm90: the consumer warpgroup's accumulators (warp.m*warp.n/128) plus ~40; the producer needs few.
    """
    w = config.warp
    if config.family is Family.SM80_MMA:
        acc = w.m * w.n // 32
        frag_a = 2 * (w.m // 16) * 4
        frag_b = 2 * (w.n // 8) * 2
        return acc + frag_a + frag_b + 40
    return w.m * w.n // 128 + 40


def regs_allocated(config: TileConfig) -> int:
    """Registers per CTA after rounding each thread's count to the allocation unit."""
    per_thread = min(REG_LIMIT, regs_estimate(config))
    per_thread = math.ceil(per_thread / REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    if config.family is Family.SM90_WGMMA and config.warp_specialized:
        # setmaxnreg moves registers from the producer (40) to consumers; the CTA's pool is the launch total.
        consumers = config.math_threads
        return consumers * per_thread + 128 * 40
    return config.threads * per_thread


def ctas_per_sm(config: TileConfig, gpu: Gpu, operands: "Operands | None" = None) -> int:
    """Occupancy: resident CTAs per SM, limited by threads, shared memory and registers."""
    limits = [gpu.max_ctas_per_sm, gpu.max_threads_per_sm // max(1, config.threads)]
    smem = smem_bytes(config, operands) + 1024  # the driver reserves 1 KB per CTA
    limits.append(gpu.smem_per_sm // smem)
    limits.append(gpu.regs_per_sm // max(1, regs_allocated(config)))
    return max(0, min(limits))


def check(config: TileConfig, gpu: Gpu, arch: "Arch | None" = None, problem: "Problem | None" = None,
          operands: "Operands | None" = None) -> "list[Violation]":
    """Every feasibility rule `config` breaks on `gpu` (for `arch`, and for `problem` if given)."""
    arch = arch or gpu.arch
    if operands is None and problem is not None:
        operands = problem.operands
    out: list[Violation] = []

    def rule(ok: bool, name: str, value, limit):
        if not ok:
            out.append(Violation(name, value, limit))

    def staged_epilogue(who: str, why: str):
        # What the staged (non-TMA-store) epilogue of the sm90 template serves: data-parallel tiles or split-K
        # with the reduction launch, stored by the consumers themselves.
        rule(decomp.kind is DecompKind.DATA_PARALLEL or (decomp.kind is DecompKind.SPLIT_K and not decomp.fused),
             f"{who} {why}: data-parallel tiles or split-K without the fused reduction only", decomp.tag,
             "dp or splitk<S>")
        rule(config.schedule is Schedule.COOPERATIVE and not config.store_warp,
             f"{who} {why}: cooperative schedule, no store warp",
             config.schedule.value + ("+sw" if config.store_warp else ""), Schedule.COOPERATIVE.value)

    cta, warp, mma = config.cta, config.warp, config.mma
    fam = config.family
    decomp = config.decomposition

    # Architecture and dtype support.
    rule(arch.cc >= fam.min_arch.cc and (fam is not Family.SM90_WGMMA or arch.has_wgmma),
         f"family {fam.value} needs arch", arch.value, fam.min_arch.value)
    rule(arch.cc <= gpu.arch.cc, "arch must not exceed the GPU's", arch.value, gpu.arch.value)
    if operands is not None:
        rule(operands.a_dtype in FAMILY_DTYPES[fam], f"family {fam.value} supports dtypes", operands.a_dtype.value,
             sorted(d.value for d in FAMILY_DTYPES[fam]))

    # The operand swap: the main loop computes D^T = B^T @ A^T, and the staged epilogue (data-parallel) or the
    # reduction launch (split-K) writes D in the caller's frame. Every rule below about A, B and the tile then
    # reads the swapped operands (cta.m tiles the problem's N, cta.n its M).
    if config.swap_ab:
        rule(fam is Family.SM90_WGMMA, "the operand swap is implemented in sm90_wgmma only", fam.value,
             Family.SM90_WGMMA.value)
        staged_epilogue("a swapped kernel", "writes D transposed from its staged epilogue or its reduction launch")
        rule(config.cluster.size == 1, "the operand swap is implemented without clusters", str(config.cluster), "1x1")
        if problem is not None:
            rule(problem.m <= cta.n, "the operand swap serves skinny products: M must fit the swapped tile's N",
                 problem.m, cta.n)
        if operands is not None:
            operands = operands.swapped()

    # Divisibility between tile levels.
    rule(cta.m % warp.m == 0, "CTA tile M must be a multiple of warp tile M", f"{cta.m} % {warp.m}", 0)
    rule(cta.n % warp.n == 0, "CTA tile N must be a multiple of warp tile N", f"{cta.n} % {warp.n}", 0)
    rule(warp.k == cta.k, "warp tile K must equal CTA tile K (warps split M and N only)", warp.k, cta.k)
    rule(warp.m % mma.m == 0, "warp tile M must be a multiple of MMA M", f"{warp.m} % {mma.m}", 0)
    rule(warp.n % mma.n == 0, "warp tile N must be a multiple of MMA N", f"{warp.n} % {mma.n}", 0)
    rule(cta.k % mma.k == 0, "CTA tile K must be a multiple of MMA K", f"{cta.k} % {mma.k}", 0)

    # MMA instruction legal for the dtype and architecture.
    if fam is Family.SM80_MMA:
        rule((mma.m, mma.n, mma.k) in MMA_SHAPES_SM80, "mma.sync shape for 16-bit inputs must be", str(mma), "16x8x16")
        rule(warp.m % 16 == 0 and warp.n % 16 == 0, "warp tile M and N must be multiples of 16 (ldmatrix x4)",
             f"{warp.m}x{warp.n}", 16)
        rule(cta.k in (16, 32, 64, 128), "CTA tile K must be 16, 32, 64 or 128", cta.k, "16..128")
        # The template double-buffers MMA fragments over k16 steps, alternating two buffers: an odd
        # number of steps per CTA tile would hand the next tile's first step the wrong buffer.
        rule(cta.k % 32 == 0, "sm80_mma CTA tile K must be a multiple of 32 (even k16 steps for fragment double-buffering)",
             cta.k, 32)
        # The XOR swizzle permutes 16-byte chunks inside 8-chunk groups and copy rounds must cover whole
        # swizzle groups: both hold only for power-of-two tile widths and thread counts.
        rule(_pow2(cta.m) and _pow2(cta.n), "sm80_mma CTA tile M and N must be powers of two (swizzle groups)",
             f"{cta.m}x{cta.n}", "2^k")
        rule(_pow2(config.threads), "sm80_mma threads per block must be a power of two (whole copy rounds)",
             config.threads, "2^k")
        rule(2 <= config.stages <= 5, "pipeline stages must be 2..5 for cp.async", config.stages, "2..5")
        rule(config.cluster.size == 1, "clusters need the sm90_wgmma family", str(config.cluster), "1x1")
        rule(not config.warp_specialized, "warp specialization needs the sm90_wgmma family", True, False)
        rule(not config.persistent, "the sm80_mma family is not persistent", True, False)
        rule(config.schedule is Schedule.COOPERATIVE, "the ping-pong schedule needs the sm90_wgmma family",
             config.schedule.value, Schedule.COOPERATIVE.value)
        rule(not config.store_warp, "a store warp needs the sm90_wgmma family", True, False)
        elt = _ab_bytes(operands)
        loads = config.threads * 16
        rule((cta.m * cta.k * elt) % loads == 0,
             "A tile bytes must be a multiple of threads*16 (whole cp.async rounds)", cta.m * cta.k * elt, loads)
        rule((cta.n * cta.k * elt) % loads == 0,
             "B tile bytes must be a multiple of threads*16 (whole cp.async rounds)", cta.n * cta.k * elt, loads)
    else:
        rule(mma.m == 64 and mma.k == 16, "wgmma shape for 16-bit inputs must be m64nNk16", str(mma), "64xNx16")
        rule(mma.n % 8 == 0 and 8 <= mma.n <= 256, "wgmma N must be a multiple of 8 up to 256", mma.n, "8..256")
        rule(mma.n == warp.n, "wgmma N must equal the warpgroup tile N", mma.n, warp.n)
        rule(config.smem_layout is SmemLayout.SWIZZLE, "sm90_wgmma needs the 128B swizzle layout",
             config.smem_layout.value, "swizzle")
        rule(cta.k * _ab_bytes(operands) == 128, "CTA tile K must span one 128-byte swizzle atom",
             cta.k * _ab_bytes(operands), 128)
        rule(1 <= config.warps_m * config.warps_n <= 3, "consumer warpgroups must be 1, 2 or 3",
             config.warps_m * config.warps_n, "1..3")
        if config.warps_m * config.warps_n == 3:
            rule(config.warps_n == 1, "three consumer warpgroups are stacked in M (warpgroup tile N = CTA tile N)",
                 f"{config.warps_m}x{config.warps_n}", "3x1")
        # 16 bytes of mbarriers per stage in a 256-byte region (the template's BARRIER_REGION).
        rule(2 <= config.stages <= 12, "pipeline stages must be 2..12", config.stages, "2..12")
        rule(config.cluster.m in (1, 2) and config.cluster.n in (1, 2) and config.cluster.size <= 2,
             "cluster must be 1x1, 2x1 or 1x2", str(config.cluster), "size<=2")
        rule(arch.has_wgmma or config.cluster.size == 1, "clusters need sm_90a", arch.value, "sm_90a")
        acc = warp.m * warp.n // 128
        rule(acc <= 192, "accumulators per consumer thread must leave room for addressing", acc, 192)
        # The template stores each operand tile as 64-wide blocks of 8 KB (one TMA box or slice each). A B tile of
        # 16 or 32 rows is one K-major box of its own height (the swapped kernels' activations); its epilogue
        # is the staged one (16- or 32-column chunks), never D's TMA-store boxes.
        if cta.n < 64:
            rule(cta.n in (16, 32) and warp.n == cta.n and cta.m % 64 == 0, "sm90 tiles narrower than 64 columns "
                 "must be 16 or 32 wide, one warpgroup wide, with CTA tile M a multiple of 64",
                 f"{cta.m}x{cta.n}/{warp.n}", "Mx16 or Mx32")
            staged_epilogue("sm90 tiles narrower than 64 columns", "use the staged epilogue")
            if operands is not None:
                rule(operands.b_layout.value == "col", "sm90 tiles narrower than 64 columns need B K-major in "
                     "shared memory (column-major B, or row-major A when swapped)", operands.b_layout.value, "col")
        else:
            rule(cta.m % 64 == 0 and cta.n % 64 == 0 and warp.n % 64 == 0,
                 "sm90 CTA tile M, N and warpgroup tile N must be multiples of 64", f"{cta.m}x{cta.n}/{warp.n}", 64)
        rule(cta.m <= 256 and cta.n <= 256, "sm90 CTA tile M and N must be at most 256 (TMA box limit)",
             f"{cta.m}x{cta.n}", 256)
        rule(config.warp_specialized, "sm90_wgmma is warp-specialized (a producer warpgroup issues TMA)",
             config.warp_specialized, True)
        # A 2-CTA cluster splits the shared operand's tile into one TMA slice per CTA.
        if config.cluster.m > 1:
            rule(cta.n % (64 * config.cluster.size) == 0, "a 2x1 cluster multicasts B: CTA tile N must split "
                 "into 64-wide slices per CTA", cta.n, 64 * config.cluster.size)
        if config.cluster.n > 1:
            if operands is not None and operands.a_layout.value == "row":
                # K-major A: each CTA's slice is a box of M rows of 128 bytes, whole 8-row swizzle groups.
                rule(cta.m % (8 * config.cluster.size) == 0, "a 1x2 cluster multicasts A: CTA tile M must split "
                     "into 8-row slices per CTA (K-major A)", cta.m, 8 * config.cluster.size)
            else:
                # MN-major A is stored as 64-wide column blocks, one TMA box each: slices are whole blocks.
                rule(cta.m % (64 * config.cluster.size) == 0, "a 1x2 cluster multicasts A: CTA tile M must split "
                     "into 64-wide slices per CTA", cta.m, 64 * config.cluster.size)
        if config.schedule is Schedule.PINGPONG:
            # Two consumer warpgroups own whole alternate tiles of the persistent loop, in the ring's order.
            rule(warp.m == cta.m and warp.n == cta.n, "ping-pong: the warpgroup tile must equal the CTA tile "
                 "(each consumer warpgroup owns whole tiles)", f"{warp.m}x{warp.n}", f"{cta.m}x{cta.n}")
            rule(config.persistent, "ping-pong needs the persistent tile loop (warpgroups alternate tiles)",
                 config.persistent, True)
            rule(decomp.kind is DecompKind.DATA_PARALLEL, "ping-pong is implemented for data-parallel tiles only",
                 decomp.kind.value, DecompKind.DATA_PARALLEL.value)
        if config.store_warp:
            # The producer warpgroup's warp 1 walks the consumers' tiles and stores their TMA-store boxes.
            rule(config.schedule is Schedule.COOPERATIVE, "a store warp serves the cooperative schedule",
                 config.schedule.value, Schedule.COOPERATIVE.value)
            rule(decomp.kind is DecompKind.DATA_PARALLEL, "a store warp serves data-parallel tiles (split-K and "
                 "Stream-K store fp32 partials)", decomp.kind.value, DecompKind.DATA_PARALLEL.value)
            if operands is not None:
                rule(operands.align_c >= 8, "a store warp issues TMA stores: D's leading dimension must be a "
                     "multiple of 16 bytes", f"align {operands.align_c}", 8)
        if decomp.kind is DecompKind.STREAM_K:
            # Iteration ranges are per CTA, and an owner waits for later CTAs' partials: every CTA of the
            # grid must be resident at once, which only the persistent launch guarantees.
            rule(config.persistent, "Stream-K needs the persistent tile loop (all CTAs resident)",
                 config.persistent, True)
            rule(config.cluster.size == 1, "Stream-K is implemented without clusters", str(config.cluster), "1x1")
            rule(config.schedule is Schedule.COOPERATIVE, "Stream-K is implemented for the cooperative schedule",
                 config.schedule.value, Schedule.COOPERATIVE.value)
        if operands is not None:
            # TMA needs every global stride to be a multiple of 16 bytes (cuTensorMapEncodeTiled).
            min_align = 16 // _ab_bytes(operands)
            rule(operands.align_a >= min_align, "sm90 TMA needs A's leading dimension to be a multiple of 16 bytes",
                 f"align {operands.align_a}", min_align)
            rule(operands.align_b >= min_align, "sm90 TMA needs B's leading dimension to be a multiple of 16 bytes",
                 f"align {operands.align_b}", min_align)

    # Block shape.
    rule(32 <= config.threads <= 1024, "threads per block must be 32..1024", config.threads, 1024)
    rule(config.raster.group in (1, 2, 4, 8, 16), "rasterization group must be 1, 2, 4, 8 or 16",
         config.raster.group, "1,2,4,8,16")

    # Decomposition.
    rule(decomp.kind in FAMILY_DECOMPOSITIONS[fam], f"family {fam.value} supports decompositions", decomp.kind.value,
         sorted(d.value for d in FAMILY_DECOMPOSITIONS[fam]))
    if decomp.fused:
        rule(decomp.kind is DecompKind.SPLIT_K, "a fused reduction is a split-K option", decomp.kind.value,
             DecompKind.SPLIT_K.value)
        rule(fam is Family.SM90_WGMMA, "the fused split-K reduction is implemented in sm90_wgmma only", fam.value,
             Family.SM90_WGMMA.value)
    if decomp.kind is DecompKind.SPLIT_K:
        rule(2 <= decomp.splits <= 16, "split-K factor must be 2..16", decomp.splits, "2..16")
        if problem is not None:
            k_tiles = math.ceil(problem.k / cta.k)
            rule(decomp.splits <= k_tiles, "split-K factor must not exceed the K tiles", decomp.splits, k_tiles)
    else:
        rule(decomp.splits == 1, "split factor must be 1 unless split-K", decomp.splits, 1)

    # Resources.
    smem = smem_bytes(config, operands)
    rule(smem <= gpu.smem_per_block_optin, "shared memory per block must fit the GPU's opt-in limit", smem,
         gpu.smem_per_block_optin)
    regs = regs_estimate(config)
    rule(regs <= REG_LIMIT, "estimated registers per thread must be at most 255", regs, REG_LIMIT)
    rule(regs_allocated(config) <= gpu.regs_per_sm, "registers per block must fit the register file",
         regs_allocated(config), gpu.regs_per_sm)
    return out


def validate(config: TileConfig, gpu: Gpu, arch: "Arch | None" = None, problem: "Problem | None" = None,
             operands: "Operands | None" = None) -> TileConfig:
    """Return `config` unchanged, or raise InvalidConfig listing every broken rule."""
    violations = check(config, gpu, arch, problem, operands)
    if violations:
        ops = operands or (problem.operands if problem else Operands())
        raise InvalidConfig(Kernel(arch or gpu.arch, ops, config).name, violations)
    return config
