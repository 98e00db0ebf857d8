"""A Python without NVRTC (no cuda-bindings, or no libnvrtc): every command that compiles refuses up front, in one
line with exit status 2 naming what to install. Regression: `tune --dry-run` listed every candidate as 'compile
error: NVRTC failed to compile ...' (the ModuleNotFoundError cut off in its column), then 'no candidate compiled',
exit status 0."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemmgen.codegen import nvrtc

ROOT = Path(__file__).resolve().parents[1]

# cuda (cuda-bindings) made unimportable, as in a Python where it was never installed.
WITHOUT_CUDA = ("import sys; sys.modules['cuda'] = None; sys.modules['cuda.bindings'] = None; "
                "from gemmgen.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("command", [
    ["tune", "256", "256", "256", "--gpu", "h100", "--dry-run"],
    ["tune", "256", "256", "256", "--gpu", "a100", "--dry-run", "--jobs", "0"],
    ["compile", "256", "256", "256", "--gpu", "h100", "--out", "OUT"],
    ["space", "--gpu", "a100", "--compile", "--jobs", "1"],
    ["suite", "SUITE", "--gpu", "h100", "--dry-run"],
    ["tune-linear", "256", "256", "--tokens", "1..64", "--gpu", "h100", "--dry-run"],
], ids=lambda c: "-".join(c[:1] + [a for a in c if a in ("--dry-run", "--compile", "--jobs")]))
def test_a_python_without_cuda_bindings_is_refused_once_naming_what_to_install(tmp_path, command):
    suite = tmp_path / "suite.yaml"
    suite.write_text("shapes:\n  - {M: 256, N: 256, K: 256}\n")
    argv = [str(tmp_path / "out") if a == "OUT" else str(suite) if a == "SUITE" else a for a in command]
    env = dict(os.environ, PYTHONPATH=str(ROOT), GEMMGEN_RESULTS=str(tmp_path / "results"),
               GEMMGEN_CACHE=str(tmp_path / "cache"), GEMMGEN_DATA=str(tmp_path / "data"))
    proc = subprocess.run([sys.executable, "-c", WITHOUT_CUDA, *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert "NVRTC is not available (ModuleNotFoundError" in errors[0]
    assert "cuda-bindings[all]" in errors[0] and "nvidia-cuda-nvrtc" in errors[0]
    assert "compile error" not in proc.stdout and "NVRTC failed" not in proc.stdout + proc.stderr


def test_cuda_bindings_without_libnvrtc_is_refused_naming_the_loader_error(monkeypatch):
    from cuda.bindings import nvrtc as bindings

    def missing():
        raise RuntimeError("Failed to dlopen libnvrtc.so.13")

    monkeypatch.setattr(nvrtc, "_loaded", None)
    monkeypatch.setattr(bindings, "nvrtcVersion", missing)
    with pytest.raises(nvrtc.NvrtcUnavailable, match="RuntimeError: Failed to dlopen libnvrtc") as caught:
        nvrtc.compile_source("probe", "extern \"C\" __global__ void probe() {}", ("--gpu-architecture=sm_90",))
    assert caught.value.exit_code == 2 and "nvidia-cuda-nvrtc" in str(caught.value)
    with pytest.raises(nvrtc.NvrtcUnavailable):
        nvrtc.compile_for_device.__wrapped__("probe", "extern \"C\" __global__ void probe() {}", (9, 0))
