"""Host-side element helpers (NumPy): random values, bf16 rounding and raw-element conversions."""
from __future__ import annotations

from ..model.arch import DType
from ..model.errors import InvalidInput

def host_uniform(dtype: "DType | str", count: int, seed: int, lo: float = -1.0, hi: float = 1.0):
    """Uniform values on the host, as the raw element type (uint16 bits for bf16)."""
    import numpy as np

    dt = DType.parse(dtype)
    values = np.random.default_rng(seed).uniform(lo, hi, count).astype(np.float32)
    if dt is DType.F32:
        return values
    if dt is DType.F16:
        return values.astype(np.float16)
    if dt is DType.BF16:
        return float32_to_bf16_bits(values)
    raise InvalidInput("random fill supports bf16, f16 and f32", dt.value)


def float32_to_bf16_bits(values):
    """Round fp32 to bf16 (nearest, ties to even) and return the 16-bit patterns."""
    import numpy as np

    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def to_float32(raw, dtype: "DType | str"):
    """fp32 values of a host array of raw elements (bf16 as uint16 bits, f16, f32)."""
    import numpy as np

    dt = DType.parse(dtype)
    if dt is DType.BF16:
        return (np.asarray(raw).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if dt is DType.F16:
        return np.asarray(raw).view(np.float16).astype(np.float32)
    if dt is DType.F32:
        return np.asarray(raw, dtype=np.float32)
    raise InvalidInput("conversion supports bf16, f16 and f32", dt.value)


def numpy_dtype(dtype: "DType | str"):
    """The NumPy type that holds one element's raw bits."""
    import numpy as np

    return {DType.BF16: np.uint16, DType.F16: np.float16, DType.F32: np.float32}[DType.parse(dtype)]


__all__ = ["float32_to_bf16_bits", "host_uniform", "numpy_dtype", "to_float32"]
