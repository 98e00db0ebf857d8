"""loader.py: bundle discovery and operand checks on the CPU; on a GPU, gemmgen.load() on torch and cupy
arrays against torch.matmul, and benchmarks/launch_from_manifest.py launching a bundle without gemmgen."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import gemmgen
from gemmgen.model.errors import InvalidInput
from gemmgen.runtime.arrays import ArrayInfo, check_operand, describe_array
from gemmgen.runtime.loader import find_manifest, read_bundle
from gemmgen.model.problem import Problem
from gemmgen.tune.naive import naive_manifest

ROOT = Path(__file__).resolve().parent.parent


def fake_cubin(sm: int = 90) -> bytes:
    """A 64-byte ELF header that says CUDA (e_machine 190) and sm_<sm> (e_flags), as a cubin's does."""
    header = bytearray(64)
    header[:5] = b"\x7fELF\x02"
    header[18:20] = (190).to_bytes(2, "little")
    header[48:52] = (0x6000004 | sm << 8).to_bytes(4, "little")
    return bytes(header)


def write_bundle(folder: Path, problem: Problem, cubin: "bytes | None" = None, splits: int = 1) -> Path:
    cubin = fake_cubin() if cubin is None else cubin
    manifest = naive_manifest(problem, splits=splits)
    manifest["cubin_sha256"] = hashlib.sha256(cubin).hexdigest()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / manifest["cubin"]).write_bytes(cubin)
    path = folder / (manifest["name"] + ".json")
    path.write_text(json.dumps(manifest))
    return path


def test_a_folder_with_one_manifest_is_a_bundle(tmp_path):
    path = write_bundle(tmp_path, Problem.create(64, 32, 16))
    (tmp_path / "notes.json").write_text('{"not": "a manifest"}')
    assert find_manifest(tmp_path) == path
    manifest, cubin, found = read_bundle(tmp_path)
    assert cubin == fake_cubin() and manifest["problem"]["M"] == 64 and found == path


def test_a_name_that_is_not_the_passed_manifests_kernel_is_refused(tmp_path):
    # Regression: load("bundle/K.json", name="other") ignored the name and loaded K.
    path = write_bundle(tmp_path, Problem.create(64, 32, 16))
    assert find_manifest(path, path.stem) == path
    with pytest.raises(InvalidInput, match="name must be the kernel of the manifest passed"):
        gemmgen.load(path, name="other")


def test_a_json_nested_thousands_deep_in_a_bundle_folder_is_named_not_a_recursion_error(tmp_path):
    # Regression: the loader parsed manifests with json.loads itself, so a .json nested 100,000 deep (in the folder,
    # or passed) ended gemmgen.load in a bare RecursionError; the files reader names it.
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InvalidInput, match="deep.json is not readable JSON .*nest so deeply"):
        gemmgen.load(tmp_path)
    with pytest.raises(InvalidInput, match="a manifest must be readable JSON.*nest so deeply"):
        gemmgen.load(tmp_path / "deep.json")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_in_a_bundle_folder_is_passed_over_not_waited_on(tmp_path):
    # Regression: find_manifest opened every *.json of the folder, and opening a named pipe with no writer blocks:
    # gemmgen.load(folder) never returned. Only regular files are read; the pipe is named when no manifest is found.
    os.mkfifo(tmp_path / "pipe.json")
    path = write_bundle(tmp_path / "bundle", Problem.create(64, 32, 16))
    os.mkfifo(path.parent / "pipe.json")
    outcome = {}

    def load(folder, key):
        try:
            outcome[key] = find_manifest(folder)
        except InvalidInput as exc:
            outcome[key] = exc

    for folder, key in ((path.parent, "bundle"), (tmp_path, "empty")):
        worker = threading.Thread(target=load, args=(folder, key), daemon=True)
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), f"find_manifest({folder}) blocked on the named pipe"
    assert outcome["bundle"] == path
    assert "pipe.json is not a regular file" in str(outcome["empty"])


def test_two_manifests_in_a_folder_are_ambiguous(tmp_path):
    write_bundle(tmp_path, Problem.create(64, 32, 16))
    write_bundle(tmp_path, Problem.create(64, 32, 16, "f16"))
    with pytest.raises(InvalidInput, match="exactly one"):
        find_manifest(tmp_path)


