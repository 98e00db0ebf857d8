"""gemmgen.load(path): an exported kernel bundle (launch manifest .json + .cubin) as a callable.

    k = gemmgen.load("out/")                    # the folder, or the manifest .json itself
    k(A, B, D)                                  # torch or cupy arrays on the GPU; D is written and returned
    k(A, B, D, C=C, bias=bias)                  # when the kernel was built with beta != 0 / a bias

A cubin is built for dtypes, layouts, alignment and an epilogue, not for one shape: a kernel of a registered
family serves any packed M, N, K its rules allow (the manifest's `serves` says which; runtime/serve.py checks each
new shape exactly), with grid and workspace computed for the shape at hand. A manifest of another kernel serves
its own problem only. Anything else is refused with InvalidInput saying why. A is M×K and B is K×N in logical shape; a column-major operand is the transposed
view of a contiguous array (torch: `torch.empty(K, M).t()`). bf16 arrays without a bf16 dtype (cupy) may
be passed as uint16/int16 holding the bits. The launch goes on the array library's current stream.
The split-K workspace belongs to the loaded kernel: do not run one loaded kernel on two streams at once.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..model import parse
from ..model.errors import InvalidInput
from ..model.files import load_json, read_text
from ..model.problem import Problem
from .arrays import (SCALES, ArrayInfo, _is_torch, _torch_key, _torch_stream, check_aliasing, check_operand,
                     describe_array, stream_handle)
from .bundle import runs_on, verify
from .serve import device_manifest, kernel_of, problem_from_shapes

MANIFEST_FORMAT = "gemmgen-manifest/1"
BOUND_SEQUENCES = 16  # launch sequences kept bound to recently seen arrays (weights stay, activations rotate)


def find_manifest(path: "str | Path", name: "str | None" = None) -> Path:
    """The manifest of a bundle: `path` itself if it is a .json file, else the folder's one manifest, or the one
    whose kernel is `name` when the folder holds several."""
    path = Path(path)
    if path.is_file():
        if name is not None and path.stem != name:   # it picks one of a folder's kernels: here it would be ignored
            raise InvalidInput("name must be the kernel of the manifest passed (or pass its folder)", name,
                               f"{path.name} is {path.stem}")
        return path
    if not path.is_dir():
        raise InvalidInput("a kernel bundle must be a folder or a manifest .json file", str(path))
    found, passed_over = [], []
    for candidate in sorted(path.glob("*.json")):
        if not candidate.is_file():   # a named pipe was opened and waited on forever; a folder or device is no manifest
            passed_over.append(f"{candidate.name} is not a regular file")
            continue
        try:   # through the files reader: a size limit, and nesting thousands deep was a bare RecursionError
            payload = load_json("a manifest", read_text("a manifest", candidate), candidate.name)
        except InvalidInput as exc:
            passed_over.append(f"{candidate.name} is not readable JSON ({str(exc)[:80]})")
            continue
        form = payload.get("format") if isinstance(payload, dict) else None
        if form == MANIFEST_FORMAT:
            found.append(candidate)
        elif isinstance(form, str) and form.startswith("gemmgen-manifest/"):
            passed_over.append(f"{candidate.name} has format {form!r}")
    if name is not None:
        named = [p for p in found if p.stem == name]
        if not named:
            raise InvalidInput("name must be one of the folder's kernels", name, [p.stem for p in found])
        return named[0]
    if len(found) != 1:
        names = [p.stem for p in found]
        # A damaged or newer manifest was skipped without a word: say which, when it may be the one meant.
        raise InvalidInput(f"a bundle folder must hold exactly one {MANIFEST_FORMAT} .json (or pass the file, or "
                           "name=KERNEL)", names or str(path), "; ".join(passed_over[:2]) if not found else "")
    return found[0]


def read_bundle(path: "str | Path", name: "str | None" = None) -> "tuple[dict, bytes, Path]":
    """(manifest, cubin bytes, manifest path) of a bundle, after bundle.verify: schema, cubin sha256 and
    architecture, and launches recomputed from the kernel's configuration."""
    manifest_path = find_manifest(path, name)
    try:
        manifest = load_json("a manifest", read_text("a manifest", manifest_path), str(manifest_path))
    except InvalidInput as exc:
        raise InvalidInput("a manifest must be readable JSON", str(manifest_path), exc.rule) from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise InvalidInput(f"a manifest must have format {MANIFEST_FORMAT}", str(manifest_path))
    cubin_name = str(manifest.get("cubin") or (str(manifest.get("name", "")) + ".cubin"))
    if Path(cubin_name).name != cubin_name or cubin_name in (".", ".."):
        # The exporter writes a bare file name; a path could leave the bundle, and one naming /dev/zero was
        # read until memory ran out.
        raise InvalidInput("manifest field cubin must be a file name in the manifest's folder", cubin_name)
    cubin_path = manifest_path.parent / cubin_name
    try:
        cubin = cubin_path.read_bytes() if cubin_path.is_file() else None
    except OSError:
        cubin = None
    if cubin is None:
        raise InvalidInput("a bundle must hold the cubin its manifest names", str(cubin_path))
    verify(manifest, cubin)
    return manifest, cubin, manifest_path


