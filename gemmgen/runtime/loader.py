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

import operator
from dataclasses import dataclass, replace
from pathlib import Path

from ..model.arch import DType
from ..model.errors import InvalidInput
from ..model.files import load_json, read_text
from ..model.problem import Layout, Problem, Scaling
from .bundle import runs_on, verify
from .serve import device_manifest, kernel_of, problem_from_shapes

MANIFEST_FORMAT = "gemmgen-manifest/1"
BOUND_SEQUENCES = 16  # launch sequences kept bound to recently seen arrays (weights stay, activations rotate)
DTYPE_NAMES = {"bf16": {"bfloat16", "uint16", "int16"}, "f16": {"float16"}, "f32": {"float32"},
               # fp8: torch's float8 types, or their bytes as uint8/int8 (cupy has no fp8 dtype)
               "e4m3": {"float8_e4m3fn", "uint8", "int8"}, "e5m2": {"float8_e5m2", "uint8", "int8"}}
SCALES = ("scale_a", "scale_b")   # fp8 kernels' scales: float32 on the GPU (Problem.scale_shapes), or None (1)


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


@dataclass(frozen=True)
class ArrayInfo:
    """What the loader needs to know of an array: address, logical shape, strides in elements, dtype, stream."""

    ptr: int
    shape: "tuple[int, ...]"
    strides: "tuple[int, ...]"
    dtype: str
    device: "int | None"
    stream: int


