"""sm90_wgmma's feasibility rules and resource estimates (TMA, wgmma, warp specialization, clusters)."""
from __future__ import annotations

import math

from ...model.arch import Arch, DType, Gpu, catalogue
from ...model.problem import SCALE_BLOCK, Fp8Accum, Fp32Math, Layout, Operands, Problem, Scaling
from ...model.tiles import DecompKind, SmemLayout
from ..base import Rule, elt_bytes
from .config import Schedule, Sm90Config

BARRIER_BYTES = 1024  # mbarriers and scheduler state, rounded to a swizzle atom
EPI_WARP_BYTES = 16 * 40 * 4  # epilogue staging per consumer warp: 16 rows x 40 fp32
EPI_BOX_BYTES = 16 * 32 * 2   # one TMA-store box of the epilogue: 16 rows x 32 16-bit columns
PRODUCER_REGS = 40   # the producer thread only computes TMA coordinates
# The widest warpgroup tile N: m64n256 and a second wgmma over the columns past 256 (192 accumulators a thread at
# most: the accumulator rule below).
WIDE_MMA_N = 384
WIDE_SWAP_COLUMNS = 4   # tile columns of M a wide swapped tile serves (swap_m_max)
SPLIT_FACTOR = 3        # 3xTF32's K segments: the kernel's K scalar is three times K rounded up to whole k-tiles
INT_MAX = 2**31 - 1     # the ABI's `int` scalars (M, N, K, lda, ldb, ldc, ldd)
PACK_ROUND_ELEMENTS = 128   # the most elements a packed copy's rows are rounded up by (128 bytes of fp8)


