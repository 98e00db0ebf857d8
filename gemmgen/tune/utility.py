"""Small helper kernels the measuring process runs beside the kernels it times: a random fill generated on the
device, and a kernel that holds a stream busy so the launches queued behind it are timed as the GPU runs them.

They are compiled through the one NVRTC driver (codegen/nvrtc.compile_for_device) for the device at hand, once per
Device; without NVRTC the fill falls back to NumPy on the host and holding a stream is skipped.
"""
from __future__ import annotations

from ..model.arch import DType
from ..model.errors import CompileError, InvalidInput
from ..runtime.device import Buffer, Device, Module
from ..runtime.host import host_uniform
from ..runtime.launch import PreparedLaunch, enqueue, pack_params
from ..runtime import driver as drv

UTILITY_SOURCE = r"""
// gemmgen utility kernels: random fill. No headers, so NVRTC needs no include path.
__device__ __forceinline__ unsigned long long splitmix64(unsigned long long x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// kind: 0 bf16, 1 f16, 2 f32, 3 e4m3, 4 e5m2 (fp8: saturating round to nearest). Each element hashes
// (seed, index), so the values do not depend on the grid.
extern "C" __global__ void gemmgen_fill_uniform(void* out, unsigned long long n, unsigned long long seed,
                                                int kind, float lo, float hi) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned long long h = splitmix64(seed * 0xD1B54A32D192ED03ull ^ i);
        float u = (float)(h >> 40) * (1.0f / 16777216.0f);  // top 24 bits: exact in fp32, in [0, 1)
        float x = lo + (hi - lo) * u;
        if (kind == 2) {
            ((float*)out)[i] = x;
        } else if (kind >= 3) {
            unsigned short pair;   // cvt packs two fp8 values; the low byte holds the second operand's
            if (kind == 3) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
            else           asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
            ((unsigned char*)out)[i] = (unsigned char)(pair & 0xFF);
        } else {
            unsigned short bits;
            if (kind == 0) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(x));
            else           asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(x));
            ((unsigned short*)out)[i] = bits;
        }
    }
}

// Holds the stream for `ns` nanoseconds of GPU time (one thread). Timed runs are queued behind it, so the
// GPU then runs them back to back and the events time the kernels, not the host's launch overhead.
extern "C" __global__ void gemmgen_hold(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("nanosleep.u32 2000;" ::: "memory");
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"""


def _module(dev: Device) -> "Module | None":
    """The helper kernels, compiled once per Device; None (remembered) when NVRTC cannot build them."""
    if "utility" not in dev.cache:
        try:
            from ..codegen.nvrtc import NvrtcUnavailable, compile_for_device

            dev.cache["utility"] = dev.load(compile_for_device("gemmgen_utility", UTILITY_SOURCE, dev.props.cc))
        except (ImportError, NvrtcUnavailable, CompileError):
            dev.cache["utility"] = None
    return dev.cache["utility"]


def fill_uniform(dev: Device, buf: Buffer, dtype: "DType | str", count: int, seed: int, lo: float = -1.0,
                 hi: float = 1.0, stream: int = 0) -> None:
    """Uniform random values in [lo, hi), generated on the device by a counter-based hash of (seed, index);
    on the host with NumPy when NVRTC is missing (the same distribution)."""
    dt = DType.parse(dtype)
    module = _module(dev)
    if module is None:
        dev.copy_to_device(buf, host_uniform(dt, count, seed, lo, hi))
        return
    kind = {DType.BF16: 0, DType.F16: 1, DType.F32: 2, DType.E4M3: 3, DType.E5M2: 4}.get(dt)
    if kind is None:
        raise InvalidInput("random fill supports bf16, f16, f32, e4m3 and e5m2", dt.value)
    fn = module.function("gemmgen_fill_uniform")
    params = pack_params([
        {"name": "out", "kind": "tensor", "tensor": "out"},
        {"name": "n", "kind": "scalar", "ctype": "unsigned long long", "value": int(count)},
        {"name": "seed", "kind": "scalar", "ctype": "unsigned long long", "value": int(seed) & (2**64 - 1)},
        {"name": "kind", "kind": "scalar", "ctype": "int", "value": kind},
        {"name": "lo", "kind": "scalar", "ctype": "float", "value": float(lo)},
        {"name": "hi", "kind": "scalar", "ctype": "float", "value": float(hi)},
    ], {"out": buf.ptr}, entry="gemmgen_fill_uniform")
    blocks = max(1, min(4 * dev.props.sm_count * 8, (count + 255) // 256))
    enqueue(drv.driver_module(), PreparedLaunch(fn, (blocks, 1, 1), (256, 1, 1), (1, 1, 1), 0, params), stream)


def hold_stream(dev: Device, seconds: float, stream: int = 0) -> bool:
    """Keep `stream` busy for `seconds` of GPU time; False (nothing queued) when NVRTC is missing."""
    module = _module(dev)
    if module is None:
        return False
    fn = module.function("gemmgen_hold")
    params = pack_params([{"name": "ns", "kind": "scalar", "ctype": "unsigned long long",
                           "value": int(seconds * 1e9)}], {}, entry="gemmgen_hold")
    enqueue(drv.driver_module(), PreparedLaunch(fn, (1, 1, 1), (1, 1, 1), (1, 1, 1), 0, params), stream)
    return True


__all__ = ["UTILITY_SOURCE", "fill_uniform", "hold_stream"]
