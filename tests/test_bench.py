"""bench.py: thresholds, statistics and plans on the CPU; GpuBenchmark's contract (never raises, pickles
without a GPU); on a GPU, verification of right and wrong kernels by every reference backend, and timing."""
from __future__ import annotations

import functools
import math
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gemmgen.tune import bench
from gemmgen.tune.bench import GpuBenchmark, Measurement, TimingPolicy
from gemmgen.model.errors import CudaError, InvalidInput
from gemmgen.model.problem import Problem
from gemmgen.tune.naive import naive_manifest

ROOT = Path(__file__).resolve().parent.parent


def test_thresholds_per_dtype_grow_slowly_with_k():
    assert bench.threshold("bf16", 1) == pytest.approx(1e-2, rel=1e-3)
    assert bench.threshold("f16", 1) == pytest.approx(2e-3, rel=1e-3)
    assert bench.threshold("f16", 65536) - bench.threshold("f16", 1) == pytest.approx(8 * 255 * 2 ** -24, rel=0.01)
    # One missing K slice at K = 4097 (relative error ~ 1/sqrt(K)) must fail even for bf16.
    assert 1 / math.sqrt(4097) > bench.threshold("bf16", 4097)


def test_threshold_refuses_a_dtype_without_one():
    with pytest.raises(InvalidInput):
        bench.threshold("e4m3", 64)


def test_median_and_percentiles():
    assert bench.median([3.0, 1.0, 2.0]) == 2.0
    assert bench.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert bench.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 10) == pytest.approx(1.4)
    with pytest.raises(InvalidInput):
        bench.median([])


def test_rotation_covers_twice_the_l2():
    l2 = 50 * 2 ** 20
    assert bench.rotation_count(96 * 2 ** 20, l2) == 2  # 4096^3 bf16: two sets = 192 MB > 100 MB
    assert bench.rotation_count(384 * 2 ** 20, l2) == 1  # 8192^3: one set is already 384 MB
    small = 6 * 2 ** 20
    count = bench.rotation_count(small, l2)
    assert count * small > 2 * l2 and (count - 1) * small <= 2 * l2
    assert bench.rotation_count(1024, l2) == 64  # capped: tiny problems are launch-bound anyway


def test_plan_runs_warms_up_25ms_and_times_100ms_with_at_least_20_runs():
    assert bench.plan_runs(1e-3) == (25, 100)
    assert bench.plan_runs(20e-3) == (3, 20)
    assert bench.plan_runs(1e-6) == (2000, 2000)  # capped
    assert bench.plan_runs(1e-3, TimingPolicy(warmup_s=0.01, measure_s=0.05, min_reps=30)) == (10, 50)


def test_nan_anywhere_fails_even_with_a_small_error():
    problem = Problem.create(10, 10, 10)
    assert "NaN" in bench.verdict(0.0, 1, 1e-2, problem)
    assert "wrong result" in bench.verdict(0.0, 1, 1e-2, problem)
    assert bench.verdict(math.nan, 0, 1e-2, problem)
    assert bench.verdict(5e-3, 0, 1e-2, problem) == ""
    assert "relative error" in bench.verdict(2e-2, 0, 1e-2, problem)
    assert "sampled" in bench.verdict(5e-3, 0, 1e-2, problem, sample_rel_error=0.5)


def test_manifest_for_another_problem_is_named():
    manifest = naive_manifest(Problem.create(64, 64, 64))
    assert bench.manifest_mismatch(manifest, Problem.create(64, 64, 64)) == ""
    why = bench.manifest_mismatch(manifest, Problem.create(64, 64, 128, b="col"))
    assert "K=64 (want 128)" in why and "b_layout='row' (want 'col')" in why


def test_measurement_tflops_and_spread():
    m = Measurement(True, 1e-3, (0.9e-3, 1e-3, 1.1e-3), 1e-3, "", flops=2 * 4096 ** 3)
    assert m.tflops == pytest.approx(137.44, rel=1e-3)
    assert m.spread == pytest.approx(0.16, rel=1e-6)
    assert Measurement(False, reason="x", flops=10).tflops is None
    assert m.to_dict()["runs"] == 3


def test_benchmark_pickles_as_its_settings_without_touching_a_gpu():
    b = GpuBenchmark(reference="kernel", policy=TimingPolicy(min_reps=5), seed=3)
    clone = pickle.loads(pickle.dumps(b))
    assert (clone.reference, clone.policy.min_reps, clone._device) == ("kernel", 5, None)


