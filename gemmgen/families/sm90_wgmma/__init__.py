"""sm90_wgmma: the Hopper GEMM (sm_90a): TMA, an mbarrier ring, warp specialization and wgmma.

One producer warpgroup issues TMA into a ring of `stages` 128B-swizzled stages; one to three consumer
warpgroups (or two alternating ones, ping-pong) run wgmma m64nNk16 on them, with setmaxnreg moving registers
to the consumers. Knobs (Sm90Config): persistent tile loop, 2x1, 1x2 and 2x2 clusters with multicast, ping-pong, a store
warp for D's TMA stores, the operand swap for skinny M, split-K (reduction launch or fused) and Stream-K.
Templates: templates/sm90_wgmma/. Search space: search_spaces/sm90_wgmma.yaml.
"""
from __future__ import annotations

import math

from ...model import paths
from ...model.arch import Arch, DType, Gpu
from ...model.problem import Layout, Problem, Scaling
from ...model.tiles import DecompKind, Kernel
from .. import register
from ..base import KernelFamily, Launches, ModelTraits, Prepass
from . import context as _context
from . import launch as _launch
from . import rules as _rules
from .config import Schedule, Sm90Config

# Fraction of the datasheet tensor peak the main loop sustains: refit from the 2026-11-22 suite on the H100
# (docs/perf-notes.md, "Model calibration").
EFFICIENCY = 0.90
# A store warp (store_warp) takes the TMA stores' issue off the consumers: the fraction of the cooperative
# persistent kernel's epilogue still exposed with it (docs/perf-notes.md, "The store warp").
STORE_WARP_EXPOSED = 0.9
# Promotion (fp8, 3xTF32): each interval ends with every wgmma of the warpgroup drained (wait 0) before the adds,
# so the tensor cores idle for about this fraction of one k-tile per interval. First a guess (0.15); measured on
# the H100 (docs/perf-notes.md, "Tuned tf32 and fp8 scalings"): 3xTF32 at 4096³ ran 3.5% faster promoting every 8
# k-tiles than every 4 (0.29 from t ∝ 1 + b / interval), fp8 block scaling (every k-tile, plus its rescale) at 87%
# of the 0.15 model, fp8 every k-tile at 0.80-0.93 of unpromoted.
PROMOTE_BUBBLE = 0.25
# A 16-bit D whose rows are off 16-byte boundaries (no TMA store): its bytes cost extra time, on every schedule,
# at these rates (H100, docs/perf-notes.md, "Composed stores": 4096x4095x4096 against 4096³ with the same
# configuration): aligned 16-byte stores composed from the store boxes 13.6 µs for 33.5 MB; the staged element
# stores 26-42 µs (ping-pong and cooperative).
COMPOSED_D_RATE = 2.5e12
ELEMENT_D_RATE = 1.0e12
# Staggered promotion (promote_stagger): one warpgroup's drain runs beside the other warpgroups' wgmmas. Predicted
# first to leave a third of the bubble; measured on the H100 (docs/perf-notes.md, "fp8 promotion intervals"):
# -1.5% to +6% against plain promotion at the same interval, so it is priced at nearly the plain bubble.
PROMOTE_STAGGER_BUBBLE = 0.22
# Tiles of 128-256 rows whose N is not a multiple of 64 (the `widths` spaces: one K-major B box of N rows, the
# staged epilogue) ran slower than the model's price for their MMAs and bytes: measured / predicted 1.00-1.04
# (median per row group) against 0.96 for the 64-multiple tiles timed beside them, over 20 products on the H100
# (docs/perf-notes.md, "Tile widths that fit the waves"). Why is not taken apart; charged as idle tensor time.
ODD_WIDTH_EFFICIENCY = 0.94
# Ping-pong kernels reading A M-major (a column-major 16-bit A, wgmma's transposed A) ran 1.35-1.46x their price
# where the cooperative kernels timed beside them ran at 0.88-0.98x (the model's 14 best at 7408x1256x1032 cc and
# 1336x2784x1440 cr), and 1.07x against 0.98x at 3581x13704x576 cc (9 k-tiles), H100, 2026-11-27; with A K-major
# the two schedules' errors differed by 3-5%. Why is not taken apart; charged as idle tensor time. 0.8 moves the
# first product off a ping-pong tile 29% slower and keeps the third on its faster one (0.72 did not).
PINGPONG_MN_A_EFFICIENCY = 0.8
# Ping-pong tiles with short k-loops, and on rows that are not 128-byte multiples: over 86 products (the model's
# ten best distinct configurations timed on 72 random products and the batch suite, plus the stored tunes; H100,
# 2026-11-27, docs/perf-notes.md "Ping-pong on short k-loops") ping-pong ran slower than its price against the
# cooperative kernels timed beside it by a factor that fell with the k-tiles a tile runs: 1.3-1.75x at 5-27
# k-tiles, 1.2x at 16-48, 1.0x at 64 and more, and a further ~8% where a TMA-loaded operand's rows straddle 128-byte
# lines. Fitted (log-linear, per-problem centred) as about 1.8 k-tiles of the tensor cores' time lost per tile
# (each warpgroup's turn starts only when the other has issued its tile), plus the unaligned rows' share. Why the
# turn costs that much is not taken apart; charged as idle tensor time.
PINGPONG_TURN_KTILES = 1.8
PINGPONG_UNALIGNED_EFFICIENCY = 0.92
# An MN-major (16-bit) B whose tile is not whole 64-column blocks has its narrow part (all of a tile under 64
# columns, the remainder of a wider one) in 16- or 32-column blocks under the 32B or 64B swizzle (rules.mn_blocks).
# Measured on the H100 with whole tiles in such blocks, against the same tiles on a K-major B (2026-11-27,
# docs/perf-notes.md, "Narrow MN-major blocks"): 32B (80, 144 wide) 1.34-1.54x their K-major time at 200x5000x3000
# and 4096^3, 64B 1.03-1.29x (96, 160 wide); Nsight Compute showed the 32B tile L2-throughput-bound (77% against
# 60% for the 128-wide one), 32-byte rows costing L2 about twice per byte. Charged as idle tensor time.
MN_NARROW_EFFICIENCY = {32: 0.7, 64: 0.75}
# A tile wider than 64 columns keeps only its remainder narrow and reads it with a second wgmma of the remainder's
# width (80 = 64 + 16, 144 = 128 + 16, 96 = 64 + 32): measured on the H100 (same notes) at 1.11-1.26x the K-major
# time at 4096^3 (80, 96, 144; 160 1.06x) and 1.04-1.06x at 200x5000x3000, which puts the remainder's columns at
# about half the tensor rate.
MN_REMAINDER_EFFICIENCY = 0.5
# Bytes per second one CTA's TMA loads stream from DRAM, whatever its ring holds: a grid of few CTAs cannot pull
# HBM's rate. Measured on the H100 (docs/perf-notes.md, "Few CTAs streaming B"): 16x14336x4096 rc with 64x256
# tiles (56 CTAs) moved its 118 MB at 47 GB/s per CTA once the launch's fixed time is taken off, where 132 CTAs of
# a swapped 64x16 tile reached 2.55 TB/s.
SM_STREAM_RATE = 48e9
# A 1x2 pair of swapped tiles whose second tile is at most half full (M up to 1.5 tiles): measured 13-35% slower than
# one tile as wide as M (H100, docs/perf-notes.md, "Tiles as wide as the batch": M 40-64 on 64x48 pairs), while the
# model's other terms price the two level; its loads are taken to reach this fraction of the memory rate. (A rule
# would refuse such a pair at the M it still serves correctly.) Re-measured on the H200 (2026-11-27): with edge maps
# 7-47% slower than one 64x64 tile at M 40-64; once a padding CTA loads nothing past the edge, 4% at M 56 and 40
# (14.9 vs 14.3 us, 14.7 vs 14.1), but the model prices the pair ~14% faster than the tile there, so it stays.
HALF_EMPTY_PAIR_LOAD_EFFICIENCY = 0.75
# A 2x1 pair of 64-row tiles over M <= 64: its second CTA has no rows and only loads its half of B for the first.
# Measured on the H100 1.2-1.7x slower than the unclustered or swapped tile the model ranked next at M = 7-56 with
# short K (docs/perf-notes.md, "Pairs of 64-row tiles over M <= 64"), where the model, seeing one wave either way and
# the pair's halved requests, ranked it first. Priced (its main loop and its loads at this fraction), not refused: a
# pair tuned at M 65-128 still serves smaller M.
EMPTY_PAIR_EFFICIENCY = 0.6


