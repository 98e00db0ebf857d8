"""Arithmetic intensity per level of the tile hierarchy, the roofline, and the predicted time of a
configuration on a GPU: the public calculator, and the model the tuner ranks configurations by.

Pure functions and frozen dataclasses; no CUDA. Two halves:

* Per level (`cta_level`, `smem_level`, `warp_level`, `mma_level`): FLOP per byte that level of
  the hierarchy moves, and the bytes per clock per SM it must deliver to keep the tensor cores at a
  given peak (FLOP per clock per SM).
* Per problem (`roofline`, `predict`): minimum traffic, tiled traffic with operand re-reads, what L2
  reuse under the rasterization saves, waves, occupancy, a predicted time and the bound that binds.

The constants in "Model constants" below are the model's only tunable numbers; a calibration
against measured kernels may refit them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..model.arch import DType, Gpu
from ..families.rules import ctas_per_sm as _ctas_per_sm
from ..families.rules import check
from ..model.errors import InvalidConfig, InvalidInput
from ..model.problem import Problem
from ..model.tiles import DecompKind, Family, Kernel, RasterOrder, Schedule, Shape3, TileConfig, streamk_remainder

# --- Model constants --------------------------------------------------------------------------
# Fraction of the datasheet tensor peak a family's main loop sustains when nothing else limits it.
# mma.sync cannot feed Hopper's tensor cores (about 65% of peak reported). sm90_wgmma: refit from the
# 2026-11-22 suite on the H100 (results/h100-sxm/suite-20261122-051751.json): at 0.85 the large shapes
# measured 3-11% above the prediction; 0.90 centres them.
TENSOR_EFFICIENCY_HOPPER = {Family.SM80_MMA: 0.65, Family.SM90_WGMMA: 0.90}
# TMA boxes over rows that do not start on 128-byte boundaries (e.g. ld = 3000 bf16 = 6000 B) ran
# 1.28x (128x256) and 1.50x (128x128) slower than at ld 3008 on the H100 with the tensor maps' 128B L2
# promotion (1.45-1.74x with the former 256B; docs/perf-notes.md, odd3000): the sm90 main loop's rate
# is divided by this.
TMA_UNALIGNED_SLOWDOWN = 1.4
# Clocks from a TMA load's issue to its data in shared memory, under load. The stages ahead of the one
# being consumed must cover it, or the tensor cores wait. Ping-pong consumers each see about half the
# ring. Set so that 128x128x64 ping-pong needs 6 stages, as measured on the H100 (4 stages: 0.94x
# cuBLAS, 6 stages: 1.02x, docs/perf-notes.md); refit from tuning data.
TMA_LATENCY_CLOCKS = 1600.0
TENSOR_EFFICIENCY_OTHER = {Family.SM80_MMA: 0.80}  # mma.sync on sm_80/86/89
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
ACC_BYTES = 4  # fp32 accumulators and split-K partials
# Fused split-K (docs/perf-notes.md, "Fused split-K"): a fixed cost (the arrival's fence, atomic and barriers,
# and a last slice that starts its reduction only after the others) plus the last slice's read of its tile's
# partials at a per-SM rate far below L2's: one SM reduces each tile. Both fitted to the two shapes measured on
# the H100 (16x4096x4096 split 8 with 64x128 tiles: +1.95 us over the reduction launch; 1024x1024x65536 split 4
# with 128x256 tiles: +12.4 us), so they reproduce those two and are not yet validated beyond them.
FUSED_ARRIVE_S = 3.5e-6
FUSED_REDUCE_BYTES_PER_S_PER_SM = 29e9
# A store warp (config.store_warp) takes the TMA stores' issue off the consumers. On the H100 (timeline.py, 4096^3,
# 128x256) the epilogue per tile fell from 1.76 to 0.51 us while the next tile's main loop grew by ~0.5 us (the
# stores' shared-memory reads now overlap it): 0.57 of it stayed exposed by the stamps. Timed with events over
# eight suite winners it was 0.995x on average (0.96-1.02): the card is power-limited, so an idle gap removed
# partly comes back as a lower clock. The model keeps 0.9 of the epilogue, about what the events showed, so that
# it does not rank the store warp ahead for a gain measured only by the stamps (docs/perf-notes.md).
STORE_WARP_EXPOSED = 0.9

# The seed note's inputs (../shared/seeds/003_*.txt): its warp shapes, with m16n8k16.
SEED_MMA = Shape3(16, 8, 16)
SEED_WARP_SHAPES = (Shape3(16, 8, 16), Shape3(64, 64, 32), Shape3(32, 128, 32), Shape3(16, 64, 32),
                    Shape3(16, 128, 32), Shape3(32, 32, 32), Shape3(64, 64, 64), Shape3(32, 32, 64),
                    Shape3(64, 32, 32))
SEED_PEAK_PER_SM = 6780.0  # the note's (mis-derived) FLOP/clock/SM; the catalogue holds ~512


# --- Per level -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Level:
    """One level of the hierarchy: the work of one step, the bytes it moves, and the feed rate it needs."""

    name: str
    shape: Shape3
    flops: float  # FLOP of one step at this level
    bytes: float  # bytes that step moves into the level
    peak_per_sm: float  # FLOP per clock per SM the rate below is computed for
    counts: str  # what the bytes count, in words

    @property
    def intensity(self) -> float:
        """FLOP per byte moved at this level."""
        return self.flops / self.bytes

    @property
    def bytes_per_clock(self) -> float:
        """Bytes per clock per SM this level must deliver to keep the tensor cores at peak_per_sm."""
        return self.peak_per_sm / self.intensity

    def to_dict(self) -> dict:
        return {"level": self.name, "shape": str(self.shape), "flops": self.flops, "bytes": self.bytes,
                "intensity": self.intensity, "bytes_per_clock_per_sm": self.bytes_per_clock,
                "peak_per_sm": self.peak_per_sm, "counts": self.counts}


def _elt_bytes(dtype: "DType | str | int") -> int:
    return dtype if isinstance(dtype, int) else DType.parse(dtype).bytes


def cta_level(cta: Shape3, dtype: "DType | str | int" = "bf16", peak_per_sm: float = 1.0,
              multicast_m: int = 1, multicast_n: int = 1) -> Level:
    """Global (L2/DRAM) -> shared memory at the CTA tile.

    One k-step of a CTA does 2*BM*BN*BK FLOP and loads an A tile (BM*BK) and a B tile (BK*BN):
    FLOP/byte = 2*BM*BN*BK / ((BM*BK + BK*BN) * elt_bytes); bf16 128x256x64 gives 85.33.
    With a cluster's TMA multicast, A is shared by the `multicast_n` CTAs along N and B by the
    `multicast_m` CTAs along M, so each CTA's share of the L2 traffic shrinks by those factors.
    """
    elt = _elt_bytes(dtype)
    a = cta.m * cta.k * elt / multicast_n
    b = cta.k * cta.n * elt / multicast_m
    note = "A and B tiles per CTA k-step (BM*BK + BK*BN elements)"
    if multicast_m * multicast_n > 1:
        note += f", A shared by {multicast_n} and B by {multicast_m} CTAs (multicast)"
    return Level("global->shared", cta, 2.0 * cta.m * cta.n * cta.k, a + b, peak_per_sm, note)


def smem_level(warp: Shape3, dtype: "DType | str | int" = "bf16", peak_per_sm: float = 1.0,
               family: Family = Family.SM80_MMA) -> Level:
    """Shared memory -> registers (or tensor cores) at the warp tile: the A and B operand bytes only.

    sm80_mma: each warp reads its A fragment (WM*WK) and B fragment (WK*WN) with ldmatrix:
    FLOP/byte = 2*WM*WN*WK / ((WM*WK + WK*WN) * elt_bytes).
    sm90_wgmma: each m64nNk16 instruction of a warpgroup reads its 64x16 A slice and the whole
    16xN B slice from shared memory, so B is read WM/64 times: FLOP/byte = 2*WN / ((1 + WN/64) * elt).
    """
    elt = _elt_bytes(dtype)
    flops = 2.0 * warp.m * warp.n * warp.k
    if family is Family.SM90_WGMMA:
        bytes_ = (warp.m * warp.k + (warp.m / 64) * warp.k * warp.n) * elt
        note = "A slices and B (re-read per m64 instruction) per warpgroup k-step"
    else:
        bytes_ = (warp.m * warp.k + warp.k * warp.n) * elt
        note = "A and B fragments per warp k-step (ldmatrix)"
    return Level("shared->registers", warp, flops, bytes_, peak_per_sm, note)


def warp_level(warp: Shape3, mma: Shape3, peak_per_sm: float = SEED_PEAK_PER_SM,
               dtype: "DType | str | int" = "f16") -> Level:
    """The seed note's warp-level intensity: A and B fragments plus accumulator traffic per MMA k-step.

    A warp tile WM x WN x WK does 2*WM*WN*WK FLOP; it reads WM*WK of A and WK*WN of B, and touches
    its WM*WN accumulators once per MMA k-step (WK/MmaK times). Counted, as the note does, at the
    input element size, FLOP/byte = (2/elt_bytes) / (1/WM + 1/WN + 1/MmaK); for 16-bit inputs that
    is exactly the note's 1 / (1/WM + 1/WN + 1/MmaK), and bytes/clock = peak_per_sm / intensity.
    """
    elt = _elt_bytes(dtype)
    flops = 2.0 * warp.m * warp.n * warp.k
    # Written as the note's closed form so the table reproduces digit for digit.
    intensity = (2.0 / elt) / (1.0 / warp.m + 1.0 / warp.n + 1.0 / mma.k)
    return Level("warp (seed note)", warp, flops, flops / intensity, peak_per_sm,
                 "A, B fragments + accumulators once per MMA k-step, at the input element size")


def mma_level(mma: Shape3, dtype: "DType | str | int" = "bf16", peak_per_sm: float = 1.0,
              acc_bytes: int = ACC_BYTES) -> Level:
    """Register level at one MMA instruction: A and B fragments in, fp32 C in and D out.

    FLOP/byte = 2*m*n*k / ((m*k + k*n)*elt_bytes + 2*m*n*acc_bytes); m16n8k16 bf16 gives 2.286.
    """
    elt = _elt_bytes(dtype)
    bytes_ = (mma.m * mma.k + mma.k * mma.n) * elt + 2 * mma.m * mma.n * acc_bytes
    return Level("registers->MMA", mma, 2.0 * mma.m * mma.n * mma.k, bytes_, peak_per_sm,
                 "A, B fragments and fp32 C in, D out per instruction")


def peak_per_sm(gpu: Gpu, dtype: "DType | str") -> float:
    """Dense tensor FLOP per clock per SM of `gpu` for `dtype`, from the catalogue."""
    return gpu.tensor_flop_per_clock_per_sm(dtype)


def seed_table(peak: float = SEED_PEAK_PER_SM, mma: Shape3 = SEED_MMA,
               warps: "tuple[Shape3, ...]" = SEED_WARP_SHAPES, dtype: "DType | str" = "f16") -> "list[Level]":
    """The seed note's warp-level table: one row per warp shape."""
    return [warp_level(w, mma, peak, dtype) for w in warps]


