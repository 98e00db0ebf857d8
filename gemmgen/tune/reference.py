"""fp32-accumulate references that a kernel's output is checked against.

Backends, best first:
  torch   cuBLAS through torch on the same device buffers (no copies; TF32 off so the reference is fp32)
  cupy    cuBLAS through cupy, likewise
  kernel  gemmgen's own naive fp32 kernel (NVRTC), then norms on the host, plus a float64 NumPy check of
          256 sampled entries that also checks the reference kernel itself

All compute ref = act(alpha * A@B + beta*C + bias) in fp32 from the same bf16/f16 inputs the kernel read,
and compare D with it by the relative Frobenius error ||D - ref|| / ||ref||. fp8 products (torch only) with rowcol
scaling scale A@B's row m by scale_a[m] and column n by scale_b[n]; with block scaling A and B are dequantized by
their 128-wide block scales first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..model.arch import DType
from ..model.errors import InvalidInput
from ..model.problem import SCALE_BLOCK, Activation, Layout, Problem, Scaling

# The epilogue activation as the reference kernel's `act` parameter (and the naive kernel's __ACT__): the CUDA
# sources test these codes, so both sides take them from here.
ACTIVATION_CODES = {Activation.NONE: 0, Activation.RELU: 1, Activation.GELU: 2, Activation.SILU: 3}

BACKENDS = ("torch", "cupy", "kernel")
SAMPLES = 256
GELU_C = 0.7978845608028654  # sqrt(2/pi), the tanh approximation's constant


@dataclass(frozen=True)
class GemmPointers:
    """Device addresses of one problem's operands. c and bias are 0 when the problem does not read them."""

    a: int
    b: int
    d: int
    c: int = 0
    bias: int = 0
    scale_a: int = 0   # fp8 rowcol or block scaling's float32 scales (Problem.scale_shapes); 0 for per-tensor (1)
    scale_b: int = 0
    row_sums: int = 0  # a kernel built with the row sums of A writes them here (M values of D's dtype)

    def as_dict(self) -> "dict[str, int]":
        """Names as the kernel ABI and the manifest's 'tensor' fields spell them."""
        out = {"A": self.a, "B": self.b, "D": self.d}
        for name in ("c", "bias", "scale_a", "scale_b", "row_sums"):
            if getattr(self, name):
                out["C" if name == "c" else name] = getattr(self, name)
        return out


@dataclass(frozen=True)
class Comparison:
    """How far a kernel's output is from the reference."""

    rel_error: float  # ||D - ref||_F / ||ref||_F over the finite entries; inf if any entry is not finite
    nonfinite: int  # NaN or Inf entries in D (poison left behind means unwritten elements)
    backend: str
    sample_rel_error: "float | None" = None  # D against float64 at sampled entries (kernel backend)
    detail: str = ""


def available_backends() -> "list[str]":
    """Backends importable here, best first (the kernel backend needs only NVRTC)."""
    out = []
    for name in ("torch", "cupy"):
        try:
            __import__(name)
            out.append(name)
        except ImportError:
            pass
    return out + ["kernel"]


def storage_shapes(problem: Problem) -> "dict[str, tuple[int, ...]]":
    """Shape of each operand's storage (row-major storage order), as the tuner's benchmark allocates it: a row is
    the operand's leading dimension long, so a problem with wider leading dimensions (a view) gets buffers with
    gaps between its rows (view_widths says how much of each row is the operand)."""
    m, n, k = problem.m, problem.n, problem.k
    shapes = {"A": (m, problem.lda) if problem.a_layout is Layout.ROW else (k, problem.lda),
              "B": (k, problem.ldb) if problem.b_layout is Layout.ROW else (n, problem.ldb),
              "D": (m, problem.ldc)}
    if problem.epilogue.beta != 0:
        shapes["C"] = (m, problem.ldc)
    if problem.epilogue.bias:
        shapes["bias"] = (n,)
    if problem.scaling is not Scaling.TENSOR:
        shapes["scale_a"], shapes["scale_b"] = problem.scale_shapes
    if problem.epilogue.row_sums:
        shapes["row_sums"] = (m,)
    return shapes


