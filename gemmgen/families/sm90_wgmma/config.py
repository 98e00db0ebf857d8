"""The sm90_wgmma configuration: the shared tile fields plus the Hopper kernel's knobs.

`warp` is the tile of one consumer warpgroup (128 threads), so the consumer-warpgroup arrangement is
cta.m/warp.m x cta.n/warp.n; one producer warpgroup issues TMA when the kernel is warp-specialized.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ...model.tiles import TileConfig, parse_bool, parse_enum, parse_int


class Schedule(str, Enum):
    """How consumer warpgroups share output tiles.

    cooperative: every consumer warpgroup computes its `warp` slice of each CTA tile.
    pingpong: two consumer warpgroups own whole alternate tiles (`warp` equals `cta`); their mainloops take
    turns, so one warpgroup's epilogue overlaps the other's mainloop.
    """

    COOPERATIVE = "cooperative"
    PINGPONG = "pingpong"


@dataclass(frozen=True)
class Sm90Config(TileConfig, family="sm90_wgmma"):
    """A point of the sm90_wgmma space (TMA, mbarrier ring, wgmma, warp specialization)."""

    warp_specialized: bool = False
    persistent: bool = False
    schedule: Schedule = Schedule.COOPERATIVE
    # Cooperative data-parallel: D's TMA stores issued by a warp of the producer warpgroup, so the consumers go
    # from filling the store boxes straight to the next tile (docs/perf-notes.md, "The store warp").
    store_warp: bool = False
    # The kernel computes D^T = B^T @ A^T, so the problem's M (a handful of rows, as in decoding) becomes
    # wgmma's N and its N fills the 64-row wgmma M; cta.m then tiles the problem's N and cta.n its M. The
    # staged epilogue (data-parallel) or the split-K reduction launch writes D in the caller's frame
    # (docs/perf-notes.md, "Operand swap").
    swap_ab: bool = False
    # fp8: every `promote` k-tiles (128 elements of K each), the wgmma partial sums are added into separate fp32
    # accumulators (Hopper's fp8 wgmma accumulates with reduced precision; DeepSeek-V3 promotes every 128).
    # 0: off, the wgmma accumulators hold the whole sum.
    promote: int = 0
    # Staggered promotion: the consumer warpgroups end their promotion intervals at different k-tiles (warpgroup c
    # promote * c / consumers k-tiles earlier), so while one drains its wgmmas and adds its partial sums the others'
    # wgmmas keep the tensor cores busy; with the intervals in step all of them drain at once. Cooperative tiles
    # of two or three consumer warpgroups, promote >= 2.
    promote_stagger: bool = False
    # fp32 inputs at fp32 accuracy (3xTF32): each operand split into a tf32 part and a tf32 remainder,
    # A' = [A_big | A_big | A_small] and B' = [B_big ; B_small ; B_big] along K by a pre-pass, so one tf32 GEMM
    # over K' = 3K sums the three products that carry fp32 accuracy (the small x small one is dropped).
    split3: bool = False

    KNOBS = {"warp_specialized": False, "persistent": False, "schedule": "cooperative", "store_warp": False,
             "swap_ab": False, "promote": 0, "promote_stagger": False,
             "split3": False}

    @property
    def consumers(self) -> int:
        """Consumer warpgroups: the warpgroup arrangement, twice over in ping-pong (two over one tile)."""
        return self.warps_m * self.warps_n * (2 if self.schedule is Schedule.PINGPONG else 1)

    @property
    def math_threads(self) -> int:
        return self.consumers * 128

    @property
    def threads(self) -> int:
        return self.math_threads + (128 if self.warp_specialized else 0)

    def knob_tags(self) -> "list[str]":
        parts = []
        if self.warp_specialized:
            parts.append("ws")
        if self.persistent:
            parts.append("pers")
        if self.schedule is not Schedule.COOPERATIVE:  # named only when not the default: old names stay
            parts.append("pp")
        if self.store_warp:
            parts.append("sw")
        if self.swap_ab:
            parts.append("swap")
        if self.promote:
            parts.append(f"pr{self.promote}")
        if self.promote_stagger:
            parts.append("ps")
        if self.split3:
            parts.append("x3")
        return parts

    def knob_values(self) -> dict:
        return {
            "warp_specialized": self.warp_specialized,
            "persistent": self.persistent,
            "schedule": self.schedule.value,
            # omitted when false, so records written before the field existed stay identical
            **({"store_warp": True} if self.store_warp else {}),
            **({"swap_ab": True} if self.swap_ab else {}),
            **({"promote": self.promote} if self.promote else {}),
            **({"promote_stagger": True} if self.promote_stagger else {}),
            **({"split3": True} if self.split3 else {}),
        }

    @classmethod
    def parse_knobs(cls, raw: dict) -> dict:
        # parse_bool, never bool(): a config file's `persistent: "false"` is text, and bool() of text is True.
        return {"warp_specialized": parse_bool("warp_specialized", raw["warp_specialized"]),
                "persistent": parse_bool("persistent", raw["persistent"]),
                "schedule": parse_enum(Schedule, "schedule", raw["schedule"]),
                "store_warp": parse_bool("store_warp", raw["store_warp"]),
                "swap_ab": parse_bool("swap_ab", raw["swap_ab"]),
                "promote": parse_int("promote", raw["promote"]),
                "promote_stagger": parse_bool("promote_stagger", raw["promote_stagger"]),
                "split3": parse_bool("split3", raw["split3"])}


__all__ = ["Schedule", "Sm90Config"]
