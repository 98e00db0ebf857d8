"""NVRTC -> SASS cubin and a resource report, with an on-disk content-addressed cache and a process pool.

Only cubins are produced: PTX from a newer NVRTC does not load on an older driver, while a cubin for
the exact target (sm_80, sm_86, sm_89, sm_90a) does. Every NVRTC return code is checked; a failed
compilation raises CompileError carrying the NVRTC log and the path of the rendered source.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

from ..model.atomic import atomic_write
from ..model import paths
from ..model.arch import Arch, Gpu
from ..model.errors import CompileError, GemmgenError, MissingTool
from .render import render
from ..model.tiles import Kernel

CACHE_FORMAT = "gemmgen-nvrtc-cache/1"


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one entry point (from --ptxas-options=-v)."""

    registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_bytes: int = 0
    smem_static_bytes: int = 0
    # ptxas put a wait after every wgmma (advisory C7511/C7514: "wgmma.mma_async instructions are serialized"):
    # the tensor pipe then runs one MMA at a time, a silent slowdown of ~2x that no spill count shows.
    wgmma_serialized: bool = False

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes

    @property
    def smem_static(self) -> int:
        return self.smem_static_bytes

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Compiled:
    """One compiled kernel: the cubin, its source, the NVRTC log and ptxas' report.

    `resources` is the main entry point's; `entries` holds every entry point's (split-K adds `<name>_reduce`).
    """

    name: str
    cubin: bytes
    source: str
    log: str
    resources: Resources
    options: "tuple[str, ...]"
    entries: "tuple[tuple[str, Resources], ...]" = field(default=())
    cached: bool = False
    nvrtc_version: str = ""

    @property
    def identity(self) -> str:
        """codegen/identity.kernel_identity of this build: source, options, NVRTC version."""
        from .identity import kernel_identity

        return kernel_identity(self.source, self.options, self.nvrtc_version)

    @property
    def spill_bytes(self) -> int:
        """Spills of any entry point: a spill anywhere in the cubin counts."""
        return max([self.resources.spill_bytes] + [r.spill_bytes for _, r in self.entries])


class NvrtcCallError(GemmgenError):
    """An NVRTC API call (not the compilation itself) failed."""

    def __init__(self, call: str, code: int, detail: str = ""):
        self.call, self.code, self.detail = call, code, detail
        super().__init__(call, code, detail)

    def __str__(self) -> str:
        return f"{self.call} failed with NVRTC error {self.code}" + (f": {self.detail}" if self.detail else "")


NVRTC_INSTALL = "pip install 'cuda-bindings[all]>=12.8' nvidia-cuda-nvrtc, which installing gemmgen brings"


class NvrtcUnavailable(MissingTool):
    """NVRTC cannot be used from this Python: cuda-bindings or libnvrtc is not installed."""

    message = "NVRTC is not available ({what}); install it: {hint}"

    def __init__(self, reason: str, hint: str = NVRTC_INSTALL):
        self.reason = reason
        super().__init__(reason, hint)


_loaded = None  # the nvrtc module, once it has loaded libnvrtc


def _bindings():
    """cuda.bindings' nvrtc module with libnvrtc loaded, or NvrtcUnavailable naming what is missing."""
    global _loaded
    if _loaded is not None:
        return _loaded
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()  # loads libnvrtc: cuda.pathfinder raises its own error where it is missing
    except Exception as exc:  # noqa: BLE001 - ImportError, or whatever the loader raises
        first = (str(exc).splitlines() or [""])[0][:160]
        raise NvrtcUnavailable(f"{type(exc).__name__}: {first}") from None
    _loaded = nvrtc
    return nvrtc


def require_nvrtc() -> None:
    """Refuse up front, before any ranking or process pool, where nothing could be compiled."""
    _bindings()