def check(config: Sm90Config, gpu: Gpu, arch: Arch, problem: "Problem | None", operands: "Operands | None",
          rule: Rule) -> None:
    cta, warp, mma = config.cta, config.warp, config.mma
    decomp = config.decomposition

    def staged_epilogue(who: str, why: str):
        # What the staged (non-TMA-store) epilogue serves: data-parallel tiles, or split-K whose partials the
        # reduction launch or the tile's last slice (fused; fused_reduce_tile has a transposed form) sums.
        # Stream-K's fix-up is not built for it.
        rule(decomp.kind in (DecompKind.DATA_PARALLEL, DecompKind.SPLIT_K),
             f"{who} {why}: data-parallel tiles or split-K only", decomp.tag, "dp or splitk<S>[f]")
        rule(config.schedule is Schedule.COOPERATIVE and not config.store_warp,
             f"{who} {why}: cooperative schedule, no store warp",
             config.schedule.value + ("+sw" if config.store_warp else ""), Schedule.COOPERATIVE.value)

    if operands is not None and operands.row_sums:
        # Two warps of the producer warpgroup sum each stage's A tile in shared memory (templates/sm90_wgmma/
        # rowsum.cuh.j2), in the CTAs of tile column 0, so each row of A is summed by one CTA over all of K.
        rule(decomp.kind is DecompKind.DATA_PARALLEL, "row sums of A are written by data-parallel kernels only "
             "(a K slice's CTA would hold part of a row's sum)", decomp.tag, "dp")
        rule(not config.swap_ab, "row sums of A are not written by a swapped kernel (its main loop reads B^T as A)",
             "swap", "no swap")
        rule(operands.a_dtype.bytes == 2, "row sums of A are written for 16-bit A (bf16, f16)",
             operands.a_dtype.value, "bf16 or f16")
        # Each of the two warps owns one 64-row block of a 128-row tile; with two blocks each (192 or 256 rows)
        # they fell behind the consumers: 35-37% slower kernels at 8192 tokens against 2% for 128-row tiles
        # (benchmarks/row_sums.py, docs/perf-notes.md).
        rule(config.cta.m <= 128, "row sums of A need a CTA tile of at most 128 rows (two 64-row blocks, one per "
             "row-sum warp)", config.cta.m, "<= 128")

    # The operand swap: the main loop computes D^T = B^T @ A^T, and the staged epilogue (data-parallel) or the
    # reduction launch (split-K) writes D in the caller's frame. Every rule below about A, B and the tile then
    # reads the swapped operands (cta.m tiles the problem's N, cta.n its M).
    if config.swap_ab:
        staged_epilogue("a swapped kernel", "writes D transposed from its staged epilogue or its reduction launch")
        if problem is not None:
            # A 1x2 cluster's two tiles of the problem's M share the weights' tile (the swapped kernel's A); a wide
            # swapped tile spans a few token columns (swap_m_max).
            rule(problem.m <= swap_m_max(config), "the operand swap serves skinny products: M must fit the "
                 "swapped tile's N (times the cluster's N, or four of a wide swapped tile)", problem.m,
                 swap_m_max(config))
        if operands is not None:
            operands = operands.swapped()

    if operands is not None and operands.a_dtype is not operands.b_dtype:
        # wgmma names A's and B's types apart only in its fp8 forms (m64nNk32.f32.e4m3.e5m2 and the like).
        rule(operands.a_dtype.bytes == 1 and operands.b_dtype.bytes == 1,
             "sm90_wgmma mixes A and B dtypes only when both are fp8 (e4m3, e5m2)",
             f"{operands.a_dtype.value} x {operands.b_dtype.value}", "e4m3/e5m2 x e4m3/e5m2")
    # One wgmma k-step reads 32 bytes of K per row: k16 for 16-bit inputs, k32 for fp8.
    elt = elt_bytes(operands)
    rule(mma.m == 64 and mma.k * elt == 32, f"wgmma shape for {8 * elt}-bit inputs must be m64nNk{32 // elt}",
         str(mma), f"64xNx{32 // elt}")
    if operands is not None and elt != 2:
        kind = "fp8" if elt == 1 else "tf32 (fp32 inputs)"
        # wgmma takes MN-major (transposed) shared-memory operands for 16-bit types only: an fp8 or tf32 operand
        # stored MN-major, or with rows TMA cannot read, is copied K-major by the pack launch (launch.packed), so
        # every layout and alignment runs.
        allowed = ("bf16", "f16", "f32") if elt == 1 else ("f32",)
        rule(operands.c_dtype.value in allowed, f"{kind} kernels write D in {', '.join(allowed)}",
             operands.c_dtype.value, ", ".join(allowed))
    if operands is not None and elt == 2:
        # 16-bit inputs write D in their own type, or in fp32 through the staged epilogue (no TMA stores).
        rule(operands.c_dtype in (operands.a_dtype, DType.F32), "sm90_wgmma writes D in the inputs' dtype or f32",
             operands.c_dtype.value, f"{operands.a_dtype.value} or f32")
    # Past 256 (wgmma's widest), a warpgroup tile of whole 64-column blocks is issued as m64n256 plus m64n(N - 256)
    # on the next columns (cuBLAS runs 320-wide tiles at 4096x14336x4096 and 8192^3: nvjet 320x128).
    rule((mma.n % 8 == 0 and 8 <= mma.n <= 256) or (mma.n % 64 == 0 and mma.n <= WIDE_MMA_N),
         f"wgmma N must be a multiple of 8 up to 256 (or of 64 up to {WIDE_MMA_N}, issued as two wgmmas)",
         mma.n, f"8..256, 320, {WIDE_MMA_N}")
    rule(mma.n == warp.n, "wgmma N must equal the warpgroup tile N", mma.n, warp.n)
    rule(config.smem_layout is SmemLayout.SWIZZLE, "sm90_wgmma needs the 128B swizzle layout",
         config.smem_layout.value, "swizzle")
    rule(cta.k * elt_bytes(operands) == 128, "CTA tile K must span one 128-byte swizzle atom",
         cta.k * elt_bytes(operands), 128)
    rule(1 <= config.warps_m * config.warps_n <= 3, "consumer warpgroups must be 1, 2 or 3",
         config.warps_m * config.warps_n, "1..3")
    if config.warps_m * config.warps_n == 3:
        rule(config.warps_n == 1, "three consumer warpgroups are stacked in M (warpgroup tile N = CTA tile N)",
             f"{config.warps_m}x{config.warps_n}", "3x1")
    # 16 bytes of mbarriers per stage in a 256-byte region (the template's BARRIER_REGION).
    rule(2 <= config.stages <= 12, "pipeline stages must be 2..12", config.stages, "2..12")
    # 2x2: A multicast along each cluster row and B along each column, each CTA couples its ring to three
    # (docs/perf-notes.md, "2x2 clusters"); 4-CTA lines (4x1, 1x4) ran slower than pairs and are not offered.
    rule(config.cluster.m in (1, 2) and config.cluster.n in (1, 2),
         "cluster must be 1x1, 2x1, 1x2 or 2x2", str(config.cluster), "1x1, 2x1, 1x2 or 2x2")
    rule(arch.has_wgmma or config.cluster.size == 1, "clusters need sm_90a", arch.value, "sm_90a")
    acc = warp.m * warp.n // 128
    if config.promote:
        # A second accumulator set holds each interval's wgmma partial sums.
        # fp8: 1-4 k-tiles of 128 (DeepSeek-V3 promotes every 128 elements); tf32 k-tiles are 32 wide, so 8 of
        # them are 256 elements (3xTF32 measured 4.1e-7 at 4 against cuBLAS fp32's 1.1e-6: room for 8).
        intervals = (1, 2, 4, 8) if elt == 4 else (1, 2, 4)
        rule(config.promote in intervals, f"promotion interval must be {', '.join(map(str, intervals))} k-tiles "
             f"for {8 * elt}-bit inputs", config.promote, ",".join(map(str, intervals)))
        rule(elt != 2, "promotion into fp32 accumulators is for fp8 and tf32 inputs", f"{8 * elt}-bit",
             "fp8 or fp32")
        acc *= 2
    if config.promote_stagger:
        rule(config.promote >= 2, "staggered promotion (promote_stagger) needs an interval of 2 or more k-tiles "
             "to stagger", config.promote, ">= 2")
        rule(config.schedule is Schedule.COOPERATIVE and config.consumers >= 2, "staggered promotion "
             "(promote_stagger) staggers the consumer warpgroups of one cooperative tile: 2 or 3 of them",
             f"{config.schedule.value}, {config.consumers} consumer(s)", "cooperative, 2-3")
    rule(acc <= 192, "accumulators per consumer thread must leave room for addressing", acc, 192)
    if operands is not None and operands.scaling is Scaling.BLOCK:
        _check_block_scaling(config, rule)
    if problem is not None and elt == 1 and problem.fp8_accum is Fp8Accum.FP32:
        # fp32 accumulation asked for: the partial sums promoted every 128-512 elements of K (1-4 k-tiles); the
        # error is then cuBLAS's default's (every 128) to 1.7% above it (every 512), against 1.3-1.6x unpromoted
        # (H100, docs/perf-notes.md, "fp8 promotion intervals").
        rule(1 <= config.promote <= 4, "--accumulate fp32 promotes the fp8 partial sums into fp32 every 1-4 "
             "k-tiles (promote 1, 2 or 4)", config.promote, "1, 2 or 4")
    if problem is not None and elt == 4:
        # fp32 inputs: the problem says which math (Problem.fp32_math); 3xTF32's kernels are the split3 ones.
        x3 = problem.fp32_math is Fp32Math.X3
        rule(config.split3 == x3, "3xTF32 (split3) kernels serve --math 3xtf32 problems, tf32 kernels the others",
             "split3" if config.split3 else "tf32 kernel", f"--math {problem.fp32_math.value}")
    if config.split3:
        rule(elt == 4, "3xTF32 (split3) is for fp32 inputs", f"{8 * elt}-bit", "fp32")
        rule(not config.swap_ab and decomp.kind is not DecompKind.STREAM_K,
             "3xTF32 (split3) runs data-parallel or split-K tiles, unswapped", decomp.tag, "dp or splitk<S>")
        # wgmma adds tf32 products into its accumulators with reduced precision: without promotion the three
        # products reach 2e-5, with it 2-4e-7 (H100, tests/test_hopper_paths_gpu.py), fp32's class.
        rule(config.promote >= 1, "3xTF32 (split3) promotes its partial sums into fp32 (promote 1, 2, 4 or 8)",
             config.promote, "1, 2, 4 or 8")
        if problem is not None:
            # The main loop walks three K segments and takes their total as its `int` K: past INT_MAX it wrapped
            # (K = 2e9 passed 6e9, read as 1.7e9), and the kernel summed a fraction of K without a word.
            k3 = SPLIT_FACTOR * math.ceil(problem.k / cta.k) * cta.k
            rule(k3 <= INT_MAX, "3xTF32 (split3) passes its three K segments (3 x K rounded up to whole k-tiles) "
                 "as one 32-bit int", k3, INT_MAX)
    if problem is not None and max(problem.m, problem.n, problem.k) > INT_MAX - PACK_ROUND_ELEMENTS:
        # A packed copy's rows are rounded up to whole 128-byte lines, and the main loop takes that leading
        # dimension as its `int` lda/ldb: an operand whose contiguous extent is within one line of INT_MAX (bf16
        # K = 2^31 - 1 on misaligned rows) wrapped to a negative one. (Checked near the limit only: it is rare.)
        from ...model.tiles import Kernel
        from .launch import pack_plan   # launch.py builds on this module

        for copy in pack_plan(Kernel(arch, problem.operands, config), problem):
            rule(copy["packed_ld"] <= INT_MAX, f"the packed copy of {copy['tensor']} (rows rounded up to 128 bytes) "
                 "must have a leading dimension that fits a 32-bit int", copy["packed_ld"], INT_MAX)
    # The template stores each operand tile as 64-wide blocks of 8 KB (one TMA box or slice each). A K-major B tile
    # whose N is not a multiple of 64 (16-240 rows: the swapped kernels' activations, the batch tiles) is one box of
    # its own height; its epilogue is the staged one (16- or 32-column chunks), never D's TMA-store boxes.
    b_kmajor = operands is None or b_is_kmajor(operands) or elt != 2   # fp8 and tf32 are packed K-major
    if cta.n % 64:
        # A K-major B tile of any whole number of 8-row swizzle groups is one box of its own height, and the
        # staged epilogue writes 16- or 32-column chunks: tiles as wide as a batch's M (48-112, as cuBLAS runs).
        rule(cta.n % 16 == 0 and warp.n == cta.n and cta.m % 64 == 0, "sm90 tiles whose N is not a multiple of "
             "64 must be a multiple of 16, one warpgroup wide, with CTA tile M a multiple of 64",
             f"{cta.m}x{cta.n}/{warp.n}", "Mx16, Mx32, Mx48, ...")
        staged_epilogue("sm90 tiles whose N is not a multiple of 64", "use the staged epilogue")
        # An MN-major (16-bit) B tile of such a width keeps its last 16-48 columns in 16- or 32-column blocks under
        # the 32B or 64B swizzle (mn_blocks): row-major B, or column-major A when swapped, as torch.matmul passes them.
    else:
        rule(cta.m % 64 == 0 and cta.n % 64 == 0 and warp.n % 64 == 0,
             "sm90 CTA tile M, N and warpgroup tile N must be multiples of 64", f"{cta.m}x{cta.n}/{warp.n}", 64)
    # A TMA box spans at most 256 rows: a K-major B tile (or multicast slice) past that loads as two boxes.
    rule(cta.m <= 256 and cta.n <= WIDE_MMA_N, f"sm90 CTA tile M must be at most 256 (TMA box limit) and N at "
         f"most {WIDE_MMA_N} (two boxes)", f"{cta.m}x{cta.n}", f"256x{WIDE_MMA_N}")
    rule(config.warp_specialized, "sm90_wgmma is warp-specialized (a producer warpgroup issues TMA)",
         config.warp_specialized, True)
    # A cluster splits each operand it shares into one TMA slice per CTA that shares it (its row for A, column for B).
    if config.cluster.m > 1:
        if b_kmajor:
            # K-major B: each CTA's slice is a box of N rows of 128 bytes, whole 8-row swizzle groups.
            rule(cta.n % (8 * config.cluster.m) == 0, "a cluster along M multicasts B: CTA tile N must split "
                 "into 8-row slices per CTA (K-major B)", cta.n, 8 * config.cluster.m)
        else:
            # MN-major B is stored as 64-wide column blocks, one TMA box each: slices are whole blocks.
            rule(cta.n % (64 * config.cluster.m) == 0, "a cluster along M multicasts B: CTA tile N must split "
                 "into 64-wide slices per CTA", cta.n, 64 * config.cluster.m)
        if cta.m == 64 and problem is not None and not config.swap_ab:
            # The pair of 64-row tiles is for M <= 128, where it covers every row and B's tile is read once
            # per N tile: measured 5-23% faster than 1x1 at M 88-128 and up to 15% slower at M 1024-1912,
            # where the model cannot tell them apart (docs/perf-notes.md, "Shapes nobody chose").
            rule(problem.m <= cta.m * config.cluster.m, f"a {config.cluster} cluster of 64-row tiles serves M up to "
                 f"{cta.m * config.cluster.m} (its cluster column covers every row, so B is read once per N tile)",
                 problem.m, cta.m * config.cluster.m)
    if config.cluster.n > 1:
        # fp8 and tf32 A reaches shared memory K-major in any layout (packed, launch.transposed).
        if operands is not None and (operands.a_layout.value == "row" or elt != 2):
            # K-major A: each CTA's slice is a box of M rows of 128 bytes, whole 8-row swizzle groups.
            rule(cta.m % (8 * config.cluster.n) == 0, "a cluster along N multicasts A: CTA tile M must split "
                 "into 8-row slices per CTA (K-major A)", cta.m, 8 * config.cluster.n)
        else:
            # MN-major A is stored as 64-wide column blocks, one TMA box each: slices are whole blocks.
            rule(cta.m % (64 * config.cluster.n) == 0, "a cluster along N multicasts A: CTA tile M must split "
                 "into 64-wide slices per CTA", cta.m, 64 * config.cluster.n)
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
        rule(config.schedule is Schedule.COOPERATIVE, "Stream-K is implemented for the cooperative schedule",
             config.schedule.value, Schedule.COOPERATIVE.value)
    # TMA needs every global stride to be a multiple of 16 bytes (cuTensorMapEncodeTiled): an operand whose rows
    # are not is packed into the workspace first (launch.pack_plan), so no alignment rule stands here.


