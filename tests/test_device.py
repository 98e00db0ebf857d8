"""device.py: driver errors, the no-driver path, parameter packing from a manifest; on a GPU, memory,
random fill, poison, launches (single, split-K with workspace) and sticky-error reporting."""
from __future__ import annotations

import ctypes
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gemmgen.runtime import device, driver
from gemmgen.tune import utility


def nvrtc_missing() -> bool:
    try:
        from gemmgen.codegen.nvrtc import nvrtc_version
        return not nvrtc_version()
    except Exception:  # noqa: BLE001 - no bindings or no libnvrtc
        return True


def compile_for_device(*args):
    from gemmgen.codegen.nvrtc import compile_for_device as compile_
    return compile_(*args)


compile_for_device.cache_clear = lambda: __import__("gemmgen.codegen.nvrtc", fromlist=["x"]).compile_for_device.cache_clear()
from gemmgen.model.errors import CudaError, InvalidInput, NoGpu
from gemmgen.model.problem import Problem
from gemmgen.tune.naive import naive_manifest

ROOT = Path(__file__).resolve().parent.parent


# --- a fake driver: the no-driver and error paths without a GPU ------------------------------------

class _FakeResult(int):
    pass


class FakeDriver:
    """Enough of cuda.bindings.driver for init_driver and check."""

    def __init__(self, init=None):
        self._init = init
        import enum

        class CUresult(enum.IntEnum):
            CUDA_SUCCESS = 0
            CUDA_ERROR_NO_DEVICE = 100
            CUDA_ERROR_ILLEGAL_ADDRESS = 700

        self.CUresult = CUresult

    def cuInit(self, flags):
        if isinstance(self._init, Exception):
            raise self._init
        return (self.CUresult(self._init or 0),)

    def cuGetErrorName(self, err):
        return (self.CUresult(0), self.CUresult(int(err)).name.encode())

    def cuGetErrorString(self, err):
        return (self.CUresult(0), b"an illegal memory access was encountered")


@pytest.fixture
def fake_driver(monkeypatch):
    def install(init=None):
        fake = FakeDriver(init)
        monkeypatch.setattr(driver, "driver_module", lambda: fake)
        device.init_driver.cache_clear()
        return fake

    yield install
    device.init_driver.cache_clear()