def config_levels(config: TileConfig, dtype: "DType | str", peak: float) -> "tuple[Level, ...]":
    """Every level of `config` at `peak` FLOP/clock/SM, from DRAM inwards."""
    cl = config.cluster
    share_m = 1 + (cl.m - 1) * MULTICAST_REALIZED
    share_n = 1 + (cl.n - 1) * MULTICAST_REALIZED
    return (cta_level(config.cta, dtype, peak, share_m, share_n),
            smem_level(config.warp, dtype, peak, config.family),
            warp_level(config.warp, config.mma, peak, dtype),
            mma_level(config.mma, dtype, peak))


def latency_coverage(config: TileConfig, flop_per_clock: float) -> float:
    """Fraction of the main loop's rate left when the stages in flight do not cover the TMA latency.

    One stage feeds a consumer for (its FLOP / rate) clocks; the stages ahead of it (stages-1, or about
    half the ring per consumer in the ping-pong schedule) must last TMA_LATENCY_CLOCKS."""
    per_consumer_tile = config.warp if config.schedule is Schedule.PINGPONG else config.cta
    stage_clocks = 2.0 * per_consumer_tile.m * per_consumer_tile.n * config.cta.k / flop_per_clock
    if config.schedule is Schedule.PINGPONG:
        ahead = config.stages / 2
    else:
        ahead = config.stages - 1
    return min(1.0, ahead * stage_clocks / TMA_LATENCY_CLOCKS)