def test_missing_cubin_and_missing_path_are_user_errors(tmp_path):
    path = write_bundle(tmp_path, Problem.create(64, 32, 16))
    next(tmp_path.glob("*.cubin")).unlink()
    with pytest.raises(InvalidInput, match="cubin"):
        gemmgen.load(path)
    with pytest.raises(InvalidInput, match="folder or a manifest"):
        gemmgen.load(tmp_path / "nope")


def test_a_path_the_system_refuses_to_look_up_is_named_not_a_bare_os_error(tmp_path):
    # Regression: gemmgen.load("x" * 5000) ended in a bare OSError (File name too long) from Path.is_dir, which
    # ignores only missing paths.
    with pytest.raises(InvalidInput, match=r"gemmgen.load needs a path it can read, but got 'xxx.*5000 characters.*"
                                           r"File name too long"):
        gemmgen.load("x" * 5000)
    with pytest.raises(InvalidInput, match="folder or a manifest"):   # a path that is not there, as before
        gemmgen.load(tmp_path / "nope" / "deeper")


def _info(shape, strides, dtype="bfloat16", ptr=256):
    return ArrayInfo(ptr, shape, strides, dtype, 0, 0)


def test_operand_checks_name_shape_layout_dtype_and_alignment():
    problem = Problem.create(64, 32, 16, "bf16", "col", "row")
    check_operand("A", _info((64, 16), (1, 64)), problem)  # col-major A: a transposed K x M array
    check_operand("D", _info((64, 32), (32, 1), "uint16"), problem)  # bf16 bits without a bf16 dtype
    with pytest.raises(InvalidInput, match="A must have shape"):
        check_operand("A", _info((16, 64), (64, 1)), problem)
    with pytest.raises(InvalidInput, match="A must be col-major"):
        check_operand("A", _info((64, 16), (16, 1)), problem)
    with pytest.raises(InvalidInput, match="B must have dtype bf16"):
        check_operand("B", _info((16, 32), (32, 1), "float16"), problem)
    with pytest.raises(InvalidInput, match="16-byte"):
        check_operand("B", _info((16, 32), (32, 1), ptr=258), problem)


def test_strides_of_unit_extent_axes_do_not_matter():
    problem = Problem.create(1, 32, 16)
    check_operand("A", _info((1, 16), (999, 1)), problem)


def test_cuda_array_interface_arrays_are_described():
    class Fake:
        __cuda_array_interface__ = {"shape": (4, 6), "typestr": "<f2", "data": (4096, False), "version": 3}

    info = describe_array(Fake(), "A")
    assert (info.ptr, info.shape, info.strides, info.dtype) == (4096, (4, 6), (6, 1), "float16")
    with pytest.raises(InvalidInput, match="torch or cupy"):
        describe_array([1, 2], "A")


@pytest.mark.parametrize("cai,rule", [
    ({"shape": (4, 6), "typestr": "<f2", "data": (4096, False), "version": 3, "strides": (12, 3)}, "whole elements"),
    ({"shape": (4, 6), "typestr": "<f2", "data": (None, False), "version": 3}, "must give shape, typestr and data"),
    ({"shape": ("4", 6), "typestr": "<f2", "data": (4096, False), "version": 3}, "must give shape, typestr and data"),
    ({"typestr": "<f2", "data": (4096, False), "version": 3}, "must give shape, typestr and data"),
])
def test_a_cuda_array_interface_that_describes_no_array_is_refused_by_name(cai, rule):
    # Regression: a byte stride of 3 on 2-byte elements was floored to 1 (read as contiguous: the kernel would read
    # other elements than the array's), and a missing key or a null pointer was a bare KeyError or TypeError.
    class Fake:
        __cuda_array_interface__ = cai

    with pytest.raises(InvalidInput, match=rule):
        describe_array(Fake(), "A")


def test_c_and_bias_must_match_how_the_kernel_was_built(tmp_path):
    kernel = gemmgen.load(write_bundle(tmp_path, Problem.create(64, 32, 16)))
    with pytest.raises(InvalidInput, match="C must be None"):
        kernel(None, None, None, C=object())
    with pytest.raises(InvalidInput, match="bias must be None"):
        kernel(None, None, None, bias=object())
    beta = gemmgen.load(write_bundle(tmp_path / "beta", Problem.create(64, 32, 16, beta=1.0, bias=True)))
    with pytest.raises(InvalidInput, match="C is required"):
        beta(None, None, None)