class LoadedKernel:
    """A compiled GEMM for one problem, callable on torch or cupy arrays."""

    def __init__(self, manifest: dict, cubin: bytes, source: str = "<memory>"):
        self.manifest, self.cubin, self.source = manifest, cubin, source
        self.problem = Problem.from_dict(manifest["problem"])
        # The kernel serves other shapes too when a registered family describes it (serve.check_serves).
        self.kernel = kernel_of(manifest)
        self.name = str(manifest.get("name", "kernel"))
        self._device = None
        self._module = None
        self._workspace = None
        self._bound: "dict[tuple, object]" = {}  # array identities -> bound launch sequence (oldest first)
        self._set_current = None  # makes the device's context current (runtime/device.py current_setter)
        # Bumped whenever bound sequences die (a grown workspace, close()): a caller that keeps sequences of its
        # own (runtime/dispatch.py) drops them when this changes.
        self.generation = 0

    def __repr__(self) -> str:
        return f"<gemmgen kernel {self.name} for {self.problem.label} from {self.source}>"

    def __call__(self, A, B, D, C=None, bias=None, stream: "int | None" = None, scale_a=None, scale_b=None,
                 row_sums=None):
        """D = epilogue(A @ B) on the stream current for D (or `stream`); returns D. fp8 kernels take scales as
        float32 GPU arrays, shaped by the kernel's scaling: one element each per tensor (D = alpha * scale_a *
        scale_b * A @ B ...), (M,)/(N,) per row and column (rowcol), or DeepGEMM's blocks (block:
        docs/fp8-scaling.md); None means 1. A kernel built with row sums also writes row_sums[m] = sum_k A[m, k]
        (an (M,) array of D's dtype; None skips them)."""
        if stream is not None and type(stream) is not int:
            stream = stream_handle(stream)
        try:  # torch arrays: their identity through torch's fast accessors (nothing else has data_ptr and stride())
            key = _torch_key(A, B, D, C, bias, scale_a, scale_b, row_sums)
        except (AttributeError, TypeError):
            key = None
        else:
            # Arrays seen before were checked when they were bound: one lookup, then the launch (the per-call
            # path issue 20 asks to keep free of Python-level validation).
            sequence = self._bound.get(key)
            if sequence is not None:
                self._set_current()  # the caller may have made another device's context current
                sequence.run(_torch_stream(D.get_device()) if stream is None else stream)
                return D
        sequence, default_stream = self._sequence(A, B, D, C, bias, scale_a, scale_b, row_sums, key)
        sequence.run(default_stream() if stream is None else stream)
        return D

    def bind(self, A, B, D, C=None, bias=None, scale_a=None, scale_b=None, row_sums=None):
        """The launch sequence bound to these arrays (checked once): its run(stream) enqueues the kernel with no
        per-call work beyond the launch itself, e.g. inside a loop or a CUDA graph capture."""
        return self._sequence(A, B, D, C, bias, scale_a, scale_b, row_sums)[0]

    def bind_launch(self, A, B, D, C=None, bias=None, scale_a=None, scale_b=None,
                    row_sums=None) -> "BoundLaunch":
        """A launch bound to these arrays (checked once) that the caller keeps and this kernel does not: calling
        it with D's address and a stream launches into that D, for a caller whose output moves every call (a new
        torch.empty) while the inputs stay (see BoundLaunch)."""
        given = self._given(A, B, D, C, bias, scale_a, scale_b, row_sums)
        return BoundLaunch(self, {name: describe_array(x, name, stream=False) for name, x in given.items()})

    def _given(self, A, B, D, C, bias, scale_a, scale_b, row_sums=None) -> dict:
        """The operands by name, after checking that C, bias, the scales and row_sums match how the kernel was
        built."""
        ep = self.problem.epilogue
        given = {"A": A, "B": B, "D": D}
        if ep.beta != 0:
            if C is None:
                raise InvalidInput("C is required: this kernel was built with beta != 0", ep.beta)
            given["C"] = C
        elif C is not None:
            raise InvalidInput("C must be None: this kernel was built with beta = 0 and never reads it", "C")
        if ep.bias:
            if bias is None:
                raise InvalidInput("bias is required: this kernel was built with a bias", "bias=None")
            given["bias"] = bias
        elif bias is not None:
            raise InvalidInput("bias must be None: this kernel was built without a bias", "bias")
        for name, scale in zip(SCALES, (scale_a, scale_b)):
            if scale is not None:
                if self.problem.a_dtype.bytes != 1:
                    raise InvalidInput(f"{name} is for fp8 kernels: this one reads {self.problem.a_dtype.value}", name)
                given[name] = scale
        if row_sums is not None:
            if not ep.row_sums:
                raise InvalidInput("row_sums must be None: this kernel was built without the row sums of A",
                                   "row_sums")
            given["row_sums"] = row_sums
        return given

    def _sequence(self, A, B, D, C, bias, scale_a=None, scale_b=None, row_sums=None, key=None):
        given = self._given(A, B, D, C, bias, scale_a, scale_b, row_sums)
        # The arrays' identity (address, shape, strides, dtype) is the key of a bound launch sequence: a call with
        # arrays seen before skips the checks, the parameter packing and the tensor-map encoding. Device addresses
        # are unique across the process (unified addressing), so no device is in the key.
        if all(_is_torch(x) for x in given.values()):
            if key is None:
                key = _torch_key(A, B, D, C, bias, scale_a, scale_b, row_sums)
            sequence = self._bound.get(key)
            if sequence is None:
                sequence = self._bind({n: describe_array(x, n, stream=False) for n, x in given.items()}, key)
            else:
                self._set_current()
            return sequence, lambda: _torch_stream(D.get_device())
        infos = {name: describe_array(x, name, stream=name == "D") for name, x in given.items()}
        key = tuple((info.ptr, info.shape, info.strides, info.dtype, info.device) for info in infos.values())
        sequence = self._bound.get(key)
        if sequence is None:
            sequence = self._bind(infos, key)
        else:
            self._set_current()
        return sequence, lambda: infos["D"].stream

    def _bind(self, infos: "dict[str, ArrayInfo]", key: tuple):
        """Check the arrays, then bind the launches for their problem to their addresses, kept under `key`."""
        sequence = self._prepare(infos)
        if len(self._bound) >= BOUND_SEQUENCES:
            self._bound.pop(next(iter(self._bound)))  # the oldest binding
        self._bound[key] = sequence
        return sequence

    def _prepare(self, infos: "dict[str, ArrayInfo]"):
        """Check the arrays, then bind the launches for their problem to their addresses (kept by the caller)."""
        problem = self.problem
        if self.kernel is not None:
            problem = problem_from_shapes(self.problem, infos["A"].shape, infos["B"].shape, infos["D"].shape,
                                          infos["A"].strides, infos["B"].strides, infos["D"].strides)
        for name, info in infos.items():
            check_operand(name, info, problem)
        check_aliasing(infos, problem)
        devices = {info.device for info in infos.values() if info.device is not None}
        if len(devices) > 1:
            raise InvalidInput("all operands must be on one GPU", sorted(devices))
        dev = self._ensure(devices.pop() if devices else 0)
        dev.make_current()
        # A persistent kernel's grid (and a Stream-K kernel's workspace) follows the GPU: the bundle's launches were
        # computed for an H100 SXM's 132 SMs and one CTA per cluster slot, so even at the bundle's own problem they
        # are recomputed for this device (an H100 PCIe has 114 SMs; clusters that cannot all be resident wait for
        # whole tile loops, and Stream-K's owners spin on CTAs that must be resident).
        persistent = self.kernel is not None and bool(getattr(self.kernel.config, "persistent", False))
        manifest = self.manifest if problem == self.problem and not persistent else self._manifest_for(problem, dev)
        workspace = self._workspace_for(dev, int(manifest.get("workspace_bytes", 0) or 0))
        pointers = {name: info.ptr for name, info in infos.items()}
        return dev.prepare(manifest, self._module, pointers, workspace)

    def _manifest_for(self, problem: Problem, dev) -> dict:
        """The launches for a problem other than the bundle's, or for a persistent kernel on this device."""
        return device_manifest(self.manifest, self.kernel, problem, dev.props.sm_count, self._module)

    def _workspace_for(self, dev, nbytes: int):
        """The kernel's workspace, grown (and every binding to the old one dropped) when a problem needs more."""
        if nbytes and (self._workspace is None or self._workspace.nbytes < nbytes):
            if self._workspace is not None:
                dev.free(self._workspace)
            self._bound.clear()
            self.generation += 1
            self._workspace = dev.alloc(nbytes)
        return self._workspace

    def _ensure(self, ordinal: int):
        if self._device is None or self._device.ordinal != ordinal:
            from .device import Device

            self.close()
            device = Device(ordinal).open()
            if not runs_on(self.manifest["arch"], device.props.cc):
                device.close()
                raise InvalidInput("the bundle's arch must run on this GPU", self.manifest["arch"],
                                   f"device {ordinal} is compute capability {device.props.cc[0]}.{device.props.cc[1]}")
            self._device = device
            self._set_current = device.current_setter()
            self._module = self._device.load(self.cubin)
        return self._device

    def close(self) -> None:
        if self._device is not None:
            self._device.close()
            self._device = self._module = self._workspace = None
            self._bound.clear()
            self.generation += 1


