"""Launching from a manifest: kernel parameters packed from its `params`, and a launch sequence enqueued with
cuLaunchKernel, or cuLaunchKernelEx where a launch asks for a thread-block cluster."""
from __future__ import annotations

import ctypes
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..model.errors import InvalidInput
from . import driver as drv  # its driver_module through the module, so tests can fake the driver
from .driver import check

if TYPE_CHECKING:  # annotations only: device.py imports this module
    from .device import Buffer, Function

_SCALAR_CTYPES = {
    "int": ctypes.c_int32, "int32_t": ctypes.c_int32, "unsigned": ctypes.c_uint32,
    "unsigned int": ctypes.c_uint32, "uint32_t": ctypes.c_uint32, "long long": ctypes.c_int64,
    "int64_t": ctypes.c_int64, "unsigned long long": ctypes.c_uint64, "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_uint64, "float": ctypes.c_float, "double": ctypes.c_double,
}
TENSORMAP_BYTES = 128
# The tensor-valued names of the ABI; C and bias may be null (beta == 0, no bias).
# fp8 scales: null means 1; row_sums: null means the kernel skips the row sums of A
NULLABLE_TENSORS = frozenset({"C", "bias", "scale_a", "scale_b", "row_sums"})


def scalar(ctype, value, name: str, entry: str = "kernel"):
    """`value` as the C scalar `ctype`, or InvalidInput naming the parameter where it does not fit: ctypes wraps an
    integer silently (an `int` K of 6e9 reached the kernel as 1.7e9), and takes a float32 past 3.4e38 as inf."""
    if ctype in (ctypes.c_float, ctypes.c_double):
        converted = ctype(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                abs(converted.value) == float("inf") and abs(value) != float("inf")):
            raise InvalidInput(f"{entry}: scalar parameter {name} must be a number its C type "
                               f"({ctype.__name__[2:]}) holds", value)
        return converted
    bits = 8 * ctypes.sizeof(ctype)
    lo, hi = (-(1 << bits - 1), (1 << bits - 1) - 1) if ctype(-1).value == -1 else (0, (1 << bits) - 1)
    try:   # an int or an integer type of its own (NumPy's); not 4096.0 or True
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or not lo <= number <= hi:
        raise InvalidInput(f"{entry}: scalar parameter {name} must be an integer its C type ({ctype.__name__[2:]}) "
                           f"holds, {lo}..{hi}", value)
    return ctype(number)


@dataclass
class PackedParams:
    """Host storage for one launch's parameters and the void** array cuLaunchKernel reads."""

    names: "tuple[str, ...]"
    storage: list  # ctypes objects, kept alive while the launch is enqueued
    array: object  # (c_void_p * n)
    # Per parameter: its manifest kind and the operand it reads ('' for scalars), so a bound launch can re-point
    # one operand in place (LaunchSequence.pointer_setter).
    kinds: "tuple[str, ...]" = ()
    tensors: "tuple[str, ...]" = ()

    @property
    def address(self) -> int:
        """The kernelParams argument: the address of the void* array (0 when there are no parameters)."""
        return ctypes.addressof(self.array) if self.names else 0

    def raw(self, index: int) -> bytes:
        """The bytes the kernel receives for parameter `index` (for tests and debugging)."""
        value = self.storage[index]
        return ctypes.string_at(ctypes.addressof(value), ctypes.sizeof(value))