def test_measure_never_raises_it_reports(monkeypatch):
    """Without a GPU (or with any failure) measure returns ok=False with the reason."""
    problem = Problem.create(64, 64, 64)
    b = GpuBenchmark()

    def broken():
        raise CudaError("cuInit", 100, "CUDA_ERROR_NO_DEVICE")

    monkeypatch.setattr(GpuBenchmark, "device", property(lambda self: broken()))
    result = b.measure(naive_manifest(problem), b"\x7fELF", problem)
    assert not result.ok and "CUDA_ERROR_NO_DEVICE" in result.reason and result.flops == problem.flops
    assert b.healthy  # no device is not a sticky error


def test_measure_refuses_a_manifest_of_another_problem_before_touching_the_gpu():
    b = GpuBenchmark()
    result = b.measure(naive_manifest(Problem.create(64, 64, 64)), b"", Problem.create(64, 64, 65))
    assert not result.ok and "another problem" in result.reason and b._device is None


# --- on the GPU -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_bench():
    b = GpuBenchmark(policy=TimingPolicy(warmup_s=0.005, measure_s=0.02, min_reps=5))
    yield b
    b.close()


@functools.lru_cache(maxsize=1)
def _device_cc():
    from gemmgen.runtime.device import Device

    with Device() as dev:
        return dev.props.cc


def _naive(problem, fault="none", splits=1):
    from gemmgen.tune.naive import naive_cubin

    return naive_manifest(problem, fault, splits), naive_cubin(problem, _device_cc(), fault, splits)


@pytest.mark.gpu
@pytest.mark.parametrize("reference", ["auto", "kernel"])
@pytest.mark.parametrize("problem", [
    Problem.create(128, 256, 64, "bf16", "row", "row"),
    Problem.create(17, 1000, 33, "f16", "col", "col", alpha=0.5, beta=-1.5, bias=True, activation="gelu"),
    Problem.create(1, 17, 4097, "bf16", "col", "row", bias=True, activation="relu"),
    Problem.create(19, 300, 77, "bf16", "row", "col", beta=0.5, bias=True, activation="silu"),
])
def test_right_kernel_verifies_and_times(gpu_bench, problem, reference):
    gpu_bench.reference = reference
    manifest, cubin = _naive(problem)
    m = gpu_bench.measure(manifest, cubin, problem)
    assert m.ok, m.reason
    assert m.rel_error < m.threshold and m.time_s > 0 and len(m.times_s) >= 5
    assert m.backend == ("kernel" if reference == "kernel" else "torch")


@pytest.mark.gpu
def test_split_k_with_workspace_verifies(gpu_bench):
    problem = Problem.create(96, 80, 1000, "bf16", "row", "col", beta=1.0)
    manifest, cubin = _naive(problem, splits=4)
    m = gpu_bench.measure(manifest, cubin, problem)
    assert m.ok, m.reason


@pytest.mark.gpu
@pytest.mark.parametrize("reference", ["auto", "kernel"])
def test_dropping_one_k_element_fails_verification(gpu_bench, reference):
    gpu_bench.reference = reference
    problem = Problem.create(64, 64, 4097, "bf16")
    manifest, cubin = _naive(problem, fault="wrong")
    m = gpu_bench.measure(manifest, cubin, problem)
    assert not m.ok and "wrong result" in m.reason and m.rel_error > m.threshold


@pytest.mark.gpu
@pytest.mark.parametrize("reference", ["auto", "kernel"])
@pytest.mark.parametrize("problem", [
    Problem.create(96, 80, 72, "bf16", "row", "col", beta=1.0, lda=75, ldb=81, ldc=83),
    Problem.create(33, 17, 40, "f16", "col", "row", bias=True, activation="relu", lda=40, ldb=24, ldc=17),
])
def test_views_with_gaps_verify_and_time_and_cublas_runs_on_them(gpu_bench, problem, reference):
    """Operands allocated with their leading dimensions, NaN in the gaps: a kernel that honours them passes."""
    gpu_bench.reference = reference
    m = gpu_bench.measure(*_naive(problem), problem)
    assert m.ok, m.reason
    assert m.backend == ("kernel" if reference == "kernel" else "torch")
    if reference == "auto":
        t = gpu_bench.cublas_time(problem)
        assert t is not None and t > 0


@pytest.mark.gpu
def test_a_kernel_that_writes_between_the_rows_of_d_fails_verification(gpu_bench):
    gpu_bench.reference = "auto"
    packed = Problem.create(64, 48, 32, "bf16", "row", "col")
    assert gpu_bench.measure(*_naive(packed, fault="past"), packed).ok  # packed: the fault writes nothing extra
    view = packed.with_leading(0, 0, 56)
    m = gpu_bench.measure(*_naive(view, fault="past"), view)
    assert not m.ok and "between D's rows" in m.reason, m.reason


