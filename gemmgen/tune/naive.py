"""A naive GEMM with the sm80 family's plain-pointer kernel ABI, one thread per output: not fast, and made to be
wrong on request (FAULTS: an unmapped write, a hang, a dropped K element, a write past D's rows) so tests can
exercise the launcher, verification and fault isolation, and examples can launch a kernel from its manifest.
"""
from __future__ import annotations

from ..model.arch import DType
from ..model.errors import InvalidInput
from ..model.problem import Layout, Problem
from .reference import ACTIVATION_CODES

FAULTS = ("none", "oob", "hang", "wrong", "past")

_NAIVE_TEMPLATE = r"""
// A naive GEMM with gemmgen's plain pointer kernel ABI, one thread per output. Not fast; for testing the
// launcher, verification and fault isolation. FAULT: 0 none, 1 writes to an unmapped address, 2 never
// finishes, 3 drops the last K element (a wrong result), 4 also writes one element past each row of D (into the gap
// of a view: right inside the view, wrong outside it).
#define FAULT __FAULT__
typedef unsigned short T;  // bf16 or f16 bits
__device__ __forceinline__ float ld(const T* p, long long i) {
    unsigned short h = p[i];
#if __IS_BF16__
    return __uint_as_float(((unsigned int)h) << 16);
#else
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#endif
}
__device__ __forceinline__ T st(float x) {
    unsigned short h;
#if __IS_BF16__
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
#endif
    return h;
}
__device__ __forceinline__ float epilogue(float acc, const T* C, const T* bias, int i, int j, int ldc,
                                          float alpha, float beta) {
    float x = alpha * acc;
    if (C) x += beta * ld(C, (long long)i * ldc + j);
    if (bias) x += ld(bias, j);
#if __ACT__ == 1
    x = fmaxf(x, 0.0f);
#elif __ACT__ == 2
    x = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
#elif __ACT__ == 3
    x = x / (1.0f + expf(-x));
#endif
    return x;
}
__device__ __forceinline__ float dot(const T* A, const T* B, int i, int j, int k0, int k1, int lda, int ldb) {
    float acc = 0.0f;
    for (int k = k0; k < k1; ++k)
        acc = fmaf(ld(A, __A_COL__ ? (long long)k * lda + i : (long long)i * lda + k),
                   ld(B, __B_COL__ ? (long long)j * ldb + k : (long long)k * ldb + j), acc);
    return acc;
}

extern "C" __global__ void __NAME__(const T* A, const T* B, const T* C, T* D, const T* bias, float* workspace,
                                    int M, int N, int K, int lda, int ldb, int ldc, int ldd, float alpha, float beta) {
    int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y * blockDim.y + threadIdx.y;
#if FAULT == 1
    // Bit 47 set: far above any allocation (a nearby overrun can land in other mapped memory unnoticed).
    D = (T*)((unsigned long long)D ^ (1ull << 47));
#endif
#if FAULT == 2
    // A loop around a volatile local was optimised away on the H100 (the trial completed). An asm
    // volatile statement is a side effect the compiler must keep, so this one never ends.
    for (;;) { asm volatile("nanosleep.u32 1000;" ::: "memory"); }
#endif
    if (i >= M || j >= N) return;
#if __SPLITS__ > 1
    // Partial sums of one K slice into the fp32 workspace (zeroed by the launcher before the sequence).
    int per = (K + __SPLITS__ - 1) / __SPLITS__, k0 = blockIdx.z * per, k1 = min(K, k0 + per);
    atomicAdd(&workspace[(long long)i * N + j], dot(A, B, i, j, k0, k1, lda, ldb));
#else
    float acc = dot(A, B, i, j, 0, FAULT == 3 ? K - 1 : K, lda, ldb);
    D[(long long)i * ldd + j] = st(epilogue(acc, C, bias, i, j, ldc, alpha, beta));
#if FAULT == 4
    if (j == N - 1 && ldd > N) D[(long long)i * ldd + N] = st(0.0f);
#endif
#endif
}

#if __SPLITS__ > 1
extern "C" __global__ void __NAME___reduce(const T* A, const T* B, const T* C, T* D, const T* bias,
                                           float* workspace, int M, int N, int K, int lda, int ldb, int ldc,
                                           int ldd, float alpha, float beta) {
    int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= M || j >= N) return;
    D[(long long)i * ldd + j] = st(epilogue(workspace[(long long)i * N + j], C, bias, i, j, ldc, alpha, beta));
}
#endif
"""