def pack_params(params: "list[dict]", pointers: "dict[str, int]", workspace: int = 0,
                encode_tensormap=None, entry: str = "kernel") -> PackedParams:
    """Kernel parameters in manifest order: device pointers for tensors and the workspace, scalars by ctype,
    and 128-byte tensor maps from `encode_tensormap(spec, base_ptr)`."""
    storage, names, kinds, tensors = [], [], [], []
    for spec in params:
        name, kind = spec.get("name", "?"), spec.get("kind")
        tensors.append(str(spec.get("tensor", name)) if kind in ("tensor", "tensormap") else "")
        kinds.append(str(kind))
        if kind == "tensor":
            tensor = spec.get("tensor", name)
            ptr = pointers.get(tensor)
            if ptr is None:
                if tensor not in NULLABLE_TENSORS:
                    raise InvalidInput(f"{entry}: tensor parameter {name} needs a device pointer for", tensor)
                ptr = 0
            value = ctypes.c_uint64(int(ptr))
        elif kind == "workspace":
            # A pointer into the workspace: its start, or a region `offset_bytes` in (a packed operand's copy).
            value = ctypes.c_uint64(int(workspace or 0) + int(spec.get("offset_bytes", 0)) if workspace else 0)
        elif kind == "scalar":
            ctype = _SCALAR_CTYPES.get(" ".join(str(spec.get("ctype", "")).replace("const", "").split()))
            if ctype is None:
                raise InvalidInput(f"{entry}: scalar parameter {name} must have a ctype among {sorted(_SCALAR_CTYPES)}",
                                   spec.get("ctype"))
            if "value" not in spec:
                raise InvalidInput(f"{entry}: scalar parameter {name} must carry a value", spec)
            value = scalar(ctype, spec["value"], name, entry)
        elif kind == "tensormap":
            if encode_tensormap is None:
                raise InvalidInput(f"{entry}: tensormap parameter {name} needs gemmgen.runtime.tma to encode it", spec)
            tensor = spec.get("tensor")
            # A map over the workspace reads a copy the launch sequence's pack launches wrote there.
            base = int(workspace) + int(spec.get("offset_bytes", 0)) if tensor == "workspace" and workspace \
                else pointers.get(tensor)
            if not base:
                raise InvalidInput(f"{entry}: tensormap parameter {name} needs a device pointer for", tensor)
            encoded = bytes(encode_tensormap(spec, int(base)))
            if len(encoded) != TENSORMAP_BYTES:
                raise InvalidInput(f"{entry}: an encoded tensor map must be {TENSORMAP_BYTES} bytes", len(encoded))
            # The driver copies parameter bytes out of host memory, so the host copy needs no 64-byte alignment.
            value = (ctypes.c_ubyte * TENSORMAP_BYTES).from_buffer_copy(encoded)
        else:
            raise InvalidInput(f"{entry}: parameter kind must be tensor, tensormap, workspace or scalar", kind)
        storage.append(value)
        names.append(name)
    array = (ctypes.c_void_p * max(1, len(storage)))(*[ctypes.addressof(v) for v in storage])
    return PackedParams(tuple(names), storage, array, tuple(kinds), tuple(tensors))


def default_tensormap_encoder():
    """gemmgen.runtime.tma.encode where that module exists (the Hopper family), else None."""
    try:
        from . import tma
    except ModuleNotFoundError:
        return None
    return tma.encode


@dataclass
class PreparedLaunch:
    function: Function
    grid: "tuple[int, int, int]"
    block: "tuple[int, int, int]"
    cluster: "tuple[int, int, int]"
    dynamic_smem: int
    params: PackedParams
    # Programmatic dependent launch (the manifest's `programmatic`): the kernel may start while the previous
    # kernel of the stream finishes; it waits for it (griddepcontrol.wait) before touching global memory.
    programmatic: bool = False


class LaunchSequence:
    """A manifest's launches bound to buffers: run() zeroes what the manifest's workspace_zero asks for
    before every run, and enqueues the launches in order.

    Each launch is turned into a ready call once: plain launches go straight to libcuda's cuLaunchKernel through
    ctypes with their arguments converted ahead (cuda-python's wrapper converts them on every call, about 5 us),
    cluster launches keep one cuLaunchKernelEx configuration whose stream alone changes."""

    def __init__(self, launches: "list[PreparedLaunch]", workspace: "Buffer | None", name: str,
                 zero_each_run: "int | None" = None):
        self.launches, self.workspace, self.name = launches, workspace, name
        self.zero_each_run = workspace.nbytes if workspace is not None and zero_each_run is None else (zero_each_run or 0)
        self._calls = [ready_call(launch) for launch in launches]

    def run(self, stream: int = 0) -> None:
        if self.workspace is not None and self.zero_each_run:
            # sm80 split-K accumulates into the workspace: its contract is that it starts at zero.
            driver = drv.driver_module()
            check("cuMemsetD8Async", driver.cuMemsetD8Async(self.workspace.ptr, 0, self.zero_each_run, stream),
                  f"zeroing the workspace of {self.name}")
        for call in self._calls:
            call(stream)

    def pointer_setter(self, tensor: str):
        """A call ptr -> None that re-points every plain pointer parameter reading operand `tensor` to a new
        address, in the packed storage the launches read (the driver copies parameters when a launch is
        enqueued, so launches already queued keep the old address); None where a tensor map reads the operand
        (its encoding holds the address: bind again) or no parameter does."""
        slots = []
        for launch in self.launches:
            params = launch.params
            for kind, read, value in zip(params.kinds, params.tensors, params.storage):
                if read != tensor:
                    continue
                if kind != "tensor":
                    return None
                slots.append(value)
        if not slots:
            return None
        if len(slots) == 1:
            slot = slots[0]

            def set_pointer(ptr: int) -> None:
                slot.value = ptr
            return set_pointer

        def set_pointers(ptr: int) -> None:
            for value in slots:
                value.value = ptr
        return set_pointers


