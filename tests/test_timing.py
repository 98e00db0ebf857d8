"""Timing policies without a GPU: the hold-kernel batching of bursts against back-to-back sustained runs, and
the policy switch through the measuring process."""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmgen.tune.bench import TIMINGS, GpuBenchmark, TimingPolicy, timing_policy  # noqa: E402
from gemmgen.model.errors import InvalidInput  # noqa: E402


class FakeEvent:
    def __init__(self, clock, device=None):
        self.clock, self.t, self.device = clock, None, device

    def record(self, stream):
        self.t = self.clock.now
        if self.device is not None:
            self.device.after_run = False   # an event between two runs: the second waits for the first to end

    def elapsed_s(self, start):
        return self.t - start.t


class FakeDevice:
    """A GPU whose every run takes `run_s`; counts the hold kernels queued. `enqueue_s` is the host's time to
    launch one run: on a stream that no hold keeps busy the GPU waits that long for each run."""

    def __init__(self, run_s, enqueue_s=0.0, overlap_s=0.0):
        self.now, self.run_s, self.enqueue_s, self.holds, self.runs = 0.0, run_s, enqueue_s, 0, 0
        self.credit = 0
        # A kernel that starts while the previous run ends (programmatic dependent launch): a run right after
        # another run, with no event between them, takes overlap_s less.
        self.overlap_s, self.after_run = overlap_s, False

    def event(self):
        return FakeEvent(self, self)

    def hold_stream(self, seconds, stream):
        # While the hold runs, the host enqueues seconds / enqueue_s runs; those then run back to back.
        self.holds += 1
        self.credit = seconds / self.enqueue_s if self.enqueue_s else float("inf")

    def synchronize(self, what):
        self.credit = 0

    def run(self, i):
        self.runs += 1
        run_s = self.run_s - (self.overlap_s if self.after_run else 0.0)
        self.after_run = True
        if self.credit >= 1:
            self.credit -= 1
            self.now += run_s
        else:
            self.now += max(run_s, self.enqueue_s)


class FakeHelpers:
    """The benchmark's device-side helpers, on the fake device."""

    @staticmethod
    def hold_stream(dev, seconds, stream):
        return dev.hold_stream(seconds, stream)


def timed(policy, run_s, enqueue_s=0.0, overlap_s=0.0):
    bench = GpuBenchmark(policy=policy)
    bench.helpers = FakeHelpers
    dev = FakeDevice(run_s, enqueue_s, overlap_s)
    bench._device = dev
    times = bench._timed(dev.run, 0, "timing a fake")
    return times, dev


def test_bursts_queue_their_runs_behind_hold_kernels():
    times, dev = timed(TIMINGS["burst"], 185e-6)
    assert len(times) == 541 and dev.holds == 2 + 6      # the estimate's two, then 0.1 s of 185 us in batches of 100
    assert all(t == pytest.approx(185e-6) for t in times)


def test_stream_timing_times_runs_ten_back_to_back_so_a_programmatic_launch_overlaps_the_last_run():
    """A 17 us kernel whose start overlaps the previous run's end by 3 us: timed one by one (burst), every run
    takes 17 us; back to back in groups of ten (stream), a sample is the group's mean, 17 - 0.9 x 3 us."""
    burst, _ = timed(TIMINGS["burst"], 17e-6, overlap_s=3e-6)
    assert all(t == pytest.approx(17e-6) for t in burst)
    stream, dev = timed(TIMINGS["stream"], 17e-6, overlap_s=3e-6)
    assert all(t == pytest.approx(17e-6 - 0.9 * 3e-6) for t in stream)
    assert len(stream) == 200 and dev.runs >= 2 + 2000    # 0.1 s of runs capped at 2000, one sample per ten
    assert dev.holds == 2 + 20                            # ten groups (100 runs) behind each hold
    long, _ = timed(TIMINGS["stream"], 8e-3)              # an 8 ms kernel: five groups of ten, 0.4 s
    assert len(long) == 5 and all(t == pytest.approx(8e-3) for t in long)


def test_sustained_runs_back_to_back_after_a_long_warm_up():
    times, dev = timed(TIMINGS["sustained"], 185e-6)
    assert dev.holds == 2                                 # the estimate's; then no idle gap for the card to cool in
    assert len(times) == 2703 and dev.runs >= 2 + 5406 + 2703   # 1 s warm-up, then 0.5 s timed


def test_sustained_keeps_the_holds_for_kernels_shorter_than_their_launch():
    policy = TimingPolicy(warmup_s=0.01, measure_s=0.005, sustained=True)
    times, dev = timed(policy, 10e-6)
    assert dev.holds == 2 + 5 and len(times) == 500


def test_a_short_run_with_a_slow_launch_is_not_taken_for_a_long_one():
    """torch's dispatch (~45 us here) must not enter the estimate: a 10 us cuBLAS run timed back to back from
    Python would read the host's launch rate (what made sq1024's cuBLAS read 94 TFLOP/s sustained)."""
    times, dev = timed(TIMINGS["sustained"], 10e-6, enqueue_s=45e-6)
    assert dev.holds > 2 and all(t == pytest.approx(10e-6) for t in times)


def test_the_policy_switch_names_its_rule_and_restores_the_constructed_policy():
    own = TimingPolicy(warmup_s=0.002, measure_s=0.005, min_reps=3)
    bench = GpuBenchmark(policy=own)
    bench.set_timing("sustained")
    assert bench.policy is TIMINGS["sustained"]
    assert pickle.loads(pickle.dumps(bench)).policy == own   # a child starts from the constructed policy
    bench.set_timing(None)
    assert bench.policy is own
    with pytest.raises(InvalidInput, match="--timing must be one of burst, sustained, stream"):
        timing_policy("steady")


def test_the_worker_passes_the_timing_to_its_child_and_again_after_a_replacement(tmp_path):
    import json

    from gemmgen.model.problem import Problem
    from gemmgen.model.tiles import TileConfig
    from gemmgen.tune.worker import WorkerBenchmark, replay_factory

    config = TileConfig.from_dict({"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16",
                                   "stages": 3, "smem_layout": "swizzle", "raster": {"order": "row", "group": 8}})
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"timings": {config.tag: 1e-3, "broken": {"error": "CUDA_ERROR_ILLEGAL_ADDRESS"}},
                                "cublas_time_s": 2e-3}))
    problem = Problem.create(256, 256, 256, "bf16")
    manifest = {"config": config.to_dict()}
    with WorkerBenchmark(replay_factory(str(path)), watchdog_s=30) as worker:
        with pytest.raises(InvalidInput):
            worker.set_timing("steady")
        worker.set_timing("sustained")
        assert worker.measure(manifest, b"", problem).ok     # a replay ignores the policy
        assert worker._child_timing == "sustained"
        worker._replace()                                     # a new child starts with its own policy ...
        assert worker._child_timing is None
        assert worker.cublas_time(problem) == 2e-3            # ... and is told again before its first request
        assert worker._child_timing == "sustained"
        worker.set_timing(None)
        assert worker.measure(manifest, b"", problem).ok and worker._child_timing is None


def test_the_tuner_offers_exactly_the_benchmarks_timing_policies():
    # search.py keeps its own list of names (the search never imports the benchmark): they must not drift apart.
    from gemmgen.tune.search import FINALIST_TIMINGS
    assert set(FINALIST_TIMINGS) == set(TIMINGS)
