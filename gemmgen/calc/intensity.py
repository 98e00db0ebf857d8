"""The public calculator: arithmetic intensity per level of the tile hierarchy, and the roofline.

Pure functions and frozen dataclasses; no CUDA, no kernel family. Two halves:

* Per level (`cta_level`, `smem_level`, `warp_level`, `mma_level`): FLOP per byte that level of
  the hierarchy moves, and the bytes per clock per SM it must deliver to keep the tensor cores at a
  given peak (FLOP per clock per SM).
* Per problem (`roofline`): minimum traffic against the GPU's compute and memory roofs.

The predicted time of one configuration (tiled traffic, L2 reuse, waves, occupancy) is the tuner's model,
gemmgen.rank.predict, which builds on these.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..model import parse
from ..model.arch import DType, Gpu, lookup_gpu
from ..model.errors import InvalidInput
from ..model.problem import Problem
from ..model.tiles import Shape3

ACC_BYTES = 4  # fp32 accumulators

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
    if isinstance(dtype, DType):
        return dtype.bytes
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return parse.integer("element bytes", dtype, 1, 8)
    return DType.parse(dtype).bytes


# The checks below of the calculator's arguments return at once for what the model passes (rank/predict calls
# every level once per configuration ranked); anything else goes through the parsers.
def _shape(value, what: str) -> Shape3:
    """A tile or instruction shape (a Shape3, 'MxNxK' or three integers), each extent positive: a zero one divided
    by zero, and a string or tuple was an AttributeError."""
    if isinstance(value, Shape3):
        if all(type(v) is int and v > 0 for v in (value.m, value.n, value.k)):
            return value
        value = (value.m, value.n, value.k)
    return Shape3.parse(value, what)


def _real(what: str, value, lo: float, lo_open: bool = False) -> float:
    if type(value) in (int, float) and (value > lo if lo_open else value >= lo) and math.isfinite(value):
        return value
    return parse.real(what, value, lo, lo_open=lo_open)


def cta_level(cta: Shape3, dtype: "DType | str | int" = "bf16", peak_per_sm: float = 1.0,
              multicast_m: float = 1, multicast_n: float = 1) -> Level:
    """Global (L2/DRAM) -> shared memory at the CTA tile.

    One k-step of a CTA does 2*BM*BN*BK FLOP and loads an A tile (BM*BK) and a B tile (BK*BN):
    FLOP/byte = 2*BM*BN*BK / ((BM*BK + BK*BN) * elt_bytes); bf16 128x256x64 gives 85.33.
    With a cluster's TMA multicast, A is shared by the `multicast_n` CTAs along N and B by the
    `multicast_m` CTAs along M, so each CTA's share of the L2 traffic shrinks by those factors.
    """
    cta, elt = _shape(cta, "CTA tile"), _elt_bytes(dtype)
    peak_per_sm = _real("peak_per_sm", peak_per_sm, 0.0, lo_open=True)
    # The model passes the multicast it realizes (1.8 for a 2-CTA cluster): a real number, at least 1.
    multicast_m, multicast_n = _real("multicast_m", multicast_m, 1.0), _real("multicast_n", multicast_n, 1.0)
    a = cta.m * cta.k * elt / multicast_n
    b = cta.k * cta.n * elt / multicast_m
    note = "A and B tiles per CTA k-step (BM*BK + BK*BN elements)"
    if multicast_m * multicast_n > 1:
        note += f", A shared by {multicast_n} and B by {multicast_m} CTAs (multicast)"
    return Level("global->shared", cta, 2.0 * cta.m * cta.n * cta.k, a + b, peak_per_sm, note)


def smem_level(warp: Shape3, dtype: "DType | str | int" = "bf16", peak_per_sm: float = 1.0,
               reads: str = "fragments") -> Level:
    """Shared memory -> registers (or tensor cores) at the warp tile: the A and B operand bytes only.

    fragments (mma.sync): each warp reads its A fragment (WM*WK) and B fragment (WK*WN) with ldmatrix:
    FLOP/byte = 2*WM*WN*WK / ((WM*WK + WK*WN) * elt_bytes).
    wgmma: each m64nNk16 instruction of a warpgroup reads its 64x16 A slice and the whole
    16xN B slice from shared memory, so B is read WM/64 times: FLOP/byte = 2*WN / ((1 + WN/64) * elt).
    """
    warp, elt = _shape(warp, "warp tile"), _elt_bytes(dtype)
    peak_per_sm = _real("peak_per_sm", peak_per_sm, 0.0, lo_open=True)
    flops = 2.0 * warp.m * warp.n * warp.k
    if reads not in ("fragments", "wgmma"):
        raise InvalidInput("shared-memory reads must be 'fragments' or 'wgmma'", reads)
    if reads == "wgmma":
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
    warp, mma, elt = _shape(warp, "warp tile"), _shape(mma, "MMA shape"), _elt_bytes(dtype)
    peak_per_sm = _real("peak_per_sm", peak_per_sm, 0.0, lo_open=True)
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
    mma, elt = _shape(mma, "MMA shape"), _elt_bytes(dtype)
    peak_per_sm = _real("peak_per_sm", peak_per_sm, 0.0, lo_open=True)
    acc_bytes = parse.integer("acc_bytes", acc_bytes, 1, 8)
    bytes_ = (mma.m * mma.k + mma.k * mma.n) * elt + 2 * mma.m * mma.n * acc_bytes
    return Level("registers->MMA", mma, 2.0 * mma.m * mma.n * mma.k, bytes_, peak_per_sm,
                 "A, B fragments and fp32 C in, D out per instruction")


def peak_per_sm(gpu: Gpu, dtype: "DType | str") -> float:
    """Dense tensor FLOP per clock per SM of `gpu` (a Gpu or a catalogue name) for `dtype`, from the catalogue."""
    return lookup_gpu(gpu).tensor_flop_per_clock_per_sm(dtype)


def seed_table(peak: float = SEED_PEAK_PER_SM, mma: Shape3 = SEED_MMA,
               warps: "tuple[Shape3, ...]" = SEED_WARP_SHAPES, dtype: "DType | str" = "f16") -> "list[Level]":
    """The seed note's warp-level table: one row per warp shape."""
    return [warp_level(w, mma, peak, dtype) for w in warps]


