"""The only module that holds a CUDA context: the driver API (cuda.bindings.driver), every return code checked.

    with Device() as dev:                       # cuInit, primary context retained and made current
        module = dev.load(cubin)                # cuModuleLoadData
        a = dev.alloc(nbytes); dev.copy_to_device(a, host_array)
        seq = dev.prepare(manifest, module, {"A": a.ptr, ...}, workspace)
        seq.run(); dev.synchronize("after my kernel")

The primary context is the one the CUDA runtime uses, so torch and cupy see the same pointers.
Any failing call raises CudaError(call, code, name, detail); a missing driver or device raises NoGpu.
cuda-python is imported lazily: importing this module never needs a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..model.arch import Arch, DType
from ..model.errors import CudaError, InvalidInput, NoGpu
# The runtime's pieces, re-exported so `from gemmgen.runtime.device import ...` keeps serving launchers.
from . import driver as drv  # its driver_module through the module, so tests can fake the driver
from .driver import (DRIVER_HINT, STICKY_ERRORS, check, driver_module, driver_version, error_name,  # noqa: F401
                     init_driver, is_sticky)
from .host import float32_to_bf16_bits, host_uniform, numpy_dtype, to_float32  # noqa: F401
from .launch import (NULLABLE_TENSORS, TENSORMAP_BYTES, LaunchSequence, PackedParams, PreparedLaunch,  # noqa: F401
                     default_tensormap_encoder, enqueue, launch_dims, pack_params)

POISON_16 = 0xFFFF  # a NaN for both bf16 and f16: exponent all ones, mantissa non-zero
POISON_32 = 0xFFFFFFFF  # a NaN in fp32
POISON_8 = 0xFF  # a NaN in both fp8 formats (e4m3: S.1111.111; e5m2: exponent all ones, mantissa non-zero)

@dataclass(frozen=True)
class DeviceProps:
    """What the driver says about one device."""

    ordinal: int
    name: str
    cc: "tuple[int, int]"
    sm_count: int
    l2_bytes: int
    smem_per_block_optin: int
    smem_per_sm: int
    clock_mhz: float
    memory_bytes: int
    driver: str

    @property
    def arch(self) -> Arch:
        return Arch.for_cc(*self.cc)

    def to_dict(self) -> dict:
        return {"ordinal": self.ordinal, "name": self.name, "cc": f"{self.cc[0]}.{self.cc[1]}",
                "sm_count": self.sm_count, "l2_bytes": self.l2_bytes,
                "smem_per_block_optin": self.smem_per_block_optin, "smem_per_sm": self.smem_per_sm,
                "clock_mhz": self.clock_mhz, "memory_bytes": self.memory_bytes, "driver": self.driver,
                "arch": self.arch.value}


@dataclass
class Buffer:
    """A cuMemAlloc'ed region. Freed by Device.free or when the Device closes."""

    ptr: int
    nbytes: int


class Event:
    """A CUDA event (timing enabled)."""

    def __init__(self, handle):
        self.handle = handle

    def record(self, stream: int = 0) -> None:
        driver = drv.driver_module()
        check("cuEventRecord", driver.cuEventRecord(self.handle, stream))

    def elapsed_s(self, start: "Event") -> float:
        """Seconds from `start` to this event; both must have completed."""
        driver = drv.driver_module()
        ms = check("cuEventElapsedTime", driver.cuEventElapsedTime(start.handle, self.handle))
        return float(ms) / 1e3