def _empty_pair_efficiency(config: "Sm90Config", problem: Problem) -> float:
    """EMPTY_PAIR_EFFICIENCY for a 2x1 pair of 64-row tiles over M <= 64 (its main loop and its loads), else 1."""
    if not config.swap_ab and config.cta.m == 64 and config.cluster.m > 1 and problem.m <= 64:
        return EMPTY_PAIR_EFFICIENCY
    return 1.0
# Bytes per second at which a CTA's TMA boxes cover rows past the tensor's edge (zero fill): measured on the H100
# and the H200 (docs/perf-notes.md, "Rows past the edge"), the 64 x 128 tiles of 129 x 4096 x 4096 took 10.5 us
# longer than those of 192 x 4096 x 4096 (same tiles, grid and traffic) for 63 rows x 128 B x 64 k-tiles past M,
# and 64-wide MN-major boxes 63 columns past M cost the same per byte. The edge tile's CTA pays it beside its share
# of the stream; compute-bound kernels hide it (3000^3 with and without B's edge map measured alike). Edge maps
# (launch.edge_boxes) remove it for K-major operands no cluster shares.
EDGE_FILL_RATE = 49e9


def _mn_narrow(config: Sm90Config, problem: Problem) -> "tuple[float, float]":
    """(the share of the main loop's B columns stored in narrow blocks, their MN_NARROW_EFFICIENCY): all of a tile
    narrower than 64 columns, the remainder of a wider one (rules.mn_blocks); none for a K-major B, whole 64-column
    blocks, or fp8 and tf32 (packed K-major). `problem` is the main loop's: swapped where the kernel swaps, so its B
    is the tile's N columns."""
    if problem.b_dtype.bytes != 2 or _rules.b_is_kmajor(problem.operands):
        return 0.0, 1.0
    _, span, rem, rem_span = _rules.mn_blocks(config.cta.n, 2)
    if rem:
        return rem / config.cta.n, MN_REMAINDER_EFFICIENCY
    return (1.0, MN_NARROW_EFFICIENCY[span]) if span < 128 else (0.0, 1.0)