# --- Whole problem ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Roofline:
    """The problem against the GPU's roofline, and a configuration's prediction if one was given."""

    problem: Problem
    gpu: Gpu
    peak_flops: float  # datasheet dense tensor FLOP/s for the dtype
    bandwidth: float  # datasheet DRAM bytes/s
    flops: int
    min_bytes: int
    prediction: object = None  # a rank.predict.Prediction (anything with to_dict)

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


def roofline(problem: Problem, gpu: Gpu, prediction=None) -> Roofline:
    """The problem's minimum-traffic roofline on `gpu`; `prediction` (rank.predict's, for one configuration)
    travels with it when given. A mixed fp8 pair runs at the slower of its two inputs' rates (the catalogue
    gives e4m3 and e5m2 the same fp8 rate); min_bytes counts each operand at its own element size. `gpu` is a Gpu
    or a catalogue name."""
    if not isinstance(problem, Problem):
        raise InvalidInput("roofline needs a Problem (gemmgen.Problem.create(M, N, K, dtype, ...))",
                           type(problem).__name__)
    gpu = lookup_gpu(gpu)
    peak = min(gpu.tensor_peak(problem.a_dtype), gpu.tensor_peak(problem.b_dtype))
    return Roofline(problem, gpu, peak, gpu.dram_bandwidth, problem.flops,
                    problem.min_bytes, prediction)


__all__ = ["Level", "Roofline", "cta_level", "smem_level", "warp_level", "mma_level", "seed_table", "peak_per_sm",
           "roofline", "SEED_WARP_SHAPES", "SEED_MMA", "SEED_PEAK_PER_SM"]