BOUND_OUTPUTS = 8  # D addresses kept bound per BoundLaunch where a tensor map reads D (torch recycles a few)


class BoundLaunch:
    """A kernel's launches bound to fixed inputs (A, B, C, bias, scales) for a caller that keeps it; the output D
    may move between calls. `launch(d_ptr, stream)` enqueues into the D at `d_ptr` (same shape, strides and dtype
    as the D it was made with):
      - where D is read through plain pointer parameters, the new address is written into the packed
        parameters in place (launches already enqueued keep theirs: the driver copied them);
      - where a tensor map reads D (a TMA-store epilogue), the address is encoded in the map: each new address is
        bound in full once and kept (BOUND_OUTPUTS of them, since torch's caching allocator recycles a few).
    Bindings die with the kernel's workspace (LoadedKernel.generation): the next call binds again. The owner
    calls it from one stream at a time, as for the kernel itself (the workspace is shared)."""

    def __init__(self, kernel: "LoadedKernel", infos: "dict[str, ArrayInfo]"):
        self.kernel, self._infos = kernel, infos
        self.ordinal = infos["D"].device or 0
        self._generation = None
        self._d_ptr = None
        self._set_d = None
        self._set_row_sums = None
        self._by_d: "dict[int, object]" = {}  # D address -> launch sequence, where a tensor map reads D
        self._point(infos["D"].ptr)  # binds (checks every operand) now, so a refusal surfaces at creation

    def launch(self, d_ptr: int, stream: int, row_sums_ptr: "int | None" = None) -> None:
        """Enqueue the launches into the D at address `d_ptr` on `stream` (and, for a kernel built with the row
        sums of A, into the row sums at `row_sums_ptr`; None: where they were bound, or skipped if unbound)."""
        if d_ptr != self._d_ptr or self._generation != self.kernel.generation:
            self._point(d_ptr)
        if row_sums_ptr is not None:
            if self._set_row_sums is None:
                raise InvalidInput("row_sums is for kernels built with the row sums of A", self.kernel.name)
            self._set_row_sums(row_sums_ptr)
        self._set_current()
        self._run(stream)

    def _point(self, d_ptr: int) -> None:
        kernel = self.kernel
        if self._generation != kernel.generation:  # the workspace moved, or the kernel closed: bind again
            self._by_d.clear()
            self._set_d = None
        if self._set_d is not None:
            if d_ptr % 16:
                raise InvalidInput("D must start on a 16-byte boundary (the kernel's vector loads)", hex(d_ptr))
            self._set_d(d_ptr)
        else:
            sequence = self._by_d.get(d_ptr)
            if sequence is None:
                infos = dict(self._infos, D=replace(self._infos["D"], ptr=d_ptr))
                sequence = kernel._prepare(infos)  # may grow the workspace, and so bump the generation
                if self._generation != kernel.generation:
                    self._by_d.clear()
                    self._generation = kernel.generation
                self._set_d = sequence.pointer_setter("D")
                if self._set_d is None:
                    if len(self._by_d) >= BOUND_OUTPUTS:
                        self._by_d.pop(next(iter(self._by_d)))
                    self._by_d[d_ptr] = sequence
                self._set_current = kernel._device.current_setter()
            self._run = sequence.run
            # A new output each call (torch.empty) for the row sums too: re-pointed in place like D's pointer.
            # (None for a kernel without them: no parameter reads row_sums.)
            self._set_row_sums = sequence.pointer_setter("row_sums")
        self._d_ptr = d_ptr