def view_widths(problem: Problem) -> "dict[str, int]":
    """How many elements of each storage row (storage_shapes) belong to the operand, for the 2-D operands whose
    leading dimension is wider than that; the rest of the row is a gap no kernel may write (nor let into D)."""
    widths = {"A": problem.k if problem.a_layout is Layout.ROW else problem.m,
              "B": problem.n if problem.b_layout is Layout.ROW else problem.k, "C": problem.n, "D": problem.n}
    shapes = storage_shapes(problem)
    return {name: width for name, width in widths.items() if name in shapes and shapes[name][1] > width}


def in_view(array, problem: Problem, name: str):
    """The operand's part of a 2-D array over its whole storage (any library that slices like NumPy)."""
    width = view_widths(problem).get(name)
    return array if width is None else array[:, :width]


def operand_dtypes(problem: Problem) -> "dict[str, DType]":
    """The dtype of each operand storage_shapes names."""
    return {"A": problem.a_dtype, "B": problem.b_dtype, "C": problem.c_dtype, "D": problem.c_dtype,
            "bias": problem.c_dtype, "scale_a": DType.F32, "scale_b": DType.F32, "row_sums": problem.c_dtype}


def operand_bytes(problem: Problem) -> "dict[str, int]":
    """Bytes each operand occupies."""
    elt = {name: dt.bytes for name, dt in operand_dtypes(problem).items()}
    return {name: math.prod(shape) * elt[name] for name, shape in storage_shapes(problem).items()}


def compare(device, problem: Problem, pointers: GemmPointers, backend: str = "auto", seed: int = 0) -> Comparison:
    """Compare D with an fp32 reference computed from A, B, C and bias, on `device` (a gemmgen Device)."""
    if backend == "auto":
        backend = available_backends()[0]
    if backend not in BACKENDS:
        raise InvalidInput(f"reference backend must be one of {BACKENDS} or auto", backend)
    device.synchronize("before the reference")
    if problem.a_dtype.bytes == 1 and backend != "torch":
        raise InvalidInput("fp8 products are verified against torch (float8 tensors): install torch", backend)
    if backend == "torch":
        result = _compare_torch(problem, pointers)
    elif backend == "cupy":
        result = _compare_cupy(problem, pointers)
    else:
        result = _compare_kernel(device, problem, pointers, seed)
    return _with_gaps(device, problem, pointers, result)


def _with_gaps(device, problem: Problem, pointers: GemmPointers, result: Comparison) -> Comparison:
    """`result`, failed when D is a view and the kernel wrote into the gaps between its rows (they were poisoned
    with D, and a user's array keeps other data there)."""
    width = view_widths(problem).get("D")
    if width is None:
        return result
    import numpy as np

    from ..runtime.device import POISON_16, POISON_32, Buffer

    rows, pitch = storage_shapes(problem)["D"]
    bits, poison = (np.uint16, POISON_16) if problem.c_dtype.bytes == 2 else (np.uint32, POISON_32)
    count = rows * pitch
    raw = device.copy_to_host(Buffer(pointers.d, count * problem.c_dtype.bytes), bits, count).reshape(rows, pitch)
    written = int(np.count_nonzero(raw[:, width:] != poison))
    if not written:
        return result
    detail = "; ".join(filter(None, (result.detail, f"{written} elements written between D's rows (columns "
                                                    f"{width}..{pitch - 1} of its leading dimension)")))
    return Comparison(math.inf, result.nonfinite, result.backend, result.sample_rel_error, detail)


# --- torch ------------------------------------------------------------------------------------

class _CudaArray:
    """A bare __cuda_array_interface__ over a device address, so torch and cupy can wrap our buffers."""

    def __init__(self, ptr: int, shape: "tuple[int, ...]", typestr: str):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (int(ptr), False),
                                         "strides": None, "version": 3, "stream": None}