def test_missing_driver_library_is_one_line_nogpu(fake_driver):
    fake_driver(init=RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search.\nmore'))
    with pytest.raises(NoGpu) as info:
        device.Device().open()
    assert "\n" not in str(info.value)
    assert "no CUDA driver" in str(info.value)


def test_no_device_is_nogpu_naming_the_error(fake_driver):
    fake_driver(init=100)
    with pytest.raises(NoGpu, match="CUDA_ERROR_NO_DEVICE"):
        device.init_driver()


def test_missing_cuda_bindings_is_nogpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(NoGpu, match="cuda-python"):
        driver.driver_module()


def test_check_raises_cuda_error_with_call_code_and_decoded_name(fake_driver):
    fake = fake_driver()
    with pytest.raises(CudaError) as info:
        device.check("cuCtxSynchronize", (fake.CUresult(700),), "after my_kernel")
    err = info.value
    assert (err.call, err.code, err.name) == ("cuCtxSynchronize", 700, "CUDA_ERROR_ILLEGAL_ADDRESS")
    assert "after my_kernel" in err.detail and "illegal memory access" in err.detail
    assert device.is_sticky(err)


def test_check_returns_the_values_after_success(fake_driver):
    fake = fake_driver()
    assert device.check("cuMemAlloc", (fake.CUresult(0), 1234)) == 1234
    assert device.check("cuX", (fake.CUresult(0), 1, 2)) == (1, 2)
    assert device.check("cuY", (fake.CUresult(0),)) is None


def test_not_every_error_is_sticky():
    assert not device.is_sticky(CudaError("cuLaunchKernel", 1, "CUDA_ERROR_INVALID_VALUE"))
    assert not device.is_sticky(ValueError("x"))


# --- parameter packing ----------------------------------------------------------------------------

def _problem(**kw):
    return Problem.create(100, 200, 300, "bf16", "row", "col", **kw)


def test_pack_params_follows_the_manifest_order_and_ctypes():
    problem = _problem(alpha=2.0, beta=0.5)
    params = naive_manifest(problem)["launches"][0]["params"]
    packed = device.pack_params(params, {"A": 0x1000, "B": 0x2000, "C": 0x3000, "D": 0x4000}, workspace=0x5000)
    assert packed.names == ("A", "B", "C", "D", "bias", "workspace", "M", "N", "K", "lda", "ldb", "ldc", "ldd",
                            "alpha", "beta")
    raw = [packed.raw(i) for i in range(len(params))]
    assert [struct.unpack("<Q", r)[0] for r in raw[:6]] == [0x1000, 0x2000, 0x3000, 0x4000, 0, 0x5000]
    assert [struct.unpack("<i", r)[0] for r in raw[6:13]] == [100, 200, 300, 300, 300, 200, 200]
    assert struct.unpack("<f", raw[13])[0] == 2.0 and struct.unpack("<f", raw[14])[0] == 0.5
    # The void* array points at each storage, in order: what cuLaunchKernel dereferences.
    array = (ctypes.c_void_p * len(params)).from_address(packed.address)
    assert [array[i] for i in range(len(params))] == [ctypes.addressof(s) for s in packed.storage]


def test_pack_params_refuses_a_missing_required_pointer():
    params = naive_manifest(_problem())["launches"][0]["params"]
    with pytest.raises(InvalidInput, match="tensor parameter B"):
        device.pack_params(params, {"A": 1, "D": 2})


def test_pack_params_encodes_tensormaps_through_the_encoder():
    spec = {"name": "tmA", "ctype": "CUtensorMap", "kind": "tensormap", "tensor": "A", "dims": [64, 64],
            "strides_bytes": [128], "box": [64, 64], "swizzle": "128B", "dtype": "bf16"}
    seen = []

    def encode(s, ptr):
        seen.append((s["name"], ptr))
        return bytes(range(128))

    packed = device.pack_params([spec], {"A": 0xABC0}, encode_tensormap=encode)
    assert seen == [("tmA", 0xABC0)]
    assert packed.raw(0) == bytes(range(128))


def test_pack_params_without_an_encoder_says_tma_is_needed():
    spec = {"name": "tmA", "kind": "tensormap", "tensor": "A"}
    with pytest.raises(InvalidInput, match="gemmgen.runtime.tma"):
        device.pack_params([spec], {"A": 16})


@pytest.mark.parametrize("bad", [{"name": "x", "kind": "scalar", "ctype": "half", "value": 1},
                                 {"name": "x", "kind": "scalar", "ctype": "int"},
                                 {"name": "x", "kind": "texture"}])
def test_pack_params_rejects_unknown_kinds_ctypes_and_missing_values(bad):
    with pytest.raises(InvalidInput):
        device.pack_params([bad], {})


@pytest.mark.parametrize("spec", [{"name": "K", "kind": "scalar", "ctype": "int", "value": 6_000_000_000},
                                  {"name": "lda", "kind": "scalar", "ctype": "int", "value": 2**31},
                                  {"name": "M", "kind": "scalar", "ctype": "int", "value": 4096.0},
                                  {"name": "alpha", "kind": "scalar", "ctype": "float", "value": 1e39}])
def test_pack_params_refuses_a_scalar_its_c_type_would_wrap(spec):
    # Regression: scalars were converted with ctypes, which wraps silently: a manifest's int K of 6e9 (3xTF32's
    # three segments) reached the kernel as 1705032704, and a float alpha of 1e39 as inf.
    from gemmgen.runtime import tma

    with pytest.raises(InvalidInput, match=f"scalar parameter {spec['name']} must be"):
        device.pack_params([spec], {})
    with pytest.raises(InvalidInput, match=f"scalar parameter {spec['name']} must be"):
        tma.pack_params([spec], {})
    fits = dict(spec, value=-(2**31) if spec["ctype"] == "int" else -3.0e38)
    assert len(device.pack_params([fits], {}).storage) == 1


def test_bf16_rounding_is_nearest_even():
    values = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, 3.14159], np.float32)
    bits = device.float32_to_bf16_bits(values)
    # 1+2^-8 is a tie between 1.0 and 1+2^-7: even mantissa wins (1.0); 1+3*2^-8 rounds up to 1+2^-6.
    assert device.to_float32(bits, "bf16").tolist() == [1.0, 1.0, 1.015625, -2.5, 3.140625]


def test_host_uniform_is_in_range_and_seeded():
    a = device.to_float32(device.host_uniform("bf16", 10000, seed=1), "bf16")
    b = device.to_float32(device.host_uniform("bf16", 10000, seed=2), "bf16")
    assert a.min() >= -1.0 and a.max() <= 1.0 and abs(a.mean()) < 0.05 and a.std() > 0.5
    assert not np.array_equal(a, b)
    assert np.array_equal(a, device.to_float32(device.host_uniform("bf16", 10000, seed=1), "bf16"))


def test_utility_kernels_compile_to_sass_cubins():
    pytest.importorskip("cuda.bindings.nvrtc")
    if nvrtc_missing():
        pytest.skip("NVRTC library not loadable")
    cubin = compile_for_device("gemmgen_utility", utility.UTILITY_SOURCE, (9, 0))
    assert cubin[:4] == b"\x7fELF"


# --- on the GPU -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dev():
    with device.Device() as d:
        yield d


@pytest.mark.gpu
def test_device_reports_its_properties(dev):
    p = dev.props
    assert p.name and p.sm_count > 0 and p.l2_bytes > 0 and p.cc[0] >= 8
    assert p.driver.count(".") == 1