# --- Whole problem ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    """What the model expects of one configuration on one problem and GPU."""

    time_s: float
    tflops: float  # useful FLOP (2*M*N*K) / time
    bound: str  # 'compute' or 'memory': which side sets the main kernel's time
    limiter: str  # what limits within that side: 'tensor', 'smem', 'l2', 'waves' or 'dram'
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
    overhead_s: float
    dram_rate: float  # bytes/s the grid can pull
    levels: "tuple[Level, ...]" = field(default=())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["levels"] = [lv.to_dict() for lv in self.levels]
        return d


@dataclass(frozen=True)
class Roofline:
    """The problem against the GPU's roofline, and a configuration's prediction if one was given."""

    problem: Problem
    gpu: Gpu
    peak_flops: float  # datasheet dense tensor FLOP/s for the dtype
    bandwidth: float  # datasheet DRAM bytes/s
    flops: int
    min_bytes: int
    prediction: "Prediction | None" = None

    @property
    def ridge(self) -> float:
        """FLOP per byte where the memory roof meets the compute roof."""
        return self.peak_flops / self.bandwidth

    @property
    def min_intensity(self) -> float:
        return self.flops / self.min_bytes

    @property
    def bound(self) -> str:
        """At minimum traffic: 'compute' if the intensity is past the ridge, else 'memory'."""
        return "compute" if self.min_intensity >= self.ridge else "memory"

    @property
    def attainable_flops(self) -> float:
        return min(self.peak_flops, self.min_intensity * self.bandwidth)

    @property
    def time_lower_bound_s(self) -> float:
        return max(self.flops / self.peak_flops, self.min_bytes / self.bandwidth)

    def to_dict(self) -> dict:
        return {"problem": self.problem.to_dict(), "gpu": self.gpu.key, "peak_flops": self.peak_flops,
                "bandwidth": self.bandwidth, "ridge": self.ridge, "flops": self.flops, "min_bytes": self.min_bytes,
                "min_intensity": self.min_intensity, "bound": self.bound, "attainable_flops": self.attainable_flops,
                "time_lower_bound_s": self.time_lower_bound_s,
                "prediction": self.prediction.to_dict() if self.prediction else None}


