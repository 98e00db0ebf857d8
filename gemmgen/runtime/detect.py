"""Find the GPU through the CUDA driver and match it to the catalogue.

cuda-python is imported inside detect_gpu(), so importing this module never needs a driver.
Nothing here raises for a missing driver or device: the answer is Detected(gpu=None, reason=...).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..model.arch import Gpu, catalogue

# Device names as the driver reports them -> catalogue key. First match wins, so the more
# specific patterns come first ("H100 PCIe" before "H100"). GeForce variants with other SM counts
# (3090 Ti, 4090 D) are excluded on purpose: their rates differ from the catalogue entry.
NAME_PATTERNS: "tuple[tuple[str, str], ...]" = (
    (r"\bh200\b", "h200"),
    (r"\bh100\b.*\bpcie\b", "h100-pcie"),
    (r"\bh100\b(?!.*\bnvl\b)", "h100-sxm"),
    (r"\ba100\b.*\bpcie\b", "a100-pcie"),
    (r"\ba100\b", "a100-sxm"),
    (r"\bl40s\b", "l40s"),
    (r"\bl20\b", "l20"),
    (r"\brtx 4090\b(?! d\b)", "rtx4090"),
    (r"\brtx 3090\b(?! ti\b)", "rtx3090"),
)


@dataclass(frozen=True)
class Detected:
    """The catalogue entry for device 0 (or None), why, and the properties the driver reported."""

    gpu: "Gpu | None"
    reason: str
    props: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"gpu": self.gpu.key if self.gpu else None, "reason": self.reason, "props": dict(self.props)}


def match_name(name: str, sm_count: "int | None" = None) -> "Gpu | None":
    """The catalogue entry a driver device name denotes, or None. A known SM count must agree."""
    text = name.lower()
    gpus = catalogue()
    for pattern, key in NAME_PATTERNS:
        if re.search(pattern, text) and key in gpus:
            gpu = gpus[key]
            if sm_count is not None and sm_count != gpu.sm_count:
                return None  # same family name, different part (a cut-down or a variant we don't list)
            return gpu
    return None


# Driver attributes read into props: (prop name, CUdevice_attribute member, scale to the unit named).
_ATTRIBUTES = (
    ("sm_count", "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", 1),
    ("cc_major", "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", 1),
    ("cc_minor", "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", 1),
    ("clock_mhz", "CU_DEVICE_ATTRIBUTE_CLOCK_RATE", 1e-3),  # reported in kHz
    ("memory_clock_mhz", "CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE", 1e-3),
    ("memory_bus_bits", "CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH", 1),
    ("l2_bytes", "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE", 1),
    ("smem_per_block_optin", "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", 1),
    ("smem_per_sm", "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", 1),
    ("regs_per_sm", "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR", 1),
    ("max_threads_per_sm", "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR", 1),
)


def _error_name(cu, err) -> str:
    try:
        code, text = cu.cuGetErrorName(err)
        if code == cu.CUresult.CUDA_SUCCESS:
            return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # noqa: BLE001 - naming an error must never raise
        pass
    return str(err)


def read_props(device: int = 0) -> "tuple[dict, str]":
    """Driver properties of `device` and '' , or ({}, reason) when they cannot be read."""
    try:
        from cuda.bindings import driver as cu
    except (ImportError, OSError) as exc:
        return {}, f"cuda-python is not installed or not loadable ({type(exc).__name__})"
    try:
        (err,) = cu.cuInit(0)
    except (OSError, RuntimeError) as exc:
        # cuda-bindings raises (rather than returning an error code) when libcuda.so is absent.
        return {}, f"no CUDA driver found (libcuda.so not loadable: {type(exc).__name__})"
    if err != cu.CUresult.CUDA_SUCCESS:
        if err == cu.CUresult.CUDA_ERROR_NO_DEVICE:
            return {}, "the CUDA driver found no device"
        return {}, f"cuInit failed with {_error_name(cu, err)}"
    try:
        err, count = cu.cuDeviceGetCount()
        if err != cu.CUresult.CUDA_SUCCESS or count <= device:
            return {}, "the CUDA driver found no device" if err == cu.CUresult.CUDA_SUCCESS else \
                f"cuDeviceGetCount failed with {_error_name(cu, err)}"
        err, dev = cu.cuDeviceGet(device)
        if err != cu.CUresult.CUDA_SUCCESS:
            return {}, f"cuDeviceGet({device}) failed with {_error_name(cu, err)}"
        err, raw_name = cu.cuDeviceGetName(256, dev)
        if err != cu.CUresult.CUDA_SUCCESS:
            return {}, f"cuDeviceGetName failed with {_error_name(cu, err)}"
        props: dict = {"device": device, "count": count,
                       "name": raw_name.split(b"\0", 1)[0].decode(errors="replace").strip()}
        for prop, attr, scale in _ATTRIBUTES:
            member = getattr(cu.CUdevice_attribute, attr, None)
            if member is None:
                continue  # an attribute this cuda-python no longer has
            err, value = cu.cuDeviceGetAttribute(member, dev)
            if err == cu.CUresult.CUDA_SUCCESS:
                props[prop] = value * scale if scale != 1 else value
        err, total = cu.cuDeviceTotalMem(dev)
        if err == cu.CUresult.CUDA_SUCCESS:
            props["memory_bytes"] = int(total)
        err, version = cu.cuDriverGetVersion()
        if err == cu.CUresult.CUDA_SUCCESS:
            props["driver_version"] = f"{version // 1000}.{(version % 1000) // 10}"
    except Exception as exc:  # noqa: BLE001 - any driver failure means "no usable GPU", said plainly
        return {}, f"reading the device failed: {type(exc).__name__}: {exc}"
    if "memory_clock_mhz" in props and "memory_bus_bits" in props:
        # Double data rate: two transfers per reported memory clock.
        props["dram_bandwidth"] = 2 * props["memory_clock_mhz"] * 1e6 * props["memory_bus_bits"] / 8
    return props, ""


def detect_gpu(device: int = 0) -> Detected:
    """The catalogue GPU the driver reports as `device`, or None with a plain reason."""
    props, failure = read_props(device)
    if failure:
        return Detected(None, failure, props)
    name, sms = props["name"], props.get("sm_count")
    gpu = match_name(name, sms)
    cc = f"sm_{props.get('cc_major', '?')}{props.get('cc_minor', '?')}"
    if gpu is None:
        return Detected(None, f"found {name} ({sms} SMs, {cc}), which is not in the catalogue", props)
    return Detected(gpu, f"found {name} ({sms} SMs, {cc}) -> {gpu.key}", props)