@pytest.mark.gpu
def test_copy_round_trip_and_poison(dev):
    buf = dev.alloc(4096 * 2)
    data = np.arange(4096, dtype=np.float16)
    dev.copy_to_device(buf, data)
    assert np.array_equal(dev.copy_to_host(buf, np.float16, 4096), data)
    dev.poison(buf, "f16")
    assert np.isnan(dev.copy_to_host(buf, np.float16, 4096)).all()
    dev.poison(buf, "bf16")
    assert np.isnan(device.to_float32(dev.copy_to_host(buf, np.uint16, 4096), "bf16")).all()
    dev.free(buf)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_device_random_fill_is_uniform_seeded_and_never_zero(dev, dtype):
    n = 1 << 20
    buf = dev.alloc(n * 4)
    raw_type = device.numpy_dtype(dtype)
    utility.fill_uniform(dev, buf, dtype, n, seed=11)
    a = device.to_float32(dev.copy_to_host(buf, raw_type, n), dtype)
    utility.fill_uniform(dev, buf, dtype, n, seed=12)
    b = device.to_float32(dev.copy_to_host(buf, raw_type, n), dtype)
    utility.fill_uniform(dev, buf, dtype, n, seed=11)
    again = device.to_float32(dev.copy_to_host(buf, raw_type, n), dtype)
    assert a.min() >= -1.0 and a.max() <= 1.0
    assert abs(a.mean()) < 0.01 and abs(a.std() - 1 / 3 ** 0.5) < 0.01  # uniform on [-1, 1): sd 0.577
    assert (a == 0).mean() < 0.01
    assert not np.array_equal(a, b) and np.array_equal(a, again)
    dev.free(buf)


def _run_naive(dev, problem, splits=1, fault="none"):
    """Launch the naive ABI kernel from its manifest; return D (fp32 host) and the float64 reference."""
    from gemmgen.tune.naive import naive_cubin

    manifest = naive_manifest(problem, fault, splits)
    module = dev.load(naive_cubin(problem, dev.props.cc, fault, splits))
    m, n, k = problem.m, problem.n, problem.k
    a_count, b_count = m * k, k * n
    bufs = {"A": dev.alloc(a_count * 2), "B": dev.alloc(b_count * 2), "D": dev.alloc(m * n * 2)}
    utility.fill_uniform(dev, bufs["A"], problem.a_dtype, a_count, seed=3)
    utility.fill_uniform(dev, bufs["B"], problem.b_dtype, b_count, seed=4)
    dev.poison(bufs["D"], problem.c_dtype)
    workspace = dev.alloc(manifest["workspace_bytes"]) if manifest["workspace_bytes"] else None
    if workspace:
        utility.fill_uniform(dev, workspace, "f32", m * n, seed=5)  # garbage the launcher must zero
    dev.launch(manifest, module, {k_: b.ptr for k_, b in bufs.items()}, workspace)
    dev.synchronize("naive kernel")
    raw = {name: dev.copy_to_host(b, device.numpy_dtype(problem.a_dtype), b.nbytes // 2) for name, b in bufs.items()}
    a = device.to_float32(raw["A"], problem.a_dtype).astype(np.float64)
    b = device.to_float32(raw["B"], problem.b_dtype).astype(np.float64)
    a = a.reshape(m, k) if problem.a_layout.value == "row" else a.reshape(k, m).T
    b = b.reshape(k, n) if problem.b_layout.value == "row" else b.reshape(n, k).T
    out = device.to_float32(raw["D"], problem.c_dtype).reshape(m, n)
    for buf in list(bufs.values()) + [workspace]:
        dev.free(buf)
    dev.unload(module)
    return out, a @ b


@pytest.mark.gpu
@pytest.mark.parametrize("a,b,splits", [("row", "row", 1), ("col", "col", 1), ("row", "col", 3), ("col", "row", 4)])
def test_manifest_launch_computes_the_product(dev, a, b, splits):
    problem = Problem.create(67, 45, 129, "bf16", a, b)
    out, exact = _run_naive(dev, problem, splits)
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - exact) / np.linalg.norm(exact) < 1e-2


@pytest.mark.gpu
def test_out_of_bounds_write_surfaces_as_sticky_cuda_error_naming_the_call():
    """Run in a child: an illegal address ruins the context for the rest of its process."""
    code = textwrap.dedent("""
        from gemmgen.runtime import device, driver
        from gemmgen.model.problem import Problem
        from tests.test_device import _run_naive
        with device.Device() as dev:
            try:
                _run_naive(dev, Problem.create(64, 64, 64), fault="oob")
            except device.CudaError as exc:
                print("CAUGHT", exc.call, exc.name, device.is_sticky(exc))
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "CAUGHT" in result.stdout, result.stderr[-2000:]
    call, name, sticky = result.stdout.split("CAUGHT", 1)[1].split()
    assert call in ("cuCtxSynchronize", "cuMemcpyDtoH") and name == "CUDA_ERROR_ILLEGAL_ADDRESS" and sticky == "True"


def test_compiling_leaves_python_constants_alone():
    """Regression: NVRTC wrote an empty log into `b" " * 1`, CPython's shared b' ' object, which turned
    every space in the process into NUL (torch then failed to import on the H100)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    if nvrtc_missing():
        pytest.skip("NVRTC library not loadable")
    compile_for_device.cache_clear()
    compile_for_device("gemmgen_utility", utility.UTILITY_SOURCE, (9, 0))
    assert b" " == bytes([32]) and " ".join(["a", "b"]) == "a\x20b"