def torch_operands(problem: Problem, pointers: GemmPointers) -> dict:
    """torch tensors over the operands, in logical shape: A M×K, B K×N, C and D M×N, bias N
    (a column-major operand is a transposed view, so cuBLAS reads it in place)."""
    import torch

    shapes = storage_shapes(problem)
    dtypes = {DType.BF16: torch.bfloat16, DType.F16: torch.float16, DType.F32: torch.float32,
              DType.E4M3: torch.float8_e4m3fn, DType.E5M2: torch.float8_e5m2}
    addresses = {"A": pointers.a, "B": pointers.b, "C": pointers.c, "D": pointers.d, "bias": pointers.bias,
                 "scale_a": pointers.scale_a, "scale_b": pointers.scale_b, "row_sums": pointers.row_sums}
    kinds = operand_dtypes(problem)
    out = {}
    for name, shape in shapes.items():
        if name == "row_sums" and not addresses[name]:
            continue  # a row-sums kernel run without them (it skips them)
        dt = kinds[name]
        # CAI has no bf16 typestr: wrap the 16 bits as int16 and reinterpret.
        typestr = {1: "|u1", 2: "<i2", 4: "<f4"}[dt.bytes]
        tensor = torch.as_tensor(_CudaArray(addresses[name], shape, typestr)).view(dtypes[dt])
        out[name] = in_view(tensor, problem, name)
    if problem.a_layout is Layout.COL:
        out["A"] = out["A"].t()
    if problem.b_layout is Layout.COL:
        out["B"] = out["B"].t()
    return out