def _pingpong_turns(config: Sm90Config, problem: Problem) -> float:
    """The share of a ping-pong kernel's time its turns leave to work (PINGPONG_TURN_KTILES and
    PINGPONG_UNALIGNED_EFFICIENCY); 1 for the cooperative schedule."""
    if config.schedule is not Schedule.PINGPONG:
        return 1.0
    share = 1.0 / (1.0 + PINGPONG_TURN_KTILES / max(7, math.ceil(problem.k / config.cta.k)))
    return share * (PINGPONG_UNALIGNED_EFFICIENCY if _rows_straddle_lines(config, problem) else 1.0)


def _rows_straddle_lines(config: Sm90Config, problem: Problem) -> bool:
    """Whether an operand the main loop loads by TMA from the caller's array has rows off 128-byte boundaries."""
    # packed() answers in the main loop's frame, which a swapped kernel turns round
    frame = problem.swapped() if config.swap_ab else problem
    return any(frame.rows_straddle_lines(*_launch.packed(Kernel(Arch.SM90A, problem.operands, config))))


def _mn_narrow_efficiency(config: Sm90Config, problem: Problem) -> float:
    """The tensor rate's fraction left by B's narrow blocks: their share of the B columns runs at their rate."""
    share, efficiency = _mn_narrow(config, problem)
    return 1.0 / (1.0 - share + share / efficiency)