def _check(result, call: str):
    """Unpack a cuda.bindings return tuple, raising on any status but NVRTC_SUCCESS."""
    nvrtc = _bindings()
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(status)
        raise NvrtcCallError(call, int(status), text.decode() if isinstance(text, bytes) else str(text))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    """'13.5' style version of the NVRTC library in use (part of every cache key)."""
    major, minor = _check(_bindings().nvrtcVersion(), "nvrtcVersion")
    return f"{major}.{minor}"


def arch_option(arch: Arch) -> str:
    """--gpu-architecture for a target; sm_90a keeps its 'a' (wgmma and setmaxnreg need it)."""
    return f"--gpu-architecture={arch.value}"


def options_for(kernel: Kernel, lineinfo: bool = False) -> "tuple[str, ...]":
    opts = [arch_option(kernel.arch), "-std=c++17", "--ptxas-options=-v"]
    if lineinfo:
        opts.append("-lineinfo")
    return tuple(opts)


# --- ptxas -v parsing -----------------------------------------------------------------------------
_FUNCTION = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_SERIALIZED = re.compile(r"wgmma\.mma_async instructions are serialized.*?in the function '([^']+)'")


def parse_ptxas_log(log: str) -> "dict[str, Resources]":
    """Per entry point: registers, spills, stack and static shared memory, from ptxas' -v report."""
    frames: dict[str, tuple[int, int, int]] = {}
    current = None
    for line in log.splitlines():
        match = _FUNCTION.search(line)
        if match:
            current = match.group(1)
            continue
        match = _FRAME.search(line)
        if match and current is not None:
            frames[current] = tuple(int(g) for g in match.groups())
            current = None
    usage: dict[str, tuple[int, int]] = {}
    entry = None
    for line in log.splitlines():
        match = _ENTRY.search(line)
        if match:
            entry = match.group(1)
            continue
        match = _USED.search(line)
        if match and entry is not None:
            smem = _SMEM.search(line)
            usage[entry] = (int(match.group(1)), int(smem.group(1)) if smem else 0)
            entry = None
    serialized = {m.group(1) for m in map(_SERIALIZED.search, log.splitlines()) if m}
    out = {}
    for name in usage.keys() | frames.keys():
        regs, smem = usage.get(name, (0, 0))
        stack, stores, loads = frames.get(name, (0, 0, 0))
        out[name] = Resources(regs, stores, loads, stack, smem, name in serialized)
    return out


# --- the cache ------------------------------------------------------------------------------------
def cache_key(source: str, options: "tuple[str, ...]") -> str:
    """sha256 over everything that determines the cubin: source, options and the NVRTC version."""
    digest = hashlib.sha256()
    for part in (CACHE_FORMAT, source, "\0".join(options), nvrtc_version()):
        digest.update(part.encode())
        digest.update(b"\0\0")
    return digest.hexdigest()


def _cache_paths(key: str) -> "tuple[Path, Path]":
    base = paths.cache_dir() / "nvrtc" / key[:2]
    return base / f"{key}.cubin", base / f"{key}.json"


def _cache_load(key: str) -> "tuple[bytes, dict] | None":
    cubin_path, meta_path = _cache_paths(key)
    try:
        meta = json.loads(meta_path.read_text())
        cubin = cubin_path.read_bytes()
    except (OSError, ValueError):
        return None
    if meta.get("format") != CACHE_FORMAT or hashlib.sha256(cubin).hexdigest() != meta.get("cubin_sha256"):
        return None  # a torn or foreign entry: recompile
    return cubin, meta


def _cache_store(key: str, cubin: bytes, log: str) -> None:
    cubin_path, meta_path = _cache_paths(key)
    atomic_write(cubin_path, cubin)  # cubin first: the metadata's checksum vouches for it
    meta = {"format": CACHE_FORMAT, "log": log, "cubin_sha256": hashlib.sha256(cubin).hexdigest()}
    atomic_write(meta_path, json.dumps(meta).encode())


