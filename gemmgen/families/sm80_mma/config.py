"""The sm80_mma configuration: the shared tile fields, no knobs of its own.

`warp` is the tile of one warp (mma.sync m16n8k16, fragments through ldmatrix); warps split the CTA tile in
M and N, so the CTA runs warps_m x warps_n warps.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...model.tiles import TileConfig


@dataclass(frozen=True)
class Sm80Config(TileConfig, family="sm80_mma"):
    """A point of the sm80_mma space (mma.sync, cp.async multistage pipeline)."""

    @property
    def math_threads(self) -> int:
        return self.warps_m * self.warps_n * 32


__all__ = ["Sm80Config"]