def a_is_kmajor(operands: Operands) -> bool:
    """A (M x K) row-major keeps K contiguous: K-major in shared memory."""
    return operands.a_layout is Layout.ROW


def b_is_kmajor(operands: Operands) -> bool:
    """B (K x N) column-major keeps K contiguous: K-major in shared memory."""
    return operands.b_layout is Layout.COL


def mn_swizzle_bytes(tile_cols: int, elt: int) -> int:
    """The widest swizzle span (128, 64 or 32 bytes) whose blocks of span / elt columns tile `tile_cols` columns."""
    for span in (128, 64, 32):
        if (tile_cols * elt) % span == 0:
            return span
    raise ValueError(f"an MN-major tile of {tile_cols} columns of {elt}-byte elements is not whole 32-byte rows")


def mn_blocks(tile_cols: int, elt: int) -> "tuple[int, int, int, int]":
    """How an MN-major operand tile of `tile_cols` columns (M of A, N of B) is stored, 64 rows of K per block:
    (main columns, their swizzle span, remainder columns, its span). Whole 64-column (128-byte) blocks under the
    128B swizzle as far as they go; the remainder (16-48 columns of a width such as 80 or 144) in 16- or 32-column
    blocks under the 32B or 64B swizzle, read by a second wgmma of its own width. A tile narrower than 64 columns
    is all narrow blocks (main = the tile, at its span). Narrow blocks cost L2 about twice per byte (32-byte rows:
    docs/perf-notes.md, "Narrow MN-major blocks"), so only the remainder is stored that way."""
    if (tile_cols * elt) % 128 == 0:
        return tile_cols, 128, 0, 0
    main = tile_cols * elt // 128 * 128 // elt
    if main == 0:
        return tile_cols, mn_swizzle_bytes(tile_cols, elt), 0, 0
    rem = tile_cols - main
    return main, 128, rem, mn_swizzle_bytes(rem, elt)


