"""Verification and timing of compiled kernels: the pure policy (policy.py) and the GPU benchmark (gpu.py).

The tuner calls `GpuBenchmark().measure(manifest, cubin, problem)` in a worker process that owns the CUDA context; a
fake with the same two methods (measure, cublas_time) replays recorded timings in CI.
"""
from .gpu import GpuBenchmark
from .policy import (HOLD_BASE_S, HOLD_BATCH, HOLD_MAX_S, HOLD_PER_RUN_S, HOST_BOUND_S, THRESHOLDS, TIMINGS,
                     Measurement, TimingPolicy, describe, failed, manifest_mismatch, median, percentile, plan_runs,
                     rotation_count, threshold, timing_policy, verdict)

__all__ = ["GpuBenchmark", "HOLD_BASE_S", "HOLD_BATCH", "HOLD_MAX_S", "HOLD_PER_RUN_S", "HOST_BOUND_S", "Measurement",
           "THRESHOLDS", "TIMINGS", "TimingPolicy", "describe", "failed", "manifest_mismatch", "median", "percentile",
           "plan_runs", "rotation_count", "threshold", "timing_policy", "verdict"]