class Function:
    """One entry point of a loaded module."""

    def __init__(self, handle, name: str):
        self.handle, self.name = handle, name
        self._smem_limit = 0

    def set_dynamic_smem(self, nbytes: int) -> None:
        """Opt in to `nbytes` of dynamic shared memory (needed above 48 KB)."""
        if nbytes <= self._smem_limit:
            return
        driver = drv.driver_module()
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check("cuFuncSetAttribute", driver.cuFuncSetAttribute(self.handle, attr, int(nbytes)),
              f"{self.name}: MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes}")
        # Ask for the largest shared-memory carveout: the driver otherwise may pick a split of the L1/shared
        # array that holds fewer CTAs than fit (two 97 KB sm80 CTAs need 194 KB of the SM's 228 KB).
        carveout = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        check("cuFuncSetAttribute", driver.cuFuncSetAttribute(self.handle, carveout, 100),
              f"{self.name}: PREFERRED_SHARED_MEMORY_CARVEOUT=100")
        self._smem_limit = nbytes

    def attribute(self, name: str) -> int:
        """A CU_FUNC_ATTRIBUTE_<name> value, e.g. 'NUM_REGS'."""
        driver = drv.driver_module()
        attr = getattr(driver.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
        return int(check("cuFuncGetAttribute", driver.cuFuncGetAttribute(attr, self.handle), self.name))


class Module:
    """A cubin loaded into the current context."""

    def __init__(self, handle):
        self.handle = handle
        self._functions: dict[str, Function] = {}

    def function(self, name: str) -> Function:
        if name not in self._functions:
            driver = drv.driver_module()
            handle = check("cuModuleGetFunction", driver.cuModuleGetFunction(self.handle, name.encode()),
                           f"entry point {name}")
            self._functions[name] = Function(handle, name)
        return self._functions[name]

    def unload(self) -> None:
        if self.handle is not None:
            driver = drv.driver_module()
            check("cuModuleUnload", driver.cuModuleUnload(self.handle))
            self.handle = None


# --- kernel parameters from a manifest ----------------------------------------------------

class Device:
    """One GPU's primary context, made current; owns the buffers and modules it hands out."""

    def __init__(self, ordinal: int = 0):
        self.ordinal = ordinal
        self._device = None
        self._context = None
        self._buffers: dict[int, Buffer] = {}
        self._modules: list[Module] = []
        self.props: "DeviceProps | None" = None
        self.cache: dict = {}  # per-context helpers (utility and reference modules), dropped on close
        self._setter = None  # current_setter's call, bound to the open context

    # context lifetime
    def open(self) -> "Device":
        if self._context is not None:
            return self
        driver = init_driver()
        count = check("cuDeviceGetCount", driver.cuDeviceGetCount())
        if count == 0:
            raise NoGpu("the CUDA driver found no device", DRIVER_HINT)
        if not 0 <= self.ordinal < count:
            raise NoGpu(f"device {self.ordinal} does not exist ({count} found)", "pick an ordinal below the count")
        self._device = check("cuDeviceGet", driver.cuDeviceGet(self.ordinal))
        self._context = check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(self._device))
        check("cuCtxSetCurrent", driver.cuCtxSetCurrent(self._context))
        self.props = self._read_props(driver)
        return self

    def close(self) -> None:
        """Free what this Device allocated and release the primary context (errors here are not raised:
        after a sticky error the context is gone anyway)."""
        if self._context is None:
            return
        driver = drv.driver_module()
        for module in self._modules:
            try:
                module.unload()
            except CudaError:
                pass
        for buf in list(self._buffers.values()):
            driver.cuMemFree(buf.ptr)
        self._buffers.clear()
        self._modules.clear()
        self.cache.clear()
        driver.cuDevicePrimaryCtxRelease(self._device)
        self._context = None
        self._setter = None

    def __enter__(self) -> "Device":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def make_current(self) -> None:
        check("cuCtxSetCurrent", drv.driver_module().cuCtxSetCurrent(self._require()))

    def current_setter(self):
        """A no-argument call that makes this context current unless it already is, as cheaply as the driver
        allows: for per-call paths. Beside the real cuda-python it is libcuda through ctypes, cuCtxGetCurrent (a
        thread-local read) and cuCtxSetCurrent only when another context is current, about 0.2 us in all against
        about 1 us for cuda-python's cuCtxSetCurrent alone (make_current); elsewhere (a test's fake driver) it
        is make_current."""
        if self._setter is not None:
            return self._setter
        context = self._require()
        driver = drv.driver_module()
        real = getattr(driver, "__name__", "") == "cuda.bindings.driver"
        set_direct = drv.libcuda_set_current() if real else None
        get_direct = drv.libcuda_get_current() if real else None
        if set_direct is None or get_direct is None:
            return self.make_current
        import ctypes
        import threading

        handle = int(context)
        # ctypes drops the GIL during the call, so each thread reads the current context into its own slot.
        slots = threading.local()

        def set_current() -> None:
            try:
                slot, where = slots.slot
            except AttributeError:
                slot = ctypes.c_void_p()
                slot, where = slots.slot = (slot, ctypes.addressof(slot))
            if get_direct(where) == 0 and slot.value == handle:
                return
            code = set_direct(handle)
            if code:
                check("cuCtxSetCurrent", (driver.CUresult(code),))
        self._setter = set_current
        return set_current

    def _require(self):
        if self._context is None:
            self.open()
        return self._context

    def _read_props(self, driver) -> DeviceProps:
        attrs = driver.CUdevice_attribute

        def attribute(name: str) -> int:
            return int(check("cuDeviceGetAttribute",
                             driver.cuDeviceGetAttribute(getattr(attrs, f"CU_DEVICE_ATTRIBUTE_{name}"), self._device),
                             name))

        raw_name = check("cuDeviceGetName", driver.cuDeviceGetName(256, self._device))
        name = raw_name.split(b"\0", 1)[0].decode() if isinstance(raw_name, bytes) else str(raw_name)
        return DeviceProps(
            ordinal=self.ordinal, name=name,
            cc=(attribute("COMPUTE_CAPABILITY_MAJOR"), attribute("COMPUTE_CAPABILITY_MINOR")),
            sm_count=attribute("MULTIPROCESSOR_COUNT"), l2_bytes=attribute("L2_CACHE_SIZE"),
            smem_per_block_optin=attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
            smem_per_sm=attribute("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
            clock_mhz=attribute("CLOCK_RATE") / 1e3,
            memory_bytes=int(check("cuDeviceTotalMem", driver.cuDeviceTotalMem(self._device))),
            driver=driver_version())

    # modules and launches
    def load(self, cubin: bytes) -> Module:
        """Load a cubin (SASS for this device; PTX from a newer NVRTC would be refused by an older driver)."""
        self._require()
        driver = drv.driver_module()
        handle = check("cuModuleLoadData", driver.cuModuleLoadData(bytes(cubin)),
                       f"{len(cubin)}-byte image on {self.props.name} (cc {self.props.cc[0]}.{self.props.cc[1]})")
        module = Module(handle)
        self._modules.append(module)
        return module

    def unload(self, module: Module) -> None:
        module.unload()
        if module in self._modules:
            self._modules.remove(module)

    def prepare(self, manifest: dict, module: Module, pointers: "dict[str, int]",
                workspace: "Buffer | None" = None, encode_tensormap=None) -> LaunchSequence:
        """Bind a manifest's launches to device pointers: functions resolved, shared memory opted in,
        parameters packed. `pointers` maps A, B, C, D, bias to device addresses (C and bias may be absent)."""
        self._require()
        launches = manifest.get("launches")
        if not isinstance(launches, list) or not launches:
            raise InvalidInput("a manifest must list at least one launch", manifest.get("name"))
        needs_tma = any(p.get("kind") == "tensormap" for l in launches for p in l.get("params", ()))
        if needs_tma and encode_tensormap is None:
            encode_tensormap = default_tensormap_encoder()
        prepared = []
        for launch in launches:
            entry = launch.get("entry") or manifest.get("name")
            function = module.function(entry)
            smem = int(launch.get("dynamic_smem", 0))
            if smem > 48 * 1024:
                function.set_dynamic_smem(smem)
            params = pack_params(launch.get("params", []), pointers, workspace.ptr if workspace else 0,
                                 encode_tensormap, entry)
            prepared.append(PreparedLaunch(function, launch_dims(launch.get("grid"), "grid"),
                                            launch_dims(launch.get("block"), "block"),
                                            launch_dims(launch.get("cluster"), "cluster"), smem, params,
                                            programmatic=launch.get("programmatic") is True))
        from .manifest import workspace_zero

        driver = drv.driver_module()
        name = str(manifest.get("name", "kernel"))
        rule = workspace_zero(manifest)
        if workspace is not None and rule["bytes"] > workspace.nbytes:
            raise InvalidInput(f"{name}: the workspace is smaller than the manifest's zeroed prefix",
                               workspace.nbytes, rule["bytes"])
        if workspace is not None and rule["when"] == "bind" and rule["bytes"]:
            # Stream-K flags: zero once here; every complete run leaves them zero again.
            check("cuMemsetD8", driver.cuMemsetD8(workspace.ptr, 0, rule["bytes"]), f"zeroing the flags of {name}")
        each_run = rule["bytes"] if rule["when"] == "run" else 0
        return LaunchSequence(prepared, workspace, name, each_run)

    def launch(self, manifest: dict, module: Module, pointers: "dict[str, int]",
               workspace: "Buffer | None" = None, stream: int = 0) -> None:
        """Prepare and enqueue a manifest's launches once."""
        self.prepare(manifest, module, pointers, workspace).run(stream)

    def synchronize(self, detail: str = "") -> None:
        """cuCtxSynchronize: where asynchronous faults (illegal address, traps) surface."""
        self._require()
        check("cuCtxSynchronize", drv.driver_module().cuCtxSynchronize(), detail)

    def event(self) -> Event:
        self._require()
        driver = drv.driver_module()
        return Event(check("cuEventCreate", driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DEFAULT)))

    # memory
    def alloc(self, nbytes: int) -> Buffer:
        self._require()
        nbytes = max(1, int(nbytes))
        ptr = int(check("cuMemAlloc", drv.driver_module().cuMemAlloc(nbytes), f"{nbytes} bytes"))
        buf = Buffer(ptr, nbytes)
        self._buffers[ptr] = buf
        return buf

    def free(self, buf: "Buffer | None") -> None:
        if buf is None or buf.ptr not in self._buffers:
            return
        del self._buffers[buf.ptr]
        check("cuMemFree", drv.driver_module().cuMemFree(buf.ptr))

    def memset(self, buf: Buffer, value: int, elem_bytes: int = 1, stream: int = 0) -> None:
        """Fill `buf` with a repeated 1-, 2- or 4-byte pattern."""
        driver = drv.driver_module()
        calls = {1: ("cuMemsetD8Async", driver.cuMemsetD8Async), 2: ("cuMemsetD16Async", driver.cuMemsetD16Async),
                 4: ("cuMemsetD32Async", driver.cuMemsetD32Async)}
        name, call = calls[elem_bytes]
        check(name, call(buf.ptr, value, buf.nbytes // elem_bytes, stream))

    def poison(self, buf: Buffer, dtype: "DType | str", stream: int = 0) -> None:
        """Fill with NaN, so any element a kernel fails to write is caught by the NaN check."""
        dt = DType.parse(dtype)
        if dt.bytes == 2:
            self.memset(buf, POISON_16, 2, stream)
        elif dt.bytes == 4:
            self.memset(buf, POISON_32, 4, stream)
        else:
            raise InvalidInput("poison supports 16- and 32-bit dtypes", dt.value)

    def poison_2d(self, ptr: int, dtype: "DType | str", pitch: int, width: int, height: int, stream: int = 0) -> None:
        """NaN into `width` elements of each of `height` rows `pitch` elements apart, from address `ptr`: the gaps
        between the rows of a view, so a kernel that lets them into its result fails its check."""
        dt = DType.parse(dtype)
        driver = drv.driver_module()
        calls = {1: ("cuMemsetD2D8Async", driver.cuMemsetD2D8Async, POISON_8),
                 2: ("cuMemsetD2D16Async", driver.cuMemsetD2D16Async, POISON_16),
                 4: ("cuMemsetD2D32Async", driver.cuMemsetD2D32Async, POISON_32)}
        name, call, value = calls[dt.bytes]
        check(name, call(ptr, pitch * dt.bytes, value, width, height, stream))

    def copy_to_device(self, buf: Buffer, host) -> None:
        """Copy a host array (buffer protocol) into `buf`."""
        import numpy as np

        array = np.ascontiguousarray(host)
        if array.nbytes > buf.nbytes:
            raise InvalidInput("a host array must fit its device buffer", f"{array.nbytes} > {buf.nbytes} bytes")
        check("cuMemcpyHtoD", drv.driver_module().cuMemcpyHtoD(buf.ptr, array, array.nbytes))

    def copy_to_host(self, buf: Buffer, dtype, count: int, offset_bytes: int = 0):
        """`count` elements of numpy `dtype` from `buf` into a new host array (synchronous)."""
        import numpy as np

        out = np.empty(count, dtype=dtype)
        if offset_bytes + out.nbytes > buf.nbytes:
            raise InvalidInput("a copy must stay inside its device buffer", f"{offset_bytes + out.nbytes} > {buf.nbytes}")
        check("cuMemcpyDtoH", drv.driver_module().cuMemcpyDtoH(out, buf.ptr + offset_bytes, out.nbytes))
        return out


