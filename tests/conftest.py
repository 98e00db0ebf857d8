"""Shared fixtures, and the `gpu` marker: tests marked gpu are skipped where no CUDA device is found."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA driver and device (skipped elsewhere)")


@functools.lru_cache(maxsize=1)
def cuda_device_reason() -> str:
    """'' when cuInit and cuDeviceGetCount find a device, else why not."""
    try:
        from cuda.bindings import driver as cu
    except (ImportError, OSError) as exc:
        return f"cuda-python not importable ({exc})"
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return f"cuInit returned {err}"
        err, count = cu.cuDeviceGetCount()
    except Exception as exc:  # noqa: BLE001 - no driver library, or a broken one
        return f"no CUDA driver ({type(exc).__name__})"
    if err != cu.CUresult.CUDA_SUCCESS or count < 1:
        return "no CUDA device"
    return ""


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if "gpu" in item.keywords]
    if not marked:
        return
    reason = cuda_device_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"gpu test: {reason}")
        for item in marked:
            item.add_marker(skip)


@pytest.fixture
def h100():
    from gemmgen.model.arch import lookup_gpu

    return lookup_gpu("h100")


@pytest.fixture
def rtx3090():
    from gemmgen.model.arch import lookup_gpu

    return lookup_gpu("rtx3090")


def make_config(family, cta, warp, mma, stages, **extra):
    """A TileConfig from the same loose fields a YAML file gives."""
    from gemmgen.model.tiles import TileConfig

    return TileConfig.from_dict({"family": family, "cta": cta, "warp": warp, "mma": mma, "stages": stages, **extra})


@pytest.fixture
def hopper_big():
    """The worklog's final H100 configuration: 128x256x64, 2 consumer warpgroups, 3 stages, cluster 2x1."""
    return make_config("sm90_wgmma", "128x256x64", "64x256x64", "64x256x16", 3, cluster="2x1",
                       warp_specialized=True, persistent=True, raster={"order": "row", "group": 8})


@pytest.fixture
def sm80_default():
    return make_config("sm80_mma", "128x128x32", "64x64x32", "16x8x16", 4)