class _Cai:
    """An array that only describes itself through __cuda_array_interface__ (as numba's and cupy's do)."""

    def __init__(self, shape, typestr="<u2", strides=None, ptr=4096):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3,
                                         "strides": strides}


def _family_kernel():
    """A LoadedKernel of a registered family (so each call's shape is served), checked without a GPU."""
    from gemmgen.runtime.loader import LoadedKernel
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.runtime.serve import kernel_of

    manifest = make_manifest(kernel_of({"arch": "sm_90a", "problem": Problem.create(256, 256, 256).to_dict(),
                                        "config": {"family": "sm90_wgmma", "cta": "128x128x64", "warp": "64x128x64",
                                                   "mma": "64x128x16", "stages": 4, "warp_specialized": True,
                                                   "persistent": True}}),
                             Problem.create(256, 256, 256))
    return LoadedKernel(manifest, b"")


@pytest.mark.parametrize("a_shape", [(1, 256, 256), (256,)])
def test_a_batch_or_a_vector_is_refused_naming_the_operand(a_shape):
    # Regression: a 3-D (batched) or 1-D A reached the shape unpacking and ended in a bare ValueError ("too many
    # values to unpack") before anything said which operand was wrong.
    with pytest.raises(InvalidInput, match=r"A must be a 2-D array"):
        _family_kernel()(_Cai(a_shape), _Cai((256, 256)), _Cai((256, 256)))


def test_a_persistent_kernel_at_its_own_problem_gets_the_grid_of_the_gpu_it_runs_on(monkeypatch):
    # Regression: at the bundle's own problem the loader launched the manifest's launches as written, whose
    # persistent grid was computed for an H100 SXM (132 SMs): on an H100 PCIe (114 SMs) 18 CTAs waited for a second
    # wave, while every other shape got the device's own grid.
    from types import SimpleNamespace

    from gemmgen.runtime.serve import manifest_for

    kernel = _family_kernel()
    assert kernel.manifest["launches"][-1]["grid"] == [4, 1, 1]   # 2 x 2 tiles of 128 x 128 at 256^3
    big = Problem.create(8192, 8192, 256)
    kernel.manifest, kernel.problem = manifest_for(kernel.manifest, kernel.kernel, big), big   # as exported
    assert kernel.manifest["launches"][-1]["grid"] == [132, 1, 1]   # the export's grid: an H100 SXM's SMs
    prepared = []

    class Pcie:
        props = SimpleNamespace(sm_count=114)

        def make_current(self):
            pass

        def prepare(self, manifest, module, pointers, workspace):
            prepared.append(manifest)
            return SimpleNamespace(run=lambda stream: None)

    monkeypatch.setattr(type(kernel), "_ensure", lambda self, ordinal: Pcie())
    kernel.bind(_Cai((8192, 256), ptr=1 << 30), _Cai((256, 8192), ptr=1 << 32), _Cai((8192, 8192), ptr=1 << 34))
    assert prepared[-1]["launches"][-1]["grid"] == [114, 1, 1]


def test_a_stream_is_a_handle_or_a_torch_or_cupy_stream_and_anything_else_is_named():
    # Regression: the stream went through int(): a torch.cuda.Stream was a bare TypeError at the launch, and the text
    # '1' launched on stream 1.
    from types import SimpleNamespace

    from gemmgen.runtime.arrays import stream_handle

    assert stream_handle(SimpleNamespace(cuda_stream=0x1234)) == 0x1234   # torch.cuda.Stream
    assert stream_handle(SimpleNamespace(ptr=0x5678)) == 0x5678           # cupy.cuda.Stream
    assert stream_handle(__import__("numpy").int64(7)) == 7
    for bad in ("1", -1, 1.0, True, object()):
        with pytest.raises(InvalidInput, match="stream must be a CUDA stream"):
            stream_handle(bad)
    with pytest.raises(InvalidInput, match="stream must be a CUDA stream"):
        _family_kernel()(_Cai((256, 256)), _Cai((256, 256)), _Cai((256, 256)), stream="1")


