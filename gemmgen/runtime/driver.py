"""The CUDA driver API entry: cuda.bindings.driver imported lazily, every return code checked and decoded.

Any failing call raises CudaError(call, code, name, detail); a missing driver or device raises NoGpu.
"""
from __future__ import annotations

from functools import lru_cache

from ..model.errors import CudaError, NoGpu

DRIVER_HINT = "GPU commands need the NVIDIA driver; `gemmgen roofline` and `gemmgen tune --dry-run` work without one"
# Errors after which the context is unusable: every later call in this process fails too.
STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED", "CUDA_ERROR_TENSOR_MEMORY_LEAK", "CUDA_ERROR_UNKNOWN",
})


# --- the driver and its error codes --------------------------------------------------------

def driver_module():
    try:
        from cuda.bindings import driver
    except ImportError:
        raise NoGpu("cuda-python (cuda.bindings) is not installed", "pip install 'cuda-bindings[all]'") from None
    return driver


def error_name(code) -> str:
    """CUDA_ERROR_... for a CUresult, through cuGetErrorName, else the enum's own name."""
    driver = driver_module()
    try:
        err, name = driver.cuGetErrorName(code)
        if int(err) == 0 and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no libcuda: the enum still knows the name
        pass
    try:
        return driver.CUresult(int(code)).name
    except ValueError:
        return f"CUresult {int(code)}"


def _error_string(code) -> str:
    driver = driver_module()
    try:
        err, text = driver.cuGetErrorString(code)
        if int(err) == 0 and text:
            return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # noqa: BLE001
        pass
    return ""


def check(call: str, result, detail: str = ""):
    """Unpack a cuda-bindings result tuple (err, *values); raise CudaError naming `call` if err != 0."""
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    code = int(err)
    if code != 0:
        name = error_name(err)
        text = _error_string(err)
        raise CudaError(call, code, name, "; ".join(p for p in (detail, text) if p))
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def is_sticky(exc: BaseException) -> bool:
    """Whether an error leaves the context unusable (the worker holding it must be replaced)."""
    return isinstance(exc, CudaError) and exc.name in STICKY_ERRORS


@lru_cache(maxsize=1)
def init_driver():
    """cuInit(0) once per process; NoGpu with one line when there is no driver or no device."""
    driver = driver_module()
    try:
        result = driver.cuInit(0)
    except Exception:  # noqa: BLE001 - cuda.pathfinder raises its own error type when libcuda.so is missing
        raise NoGpu("no CUDA driver (libcuda.so could not be loaded)", DRIVER_HINT) from None
    code = int(result[0])
    if code != 0:
        name = error_name(result[0])
        if name in ("CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_NOT_INITIALIZED"):
            raise NoGpu(f"the CUDA driver found no device ({name})", DRIVER_HINT)
        raise NoGpu(f"cuInit failed with {name} ({code})", DRIVER_HINT)
    return driver


def driver_version() -> str:
    """The driver's CUDA version, e.g. '13.0'."""
    driver = init_driver()
    version = check("cuDriverGetVersion", driver.cuDriverGetVersion())
    return f"{version // 1000}.{(version % 1000) // 10}"


# --- small handles ------------------------------------------------------------------------


@lru_cache(maxsize=1)
def libcuda_launch():
    """libcuda's cuLaunchKernel through ctypes, or None where libcuda cannot be opened that way (the launcher
    then goes through cuda-python). The same library cuda-python drives: one context, one set of handles."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuLaunchKernel
    except (OSError, AttributeError):
        return None
    uint = ctypes.c_uint
    fn.argtypes = [ctypes.c_void_p, uint, uint, uint, uint, uint, uint, uint, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


# cuLaunchKernelEx's structures as cuda.h lays them out (CUDA 12 and 13): an attribute is a 4-byte id, 4 bytes of
# padding and a 64-byte value union; the ids are CUlaunchAttributeID's.
LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


def launch_ex_types():
    """(CUlaunchConfig, CUlaunchAttribute) as ctypes structures."""
    import ctypes

    class Value(ctypes.Union):
        _fields_ = [("pad", ctypes.c_char * 64), ("dims", ctypes.c_uint * 3), ("flag", ctypes.c_int)]

    class Attribute(ctypes.Structure):
        _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", Value)]

    uint = ctypes.c_uint

    class Config(ctypes.Structure):
        _fields_ = [("gridDimX", uint), ("gridDimY", uint), ("gridDimZ", uint), ("blockDimX", uint),
                    ("blockDimY", uint), ("blockDimZ", uint), ("sharedMemBytes", uint), ("hStream", ctypes.c_void_p),
                    ("attrs", ctypes.POINTER(Attribute)), ("numAttrs", uint)]

    assert ctypes.sizeof(Attribute) == 72, "CUlaunchAttribute is 72 bytes in cuda.h"
    return Config, Attribute


@lru_cache(maxsize=1)
def libcuda_launch_ex():
    """libcuda's cuLaunchKernelEx through ctypes (configuration built once by the caller, see launch_ex_types),
    or None where libcuda cannot be opened that way."""
    import ctypes

    try:
        fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


@lru_cache(maxsize=1)
def libcuda_set_current():
    """libcuda's cuCtxSetCurrent through ctypes (about 0.1 us, against about 1 us through cuda-python), or None
    where libcuda cannot be opened that way."""
    import ctypes

    try:
        fn = ctypes.CDLL("libcuda.so.1").cuCtxSetCurrent
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


@lru_cache(maxsize=1)
def libcuda_get_current():
    """libcuda's cuCtxGetCurrent through ctypes (argument: the address of a void* to fill), or None where libcuda
    cannot be opened that way."""
    import ctypes

    try:
        fn = ctypes.CDLL("libcuda.so.1").cuCtxGetCurrent
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


__all__ = ["DRIVER_HINT", "libcuda_get_current", "libcuda_launch", "libcuda_set_current", "STICKY_ERRORS", "check", "driver_module", "driver_version", "error_name", "init_driver", "is_sticky"]