class Sm90Wgmma(KernelFamily):
    name = "sm90_wgmma"
    config_type = Sm90Config
    min_arch = Arch.SM90A
    needs_wgmma = True
    # fp8 (e4m3, e5m2) runs wgmma m64nNk32 and fp32 inputs run as tf32 (m64nNk8), both on K-major operands into
    # the same fp32 accumulators.
    dtypes = frozenset({DType.BF16, DType.F16, DType.E4M3, DType.E5M2, DType.F32})
    # wgmma's fp8 forms take A and B of either fp8 type (.e4m3.e5m2, .e5m2.e4m3): gradients in e5m2 against
    # e4m3 weights or activations. Every other form reads one type for both (rules.py says so too).
    mixed_dtypes = frozenset({(DType.E4M3, DType.E5M2), (DType.E5M2, DType.E4M3)})
    decompositions = frozenset({DecompKind.DATA_PARALLEL, DecompKind.SPLIT_K, DecompKind.STREAM_K})
    # Per-row and per-column fp8 scales (rowcol) are applied to the accumulators before every epilogue path
    # (kernel.cu.j2, scale_rows_cols), in the swapped frame too; block scales (DeepGEMM's 1x128 / 128x128) in the
    # main loop's promotion of each k-tile (mainloop.cuh.j2, rules.py says which configurations take them).
    scalings = frozenset({Scaling.TENSOR, Scaling.ROWCOL, Scaling.BLOCK})
    fused_splitk = True
    # Row sums of A (a Linear layer's bias gradient beside its weight gradient): two producer warps sum the A
    # tiles as they pass through shared memory (rules.py says which configurations).
    row_sums = True
    # Every element offset in templates/sm90_wgmma is computed in size_t (row * ld + col, the pack pass, split-K's
    # planes and reduction, the row sums) and TMA takes 64-bit strides, so operands may exceed 2^31 elements
    # (tests/test_large_operands.py verifies such products on the GPU); M, N, K and the leading dimensions stay
    # `int` in the ABI.
    offset_bits = 64
    template_root = paths.TEMPLATES
    template = "sm90_wgmma/kernel.cu.j2"
    rules = _rules
    space_file = paths.SEARCH_SPACES / "sm90_wgmma.yaml"
    examples = (
        {"family": "sm90_wgmma", "cta": "128x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 3,
         "raster": {"order": "row", "group": 8}, "cluster": "2x1", "warp_specialized": True, "persistent": True},
        {"family": "sm90_wgmma", "cta": "128x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 4,
         "raster": {"order": "row", "group": 8}, "warp_specialized": True, "persistent": True},
        {"family": "sm90_wgmma", "cta": "64x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 4,
         "warp_specialized": True},
        # fp8: BK 128 elements is the same 128-byte swizzle row, wgmma k32
        {"family": "sm90_wgmma", "cta": "128x256x128", "warp": "64x256x128", "mma": "64x256x32", "stages": 4,
         "raster": {"order": "row", "group": 8}, "warp_specialized": True, "persistent": True},
        {"family": "sm90_wgmma", "cta": "128x128x128", "warp": "128x128x128", "mma": "64x128x32", "stages": 6,
         "raster": {"order": "row", "group": 8}, "warp_specialized": True, "persistent": True,
         "schedule": "pingpong"},
        # tf32 (fp32 inputs): BK 32 elements is the 128-byte row, wgmma k8; the first is the tuned 8192³ winner
        {"family": "sm90_wgmma", "cta": "128x256x32", "warp": "64x256x32", "mma": "64x256x8", "stages": 4,
         "raster": {"order": "row", "group": 8}, "cluster": "2x1", "warp_specialized": True, "persistent": True},
        {"family": "sm90_wgmma", "cta": "128x128x32", "warp": "128x128x32", "mma": "64x128x8", "stages": 6,
         "raster": {"order": "row", "group": 8}, "warp_specialized": True, "persistent": True,
         "schedule": "pingpong"},
    )

    def regs_allocated(self, config):
        per_thread = super().regs_allocated(config) // max(1, config.threads)
        return _rules.regs_allocated(config, per_thread)

    def efficiency(self, gpu: Gpu) -> float:
        return EFFICIENCY

    def store_overhead_s(self, config: Sm90Config, problem: Problem, gpu: Gpu) -> float:
        ops = problem.operands
        if ops.align_c >= 8 or ops.c_dtype.bytes != 2:
            return 0.0
        kernel = Kernel(self.min_arch, ops, config)
        if _launch.splits(kernel) > 1 or config.swap_ab:
            return 0.0   # the reduction launch or the transposed staged stores write D: not measured apart
        rate = COMPOSED_D_RATE if _launch.uses_composed_stores(kernel) else ELEMENT_D_RATE
        return problem.m * problem.n * ops.c_dtype.bytes / rate

    def load_efficiency(self, config: Sm90Config, problem: Problem) -> float:
        # A swapped kernel is priced on the swapped problem, whose N is the caller's M.
        if config.swap_ab and config.cluster.n > 1 and 2 * problem.n <= 3 * config.cta.n:
            return HALF_EMPTY_PAIR_LOAD_EFFICIENCY
        return _empty_pair_efficiency(config, problem)

    def edge_fill_s(self, config: Sm90Config, problem: Problem, ctas: int) -> float:
        # Per operand: the rows (MN-major: columns) its last tile row (column) covers past M (N), unless an edge map
        # cuts that box (K-major operands, multicast slices included since 2026-11-27). Its edge tiles are dealt out
        # over the CTAs. An MN-major multicast operand's boxes are left out: not measured apart, and priced at the
        # full rate they moved the picks of 2x1 pairs at 100x5000x3000 and 112x11952x1775 cr to tiles measured
        # 25-30% slower (H200, docs/perf-notes.md, "Rows past the edge").
        kernel = Kernel(self.min_arch, problem.operands, config)
        gp = _launch.gemm_problem(kernel, problem)
        ops = _launch.mainloop_operands(kernel)
        cta, cl = config.cta, config.cluster
        row_bytes = cta.k * ops.a_dtype.bytes * (3 if config.split3 else 1)   # 3xTF32: three K segments
        # A split-K slice covers its share of the k-tiles; the edge tiles' slices are dealt out like tiles.
        splits = _launch.splits(kernel)
        k_tiles = math.ceil(math.ceil(gp.k / cta.k) / splits)
        tiles_m, tiles_n = math.ceil(gp.m / cta.m), math.ceil(gp.n / cta.n)
        cut_a, cut_b = _launch.edge_boxes(kernel)
        seconds = 0.0
        for cut, past, shared, edge_tiles in ((cut_a, tiles_m * cta.m - gp.m, cl.n, tiles_n),
                                              (cut_b, tiles_n * cta.n - gp.n, cl.m, tiles_m)):
            if cut or past == 0 or shared > 1:
                continue
            seconds += math.ceil(edge_tiles * splits / max(1, ctas)) * past * row_bytes * k_tiles / EDGE_FILL_RATE
        return seconds

    def sm_load_rate(self, config: Sm90Config, problem: Problem, warps_per_sm: float) -> float:
        # A CTA's stream slows by its narrow MN-major B blocks' share of the bytes (MN_NARROW_EFFICIENCY).
        share, efficiency = _mn_narrow(config, problem)
        a, b = config.cta.m, config.cta.n   # bytes per k-tile, in rows of one k-tile
        # A ping-pong CTA's turns idle its stream as they idle its tensor cores (measured on memory-bound products
        # too: 10x16032x912 rc, 64x256 ping-pong 1.36x its price where the cooperative tiles beside it ran 1.01x).
        return (SM_STREAM_RATE * (a + b) / (a + b * (1.0 - share) + b * share / efficiency)
                * _pingpong_turns(config, problem))

    def compute_efficiency(self, config: Sm90Config, problem: Problem, gpu: "Gpu | None" = None) -> float:
        # Not the swapped widths (widths_swap): measured on the H100 at 0.82-0.94 of their price without it, where
        # it kept the model off the 128x208 swapped tile at 777x4096x4096 (40 us against 47-49 for its pick) and
        # the 128x224 one at 640x5120x5120 (54 against 56; docs/perf-notes.md, "The transposed epilogue").
        odd_width = (ODD_WIDTH_EFFICIENCY if config.cta.n % 64 and config.cta.m >= 128 and not config.swap_ab
                     else 1.0)
        if config.schedule is Schedule.PINGPONG:
            if problem.a_layout is Layout.COL and problem.a_dtype.bytes == 2:
                odd_width *= PINGPONG_MN_A_EFFICIENCY   # (fp8 and tf32 A are packed K-major first)
            odd_width *= _pingpong_turns(config, problem)
        odd_width *= _mn_narrow_efficiency(config, problem)
        odd_width *= _empty_pair_efficiency(config, problem)
        # Promotion drains the wgmma pipeline every `promote` k-tiles: tensor cores idle for the bubble.
        if not config.promote:
            return odd_width
        bubble = PROMOTE_STAGGER_BUBBLE if config.promote_stagger else PROMOTE_BUBBLE
        return odd_width / (1 + bubble / config.promote)

    def traits(self, config: Sm90Config, gpu: Gpu) -> ModelTraits:
        pingpong = config.schedule is Schedule.PINGPONG
        efficiency = self.efficiency(gpu)
        return ModelTraits(
            tensor_efficiency=efficiency, smem_reads="wgmma", tma_loads=True, persistent=config.persistent,
            epilogue_hidden=pingpong, epilogue_exposed=STORE_WARP_EXPOSED if config.store_warp else 1.0,
            # Ping-pong: each consumer computes whole tiles on about half the ring.
            consumer_tile=config.warp if pingpong else config.cta,
            stages_ahead=config.stages / 2 if pingpong else config.stages - 1, swapped=config.swap_ab)

    def prepass(self, config: Sm90Config, problem: Problem) -> Prepass:
        kernel = Kernel(self.min_arch, problem.operands, config)
        pack_a, pack_b = _launch.packed(kernel)
        if config.split3:
            # One launch writes both operands' small parts; the main loop reads their big parts from the operands
            # themselves where they are aligned and K-major, else from the tile pack's copies (128-byte rows).
            copied = _launch.tile_pack(kernel)
            return Prepass(_launch.prepass_bytes(kernel, problem), 1, copied, copied, _launch.SPLIT_FACTOR)
        return Prepass(_launch.prepass_bytes(kernel, problem), int(pack_a or pack_b), pack_a, pack_b)  # one launch

    def gemm_problem(self, config, problem: Problem) -> Problem:
        return problem.swapped() if config.swap_ab else problem

    def serves(self, kernel: Kernel) -> dict:
        out = super().serves(kernel)
        cfg = kernel.config
        if cfg.swap_ab:
            out["m_max"] = _rules.swap_m_max(cfg)  # the swapped tile's N (a 1x2 pair's two, a few wide ones)
        elif cfg.cta.m == 64 and cfg.cluster.m > 1:
            out["m_max"] = cfg.cta.m * cfg.cluster.m  # a cluster of 64-row tiles covers every row (rules)
        if cfg.split3:   # its int K scalar holds three K segments of whole k-tiles (rules)
            out["k_max"] = _rules.INT_MAX // (_rules.SPLIT_FACTOR * cfg.cta.k) * cfg.cta.k
        return out

    def context(self, kernel: Kernel) -> dict:
        return _context.context(kernel)

    def launches(self, kernel, problem, sm_count=None, max_clusters=None) -> Launches:
        runs, workspace, zero = _launch.manifest_launches(kernel, problem, sm_count, max_clusters)
        return Launches(runs, workspace, zero)


FAMILY = register(Sm90Wgmma())

__all__ = ["FAMILY", "Schedule", "Sm90Config", "Sm90Wgmma"]