def _at(ptr, shape, strides):
    return ArrayInfo(ptr, shape, strides, "bfloat16", None, 0)


@pytest.mark.parametrize("x,y,expected", [
    (_at(1 << 20, (64, 64), (64, 1)), _at(1 << 20, (64, 64), (64, 1)), True),              # the same array
    (_at(1 << 20, (64, 64), (128, 1)), _at((1 << 20) + 128, (64, 64), (128, 1)), False),   # big[:, :64], big[:, 64:]
    (_at(1 << 20, (64, 64), (128, 1)), _at((1 << 20) + 64, (64, 64), (128, 1)), True),     # big[:, :64], big[:, 32:96]
    (_at(1 << 20, (32, 64), (64, 1)), _at((1 << 20) + 32 * 128, (32, 64), (64, 1)), False),  # rows 0-31, rows 32-63
    (_at(1 << 20, (64, 64), (1, 64)), _at(1 << 20, (64, 64), (64, 1)), True),              # X.t() and X
    (_at(1 << 20, (64, 64), (128, 1)), _at((1 << 20) + 10 * 256 + 128, (64,), (1,)), False),  # a vector in the gap
    (_at(1 << 20, (64, 64), (128, 1)), _at((1 << 20) + 10 * 256 + 200, (64,), (1,)), True),  # ... running into a row
])
def test_overlap_is_decided_on_the_bytes_each_view_covers(x, y, expected):
    from gemmgen.runtime.arrays import overlap

    assert overlap(x, 2, y, 2) is expected and overlap(y, 2, x, 2) is expected


def test_an_output_that_overlaps_an_input_is_refused_and_c_may_be_d():
    # Regression: gemm(A, B, A), writing D over an operand the kernel still reads, was launched and computed garbage;
    # nothing compared the arrays' memory. C may be D itself (D = alpha*A@B + beta*D is element by element).
    from gemmgen.runtime.arrays import check_aliasing

    problem = Problem.create(256, 256, 256, beta=1.0)
    a, b = _at(1 << 20, (256, 256), (256, 1)), _at(1 << 24, (256, 256), (256, 1))
    with pytest.raises(InvalidInput, match="D must not overlap A"):
        _family_kernel()(_Cai((256, 256), ptr=1 << 20), _Cai((256, 256), ptr=1 << 24), _Cai((256, 256), ptr=1 << 20))
    d = _at(1 << 28, (256, 256), (256, 1))
    check_aliasing({"A": a, "B": b, "C": d, "D": d}, problem)
    with pytest.raises(InvalidInput, match="C must be D itself or not overlap it"):
        check_aliasing({"A": a, "B": b, "C": _at((1 << 28) + 512, (256, 256), (256, 1)), "D": d}, problem)
    with pytest.raises(InvalidInput, match="D must not overlap B"):
        check_aliasing({"A": a, "B": b, "D": _at((1 << 24) + 256 * 512 - 2, (256, 256), (256, 1))}, problem)


# --- on the GPU -------------------------------------------------------------------------------------

def _gpu_bundle(folder: Path, problem: Problem, splits: int = 1) -> Path:
    from gemmgen.runtime.device import Device
    from gemmgen.tune.naive import naive_cubin

    with Device() as dev:
        cc = dev.props.cc
    return write_bundle(folder, problem, naive_cubin(problem, cc, splits=splits), splits)


def _torch_operands(torch, problem: Problem):
    """Random A (M×K) and B (K×N) in [-0.5, 0.5), laid out as the problem says (col = transposed view)."""
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[problem.a_dtype.value]
    A = torch.rand(problem.m, problem.k, device="cuda").to(dt) - 0.5
    B = torch.rand(problem.k, problem.n, device="cuda").to(dt) - 0.5
    A = A.t().contiguous().t() if problem.a_layout.value == "col" else A
    B = B.t().contiguous().t() if problem.b_layout.value == "col" else B
    return A, B


