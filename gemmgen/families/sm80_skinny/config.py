"""The sm80_skinny configuration: the shared tile fields plus how many warps split K inside a CTA.

`cta` is (rows of D, which must cover all of M) x (columns per CTA) x (K per main-loop iteration); `warp` is one
warp's share: all rows, `warp.n` columns (n8 groups), the same K. Warps side by side in N make cta.n / warp.n;
`k_warps` copies of that arrangement each take an interleaved part of every CTA's K range and meet in shared
memory at the end (more bytes in flight per SM without a second launch).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..base import KWarpsConfig


@dataclass(frozen=True)
class SkinnyConfig(KWarpsConfig, family="sm80_skinny"):
    """A point of the sm80_skinny space (streamed B, mma.sync, M <= cta.m); k_warps: 1, 2 or 4."""


__all__ = ["SkinnyConfig"]
