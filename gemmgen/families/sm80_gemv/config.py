"""The sm80_gemv configuration: the shared tile fields plus how many warps split K inside a CTA.

`cta` is (rows of D, which must cover all of M) x (columns per CTA) x (rows of B one warp reads per iteration,
each thread one 16-byte vector per row: the loads it keeps in flight); `warp` is one warp's share: every row,
256 columns (32 lanes x 8), the same rows of B. `mma` is 1x1x1: the products are CUDA-core FMAs, not tensor-core
instructions. Warps side by side in N make cta.n / 256; `k_warps` copies of that arrangement take interleaved
rows of B and meet in shared memory at the end.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..base import KWarpsConfig


@dataclass(frozen=True)
class GemvConfig(KWarpsConfig, family="sm80_gemv"):
    """A point of the sm80_gemv space (row-major B streamed along N, fp32 FMAs, M <= cta.m); k_warps: 1, 2, 4, 8."""


__all__ = ["GemvConfig"]