def describe_array(x, what: str, stream: bool = True) -> ArrayInfo:
    """Address, shape, element strides, dtype name, device and (if `stream`) current stream of a torch tensor or
    of any object with __cuda_array_interface__ (cupy, numba)."""
    if hasattr(x, "data_ptr") and hasattr(x, "is_cuda"):  # torch (its CAI refuses bf16, so read it directly)
        if not x.is_cuda:
            raise InvalidInput(f"{what} must be on the GPU", str(x.device))
        index = x.get_device()
        current = 0
        if stream:
            import torch

            current = int(torch.cuda.current_stream(index).cuda_stream)
        return ArrayInfo(int(x.data_ptr()), tuple(x.shape), tuple(x.stride()), str(x.dtype)[6:], index, current)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise InvalidInput(f"{what} must be a torch or cupy array on the GPU", type(x).__name__)
    try:
        shape = tuple(operator.index(extent) for extent in cai["shape"])   # integers, not '4096' or 4096.0
        itemsize = int(cai["typestr"][2:])
        ptr = operator.index(cai["data"][0])
        byte_strides = tuple(operator.index(step) for step in cai.get("strides") or ())
    except (KeyError, IndexError, TypeError, ValueError):
        raise InvalidInput(f"{what}'s __cuda_array_interface__ must give shape, typestr and data (version 3)",
                           type(x).__name__) from None
    if byte_strides:
        # A byte stride that is not a whole number of elements (a field of a structured array) was floored to one
        # that is: the kernel then read other elements than the array's, without a word.
        if len(byte_strides) != len(shape) or itemsize <= 0 or any(step % itemsize for step in byte_strides):
            raise InvalidInput(f"{what}'s strides must be whole elements ({itemsize} bytes each)", byte_strides)
        strides = tuple(step // itemsize for step in byte_strides)
    else:
        strides, step = [], 1
        for extent in reversed(shape):
            strides.insert(0, step)
            step *= extent
        strides = tuple(strides)
    dtype = getattr(getattr(x, "dtype", None), "name", None) or _typestr_name(cai["typestr"])
    return ArrayInfo(ptr, shape, strides, dtype, None, _current_stream(x) if stream else 0)


def _torch_key(A, B, D, C, bias, scale_a, scale_b, row_sums) -> tuple:
    """The identity of a call's torch arrays (address, shape, strides, dtype; None for an operand not given):
    the key of their bound launch sequence. AttributeError or TypeError for arrays of another library."""
    return (A.data_ptr(), A.shape, A.stride(), A.dtype, B.data_ptr(), B.shape, B.stride(), B.dtype,
            D.data_ptr(), D.shape, D.stride(), D.dtype,
            None if C is None else (C.data_ptr(), C.shape, C.stride(), C.dtype),
            None if bias is None else (bias.data_ptr(), bias.shape, bias.stride(), bias.dtype),
            None if scale_a is None else (scale_a.data_ptr(), scale_a.shape, scale_a.stride(), scale_a.dtype),
            None if scale_b is None else (scale_b.data_ptr(), scale_b.shape, scale_b.stride(), scale_b.dtype),
            None if row_sums is None else (row_sums.data_ptr(), row_sums.shape, row_sums.stride(), row_sums.dtype))


def _is_torch(x) -> bool:
    return type(x).__module__ == "torch" or type(x).__name__ == "Tensor" and hasattr(x, "data_ptr")


def _torch_stream(index: int) -> int:
    """The current torch stream of device `index` as a raw handle (torch's own fast accessor where it has one)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return int(raw(index)) if raw is not None else int(torch.cuda.current_stream(index).cuda_stream)


def stream_handle(stream) -> int:
    """A CUDA stream as its raw handle: an int, a torch.cuda.Stream (cuda_stream) or a cupy Stream (ptr). Anything
    else is InvalidInput: int() of a torch stream was a bare TypeError, and of '1' a launch on stream 1."""
    for attribute in ("cuda_stream", "ptr"):
        if hasattr(stream, attribute) and not isinstance(stream, (str, bytes)):
            stream = getattr(stream, attribute)
            break
    try:   # an int, or an integer type of its own (NumPy's), not '1' or 1.0
        handle = None if isinstance(stream, bool) else operator.index(stream)
    except TypeError:
        handle = None
    if handle is None or handle < 0:
        raise InvalidInput("stream must be a CUDA stream: its handle (an int), a torch.cuda.Stream or a cupy Stream",
                           stream if isinstance(stream, (int, str)) else type(stream).__name__)
    return handle


def _typestr_name(typestr: str) -> str:
    return {"<f2": "float16", "<f4": "float32", "<u2": "uint16", "<i2": "int16"}.get(typestr, typestr)


def _current_stream(x) -> int:
    if type(x).__module__.startswith("cupy"):
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0  # the legacy default stream, which orders against every other blocking stream


def expected_layout(problem: Problem) -> "dict[str, tuple[tuple[int, ...], tuple[int, ...]]]":
    """(logical shape, element strides) each operand must have."""
    m, n, k = problem.m, problem.n, problem.k
    lda, ldb, ldc = problem.lda, problem.ldb, problem.ldc
    out = {"A": ((m, k), (lda, 1) if problem.a_layout is Layout.ROW else (1, lda)),
           "B": ((k, n), (ldb, 1) if problem.b_layout is Layout.ROW else (1, ldb)),
           "D": ((m, n), (ldc, 1))}
    if problem.epilogue.beta != 0:
        out["C"] = ((m, n), (ldc, 1))
    if problem.epilogue.bias:
        out["bias"] = ((n,), (1,))
    if problem.epilogue.row_sums:
        out["row_sums"] = ((m,), (1,))
    for name, shape in zip(SCALES, problem.scale_shapes):
        out[name] = (shape, (shape[1], 1) if len(shape) == 2 else (1,))
    return out


def _scale_view(name: str, info: ArrayInfo, problem: Problem) -> ArrayInfo:
    """A scale as the kernel reads it. Per tensor: a 0-d or one-element tensor. rowcol: scale_a as (M,) or (M, 1),
    scale_b as (N,) or (1, N) (torch._scaled_mm's rowwise shapes), read as flat vectors. block: scale_a
    (M, ceil(K/128)) and scale_b (ceil(N/128), ceil(K/128)) exactly. InvalidInput naming what the scaling needs."""
    shape = problem.scale_shapes[SCALES.index(name)]
    scaling = problem.scaling
    if scaling is Scaling.BLOCK:
        if tuple(info.shape) != shape:
            what = {"scale_a": "(M, ceil(K/128)): one per row of A and 128 of K",
                    "scale_b": "(ceil(N/128), ceil(K/128)): one per 128 x 128 block of B"}[name]
            raise InvalidInput(f"{name} must have shape {what} for block scaling", tuple(info.shape),
                               f"{shape} for {problem.m}x{problem.n}x{problem.k}")
        return info
    length = shape[0]
    shapes = {(length,), (length, 1) if name == "scale_a" else (1, length)}
    if scaling is Scaling.TENSOR:
        shapes |= {(), (1, 1)}
    if tuple(info.shape) not in shapes:
        what = {"scale_a": "one per row of A (M)", "scale_b": "one per column of B (N)"}[name]
        rule = (f"{name} must hold {length} float32 values, {what}, for rowcol scaling" if scaling is Scaling.ROWCOL
                else f"{name} must be one float32 value for per-tensor scaling")
        raise InvalidInput(rule, tuple(info.shape), f"shapes {sorted(shapes, key=len)}")
    # The stride of the axis that holds the values (none for a single value).
    stride = next((s for e, s in zip(info.shape, info.strides) if e > 1), 1)
    return ArrayInfo(info.ptr, (length,), (stride,), info.dtype, info.device, info.stream)


def check_operand(name: str, info: ArrayInfo, problem: Problem) -> None:
    """InvalidInput unless `info` has the manifest problem's shape, layout and dtype for operand `name`."""
    shape, strides = expected_layout(problem)[name]
    if name in SCALES:
        info = _scale_view(name, info, problem)
    if info.shape != shape:
        raise InvalidInput(f"{name} must have shape {shape} for this kernel", info.shape)
    # A stride along an axis of extent 1 is never used, and libraries report anything there.
    if any(extent > 1 and got != want for extent, got, want in zip(shape, info.strides, strides)):
        layout = {"A": problem.a_layout.value, "B": problem.b_layout.value}.get(name, "row")
        raise InvalidInput(f"{name} must be {layout}-major with element strides {strides}", info.strides,
                           "a col-major operand is the transposed view of a row-major array; a view's rows (columns)"
                           " may be further apart than its width (height)"
                           + ("; C and D share one leading dimension" if name in ("C", "D") else ""))
    dtype = {"A": problem.a_dtype, "B": problem.b_dtype}.get(name, problem.c_dtype)
    if name in SCALES:
        dtype = DType.F32
    if info.dtype not in DTYPE_NAMES.get(dtype.value, {dtype.value}):
        raise InvalidInput(f"{name} must have dtype {dtype.value}", info.dtype)
    if name in SCALES:
        if info.ptr % 4:
            raise InvalidInput(f"{name} must be 4-byte aligned", hex(info.ptr))
        return
    if name == "row_sums":   # written one element at a time
        if info.ptr % problem.c_dtype.bytes:
            raise InvalidInput(f"row_sums must be {problem.c_dtype.bytes}-byte aligned", hex(info.ptr))
        return
    if info.ptr % 16:
        raise InvalidInput(f"{name} must start on a 16-byte boundary (the kernel's vector loads)", hex(info.ptr))


def _rows(info: ArrayInfo, elt: int) -> "tuple[int, int, int | None] | None":
    """An operand as rows of contiguous bytes: (rows, bytes per row, bytes between rows; None for one row), in the
    frame where its contiguous axis is inner (a column-major matrix is the rows of its transpose); None where no
    axis is contiguous."""
    shape, strides = tuple(info.shape), tuple(info.strides)
    if len(shape) == 1 or (len(shape) == 2 and 1 in shape):
        length = max(shape) if shape else 1
        stride = next((s for e, s in zip(shape, strides) if e > 1), 1)
        return (1, length * elt, None) if stride == 1 or length == 1 else None
    if len(shape) != 2:
        return None
    if strides[1] == 1:
        return shape[0], shape[1] * elt, strides[0] * elt
    if strides[0] == 1:
        return shape[1], shape[0] * elt, strides[1] * elt
    return None


def overlap(x: ArrayInfo, x_elt: int, y: ArrayInfo, y_elt: int) -> "bool | None":
    """Whether two operands share a byte: True or False where their layouts let it be decided exactly (both rows of
    one pitch, say two column slices of one array, which do not overlap), else None."""
    fx, fy = _rows(x, x_elt), _rows(y, y_elt)
    if fx is None or fy is None:
        return None
    (r1, w1, p1), (r2, w2, p2) = fx, fy
    pitch = p1 or p2
    if pitch is None:   # two contiguous runs
        return x.ptr < y.ptr + w2 and y.ptr < x.ptr + w1
    if (p1 and p2 and p1 != p2) or w1 > pitch or w2 > pitch:
        return None
    # y's row k starts in x's frame at row q + k, byte column rem; a row that runs past the pitch continues at the
    # start of the next row.
    q, rem = divmod(y.ptr - x.ptr, pitch)

    def rows_meet(first: int) -> bool:
        return first < r1 and first + r2 > 0

    if rows_meet(q) and rem < w1:
        return True
    return rem + w2 > pitch and rows_meet(q + 1) and 0 < w1


def check_aliasing(infos: "dict[str, ArrayInfo]", problem: Problem) -> None:
    """InvalidInput where an output (D, row_sums) shares memory with an operand the kernel reads (A, B, bias, the
    scales), or C overlaps D without being D: tiles of D are written while other CTAs still read those bytes, so
    `gemm(A, B, A)` computed garbage without a word. C may be D itself (D = alpha*A@B + beta*D, element by element)."""
    elt = {"A": problem.a_dtype.bytes, "B": problem.b_dtype.bytes, "scale_a": 4, "scale_b": 4}
    for out in ("D", "row_sums"):
        if out not in infos:
            continue
        for name in ("A", "B", "C", "bias", "scale_a", "scale_b", "row_sums"):
            if name == out or name not in infos or (out == "row_sums" and name == "D"):
                continue
            same = (infos[name].ptr, infos[name].shape, infos[name].strides) == (
                infos[out].ptr, infos[out].shape, infos[out].strides)
            if name == "C" and out == "D" and same:
                continue
            if overlap(infos[out], elt.get(out, problem.c_dtype.bytes), infos[name],
                       elt.get(name, problem.c_dtype.bytes)):
                rule = (f"C must be D itself or not overlap it" if name == "C" else
                        f"{out} must not overlap {name}: the kernel writes {out} while it still reads {name}")
                raise InvalidInput(rule, f"{out} at {hex(infos[out].ptr)}, {name} at {hex(infos[name].ptr)}",
                                   "pass another output array")


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
    if name is None:
        from .dispatch import is_dispatch_folder, load_dispatch  # dispatch builds on this module

        if is_dispatch_folder(path):
            return load_dispatch(path)
    manifest, cubin, manifest_path = read_bundle(path, name)
    return LoadedKernel(manifest, cubin, str(manifest_path))
