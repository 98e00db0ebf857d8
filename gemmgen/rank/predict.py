"""The tuner's performance model: the predicted time of one configuration on one problem and GPU.

time = max(compute, memory, power) + overheads, built on the calculator's levels (gemmgen.calc) and on what each
kernel family says about its kernels (KernelFamily.traits: main-loop efficiency, how shared memory is read,
TMA loads, persistence, how the epilogue overlaps). Pure Python; no CUDA.

The constants in "Model constants" below are the model's only tunable numbers; a calibration
against measured kernels may refit them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .. import families
from ..calc.intensity import ACC_BYTES, Level, cta_level, mma_level, smem_level, warp_level
from ..families.base import ModelTraits
from ..families.rules import check, ctas_per_sm
from ..model.arch import DType, Gpu, lookup_gpu
from ..model.errors import InvalidConfig
from ..model.problem import Problem
from ..model.tiles import DecompKind, Kernel, RasterOrder, TileConfig, streamk_remainder
from .terms import correction

# --- Model constants --------------------------------------------------------------------------
# A family's main-loop efficiency is its own (KernelFamily.traits); the constants below are shared.
# TMA boxes over rows that do not start on 128-byte boundaries (e.g. ld = 3000 bf16 = 6000 B) ran
# 1.28x (128x256) and 1.50x (128x128) slower than at ld 3008 on the H100 with the tensor maps' 128B L2
# promotion (1.45-1.74x with the former 256B; docs/perf-notes.md, odd3000): the sm90 main loop's rate
# is divided by this at a 128x192 tile whose A and B both straddle lines. The cost is per request, so it scales
# with the straddling operands' requests per FLOP (1/N of the tile for A, 1/M for B, divided among a cluster's
# CTAs that share the tile): 1.36x at 128x256 and 1.48x at 128x128, as measured; 80-wide tiles at 7408x800x8776 cc
# ran 1.2-1.4x their price where 208-224-wide ones ran 0.87-0.94x (2026-11-27, docs/perf-notes.md "Ping-pong on
# short k-loops").
TMA_UNALIGNED_SLOWDOWN = 1.4
TMA_UNALIGNED_REFERENCE = 1 / 128 + 1 / 192   # requests per FLOP (arbitrary units) at which the slowdown is as above
# Clocks from a TMA load's issue to its data in shared memory, under load. The stages ahead of the one
# being consumed must cover it, or the tensor cores wait. Ping-pong consumers each see about half the
# ring. Set so that 128x128x64 ping-pong needs 6 stages, as measured on the H100 (4 stages: 0.94x
# cuBLAS, 6 stages: 1.02x, docs/perf-notes.md); refit from tuning data.
TMA_LATENCY_CLOCKS = 1600.0
DRAM_EFFICIENCY = 0.90  # achievable fraction of datasheet DRAM bandwidth (H100: 3.02 of 3.35 TB/s measured)
LAUNCH_OVERHEAD_S = 3.0e-6  # one kernel launch, as a fixed cost
SMEM_BYTES_PER_CLOCK_PER_SM = 128.0  # shared-memory bandwidth on sm_80..sm_90 (32 banks x 4 bytes)
# L2 -> SM bandwidth per SM per clock: A100 whitepaper gives 5120 B/clk for 108 SMs; Hopper's is
# higher but unpublished, 64 is a model guess a calibration refits.
L2_BYTES_PER_CLOCK_PER_SM = {80: 48.0, 86: 48.0, 89: 48.0, 90: 64.0}
# Overlap of the shared-memory and L2 feeds with the math is imperfect: this fraction of the
# non-binding phases' time shows up in the main loop. It is what makes a tile that needs less
# feed bandwidth faster even when no feed is saturated.
OVERLAP_PENALTY = 0.15
# Loaded DRAM latency. With Little's law, bytes in flight / latency bounds the bandwidth a grid
# with few CTAs can pull: why split-K and small tiles win on skinny problems.
DRAM_LATENCY_S = 1.0e-6
# Fraction of L2 that holds reusable operand panels (H100's L2 is two partitions that may duplicate).
L2_USABLE_FRACTION = 0.5
# The in-kernel fix-up's fixed cost (a gpu-scope fence after the partial stores, the flag's trip through L2,
# the owner's wait): 128x128 Stream-K took ~16 us at 1024^3 where data-parallel 64x128 with the same MMA work
# per CTA took 10.4 us, ~5 us more (docs/perf-notes.md, Stream-K; one data point, refit when there are more).
SK_FIXUP_S = 5.0e-6
# Range mode's fixed cost beyond moving the partials, fitted on the H100 (docs/perf-notes.md, "Stream-K range
# mode"): against the same tile data-parallel, the wave it saves minus its measured gain was 11 us at 8192^3,
# 17 at 4096x4096x14336 and 23 at 4096^3 (not explained yet: the owners do not wait, by construction).
SK_RANGE_FIXUP_S = 15.0e-6
# CTAs of one wave drift apart along K; the live set in L2 spans this many K tiles of each panel.
L2_SKEW_K_TILES = 8
# Fraction of the ideal TMA-multicast saving our sm90 kernel realises. Measured on the H100
# (docs/perf-notes.md, 2026-11-22): 2-CTA clusters ran no faster than 1x1 (0.86-0.99x of it), so the
# model credits none until a kernel shows the gain; refit from tuning data.
MULTICAST_REALIZED = 0.0
# Fused split-K (docs/perf-notes.md, "Fused split-K"): a fixed cost (the arrival's fence, atomic and barriers,
# and a last slice that starts its reduction only after the others) plus the last slice's read of its tile's
# partials at a per-SM rate far below L2's: one SM reduces each tile. Both fitted to the two shapes measured on
# the H100 (16x4096x4096 split 8 with 64x128 tiles: +1.95 us over the reduction launch; 1024x1024x65536 split 4
# with 128x256 tiles: +12.4 us), so they reproduce those two and are not yet validated beyond them.
FUSED_ARRIVE_S = 3.5e-6
FUSED_REDUCE_BYTES_PER_S_PER_SM = 29e9
# The power ceiling (docs/perf-notes.md, "The power ceiling"). A product that runs for more than a few
# milliseconds holds the GPU at its board power limit (Gpu.power_limit_w), where the clock falls until the
# energy per second fits: time >= energy / (limit - static power). Energy is counted per tensor-core FLOP
# (16-bit inputs; scaled by input width for others), per byte read from DRAM (HBM3's published ~3.9 pJ/bit,
# held, not fitted: the fitting sample barely varies DRAM traffic) and per byte of operand tile moved from L2
# through shared memory into the tensor cores (it stands for every hop of that path). So at the power limit a
# tile that moves more bytes per FLOP loses more than the clock-for-clock model says. FLOP and tile-byte
# energies fitted on the H100 to one shape's sustained times (8192^3, 32 random configurations; scored on
# other shapes: benchmarks/power_model_fit.py); other GPUs with a catalogue power limit get the same figures.
STATIC_POWER_W = 100.0
ENERGY_PJ_PER_FLOP = 0.55
ENERGY_PJ_PER_DRAM_BYTE = 31.0
ENERGY_PJ_PER_L2_BYTE = 28.0


@dataclass(frozen=True)
class ModelParams:
    """The model's free parameters: the constants above (their defaults) and a scale on each family's main-loop
    efficiency. `gemmgen calibrate --fit` refits them per GPU (rank/calibration.py stores them)."""

    tma_unaligned_slowdown: float = TMA_UNALIGNED_SLOWDOWN
    tma_latency_clocks: float = TMA_LATENCY_CLOCKS
    dram_efficiency: float = DRAM_EFFICIENCY
    launch_overhead_s: float = LAUNCH_OVERHEAD_S
    smem_bytes_per_clock_per_sm: float = SMEM_BYTES_PER_CLOCK_PER_SM
    l2_bytes_per_clock_per_sm: "float | None" = None  # None: L2_BYTES_PER_CLOCK_PER_SM of the GPU's arch
    overlap_penalty: float = OVERLAP_PENALTY
    dram_latency_s: float = DRAM_LATENCY_S
    l2_usable_fraction: float = L2_USABLE_FRACTION
    sk_fixup_s: float = SK_FIXUP_S
    sk_range_fixup_s: float = SK_RANGE_FIXUP_S
    l2_skew_k_tiles: float = L2_SKEW_K_TILES
    multicast_realized: float = MULTICAST_REALIZED
    fused_arrive_s: float = FUSED_ARRIVE_S
    fused_reduce_bytes_per_s_per_sm: float = FUSED_REDUCE_BYTES_PER_S_PER_SM
    static_power_w: float = STATIC_POWER_W
    energy_pj_per_flop: float = ENERGY_PJ_PER_FLOP
    energy_pj_per_dram_byte: float = ENERGY_PJ_PER_DRAM_BYTE
    energy_pj_per_l2_byte: float = ENERGY_PJ_PER_L2_BYTE
    efficiency_scale: "tuple[tuple[str, float], ...]" = ()  # (family, factor on its efficiency(gpu))
    # (feature, weight in log time) of rank/terms.py: learned corrections on the physical time; none by default.
    terms: "tuple[tuple[str, float], ...]" = ()

    def l2_rate(self, gpu: Gpu) -> float:
        """L2 -> SM bytes per clock per SM."""
        if self.l2_bytes_per_clock_per_sm is not None:
            return self.l2_bytes_per_clock_per_sm
        return L2_BYTES_PER_CLOCK_PER_SM.get(gpu.arch.cc, 48.0)

    def scale_of(self, family: str) -> float:
        return dict(self.efficiency_scale).get(family, 1.0)


DEFAULT_PARAMS = ModelParams()

def config_levels(config: TileConfig, dtype: "DType | str", peak: float,
                  reads: str = "fragments", params: ModelParams = DEFAULT_PARAMS) -> "tuple[Level, ...]":
    """Every level of `config` at `peak` FLOP/clock/SM, from DRAM inwards."""
    cl = config.cluster
    share_m = 1 + (cl.m - 1) * params.multicast_realized
    share_n = 1 + (cl.n - 1) * params.multicast_realized
    return (cta_level(config.cta, dtype, peak, share_m, share_n),
            smem_level(config.warp, dtype, peak, reads),
            warp_level(config.warp, config.mma, peak, dtype),
            mma_level(config.mma, dtype, peak))


def latency_coverage(traits: ModelTraits, bk: int, flop_per_clock: float,
                     params: ModelParams = DEFAULT_PARAMS) -> float:
    """Fraction of the main loop's rate left when the stages in flight do not cover the TMA latency.

    One stage feeds a consumer for (its FLOP / rate) clocks; the stages ahead of it (the family's
    stages_ahead: stages-1, or about half the ring per consumer in the ping-pong schedule) must last
    TMA_LATENCY_CLOCKS."""
    tile = traits.consumer_tile
    stage_clocks = 2.0 * tile.m * tile.n * bk / flop_per_clock
    return min(1.0, traits.stages_ahead * stage_clocks / params.tma_latency_clocks)


# --- Whole problem ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    """What the model expects of one configuration on one problem and GPU."""

    time_s: float
    tflops: float  # useful FLOP (2*M*N*K) / time
    bound: str  # 'compute', 'memory' or 'power' (the board power limit): which side sets the main kernel's time
    limiter: str  # what limits within that side: 'tensor', 'smem', 'l2', 'waves', 'dram' or 'power'
    flops: int  # 2*M*N*K
    executed_flops: float  # including the padding of partial tiles
    dram_bytes: float  # after L2 reuse
    tiled_bytes: float  # A read ceil(N/BN) times, B ceil(M/BM) times, plus C/D, bias and partials
    l2_saved_bytes: float
    intensity: float  # flops / dram_bytes
    tiled_intensity: float
    tiles: int
    units: int  # CTAs' work items: tiles x splits
    waves: float
    wave_efficiency: float
    ctas_per_sm: int
    occupancy: float  # resident threads / max threads per SM
    tensor_efficiency: float  # achieved fraction of the tensor peak in the main loop (before waves)
    compute_s: float
    memory_s: float
    power_s: float    # the energy's time at the board's power limit (0: no limit in the catalogue)
    overhead_s: float
    dram_rate: float  # bytes/s the grid can pull
    levels: "tuple[Level, ...]" = field(default=())
    correction: float = 1.0  # the learned terms' factor already in time_s (rank/terms.py); 1 without terms
    prepass_bytes: float = 0.0  # DRAM bytes of the pre-pass (packed or transposed operands), inside overhead_s
    prepass_s: float = 0.0      # its time at the copy rate, launch included (part of overhead_s)
    # The main loop at the power limit, wave by wave (full waves stretched to their energy's share, the part-empty
    # last wave at its own draw): time_s is max(compute_s, memory_s, power_bound_s) + overhead_s, times correction.
    power_bound_s: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["levels"] = [lv.to_dict() for lv in self.levels]
        return d


def tensor_efficiency(family: str, gpu: Gpu) -> float:
    """The model constant: fraction of peak the family's main loop sustains on this GPU."""
    return families.get(family).efficiency(gpu)


