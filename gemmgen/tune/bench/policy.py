"""The benchmark's pure half: thresholds and verdicts, measurements, statistics, timing policies and run plans.

No CUDA here: the tuner, the replay benchmark and tests use these without a GPU.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ...model.arch import DType
from ...model.errors import InvalidInput
from ...model.problem import Problem

# Relative Frobenius error allowed per output dtype. The inputs are exact in the kernel and the reference,
# so the error is the rounding of D to its dtype (unit roundoff u: bf16 2^-8 = 3.9e-3, f16 2^-11 = 4.9e-4).
# Measured on the H100 (ac47e8f:scripts/gpu_check.py, 49 cases, docs/device-notes.md): 1.66e-3 for bf16 and 2.1e-4
# for f16 on every shape, layout and epilogue. The thresholds leave ~6x (bf16) and ~10x (f16) margin and
# still catch one missing K slice at K = 4097 (error ~ 1/sqrt(K) = 1.6e-2).
THRESHOLDS = {DType.BF16: 1e-2, DType.F16: 2e-3, DType.F32: 1e-5}
# The floor the inputs' tensor-core math sets, whatever D's dtype: fp8 wgmma adds into its accumulators with
# reduced precision (2.1e-3 measured against an fp32 product of the same fp8 values, docs/perf-notes.md); fp32
# inputs run as tf32 (10-bit mantissa: unit roundoff 2^-11 on each input, about 1e-3 on the product).
INPUT_FLOORS = {DType.E4M3: 1e-2, DType.E5M2: 1e-2, DType.F32: 5e-3}
FP32_EPS = 2.0 ** -24


def threshold(dtype: "DType | str", k: int, inputs: "DType | str | None" = None) -> float:
    """Allowed relative error for output `dtype` after a K-long fp32 reduction of `inputs` (default: the
    output's dtype).

    The K-dependent slack covers a different fp32 summation order (split-K, tile order) from the
    reference's: a random-walk bound of 8*sqrt(K)*eps32, 1.5e-4 at K = 65536."""
    dt = DType.parse(dtype)
    if dt not in THRESHOLDS:
        raise InvalidInput(f"verification thresholds exist for {sorted(d.value for d in THRESHOLDS)}", dt.value)
    floor = INPUT_FLOORS.get(DType.parse(inputs), 0.0) if inputs is not None else 0.0
    return max(THRESHOLDS[dt], floor) + 8.0 * math.sqrt(max(1, k)) * FP32_EPS


@dataclass(frozen=True)
class Measurement:
    """One kernel on one problem: verified or not, and how long it took (median)."""

    ok: bool
    time_s: "float | None" = None
    times_s: "tuple[float, ...]" = ()
    rel_error: "float | None" = None
    reason: str = ""
    flops: int = 0
    threshold: "float | None" = None
    backend: str = ""

    @property
    def tflops(self) -> "float | None":
        if not self.ok or not self.time_s:
            return None
        return self.flops / self.time_s / 1e12

    @property
    def spread(self) -> "float | None":
        """(p90 - p10) / median of the timed runs: how noisy the timing was."""
        if len(self.times_s) < 2 or not self.time_s:
            return None
        lo, hi = percentile(self.times_s, 10), percentile(self.times_s, 90)
        return (hi - lo) / self.time_s

    def to_dict(self) -> dict:
        return {"ok": self.ok, "time_s": self.time_s, "tflops": self.tflops, "rel_error": self.rel_error,
                "threshold": self.threshold, "reference": self.backend, "reason": self.reason,
                "runs": len(self.times_s), "spread": self.spread}


# --- statistics and plans (pure) -----------------------------------------------------------------

def median(values) -> float:
    values = list(values)
    if not values:
        raise InvalidInput("a median needs at least one value", values)
    return float(statistics.median(values))


def percentile(values, q: float) -> float:
    """Linear-interpolated q-th percentile."""
    data = sorted(values)
    if not data:
        raise InvalidInput("a percentile needs at least one value", data)
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def rotation_count(set_bytes: int, l2_bytes: int, factor: float = 2.0, max_sets: int = 64,
                   max_total_bytes: int = 4 << 30) -> int:
    """How many buffer sets to rotate over so that together they exceed `factor` x L2.

    One set already larger than that needs no rotation; tiny problems are capped at `max_sets`
    (and `max_total_bytes`), where launch overhead, not L2, dominates their time anyway."""
    if set_bytes <= 0:
        raise InvalidInput("a buffer set must have a positive size", set_bytes)
    need = math.floor(factor * l2_bytes / set_bytes) + 1
    return max(1, min(need, max_sets, max(1, max_total_bytes // set_bytes)))


@dataclass(frozen=True)
class TimingPolicy:
    """How long to warm up and to measure; the repetition counts follow from one run's estimate."""

    warmup_s: float = 0.025
    measure_s: float = 0.100
    min_reps: int = 20
    max_reps: int = 2000
    min_warmup: int = 3
    l2_factor: float = 2.0
    batch: int = 100  # timed runs queued behind one hold kernel
    # Sustained: run back to back without hold kernels (whose idle gaps let the card cool and clock up between
    # batches), so the timing sees the clock a long run settles at. Only kernels longer than the host's enqueue
    # time can be timed that way; shorter ones keep the holds.
    sustained: bool = False
    # Runs between one pair of events. 1: each run timed alone. More (stream timing): runs back to back as a loop
    # enqueues them, each sample the group's time / group: a kernel launched with programmatic dependent launch
    # then starts while the previous run ends, which an event recorded between every two runs prevents (at
    # 16x4096x4096, 13.8 us a call back to back against 17.0 us one by one: docs/perf-notes.md, "Decode-sized").
    group: int = 1


# How the tuner times its finalists and cuBLAS (`--timing`). Burst: ~0.1 s per kernel in batches behind hold
# kernels, the card near its boost clock. Sustained: ~1 s of back-to-back runs first, then ~0.5 s timed: the
# power- and heat-limited clock a training loop runs at (docs/perf-notes.md, "Sustained runs"), which can
# rank kernels differently when they draw different power. Stream: as burst, but runs timed ten at a time back
# to back, as a CUDA graph or a loop that enqueues ahead runs them (the start of one overlaps the end of the last
# where the kernel allows it); it matters for kernels of a few to tens of microseconds.
TIMINGS = {
    "burst": TimingPolicy(),
    "sustained": TimingPolicy(warmup_s=1.0, measure_s=0.5, max_reps=20000, batch=20000, sustained=True),
    # At least five groups of ten: a long kernel (8 ms at 8192^3) is then timed for 0.4 s, not the 1.6 s that 200
    # runs would take, and short ones get ~0.1 s of runs as in bursts (up to 2000: 200 samples).
    "stream": TimingPolicy(min_reps=50, group=10),
}
# Below this a run is shorter than enqueueing it from Python, so back-to-back runs would leave the GPU idle.
HOST_BOUND_S = 50e-6


def timing_policy(name: str) -> TimingPolicy:
    try:
        return TIMINGS[name]
    except KeyError:
        raise InvalidInput(f"--timing must be one of {', '.join(TIMINGS)}", name) from None


# Host time to enqueue one timed run (two events and a launch; torch's dispatch is the slowest, ~20 us),
# with margin: the hold must outlast the enqueueing of its batch.
HOLD_BASE_S = 0.001
HOLD_PER_RUN_S = 60e-6
HOLD_MAX_S = 0.02
HOLD_BATCH = 100   # runs queued behind one hold (HOLD_BASE_S + 100 * HOLD_PER_RUN_S = 7 ms of enqueueing)


def plan_runs(estimate_s: float, policy: TimingPolicy = TimingPolicy()) -> "tuple[int, int]":
    """(warm-up runs, timed runs) for a kernel that takes about `estimate_s` per run."""
    est = max(estimate_s, 1e-6)
    warmup = max(policy.min_warmup, math.ceil(policy.warmup_s / est))
    reps = min(policy.max_reps, max(policy.min_reps, math.ceil(policy.measure_s / est)))
    return min(warmup, policy.max_reps), reps


def failed(reason: str, problem: "Problem | None" = None, **extra) -> Measurement:
    return Measurement(ok=False, reason=reason, flops=problem.flops if problem else 0, **extra)


def describe(exc: BaseException) -> str:
    """One line for a failed trial's reason."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:500]


def manifest_mismatch(manifest: dict, problem: Problem) -> str:
    """Why a manifest was made for another problem than `problem` ('' when they agree)."""
    stored = manifest.get("problem")
    if not isinstance(stored, dict):
        return "the manifest has no problem"
    expected = problem.to_dict()
    keys = ("M", "N", "K", "a_dtype", "b_dtype", "c_dtype", "a_layout", "b_layout", "alpha", "beta", "bias",
            "activation")
    diffs = [f"{k}={stored.get(k)!r} (want {expected[k]!r})" for k in keys if stored.get(k, expected[k]) != expected[k]]
    # Per-tensor scaling is the default that Problem.to_dict leaves out.
    scaling = stored.get("scaling", "tensor")
    if scaling != problem.scaling.value:
        diffs.append(f"scaling={scaling!r} (want {problem.scaling.value!r})")
    return "manifest is for another problem: " + ", ".join(diffs) if diffs else ""


# --- the GPU benchmark ---------------------------------------------------------------------------

def verdict(rel_error: float, nonfinite: int, limit: float, problem: Problem,
            sample_rel_error: "float | None" = None) -> str:
    """Why a result fails verification ('' when it passes). NaN or Inf anywhere always fails."""
    if nonfinite:
        total = problem.m * problem.n
        return f"wrong result: NaN/Inf in {nonfinite} of {total} outputs (an unwritten element keeps the NaN poison)"
    if not math.isfinite(rel_error) or rel_error > limit:
        return f"wrong result: relative error {rel_error:.3e} > {limit:.1e}"
    if sample_rel_error is not None and (not math.isfinite(sample_rel_error) or sample_rel_error > limit):
        return f"wrong result at sampled entries against float64: relative error {sample_rel_error:.3e} > {limit:.1e}"
    return ""