def roofline(problem: Problem, gpu: Gpu, config: "TileConfig | None" = None) -> Roofline:
    """The problem's minimum-traffic roofline on `gpu`, with `config`'s prediction if given."""
    pred = predict(problem, config, gpu) if config is not None else None
    return Roofline(problem, gpu, gpu.tensor_peak(problem.a_dtype), gpu.dram_bandwidth, problem.flops,
                    problem.min_bytes, pred)


def tensor_efficiency(family: Family, gpu: Gpu) -> float:
    """The model constant: fraction of peak the family's main loop sustains on this GPU."""
    table = TENSOR_EFFICIENCY_HOPPER if gpu.arch.cc >= 90 else TENSOR_EFFICIENCY_OTHER
    if family not in table:
        raise InvalidInput(f"family {family.value} has no efficiency on {gpu.arch.value}", family.value)
    return table[family]


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


def predict(problem: Problem, config: TileConfig, gpu: Gpu) -> Prediction:
    """Predicted time of `config` on `problem` and `gpu`; raises InvalidConfig if it cannot run.

    time = max(compute, memory) + overheads, where
      compute = executed FLOP / (SMs * peak/SM * family efficiency * feed efficiency) / wave efficiency,
      memory  = DRAM bytes after L2 reuse / min(0.9 * bandwidth, CTAs * bytes in flight / latency),
    and overheads are the launch(es), the split-K reduction pass and, for non-persistent kernels,
    each wave's pipeline fill and epilogue.
    """
    violations = check(config, gpu, problem=problem)
    if violations:
        raise InvalidConfig(Kernel(gpu.arch, problem.operands, config).name, violations)
    if config.swap_ab:
        # The main loop runs on D^T = B^T @ A^T: the same FLOPs and bytes, tiled the other way round (the bias,
        # counted per column below, is a handful of bytes either way).
        problem = problem.swapped()
    ops = problem.operands
    elt, c_elt = problem.a_dtype.bytes, problem.c_dtype.bytes
    m, n, k = problem.m, problem.n, problem.k
    cta = config.cta
    clock = gpu.boost_clock_mhz * 1e6
    peak = gpu.tensor_flop_per_clock_per_sm(problem.a_dtype)

    # Work decomposition.
    tiles_m, tiles_n = math.ceil(m / cta.m), math.ceil(n / cta.n)
    tiles = tiles_m * tiles_n
    k_tiles = math.ceil(k / cta.k)
    decomp = config.decomposition
    splits = decomp.splits if decomp.kind is DecompKind.SPLIT_K else 1
    units = tiles * splits
    per_sm = _ctas_per_sm(config, gpu, ops)
    slots = per_sm * gpu.sm_count
    sk_rem, sk_slices = 0, 1
    if decomp.kind is DecompKind.STREAM_K:
        # The template's scheme: full waves data-parallel, the last partial wave's `rem` tiles cut into
        # S = min(slots // rem, K tiles, 16) K slices, so that wave takes 1/S of a tile's time; where that
        # wave is more than half full (S = 1), its K iterations dealt out to every slot in contiguous ranges
        # (range mode, S = 0 here): the wave takes ceil(rem * K tiles / slots) iterations.
        sk_rem, sk_slices = streamk_remainder(tiles, slots, k_tiles)
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
    executed = 2.0 * (tiles_m * cta.m) * (tiles_n * cta.n) * (k_tiles * cta.k)
    fam_eff = tensor_efficiency(config.family, gpu)
    if config.family is Family.SM90_WGMMA and any(ld * elt % 128 for ld in (problem.lda, problem.ldb)):
        fam_eff /= TMA_UNALIGNED_SLOWDOWN
    if config.family is Family.SM90_WGMMA:
        fam_eff *= latency_coverage(config, peak * fam_eff)
    levels = config_levels(config, problem.a_dtype, peak)
    target = peak * fam_eff  # FLOP/clk/SM the main loop aims for
    util = {"tensor": 1.0,
            "smem": target / levels[1].intensity / SMEM_BYTES_PER_CLOCK_PER_SM,
            "l2": target / levels[0].intensity / L2_BYTES_PER_CLOCK_PER_SM.get(gpu.arch.cc, 48.0)}
    slowest = max(util, key=util.get)
    loop_time = util[slowest] + OVERLAP_PENALTY * (sum(util.values()) - util[slowest])
    achieved = fam_eff / loop_time
    compute_s = executed / (gpu.sm_count * peak * clock * achieved) / wave_eff

    # Memory: tiled traffic, then what L2 reuse within a wave (or a whole-problem fit) saves.
    a_once, b_once = m * k * elt, k * n * elt
    a_tiled, b_tiled = a_once * tiles_n, b_once * tiles_m
    # Split-K slices run one after another (z is the slowest grid axis), so a wave shares panels
    # only among the tiles of one slice.
    wave_tiles = max(1, min(slots, tiles))
    rows, cols = footprint(wave_tiles, tiles_m, tiles_n, config.raster.order, config.raster.group)
    usable_l2 = gpu.l2_bytes * L2_USABLE_FRACTION
    if a_once + b_once <= usable_l2:
        a_dram, b_dram = float(a_once), float(b_once)  # both operands stay in L2: each read once
    else:
        live = (rows * cta.m + cols * cta.n) * cta.k * elt * L2_SKEW_K_TILES
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
    in_flight = max(1, config.stages - 1) * stage
    dram_rate = min(gpu.dram_bandwidth * DRAM_EFFICIENCY, active_ctas * in_flight / DRAM_LATENCY_S)
    memory_s = (dram_bytes - (partials / 2 if splits > 1 else 0)) / dram_rate

    # Fixed costs: launches, the reduction pass's read of the partials, and each tile's epilogue where
    # nothing overlaps it. Measured on the H100 (docs/perf-notes.md, ping-pong): in the cooperative
    # persistent kernel both consumer warpgroups store together while the tensor cores idle; only the
    # ping-pong schedule hides the epilogue behind the other warpgroup's main loop.
    overhead = LAUNCH_OVERHEAD_S
    if splits > 1 and decomp.fused:
        # No second launch, but each tile's last slice reads every slice's partial of its tile back after the
        # others have arrived, on one SM; the last wave's tiles put that read on the critical path.
        tile_rows, tile_cols = min(cta.m, m), min(cta.n, n)
        overhead += FUSED_ARRIVE_S + math.ceil(tiles / slots) * splits * tile_rows * tile_cols * ACC_BYTES / \
            FUSED_REDUCE_BYTES_PER_S_PER_SM
    elif splits > 1:
        overhead += LAUNCH_OVERHEAD_S + (partials / 2) / (gpu.dram_bandwidth * DRAM_EFFICIENCY)
    if sk_slices > 1:
        # A remainder tile's owner reads the other slices' partials one after another, from L2.
        overhead += SK_FIXUP_S + (sk_slices - 1) * cta.m * cta.n * ACC_BYTES / (
            L2_BYTES_PER_CLOCK_PER_SM.get(gpu.arch.cc, 48.0) * clock)
    elif sk_slices == 0:
        # A range mode CTA stores its first piece's partial, then as an owner reads the (slots - rem) / rem
        # partials of its tile's other pieces on average, from L2.
        overhead += SK_RANGE_FIXUP_S + (1.0 + (slots - sk_rem) / sk_rem) * cta.m * cta.n * ACC_BYTES / (
            L2_BYTES_PER_CLOCK_PER_SM.get(gpu.arch.cc, 48.0) * clock)
    epilogue = cta.m * cta.n * c_elt / (gpu.dram_bandwidth * DRAM_EFFICIENCY / gpu.sm_count)
    if not config.persistent:
        overhead += math.ceil(max(waves, 1e-9)) * (DRAM_LATENCY_S + epilogue) / max(1, per_sm)
    elif config.schedule is Schedule.PINGPONG:
        overhead += DRAM_LATENCY_S
    else:
        exposed = STORE_WARP_EXPOSED if config.store_warp else 1.0
        overhead += DRAM_LATENCY_S + math.ceil(max(waves, 1e-9)) * epilogue * exposed

    main = max(compute_s, memory_s)
    bound = "compute" if compute_s >= memory_s else "memory"
    if bound == "memory":
        limiter = "dram"
    elif wave_eff < 0.5:
        limiter = "waves"
    else:
        limiter = slowest
    time_s = main + overhead
    return Prediction(
        time_s=time_s, tflops=problem.flops / time_s / 1e12, bound=bound, limiter=limiter, flops=problem.flops,
        executed_flops=executed, dram_bytes=dram_bytes, tiled_bytes=tiled_bytes,
        l2_saved_bytes=tiled_bytes - dram_bytes, intensity=problem.flops / dram_bytes,
        tiled_intensity=problem.flops / tiled_bytes, tiles=tiles, units=units, waves=waves,
        wave_efficiency=wave_eff, ctas_per_sm=per_sm, occupancy=occupancy, tensor_efficiency=achieved,
        compute_s=compute_s, memory_s=memory_s, overhead_s=overhead, dram_rate=dram_rate, levels=levels)


__all__ = ["Level", "Prediction", "Roofline", "cta_level", "smem_level", "warp_level", "mma_level", "seed_table",
           "config_levels", "peak_per_sm", "roofline", "predict", "footprint", "tensor_efficiency",
           "SEED_WARP_SHAPES", "SEED_MMA", "SEED_PEAK_PER_SM"]