def footprint(wave: int, tiles_m: int, tiles_n: int, order: RasterOrder, group: int) -> "tuple[int, int]":
    """Distinct tile rows and columns that `wave` consecutive CTAs cover under the rasterization.

    Row order walks along N; a group g > 1 walks panels g tile-rows tall column by column
    (CUTLASS-style swizzle), so one wave covers about g rows and wave/g columns. Column order mirrors it.
    """
    if order is RasterOrder.COL:
        cols, rows = footprint(wave, tiles_n, tiles_m, RasterOrder.ROW, group)
        return rows, cols
    panel = max(1, min(group, tiles_m))
    if wave >= panel * tiles_n:
        return min(tiles_m, math.ceil(wave / tiles_n)), tiles_n
    if wave <= panel:
        return wave, 1
    return panel, min(tiles_n, math.ceil(wave / panel))


def predict(problem: Problem, config: TileConfig, gpu: "Gpu | str", params: "ModelParams | None" = None) -> Prediction:
    """Predicted time of `config` on `problem` and `gpu` (with the model's free parameters `params`, by default
    the constants above); raises InvalidConfig if it cannot run.

    time = (max(compute, memory, power) + overheads) x the learned terms' correction (rank/terms.py; 1 by default),
    where
      compute = executed FLOP / (SMs * peak/SM * family efficiency * feed efficiency) / wave efficiency,
      memory  = DRAM bytes after L2 reuse / min(0.9 * bandwidth, CTAs * bytes in flight / latency)
                + the edge tiles' boxes past M or N (the family's edge_fill_s),
      power   = energy of the FLOPs, DRAM bytes and tile bytes / (board power limit - static draw),
    and overheads are the launch(es), the split-K reduction pass and, for non-persistent kernels,
    each wave's pipeline fill and epilogue.
    """
    gpu = lookup_gpu(gpu)   # a catalogue name ("h100") too, as roofline() and peak_per_sm() take
    violations = check(config, gpu, problem=problem)
    if violations:
        raise InvalidConfig(Kernel(gpu.arch, problem.operands, config).name, violations)
    p = params or DEFAULT_PARAMS
    traits = families.of(config).traits(config, gpu)
    # Operands packed before the main loop (rows TMA cannot read in place): the copies' traffic and launches
    # are charged as overhead, and the main loop reads rows that start on 128-byte boundaries.
    prepass = families.of(config).prepass(config, problem)
    caller = problem
    if traits.swapped:
        # The main loop runs on D^T = B^T @ A^T: the same FLOPs and bytes, tiled the other way round (the bias,
        # counted per column below, is a handful of bytes either way).
        problem = problem.swapped()
    ops = problem.operands
    # One element size serves A and B: Problem lets their dtypes differ only as an fp8 pair, both 1 byte.
    elt, c_elt = problem.a_dtype.bytes, problem.c_dtype.bytes
    m, n, k = problem.m, problem.n, problem.k * prepass.k_factor   # 3xTF32 runs its main loop over 3K
    cta = config.cta
    clock = gpu.boost_clock_mhz * 1e6
    # A mixed fp8 pair runs at the slower of its inputs' rates (the same fp8 rate in the catalogue).
    peak = min(gpu.tensor_flop_per_clock_per_sm(dt) for dt in (problem.a_dtype, problem.b_dtype))

    # Work decomposition.
    tiles_m, tiles_n = math.ceil(m / cta.m), math.ceil(n / cta.n)
    # A cluster runs whole: where the tile rows (columns) do not divide by its M (N), the CTAs of the last
    # cluster past the edge run their main loops too (they take part in its multicasts). Measured on the H100:
    # 192x112 tiles at 513x4096x4096 (3 tile rows) 33 us in 1x1, 61 in 2x1 clusters (148 CTAs, two waves).
    run_m = math.ceil(tiles_m / config.cluster.m) * config.cluster.m
    run_n = math.ceil(tiles_n / config.cluster.n) * config.cluster.n
    tiles = run_m * run_n
    k_tiles = math.ceil(k / cta.k)
    decomp = config.decomposition
    splits = decomp.splits if decomp.kind is DecompKind.SPLIT_K else 1
    units = tiles * splits
    per_sm = ctas_per_sm(config, gpu, ops)
    slots = per_sm * gpu.sm_count
    sk_rem, sk_slices = 0, 1
    if decomp.kind is DecompKind.STREAM_K:
        # The template's scheme: full waves data-parallel, the last partial wave's `rem` tiles cut into
        # S = min(slots // rem, K tiles, 16) K slices, so that wave takes 1/S of a tile's time; where that
        # wave is more than half full (S = 1), its K iterations dealt out to every slot in contiguous ranges
        # (range mode, S = 0 here): the wave takes ceil(rem * K tiles / slots) iterations.
        # In a cluster the kernel deals cluster tiles to resident clusters: the same split in units of the cluster.
        size = config.cluster.size
        sk_rem, sk_slices = streamk_remainder(tiles // size, max(1, slots // size), k_tiles)
        sk_rem *= size
    if sk_slices > 1:
        units = tiles - sk_rem + sk_rem * sk_slices
        waves = tiles / slots
        wave_eff = waves / (tiles // slots + 1.0 / sk_slices)
    elif sk_slices == 0:
        units = tiles - sk_rem + slots
        waves = tiles / slots
        wave_eff = waves / (tiles // slots + math.ceil(sk_rem * k_tiles / slots) / k_tiles)
    else:
        waves = units / slots
        wave_eff = units / (math.ceil(units / slots) * slots)
    active_ctas = min(units, slots)
    occupancy = per_sm * config.threads / gpu.max_threads_per_sm

    # Compute: the tensor cores do whole tiles, padding included.
    executed = 2.0 * (run_m * cta.m) * (run_n * cta.n) * (k_tiles * cta.k)
    fam_eff = min(1.0, traits.tensor_efficiency * p.scale_of(config.family))
    # What the kernel's own work beside the MMAs costs (fp8 promotion's drains, unaligned rows moved through
    # registers): time in which the tensor cores idle, kept apart for the power ceiling below.
    busy_fraction = families.of(config).compute_efficiency(config, problem, gpu)
    fam_eff *= busy_fraction
    straddle_a, straddle_b = problem.rows_straddle_lines(prepass.packed_a, prepass.packed_b)
    if traits.tma_loads and (straddle_a or straddle_b):
        # The slowdown is per TMA request: a tile's A requests per FLOP go with 1/N, B's with 1/M, and a cluster
        # multicasts (its CTAs along N share A's tile and those along M share B's, so each CTA issues only its
        # share; docs/perf-notes.md, odd3000: a 1x2 cluster gained more at unaligned rows than at aligned ones).
        cl = config.cluster
        requests = straddle_a / (cta.n * cl.n) + straddle_b / (cta.m * cl.m)
        fam_eff /= 1.0 + (p.tma_unaligned_slowdown - 1.0) * requests / TMA_UNALIGNED_REFERENCE
    if traits.tma_loads:
        fam_eff *= latency_coverage(traits, cta.k, peak * fam_eff, p)
    levels = config_levels(config, problem.a_dtype, peak, traits.smem_reads, p)
    l2_rate = p.l2_rate(gpu)
    target = peak * fam_eff  # FLOP/clk/SM the main loop aims for
    util = {"tensor": 1.0,
            "smem": target / levels[1].intensity / p.smem_bytes_per_clock_per_sm,
            "l2": target / levels[0].intensity / l2_rate}
    slowest = max(util, key=util.get)
    loop_time = util[slowest] + p.overlap_penalty * (sum(util.values()) - util[slowest])
    achieved = fam_eff / loop_time
    compute_s = executed / (gpu.sm_count * peak * clock * achieved) / wave_eff

    # Memory: tiled traffic, then what L2 reuse within a wave (or a whole-problem fit) saves.
    a_once, b_once = m * k * elt, k * n * elt
    a_tiled, b_tiled = a_once * tiles_n, b_once * tiles_m
    # Split-K slices run one after another (z is the slowest grid axis), so a wave shares panels
    # only among the tiles of one slice.
    wave_tiles = max(1, min(slots, tiles))
    rows, cols = footprint(wave_tiles, tiles_m, tiles_n, config.raster.order, config.raster.group)
    usable_l2 = gpu.l2_bytes * p.l2_usable_fraction
    if a_once + b_once <= usable_l2:
        a_dram, b_dram = float(a_once), float(b_once)  # both operands stay in L2: each read once
    else:
        live = (rows * cta.m + cols * cta.n) * cta.k * elt * p.l2_skew_k_tiles
        reuse = min(1.0, usable_l2 / live)
        a_dram = max(a_once, a_tiled * (reuse * rows / wave_tiles + (1 - reuse)))
        b_dram = max(b_once, b_tiled * (reuse * cols / wave_tiles + (1 - reuse)))
    out = m * n * c_elt + (m * n * c_elt if problem.epilogue.beta != 0 else 0) \
        + (n * c_elt if problem.epilogue.bias else 0)
    partials = 0.0
    if splits > 1:
        partials = 2.0 * splits * m * n * ACC_BYTES  # fp32 partials written, then read by the reduction
    elif sk_slices > 1:
        partials = 2.0 * sk_rem * (sk_slices - 1) * cta.m * cta.n * ACC_BYTES  # slices 1.. written, then read
    elif sk_slices == 0:
        partials = 2.0 * (slots - sk_rem) * cta.m * cta.n * ACC_BYTES   # ~one per range that begins mid-tile
    tiled_bytes = a_tiled + b_tiled + out + partials
    dram_bytes = a_dram + b_dram + out + partials

    stage = (min(cta.m, m) * cta.k + cta.k * min(cta.n, n)) * elt
    in_flight = families.of(config).bytes_in_flight(config, problem) or max(1, config.stages - 1) * stage
    dram_rate = min(gpu.dram_bandwidth * p.dram_efficiency, active_ctas * in_flight / p.dram_latency_s)
    family = families.of(config)
    dram_rate *= family.load_efficiency(config, problem)
    sm_rate = family.sm_load_rate(config, problem, min(per_sm, math.ceil(units / gpu.sm_count)) * config.threads / 32)
    if sm_rate:
        dram_rate = min(dram_rate, min(units, gpu.sm_count) * sm_rate)
    memory_s = (dram_bytes - (partials / 2 if splits > 1 else 0)) / dram_rate
    # The CTA with the edge tiles also fills its boxes' rows past M or N (TMA zero fill, at its own rate): on top
    # of its share of the stream, so it shows where the loads are the bound and hides under compute.
    memory_s += family.edge_fill_s(config, caller, active_ctas)

    # Fixed costs: launches, the reduction pass's read of the partials, and each tile's epilogue where
    # nothing overlaps it. Measured on the H100 (docs/perf-notes.md, ping-pong): in the cooperative
    # persistent kernel both consumer warpgroups store together while the tensor cores idle; only the
    # ping-pong schedule hides the epilogue behind the other warpgroup's main loop.
    # The pre-pass (packing, transposing fp8/tf32 operands to K-major, 3xTF32's split) is a copy: its bytes read
    # and written at the copy rate, plus its launch.
    prepass_s = prepass.launches * p.launch_overhead_s + prepass.dram_bytes / (gpu.dram_bandwidth * p.dram_efficiency)
    overhead = p.launch_overhead_s + prepass_s + families.of(config).store_overhead_s(config, problem, gpu)
    if splits > 1 and decomp.fused:
        # No second launch, but each tile's last slice reads every slice's partial of its tile back after the
        # others have arrived, on one SM; the last wave's tiles put that read on the critical path.
        tile_rows, tile_cols = min(cta.m, m), min(cta.n, n)
        overhead += p.fused_arrive_s + math.ceil(tiles / slots) * splits * tile_rows * tile_cols * ACC_BYTES / \
            p.fused_reduce_bytes_per_s_per_sm
    elif splits > 1:
        overhead += p.launch_overhead_s + (partials / 2) / (gpu.dram_bandwidth * p.dram_efficiency)
    if sk_slices > 1:
        # A remainder tile's owner reads the other slices' partials one after another, from L2.
        overhead += p.sk_fixup_s + (sk_slices - 1) * cta.m * cta.n * ACC_BYTES / (l2_rate * clock)
    elif sk_slices == 0:
        # A range mode CTA stores its first piece's partial, then as an owner reads the (slots - rem) / rem
        # partials of its tile's other pieces on average, from L2.
        overhead += p.sk_range_fixup_s + (1.0 + (slots - sk_rem) / sk_rem) * cta.m * cta.n * ACC_BYTES / (
            l2_rate * clock)
    epilogue = cta.m * cta.n * c_elt / (gpu.dram_bandwidth * p.dram_efficiency / gpu.sm_count)
    if not traits.persistent:
        overhead += math.ceil(max(waves, 1e-9)) * (p.dram_latency_s + epilogue) / max(1, per_sm)
    elif traits.epilogue_hidden:
        # Ping-pong hides a tile's epilogue behind the other consumer's main loop, but not the last tile's: nothing
        # runs after it. Short products pay it in full (88x8808x384 cc, one tile a CTA: the 64x256 ping-pong pick ran
        # 9.7 us where a cooperative 128x80 pair the model had level ran 5.8; docs/perf-notes.md, "Ping-pong's last
        # epilogue").
        overhead += p.dram_latency_s + epilogue
    else:
        overhead += p.dram_latency_s + math.ceil(max(waves, 1e-9)) * epilogue * traits.epilogue_exposed

    power_s = power_time(executed, dram_bytes, tiled_bytes, problem.a_dtype, gpu, p)
    # At the power limit the busy part of the main loop stretches to the energy's time; the idle part (the tensor
    # cores waiting on a drain) draws little and adds to it (a promoted fp8 kernel stays slower than an
    # unpromoted one when both are power-bound).
    if power_s:   # no ceiling on this GPU: nothing to stretch
        power_s += compute_s * (1.0 - busy_fraction)
        # The ceiling holds wave by wave: a full wave takes the longer of its compute and its share of the energy,
        # while a part-empty last wave draws in proportion to its busy slots, and its few SMs run at their clock,
        # not the power's (8192x4096x4096 on the H100: 832 tiles of 128x320, 6.3 waves, ran 6% slower than 1024
        # tiles of 128x256, 7.8 waves, where the energy over all waves had them level; docs/perf-notes.md).
        full = math.floor(waves)
        wave_s = compute_s * wave_eff / waves                  # one full wave's compute
        tail_s = max(0.0, compute_s - full * wave_s)           # the last wave's (a Stream-K slice's: shorter)
        share_s = power_s / waves                              # one full wave's energy at the ceiling
        stretched_s = full * max(wave_s, share_s) + (max(tail_s, (waves - full) * share_s) if tail_s > 0 else 0.0)
    else:
        stretched_s = 0.0
    main = max(compute_s, memory_s, stretched_s)
    bound = "compute" if compute_s >= memory_s else "memory"
    if stretched_s > max(compute_s, memory_s):
        bound = "power"
    if prepass_s > main:
        # The copy before the main loop takes longer than the main loop itself (a transposed operand of a
        # skinny product): DRAM-bound, and the pack is what to remove (lay the operand out K-major).
        bound, limiter = "memory", "pack"
    elif bound == "power":
        limiter = "power"
    elif bound == "memory":
        limiter = "dram"
    elif wave_eff < 0.5:
        limiter = "waves"
    else:
        limiter = slowest
    corr = correction(p.terms, config, problem, wave_eff)
    time_s = (main + overhead) * corr
    return Prediction(
        time_s=time_s, tflops=problem.flops / time_s / 1e12, bound=bound, limiter=limiter, flops=problem.flops,
        executed_flops=executed, dram_bytes=dram_bytes, tiled_bytes=tiled_bytes,
        l2_saved_bytes=tiled_bytes - dram_bytes, intensity=problem.flops / dram_bytes,
        tiled_intensity=problem.flops / tiled_bytes, tiles=tiles, units=units, waves=waves,
        wave_efficiency=wave_eff, ctas_per_sm=per_sm, occupancy=occupancy, tensor_efficiency=achieved,
        compute_s=compute_s, memory_s=memory_s, power_s=power_s, overhead_s=overhead, dram_rate=dram_rate, levels=levels,
        correction=corr, prepass_bytes=float(prepass.dram_bytes), prepass_s=prepass_s, power_bound_s=stretched_s)



def power_time(executed_flops: float, dram_bytes: float, l2_bytes: float, dtype: "DType | str", gpu: Gpu,
               params: ModelParams = DEFAULT_PARAMS) -> float:
    """Seconds the work takes at the GPU's board power limit: its energy over the power left after the static
    draw; 0 where the catalogue has no limit for the GPU or the model no energy figures. A FLOP's energy scales
    with the inputs' width (fp8 at half a 16-bit FLOP's, tf32 at twice: the datapath moves that many bits)."""
    budget = gpu.power_limit_w - params.static_power_w
    if budget <= 0 or not params.energy_pj_per_flop:
        return 0.0
    width = DType.parse(dtype).bytes / 2.0
    joules = 1e-12 * (executed_flops * params.energy_pj_per_flop * width
                      + dram_bytes * params.energy_pj_per_dram_byte + l2_bytes * params.energy_pj_per_l2_byte)
    return joules / budget


__all__ = ["DEFAULT_PARAMS", "ModelParams", "Prediction", "config_levels", "footprint", "latency_coverage", "power_time", "predict", "tensor_efficiency"]