def load(path: "str | Path", name: "str | None" = None):
    """Load an exported bundle (a folder holding a manifest .json and its .cubin, or the .json itself; `name`
    picks one kernel of a folder that holds several) as a LoadedKernel, or a dispatch folder (one holding
    dispatch.json, unless `name` picks one of its kernels) as a DispatchKernel that picks the kernel for each
    call's shape. Everything is verified before anything runs."""
    import os

    # Path('') is '.', and Path(None) a bare TypeError: both would hide what was passed.
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise InvalidInput("gemmgen.load needs a path (str or os.PathLike) to a bundle folder, its manifest .json or "
                           "a dispatch folder", path, f"type {type(path).__name__}")
    if not os.fspath(path):
        raise InvalidInput("gemmgen.load needs a non-empty path to a bundle folder, its manifest .json or a dispatch "
                           "folder", path)
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        pass   # not there (or a NUL byte in it): find_manifest refuses it, naming what it must be
    except OSError as exc:   # a name too long, a folder it may not enter: Path.is_dir raised these bare
        raise InvalidInput("gemmgen.load needs a path it can read", parse.shown(str(os.fspath(path))),
                           exc.strerror or type(exc).__name__) from None
    if name is None:
        from .dispatch import is_dispatch_folder, load_dispatch  # dispatch builds on this module

        if is_dispatch_folder(path):
            return load_dispatch(path)
    manifest, cubin, manifest_path = read_bundle(path, name)
    return LoadedKernel(manifest, cubin, str(manifest_path))