def _describe(launch: PreparedLaunch) -> str:
    return (f"{launch.function.name} grid={list(launch.grid)} block={list(launch.block)} smem={launch.dynamic_smem}"
            + (f" cluster={list(launch.cluster)}" if launch.cluster != (1, 1, 1) else "")
            + (" programmatic" if launch.programmatic else ""))


def ready_call(launch: PreparedLaunch):
    """stream -> None: enqueue `launch`, every return code checked, with as little per-call work as possible."""
    driver = drv.driver_module()
    gx, gy, gz = launch.grid
    bx, by, bz = launch.block
    real = getattr(driver, "__name__", "") == "cuda.bindings.driver"   # a test's fake driver has no libcuda
    if launch.cluster == (1, 1, 1) and not launch.programmatic:
        direct = drv.libcuda_launch() if real else None
        if direct is not None:
            handle, smem, params = int(launch.function.handle), launch.dynamic_smem, launch.params.address

            def call(stream: int) -> None:
                code = direct(handle, gx, gy, gz, bx, by, bz, smem, stream, params, None)
                if code:
                    check("cuLaunchKernel", (driver.CUresult(code),), _describe(launch))
            return call

        def call(stream: int) -> None:
            check("cuLaunchKernel", driver.cuLaunchKernel(launch.function.handle, gx, gy, gz, bx, by, bz,
                                                          launch.dynamic_smem, stream, launch.params.address, 0),
                  _describe(launch))
        return call
    direct = drv.libcuda_launch_ex() if real else None
    if direct is not None:
        return _direct_ex_call(direct, launch, driver)
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
    config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
    config.sharedMemBytes = launch.dynamic_smem
    attrs = []
    if launch.cluster != (1, 1, 1):
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = launch.cluster
        attrs.append(attr)
    if launch.programmatic:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    current = [None]

    def call(stream: int) -> None:
        if current[0] != stream:
            config.hStream = driver.CUstream(stream)
            current[0] = stream
        check("cuLaunchKernelEx", driver.cuLaunchKernelEx(config, launch.function.handle, launch.params.address, 0),
              _describe(launch))
    return call


def _direct_ex_call(direct, launch: PreparedLaunch, driver):
    """A ready call through libcuda's cuLaunchKernelEx by ctypes: the configuration and its attributes are built
    once, and a call only sets the stream (cuda-python's wrapper would rebuild them, ~5 us a launch)."""
    import ctypes

    Config, Attribute = drv.launch_ex_types()
    wanted = []
    if launch.cluster != (1, 1, 1):
        wanted.append((drv.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, launch.cluster))
    if launch.programmatic:
        wanted.append((drv.LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1))
    attrs = (Attribute * max(1, len(wanted)))()
    for attr, (ident, value) in zip(attrs, wanted):
        attr.id = ident
        if isinstance(value, tuple):
            attr.value.dims[0], attr.value.dims[1], attr.value.dims[2] = value
        else:
            attr.value.flag = value
    config = Config(*launch.grid, *launch.block, launch.dynamic_smem, None,
                    ctypes.cast(attrs, ctypes.POINTER(Attribute)), len(wanted))
    config_ptr = ctypes.addressof(config)
    handle, params = int(launch.function.handle), launch.params.address

    def call(stream: int) -> None:
        config.hStream = stream
        code = direct(config_ptr, handle, params, None)
        if code:
            check("cuLaunchKernelEx", (driver.CUresult(code),), _describe(launch))
    call.keep = attrs   # the attribute array must live as long as the configuration pointing at it
    return call


def enqueue(driver, launch: PreparedLaunch, stream: int) -> None:
    """Enqueue one launch (a single use: a LaunchSequence prepares its calls once)."""
    ready_call(launch)(stream)


def launch_dims(value, what: str, default=(1, 1, 1)) -> "tuple[int, int, int]":
    value = list(value if value is not None else default)
    if not (1 <= len(value) <= 3) or not all(isinstance(v, int) and v >= 1 for v in value):
        raise InvalidInput(f"launch {what} must be 1 to 3 positive integers", value)
    return tuple(value + [1] * (3 - len(value)))


# --- the device ---------------------------------------------------------------------------


__all__ = ["LaunchSequence", "ready_call", "NULLABLE_TENSORS", "PackedParams", "PreparedLaunch", "TENSORMAP_BYTES", "default_tensormap_encoder", "enqueue", "launch_dims", "pack_params"]