@pytest.mark.gpu
@pytest.mark.parametrize("a,b,splits", [("row", "row", 1), ("col", "row", 1), ("row", "col", 2), ("col", "col", 1)])
def test_loaded_kernel_matches_torch_matmul(tmp_path, a, b, splits):
    torch = pytest.importorskip("torch")
    problem = Problem.create(200, 72, 136, "bf16", a, b, beta=0.5, bias=True, activation="relu")
    kernel = gemmgen.load(_gpu_bundle(tmp_path, problem, splits).parent)
    A, B = _torch_operands(torch, problem)
    C = torch.rand(200, 72, dtype=torch.bfloat16, device="cuda")
    bias = torch.rand(72, dtype=torch.bfloat16, device="cuda")
    D = torch.full((200, 72), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert kernel(A, B, D, C=C, bias=bias) is D
    torch.cuda.synchronize()
    ref = torch.relu(0.5 * C.float() + A.float() @ B.float() + bias.float())
    assert torch.isfinite(D).all()
    assert ((D.float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.gpu
def test_loaded_kernel_rejects_a_wrong_shape_before_launching(tmp_path):
    torch = pytest.importorskip("torch")
    problem = Problem.create(64, 64, 64, "f16")
    kernel = gemmgen.load(_gpu_bundle(tmp_path, problem))
    A = torch.zeros(64, 32, dtype=torch.float16, device="cuda")
    with pytest.raises(InvalidInput, match="A must have shape"):
        kernel(A, A, A)


@pytest.mark.gpu
def test_loaded_kernel_runs_on_cupy_arrays(tmp_path):
    cp = pytest.importorskip("cupy")
    problem = Problem.create(48, 40, 72, "f16", "row", "col")
    kernel = gemmgen.load(_gpu_bundle(tmp_path, problem))
    A = (cp.random.rand(48, 72) - 0.5).astype(cp.float16)
    B = (cp.random.rand(40, 72) - 0.5).astype(cp.float16).T
    D = cp.full((48, 40), cp.nan, dtype=cp.float16)
    kernel(A, B, D)
    cp.cuda.get_current_stream().synchronize()
    ref = A.astype(cp.float32) @ B.astype(cp.float32)
    assert float(cp.linalg.norm(D.astype(cp.float32) - ref) / cp.linalg.norm(ref)) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3])
def test_standalone_script_launches_a_bundle_from_its_manifest(tmp_path, splits):
    pytest.importorskip("torch")
    problem = Problem.create(130, 70, 300, "f16", "col", "row", alpha=2.0, beta=1.0, activation="gelu")
    path = _gpu_bundle(tmp_path, problem, splits)
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "launch_from_manifest.py"), str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "-> OK" in result.stdout, result.stdout + result.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", ["1x1", "2x1"])
def test_standalone_script_launches_an_sm90_bundle_with_its_tensor_maps(tmp_path, cluster):
    # The sm90 ABI: tmA, tmB, the edge maps and (TMA-store epilogue) tmD encoded by the launcher from the
    # manifest's specs.
    pytest.importorskip("torch")
    from gemmgen.model.arch import Arch
    from gemmgen.runtime.device import Device
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.codegen.nvrtc import compile_kernel
    from gemmgen.model.tiles import Kernel, TileConfig

    with Device() as dev:
        if dev.props.cc != (9, 0):
            pytest.skip("the sm90_wgmma family needs an sm_90 GPU")
    problem = Problem.create(1000, 3000, 200, "bf16", "row", "col", beta=0.5, bias=True, activation="relu")
    config = TileConfig.from_dict({"family": "sm90_wgmma", "cta": "128x256x64", "warp": "64x256x64",
                                   "mma": "64x256x16", "stages": 4, "raster": {"order": "row", "group": 8},
                                   "cluster": cluster, "warp_specialized": True, "persistent": True})
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    compiled = compile_kernel(kernel)
    manifest = make_manifest(kernel, problem, compiled)
    names = [p["name"] for p in manifest["launches"][0]["params"]]
    # Edge maps: A and B are K-major; the 2x1 pair multicasts B in 128-row slices, the one holding N's edge cut.
    expected = ["tmA", "tmB", "tmAe", "tmBe", "tmD"]
    assert names[:len(expected)] == expected
    (tmp_path / manifest["cubin"]).write_bytes(compiled.cubin)
    path = tmp_path / (manifest["name"] + ".json")
    path.write_text(json.dumps(manifest))
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "launch_from_manifest.py"), str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "-> OK" in result.stdout, result.stdout + result.stderr[-2000:]