def _compare_torch(problem: Problem, pointers: GemmPointers) -> Comparison:
    import torch

    ops = torch_operands(problem, pointers)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 would put 1e-3 of error in the reference itself
    try:
        a, b = ops["A"].float(), ops["B"].float()
        if problem.scaling is Scaling.BLOCK:
            a, b = dequantize_blocks(torch, a, b, ops["scale_a"], ops["scale_b"])
        ref = torch.matmul(a, b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    if problem.scaling is Scaling.ROWCOL:
        ref = ref * ops["scale_a"].float()[:, None] * ops["scale_b"].float()[None, :]
    ref = _epilogue_torch(torch, ref, ops, problem)
    out = ops["D"].float()
    finite = torch.isfinite(out)
    nonfinite = int(out.numel() - int(finite.sum().item()))
    diff = torch.where(finite, out - ref, torch.zeros_like(ref))
    rel = _ratio(float(torch.linalg.vector_norm(diff.double()).item()),
                 float(torch.linalg.vector_norm(ref.double()).item()))
    sums = None
    if problem.epilogue.row_sums and pointers.row_sums:
        sums = (ops["row_sums"].double().cpu().numpy(), ops["A"].double().sum(dim=1).cpu().numpy())
    torch.cuda.synchronize()
    return _with_row_sums(Comparison(math.inf if nonfinite else rel, nonfinite, "torch", None,
                                     f"finite-part error {rel:.3e}" if nonfinite else ""), sums)


def _with_row_sums(result: Comparison, sums) -> Comparison:
    """`result` (D's comparison) with the row sums of A folded in, for a kernel built to write them: `sums` is
    (what the kernel wrote, the float64 sums of A's rows) as NumPy arrays, or None. The verdict is the worse of
    the two errors, and unwritten or non-finite sums count as non-finite outputs."""
    if sums is None:
        return result
    import numpy as np

    got, want = sums
    finite = np.isfinite(got)
    bad = int(got.size - finite.sum())
    rel = _ratio(float(np.linalg.norm(np.where(finite, got - want, 0.0))), float(np.linalg.norm(want)))
    detail = "; ".join(filter(None, (result.detail, f"row sums of A: error {rel:.3e}, {bad} not finite")))
    nonfinite = result.nonfinite + bad
    worst = math.inf if nonfinite else max(result.rel_error, rel)
    sample = None if result.sample_rel_error is None else max(result.sample_rel_error, rel)
    return Comparison(worst, nonfinite, result.backend, sample, detail)


def dequantize_blocks(torch, a, b, scale_a, scale_b):
    """A (M x K) and B (K x N) times their block scales: scale_a[m, k // 128] and scale_b[n // 128, k // 128]."""
    k, n = a.shape[1], b.shape[1]
    sa = scale_a.float().repeat_interleave(SCALE_BLOCK, dim=1)[:, :k]
    sb = scale_b.float().repeat_interleave(SCALE_BLOCK, dim=0).repeat_interleave(SCALE_BLOCK, dim=1)[:n, :k]
    return a * sa, b * sb.t()


def _epilogue_torch(torch, acc, ops, problem: Problem):
    ep = problem.epilogue
    x = acc * ep.alpha
    if ep.beta != 0:
        x = x + ep.beta * ops["C"].float()
    if ep.bias:
        x = x + ops["bias"].float()
    if ep.activation is Activation.RELU:
        x = torch.relu(x)
    elif ep.activation is Activation.GELU:
        x = torch.nn.functional.gelu(x, approximate="tanh")
    elif ep.activation is Activation.SILU:
        x = torch.nn.functional.silu(x)
    return x


# --- cupy -------------------------------------------------------------------------------------

def _cupy_float(cp, ptr: int, shape, dtype: DType):
    raw = cp.asarray(_CudaArray(ptr, shape, {DType.BF16: "<u2", DType.F16: "<f2", DType.F32: "<f4"}[dtype]))
    if dtype is DType.BF16:
        return (raw.astype(cp.uint32) << 16).view(cp.float32)
    return raw.astype(cp.float32)


def _compare_cupy(problem: Problem, pointers: GemmPointers) -> Comparison:
    import cupy as cp

    shapes = storage_shapes(problem)
    a = in_view(_cupy_float(cp, pointers.a, shapes["A"], problem.a_dtype), problem, "A")
    b = in_view(_cupy_float(cp, pointers.b, shapes["B"], problem.b_dtype), problem, "B")
    a = a.T if problem.a_layout is Layout.COL else a
    b = b.T if problem.b_layout is Layout.COL else b
    ep = problem.epilogue
    x = cp.matmul(a, b) * ep.alpha  # cupy keeps fp32 unless CUPY_TF32=1 is set
    if ep.beta != 0:
        x += ep.beta * in_view(_cupy_float(cp, pointers.c, shapes["C"], problem.c_dtype), problem, "C")
    if ep.bias:
        x += _cupy_float(cp, pointers.bias, shapes["bias"], problem.c_dtype)
    if ep.activation is Activation.RELU:
        x = cp.maximum(x, 0)
    elif ep.activation is Activation.GELU:
        x = 0.5 * x * (1 + cp.tanh(GELU_C * (x + 0.044715 * x ** 3)))
    elif ep.activation is Activation.SILU:
        x = x / (1 + cp.exp(-x))
    out = in_view(_cupy_float(cp, pointers.d, shapes["D"], problem.c_dtype), problem, "D")
    finite = cp.isfinite(out)
    nonfinite = int(out.size - int(finite.sum()))
    diff = cp.where(finite, out - x, 0)
    rel = _ratio(float(cp.linalg.norm(diff.astype(cp.float64))), float(cp.linalg.norm(x.astype(cp.float64))))
    sums = None
    if ep.row_sums and pointers.row_sums:
        sums = (cp.asnumpy(_cupy_float(cp, pointers.row_sums, shapes["row_sums"], problem.c_dtype)).astype("f8"),
                cp.asnumpy(a.astype(cp.float64).sum(axis=1)))
    cp.cuda.runtime.deviceSynchronize()
    return _with_row_sums(Comparison(math.inf if nonfinite else rel, nonfinite, "cupy", None,
                                     f"finite-part error {rel:.3e}" if nonfinite else ""), sums)


# --- gemmgen's own kernel + float64 samples -------------------------------------------------------

REFERENCE_SOURCE = r"""
// gemmgen's fp32 reference GEMM: one thread per output, fp32 FMA over K. Slow and obviously right.
// kind: 0 bf16, 1 f16, 2 f32. act: 0 none, 1 relu, 2 gelu (tanh).
__device__ __forceinline__ float load_elem(const void* p, long long idx, int kind) {
    if (kind == 2) return ((const float*)p)[idx];
    unsigned short h = ((const unsigned short*)p)[idx];
    if (kind == 0) return __uint_as_float(((unsigned int)h) << 16);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

extern "C" __global__ void gemmgen_reference_gemm(const void* A, const void* B, const void* C, const void* bias,
                                                  float* ref, int M, int N, int K, int lda, int ldb, int ldc,
                                                  int a_col, int b_col, int kind, float alpha, float beta, int act) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= M || j >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
        float a = load_elem(A, a_col ? (long long)k * lda + i : (long long)i * lda + k, kind);
        float b = load_elem(B, b_col ? (long long)j * ldb + k : (long long)k * ldb + j, kind);
        acc = fmaf(a, b, acc);
    }
    float x = alpha * acc;
    if (C) x += beta * load_elem(C, (long long)i * ldc + j, kind);
    if (bias) x += load_elem(bias, j, kind);
    if (act == 1) x = fmaxf(x, 0.0f);
    if (act == 2) x = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    if (act == 3) x = x / (1.0f + expf(-x));
    ref[(long long)i * N + j] = x;
}
"""


def reference_kernel_params(problem: Problem, pointers: GemmPointers, ref_ptr: int) -> "list[dict]":
    """The reference kernel's parameters, in the manifest's param format."""
    kind = {DType.BF16: 0, DType.F16: 1, DType.F32: 2}[problem.a_dtype]
    act = ACTIVATION_CODES[problem.epilogue.activation]
    ep = problem.epilogue

    def scalar(name, ctype, value):
        return {"name": name, "kind": "scalar", "ctype": ctype, "value": value}

    return [
        {"name": "A", "kind": "tensor", "tensor": "A"}, {"name": "B", "kind": "tensor", "tensor": "B"},
        {"name": "C", "kind": "tensor", "tensor": "C"}, {"name": "bias", "kind": "tensor", "tensor": "bias"},
        {"name": "ref", "kind": "tensor", "tensor": "ref"},
        scalar("M", "int", problem.m), scalar("N", "int", problem.n), scalar("K", "int", problem.k),
        scalar("lda", "int", problem.lda), scalar("ldb", "int", problem.ldb), scalar("ldc", "int", problem.ldc),
        scalar("a_col", "int", int(problem.a_layout is Layout.COL)),
        scalar("b_col", "int", int(problem.b_layout is Layout.COL)), scalar("kind", "int", kind),
        scalar("alpha", "float", ep.alpha), scalar("beta", "float", ep.beta), scalar("act", "int", act),
    ]


def reference_manifest(problem: Problem, pointers: GemmPointers, ref_ptr: int) -> dict:
    """A one-launch manifest for the reference kernel, so it runs through the same launcher as every kernel."""
    block = 16
    grid = [(problem.n + block - 1) // block, (problem.m + block - 1) // block, 1]
    return {"name": "gemmgen_reference_gemm", "launches": [
        {"entry": "gemmgen_reference_gemm", "grid": grid, "block": [block, block, 1], "cluster": [1, 1, 1],
         "dynamic_smem": 0, "params": reference_kernel_params(problem, pointers, ref_ptr)}]}


def _compare_kernel(device, problem: Problem, pointers: GemmPointers, seed: int) -> Comparison:
    import numpy as np

    from ..codegen.nvrtc import compile_for_device
    from ..runtime.device import Buffer, numpy_dtype, to_float32

    module = device.cache.get("reference")
    if module is None:
        module = device.cache["reference"] = device.load(compile_for_device("gemmgen_reference", REFERENCE_SOURCE, device.props.cc))
    m, n = problem.m, problem.n
    ref_buf = device.alloc(m * n * 4)
    try:
        ptrs = pointers.as_dict()
        ptrs["ref"] = ref_buf.ptr
        device.launch(reference_manifest(problem, pointers, ref_buf.ptr), module, ptrs)
        device.synchronize("after gemmgen_reference_gemm")
        ref = device.copy_to_host(ref_buf, np.float32, m * n).astype(np.float64)
    finally:
        device.free(ref_buf)

    def host(ptr, shape, dtype):
        count = math.prod(shape)
        raw = device.copy_to_host(Buffer(ptr, count * dtype.bytes), numpy_dtype(dtype), count)
        return to_float32(raw, dtype).astype(np.float64).reshape(shape)

    shapes = storage_shapes(problem)
    out = in_view(host(pointers.d, shapes["D"], problem.c_dtype), problem, "D").reshape(-1)
    finite = np.isfinite(out)
    nonfinite = int(out.size - finite.sum())
    rel = _ratio(float(np.linalg.norm(np.where(finite, out - ref, 0.0))), float(np.linalg.norm(ref)))

    # float64 at sampled entries: checks the fp32 reference kernel and the output independently of it.
    a = in_view(host(pointers.a, shapes["A"], problem.a_dtype), problem, "A")
    b = in_view(host(pointers.b, shapes["B"], problem.b_dtype), problem, "B")
    a = a.T if problem.a_layout is Layout.COL else a
    b = b.T if problem.b_layout is Layout.COL else b
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, m, SAMPLES)
    cols = rng.integers(0, n, SAMPLES)
    acc = np.einsum("sk,ks->s", a[rows, :], b[:, cols])
    c = in_view(host(pointers.c, shapes["C"], problem.c_dtype), problem, "C")[rows, cols] if pointers.c else None
    bias = host(pointers.bias, (n,), problem.c_dtype)[cols] if pointers.bias else None
    exact = epilogue_numpy(acc, problem, c, bias)
    sampled_out = out.reshape(m, n)[rows, cols]
    sampled_ref = ref.reshape(m, n)[rows, cols]
    ref_check = _ratio(float(np.linalg.norm(sampled_ref - exact)), float(np.linalg.norm(exact)))
    sample_rel = _ratio(float(np.linalg.norm(np.nan_to_num(sampled_out - exact, nan=np.inf))),
                        float(np.linalg.norm(exact)))
    detail = f"fp32 reference kernel vs float64 at {SAMPLES} samples: {ref_check:.1e}"
    if ref_check > 1e-4:
        detail = "the reference kernel disagrees with float64; " + detail
    sums = None
    if problem.epilogue.row_sums and pointers.row_sums:
        sums = (host(pointers.row_sums, (m,), problem.c_dtype), a.sum(axis=1))
    return _with_row_sums(Comparison(math.inf if nonfinite else rel, nonfinite, "kernel", sample_rel, detail), sums)


def epilogue_numpy(acc, problem: Problem, c=None, bias=None):
    """act(alpha*acc + beta*c + bias) in NumPy, in the dtype of `acc`."""
    import numpy as np

    ep = problem.epilogue
    x = acc * ep.alpha
    if ep.beta != 0 and c is not None:
        x = x + ep.beta * c
    if ep.bias and bias is not None:
        x = x + bias
    if ep.activation is Activation.RELU:
        x = np.maximum(x, 0)
    elif ep.activation is Activation.GELU:
        x = 0.5 * x * (1 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))
    elif ep.activation is Activation.SILU:
        with np.errstate(over="ignore"):   # exp(-x) = inf for very negative x: the product is then -0
            x = x / (1 + np.exp(-x))
    return x


def _ratio(num: float, den: float) -> float:
    """num/den, with an all-zero reference compared absolutely (random inputs make that rare)."""
    if den == 0.0:
        return num
    return num / den