@pytest.mark.gpu
def test_cublas_is_timed_when_torch_is_there(gpu_bench):
    pytest.importorskip("torch")
    t = gpu_bench.cublas_time(Problem.create(1024, 1024, 1024))
    assert t is not None and 1e-6 < t < 1e-2


@pytest.mark.gpu
def test_illegal_address_is_a_failed_measurement_and_marks_the_worker_unhealthy():
    code = textwrap.dedent("""
        from gemmgen.tune.bench import GpuBenchmark
        from gemmgen.model.problem import Problem
        from tests.test_bench import _naive
        p = Problem.create(64, 64, 64)
        b = GpuBenchmark()
        m = b.measure(*_naive(p, fault="oob"), p)
        print("RESULT", m.ok, b.healthy, m.reason)
        m2 = b.measure(*_naive(p), p)
        print("AFTER", m2.ok, m2.reason)
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "RESULT False False" in result.stdout, result.stdout + result.stderr[-2000:]
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in result.stdout
    assert "AFTER False" in result.stdout and "replace this worker" in result.stdout


def test_bench_command_without_a_driver_exits_2_with_one_line(capsys):
    from conftest import cuda_device_reason
    from gemmgen.cli import main

    if not cuda_device_reason():
        pytest.skip("a GPU is present: the no-driver path cannot be taken")
    assert main(["bench", "256", "256", "256", "--gpu", "h100"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no GPU available" in err


def test_bench_command_times_the_launches_of_the_device_it_runs_on(capsys, monkeypatch, tmp_path):
    # Regression: `gemmgen bench` built its manifest with the families' default SM count (an H100 SXM's 132), so on
    # an H100 PCIe (114 SMs) a persistent kernel was timed with 18 CTAs waiting for a second wave.
    import json
    from types import SimpleNamespace

    from gemmgen.cli import main
    from gemmgen.codegen import nvrtc
    from gemmgen.model.arch import Arch

    measured = []

    class Pcie:
        def __init__(self, reference="auto"):
            self.device = SimpleNamespace(props=SimpleNamespace(
                arch=Arch.SM90A, sm_count=114, to_dict=lambda: {"name": "H100 PCIe", "driver": "test"}))

        def measure(self, manifest, cubin, problem):
            measured.append(manifest)
            return Measurement(ok=False, reason="not run (test)", flops=problem.flops)

        def close(self):
            pass

    compiled = SimpleNamespace(cubin=b"", spill_bytes=0, nvrtc_version="test",
                               resources=SimpleNamespace(registers=168, stack_bytes=0, smem_static_bytes=0))
    monkeypatch.setattr(bench, "GpuBenchmark", Pcie)
    monkeypatch.setattr(nvrtc, "compile_kernel", lambda kernel, gpu, **kw: compiled)
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"family": "sm90_wgmma", "cta": "128x128x64", "warp": "64x128x64",
                                "mma": "64x128x16", "stages": 4, "warp_specialized": True, "persistent": True}))
    assert main(["bench", "4096", "4096", "4096", "--gpu", "h100-pcie", "--config", str(path), "--no-cublas"]) == 1
    assert measured[0]["launches"][0]["grid"] == [114, 1, 1]


def test_the_tuners_measurements_launch_a_persistent_kernel_for_the_device_they_run_on():
    # Regression: the tuner builds each manifest on the host for the catalogue's H100 SXM (132 SMs), and the
    # measuring worker launched it as built, so on an H100 PCIe (114 SMs) every persistent kernel was timed with 18
    # CTAs waiting for a second wave; gemmgen.load launched the same kernel with 114. Both now go through
    # runtime.serve.device_manifest. A non-persistent kernel's launches are the device's anyway: kept as built.
    from types import SimpleNamespace

    from gemmgen import Problem
    from gemmgen.model.arch import Arch
    from gemmgen.model.tiles import Kernel, TileConfig
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.tune.bench.gpu import _on_device

    problem = Problem.create(4096, 4096, 4096, "bf16", "row", "col")
    base = {"family": "sm90_wgmma", "cta": "128x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 4,
            "warp_specialized": True}
    pcie = SimpleNamespace(props=SimpleNamespace(sm_count=114))
    persistent = make_manifest(Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict({**base, "persistent": True})),
                               problem)
    assert persistent["launches"][-1]["grid"][0] == 132
    assert _on_device(persistent, problem, pcie, module=None)["launches"][-1]["grid"][0] == 114
    plain = make_manifest(Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict({**base, "persistent": False})),
                          problem)
    assert _on_device(plain, problem, pcie, module=None) is plain