def swap_m_max(config: Sm90Config) -> int:
    """The largest M a swapped kernel serves. Its tile's N holds M (a 1x2 pair's two N); a wide one (unclustered,
    128+ rows of the problem's N by 128+ of its M) spans up to four tile columns of M, so that the transposed
    product fills whole waves where M's 64-row steps cannot (513 tokens through a 4096-wide layer: 32 x 4 tiles
    of 128 x 144 in one wave, as cuBLAS runs it). Measured on the H100 (docs/perf-notes.md, "The transposed
    epilogue"): 2x1 pairs of such tiles lost 25-35% on one-wave grids, and at M 1432-2824 or on 80-112-wide tiles
    they ran 10-50% slower than the model priced them, where at 300-777 tokens they ran 4-9% faster than the
    unswapped picks."""
    wide = config.cta.m >= 128 and config.cta.n >= 128 and config.cluster.size == 1
    return config.cta.n * (WIDE_SWAP_COLUMNS if wide else config.cluster.n)


def _check_block_scaling(config: Sm90Config, rule: Rule) -> None:
    """Block scales (DeepGEMM's: A per row and 128 of K, B per 128 x 128) multiply each k-tile's partial sums as
    the main loop promotes them into fp32, so a k-tile must be one 128-K block and every k-tile promoted; each
    thread reads its rows' A scales and its warpgroup tile's B blocks once per k-tile. `operands` here are the
    main loop's (a swapped kernel's would need an A scale per column: not built)."""
    rule(config.cta.k == SCALE_BLOCK, "block scaling needs CTA tile K = 128 (one scale block per k-tile)",
         config.cta.k, SCALE_BLOCK)
    rule(config.promote == 1, "block scaling applies each 128-K block's scales as its partial sums are promoted: "
         "promote must be 1", config.promote, 1)
    rule(config.warp.n % SCALE_BLOCK == 0 or SCALE_BLOCK % config.warp.n == 0, "block scaling needs warpgroup "
         "tile N a multiple or a divisor of 128 (whole 128-column scale blocks)", config.warp.n, "16, 32, 64, 128, 256")
    rule(not config.swap_ab, "block scaling is implemented without the operand swap", config.swap_ab, False)
    # Stream-K computes a tile's origin after the main loop (registers), and the block scales need it inside.
    rule(config.decomposition.kind is not DecompKind.STREAM_K, "block scaling is implemented for data-parallel "
         "and split-K tiles (not Stream-K)", config.decomposition.kind.value, "dp or splitk")