def source_path(name: str, source: str) -> Path:
    """Where the rendered source of a kernel is kept (the path CompileError reports)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    return paths.cache_dir() / "src" / f"{name}-{digest}.cu"


# --- compilation ----------------------------------------------------------------------------------
def compile_source(name: str, source: str, options: "tuple[str, ...]") -> "tuple[bytes, str]":
    """NVRTC on one source: the cubin and the log, or CompileError with the log and the source's path."""
    nvrtc = _bindings()
    program = _check(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []),
                     "nvrtcCreateProgram")
    try:
        status = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        status = status[0] if isinstance(status, tuple) else status
        log_size = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
        # NVRTC writes into the buffer, so it must be fresh and mutable: `b" " * 1` is CPython's
        # shared one-byte object, and writing a NUL into it turns every space in the process into NUL.
        log_buf = bytearray(log_size)
        _check(nvrtc.nvrtcGetProgramLog(program, log_buf), "nvrtcGetProgramLog")
        log = bytes(log_buf).rstrip(b"\0").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            path = source_path(name, source)
            atomic_write(path, source.encode())
            raise CompileError(name, options, log, str(path))
        size = _check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return bytes(cubin), log
    finally:
        _check(nvrtc.nvrtcDestroyProgram(program), "nvrtcDestroyProgram")


@lru_cache(maxsize=32)
def compile_for_device(name: str, source: str, cc: "tuple[int, int]") -> bytes:
    """A SASS cubin of a small helper source (no template, no model) for compute capability `cc`: the measuring
    process's fill and hold kernels, the reference GEMM. CompileError with the log; NvrtcUnavailable where NVRTC
    is missing."""
    options = (f"--gpu-architecture=sm_{cc[0]}{cc[1]}", "--std=c++17")
    cubin, _ = compile_source(name, source, options)
    return cubin


def compile_kernel(kernel: Kernel, gpu: "Gpu | None" = None, lineinfo: bool = False,
                   use_cache: bool = True) -> Compiled:
    """Render (after the feasibility check), compile and report resources; served from the cache when
    the same source, options and NVRTC version were compiled before."""
    source = render(kernel, gpu)
    options = options_for(kernel, lineinfo)
    key = cache_key(source, options)
    hit = _cache_load(key) if use_cache else None
    if hit is not None:
        cubin, meta = hit
        log, cached = meta["log"], True
    else:
        cubin, log = compile_source(kernel.name, source, options)
        cached = False
        if use_cache:
            _cache_store(key, cubin, log)
    entries = parse_ptxas_log(log)
    main = entries.get(kernel.name, Resources())
    ordered = tuple(sorted(entries.items(), key=lambda kv: (kv[0] != kernel.name, kv[0])))
    return Compiled(kernel.name, cubin, source, log, main, options, ordered, cached, nvrtc_version())


def _compile_or_error(kernel: Kernel) -> "Compiled | CompileError":
    try:
        return compile_kernel(kernel)
    except CompileError as exc:
        return exc


def compile_many(kernels: "list[Kernel]", jobs: "int | None" = None,
                 on_done: "Callable[[int, int], None] | None" = None) -> "list[Compiled | CompileError]":
    """Compile every kernel over a process pool, in order; a failure is returned, not raised.
    `on_done(done, total)` is called as each one finishes, for progress."""
    kernels = list(kernels)
    if kernels:
        require_nvrtc()  # once, here, rather than as every kernel's failure
    jobs = max(1, jobs or os.cpu_count() or 1)
    results = []
    if jobs == 1 or len(kernels) <= 1:
        for kernel in kernels:
            results.append(_compile_or_error(kernel))
            if on_done:
                on_done(len(results), len(kernels))
        return results
    with ProcessPoolExecutor(max_workers=min(jobs, len(kernels))) as pool:
        for result in pool.map(_compile_or_error, kernels, chunksize=1):
            results.append(result)
            if on_done:
                on_done(len(results), len(kernels))
    return results


__all__ = ["Compiled", "NvrtcCallError", "NvrtcUnavailable", "require_nvrtc", "Resources", "cache_key", "compile_kernel",
           "compile_many", "compile_source", "nvrtc_version", "options_for", "parse_ptxas_log", "source_path"]