def naive_kernel_name(problem: Problem, fault: str = "none", splits: int = 1) -> str:
    ops = problem.operands
    return f"gemmgen_naive_{ops.tag}_splitk{splits}_{fault}"


def naive_kernel_source(problem: Problem, fault: str = "none", splits: int = 1) -> str:
    """CUDA source of the naive ABI kernel for this problem's dtypes, layouts and epilogue kind."""
    if fault not in FAULTS:
        raise InvalidInput(f"naive kernel fault must be one of {FAULTS}", fault)
    if problem.a_dtype not in (DType.BF16, DType.F16):
        raise InvalidInput("the naive kernel supports bf16 and f16", problem.a_dtype.value)
    act = ACTIVATION_CODES[problem.epilogue.activation]
    subs = {"__FAULT__": str(FAULTS.index(fault)), "__IS_BF16__": str(int(problem.a_dtype is DType.BF16)),
            "__ACT__": str(act), "__A_COL__": str(int(problem.a_layout is Layout.COL)),
            "__B_COL__": str(int(problem.b_layout is Layout.COL)), "__SPLITS__": str(int(splits)),
            "__NAME__": naive_kernel_name(problem, fault, splits)}
    source = _NAIVE_TEMPLATE
    for key, value in subs.items():
        source = source.replace(key, value)
    return f"// {subs['__NAME__']}\n" + source


def naive_manifest(problem: Problem, fault: str = "none", splits: int = 1, arch: str = "sm_90a") -> dict:
    """A launch manifest (docs/architecture.md format) for the naive kernel on `problem`."""
    name = naive_kernel_name(problem, fault, splits)
    ptr = problem.a_dtype.cuda_type + "*"
    ep = problem.epilogue

    def scalar(pname, ctype, value):
        return {"name": pname, "ctype": ctype, "kind": "scalar", "value": value}

    params = [
        {"name": "A", "ctype": "const " + ptr, "kind": "tensor", "tensor": "A"},
        {"name": "B", "ctype": "const " + ptr, "kind": "tensor", "tensor": "B"},
        {"name": "C", "ctype": "const " + ptr, "kind": "tensor", "tensor": "C"},
        {"name": "D", "ctype": ptr, "kind": "tensor", "tensor": "D"},
        {"name": "bias", "ctype": "const " + ptr, "kind": "tensor", "tensor": "bias"},
        {"name": "workspace", "ctype": "float*", "kind": "workspace"},
        scalar("M", "int", problem.m), scalar("N", "int", problem.n), scalar("K", "int", problem.k),
        scalar("lda", "int", problem.lda), scalar("ldb", "int", problem.ldb), scalar("ldc", "int", problem.ldc),
        scalar("ldd", "int", problem.ldc), scalar("alpha", "float", ep.alpha), scalar("beta", "float", ep.beta),
    ]
    block = [16, 16, 1]
    grid = [(problem.n + 15) // 16, (problem.m + 15) // 16, splits]
    launches = [{"entry": name, "grid": grid, "block": block, "cluster": [1, 1, 1], "dynamic_smem": 0,
                 "params": params}]
    if splits > 1:
        launches.append({"entry": name + "_reduce", "grid": grid[:2] + [1], "block": block, "cluster": [1, 1, 1],
                         "dynamic_smem": 0, "params": params})
    return {"format": "gemmgen-manifest/1", "name": name, "arch": arch, "cubin": name + ".cubin",
            "problem": problem.to_dict(), "config": {"family": "naive", "splits": splits, "fault": fault},
            "operands": {"a_dtype": problem.a_dtype.value, "b_dtype": problem.b_dtype.value,
                         "c_dtype": problem.c_dtype.value, "a_layout": problem.a_layout.value,
                         "b_layout": problem.b_layout.value},
            "workspace_bytes": problem.m * problem.n * 4 if splits > 1 else 0, "launches": launches,
            "resources": {}, "nvrtc_version": None, "measured": None, "verification": None}


def naive_cubin(problem: Problem, cc: "tuple[int, int]" = (9, 0), fault: str = "none", splits: int = 1) -> bytes:
    """The naive kernel compiled by NVRTC to SASS for compute capability `cc`."""
    from ..codegen.nvrtc import compile_for_device

    return compile_for_device(naive_kernel_name(problem, fault, splits), naive_kernel_source(problem, fault, splits),
                              tuple(cc))


__all__ = ["FAULTS", "naive_cubin", "naive_kernel_name", "naive_kernel_source", "naive_manifest"]