def smem_bytes(config: Sm90Config, operands: "Operands | None" = None) -> int:
    """1024-byte aligned stages for the 128B swizzle, plus the epilogue's per-warp staging (epi_boxes); one
    BARRIER_BYTES holds the mbarriers, another aligns the ring to 1024 B."""
    return _ring_bytes(config, elt_bytes(operands)) + config.math_threads // 32 * epi_warp_bytes(config, operands) \
        + 2 * BARRIER_BYTES


def _ring_bytes(config: Sm90Config, elt: int) -> int:
    stage = (config.cta.m * config.cta.k + config.cta.n * config.cta.k) * elt
    return config.stages * math.ceil(stage / 1024) * 1024


def epi_boxes(config: Sm90Config, operands: "Operands | None" = None) -> int:
    """TMA-store boxes (16 x 32, 1 KB) each consumer warp stages D in.

    Two boxes alternate unless shared memory left over by the operand ring holds more: the warp then fills
    its whole share of the tile (MI x WN/32 boxes) before any store, so it never waits for the TMA unit to
    read a box mid-epilogue, and hands them over behind one proxy fence. Halving steps from the whole share
    down to 2 (groups that divide the share), taking the largest that fits without lowering the CTAs resident
    per SM. Non-TMA-store kernels (split-K, unaligned ldc) get the same region and use 2.5 KB of it.
    Stream-K kernels get the same (they kept two until 2026-11-23, when the template stopped keeping the tile
    origin live across the main loop, which had made the 128x256 tile spill with more)."""
    warps = config.math_threads // 32
    ring = _ring_bytes(config, elt_bytes(operands)) + 2 * BARRIER_BYTES
    base = ring + warps * EPI_WARP_BYTES
    per_sm, optin = _hopper_smem()
    resident = max(1, per_sm // (base + 1024))   # the driver reserves 1 KB per CTA
    budget = min(optin, per_sm // resident - 1024)
    share = max(2, (config.warp.m // 64) * (config.warp.n // 32))
    # The whole share, else two alternating groups of boxes/2 that divide the share evenly.
    options = [share] + [b for b in (16, 8, 4) if b < share and share % (b // 2) == 0]
    for boxes in options:
        if ring + warps * max(EPI_WARP_BYTES, boxes * EPI_BOX_BYTES) <= budget:
            return boxes
    return 2


def _hopper_smem() -> "tuple[int, int]":
    """Shared memory per SM and per block on every sm_90a GPU of the catalogue (the smallest, so a kernel's
    footprint does not depend on which Hopper it is rendered for)."""
    hoppers = [g for g in catalogue().values() if g.arch is Arch.SM90A]
    return min(g.smem_per_sm for g in hoppers), min(g.smem_per_block_optin for g in hoppers)


def epi_warp_bytes(config: Sm90Config, operands: "Operands | None" = None) -> int:
    """Epilogue staging per consumer warp: the fp32 tile of the st.global path (16 rows x 40 fp32) or the
    TMA-store boxes, whichever is larger (both paths use one region)."""
    return max(EPI_WARP_BYTES, epi_boxes(config, operands) * EPI_BOX_BYTES)


def regs_estimate(config: Sm90Config) -> int:
    """The consumer warpgroup's accumulators (warp.m*warp.n/128, twice with promotion's partial sums) plus ~40;
    the producer needs few."""
    w = config.warp
    return w.m * w.n // 128 * (2 if config.promote else 1) + 40


def regs_allocated(config: Sm90Config, per_thread: int) -> int:
    """setmaxnreg moves registers from the producer (40) to consumers; the CTA's pool is the launch total."""
    if config.warp_specialized:
        return config.math_threads * per_thread + 128 * PRODUCER_REGS
    return config.threads * per_thread


__all__ = ["WIDE_MMA_N", "BARRIER_BYTES", "EPI_BOX_BYTES", "EPI_WARP_BYTES", "PRODUCER_REGS", "a_is_kmajor", "b_is_kmajor", "check", "mn_blocks", "mn_swizzle_bytes",
           "epi_boxes", "epi_warp_bytes", "regs_allocated", "regs_estimate", "smem_bytes"]
