"""The sm80_skinny configuration: the shared tile fields plus how many warps split K inside a CTA.

`cta` is (rows of D, which must cover all of M) x (columns per CTA) x (K per main-loop iteration); `warp` is one
warp's share: all rows, `warp.n` columns (n8 groups), the same K. Warps side by side in N make cta.n / warp.n;
`k_warps` copies of that arrangement each take an interleaved part of every CTA's K range and meet in shared
memory at the end (more bytes in flight per SM without a second launch).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...model.tiles import TileConfig, parse_int


@dataclass(frozen=True)
class SkinnyConfig(TileConfig, family="sm80_skinny"):
    """A point of the sm80_skinny space (streamed B, mma.sync, M <= cta.m)."""

    k_warps: int = 1

    KNOBS = {"k_warps": 1}

    @property
    def math_threads(self) -> int:
        return self.warps_n * self.k_warps * 32

    def knob_tags(self) -> "list[str]":
        return [f"kw{self.k_warps}"] if self.k_warps != 1 else []

    def knob_values(self) -> dict:
        return {"k_warps": self.k_warps}

    @classmethod
    def parse_knobs(cls, raw: dict) -> dict:
        # Parsed here, judged by the family's rules (k_warps must be 1, 2 or 4), like every other field.
        return {"k_warps": parse_int("k_warps", raw["k_warps"])}


__all__ = ["SkinnyConfig"]
