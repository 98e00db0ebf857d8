"""The arrays a loaded kernel is called with: what the loader reads of each (address, shape, strides, dtype,
device, stream; torch tensors through their fast accessors, anything else through __cuda_array_interface__), and
the checks before any launch: each operand's layout, alignment and dtype against the problem, and outputs that
share memory with the inputs. Split from loader.py, which binds and launches (the bundle side)."""
from __future__ import annotations

import operator
from dataclasses import dataclass

from ..model.arch import DType
from ..model.errors import InvalidInput
from ..model.problem import Layout, Problem, Scaling

DTYPE_NAMES = {"bf16": {"bfloat16", "uint16", "int16"}, "f16": {"float16"}, "f32": {"float32"},
               # fp8: torch's float8 types, or their bytes as uint8/int8 (cupy has no fp8 dtype)
               "e4m3": {"float8_e4m3fn", "uint8", "int8"}, "e5m2": {"float8_e5m2", "uint8", "int8"}}
SCALES = ("scale_a", "scale_b")   # fp8 kernels' scales: float32 on the GPU (Problem.scale_shapes), or None (1)


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
