"""The tile-hierarchy model: CTA tile, warp (or warpgroup) tile, MMA instruction, pipeline,
shared-memory layout, rasterization, work decomposition and Hopper cluster shape.

Everything here is a frozen dataclass with a procedural name and a dict form that round-trips
through YAML and JSON. Feasibility lives in constraints.py, not here.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum

import yaml

from .arch import Arch
from .errors import InvalidInput
from .problem import Operands

_SHAPE = re.compile(r"^\s*(\d+)\s*[x×X*,]\s*(\d+)\s*[x×X*,]\s*(\d+)\s*$")


@dataclass(frozen=True, order=True)
class Shape3:
    """An M×N×K extent: a CTA tile, a warp tile or an MMA instruction."""

    m: int
    n: int
    k: int

    @classmethod
    def parse(cls, text: "str | Shape3 | list | tuple", what: str = "tile") -> "Shape3":
        if isinstance(text, Shape3):
            return text
        if isinstance(text, (list, tuple)) and len(text) == 3 and all(isinstance(v, int) for v in text):
            shape = cls(*text)
        else:
            match = _SHAPE.match(str(text))
            if not match:
                raise InvalidInput(f"{what} must be written MxNxK with positive integers, e.g. 128x128x32", text)
            shape = cls(*(int(g) for g in match.groups()))
        if min(shape.m, shape.n, shape.k) <= 0:
            raise InvalidInput(f"{what} must be written MxNxK with positive integers, e.g. 128x128x32", text)
        return shape

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def volume(self) -> int:
        return self.m * self.n * self.k


class Family(str, Enum):
    """A kernel family is one template directory: sm80_mma (mma.sync, cp.async, ldmatrix) or sm90_wgmma (TMA, wgmma)."""

    SM80_MMA = "sm80_mma"
    SM90_WGMMA = "sm90_wgmma"

    @property
    def template(self) -> str:
        """The entry template, relative to templates/: it includes the family's mainloop, epilogue and scheduler."""
        return f"{self.value}/kernel.cu.j2"

    @property
    def min_arch(self) -> Arch:
        return Arch.SM90A if self is Family.SM90_WGMMA else Arch.SM80


class SmemLayout(str, Enum):
    """How operand tiles sit in shared memory to avoid bank conflicts."""

    SWIZZLE = "swizzle"  # XOR of the 16-byte chunk index with the row (sm80); TMA 128B swizzle (sm90)
    PAD = "pad"  # each row padded by 16 bytes


class RasterOrder(str, Enum):
    """Which grid axis moves fastest over output tiles."""

    ROW = "row"  # consecutive CTAs walk along N
    COL = "col"  # consecutive CTAs walk along M


@dataclass(frozen=True)
class Raster:
    """Block rasterization: order, and how many tiles wide a swizzle group is (1 = plain order)."""

    order: RasterOrder = RasterOrder.ROW
    group: int = 1

    @property
    def tag(self) -> str:
        return f"{self.order.value[0]}{self.group}"


class DecompKind(str, Enum):
    DATA_PARALLEL = "dp"
    SPLIT_K = "splitk"
    STREAM_K = "streamk"


# Stream-K cuts a remainder tile into at most this many K slices (the template's SK_MAX_SLICES).
SK_MAX_SLICES = 16


def streamk_remainder(tiles: int, grid: int, k_tiles: int) -> "tuple[int, int]":
    """How Stream-K splits the last partial wave of `tiles` output tiles on `grid` resident CTAs with `k_tiles`
    K tiles each, as the sm90 template's Walk does: (rem, slices). rem tiles remain after the full waves;
    slices >= 2 cuts each into that many equal K slices (the wave at most half full); 0 is range mode (the
    wave more than half full: its K iterations dealt out to every CTA in contiguous ranges); 1 leaves the
    remainder an ordinary partial wave (none, or a single K tile)."""
    rem = tiles % grid
    if rem == 0:
        return 0, 1
    slices = min(grid // rem, k_tiles, SK_MAX_SLICES)
    if slices == 1 and k_tiles >= 2:
        return rem, 0
    return rem, max(1, slices)


@dataclass(frozen=True)
class Decomposition:
    """How work is divided among CTAs: one tile each (dp), K split in `splits` parts, or Stream-K."""

    kind: DecompKind = DecompKind.DATA_PARALLEL
    splits: int = 1
    # Split-K only: the slices' fp32 partials are summed inside the GEMM launch by the last CTA to finish a
    # tile (a per-tile arrival counter), instead of by a second, reduction launch. Tag suffix "f".
    fused: bool = False

    @property
    def tag(self) -> str:
        # The factor is named whenever it is not 1, so no two decompositions share a tag (a dp config
        # with splits=2 is infeasible, but its name must still differ from splits=1).
        suffix = "f" if self.fused else ""
        if self.kind is DecompKind.SPLIT_K or self.splits != 1:
            return f"{self.kind.value}{self.splits}{suffix}"
        return self.kind.value + suffix

    def to_dict(self) -> dict:
        out = {"kind": self.kind.value, "splits": self.splits}
        if self.fused:  # omitted when false, so records written before the field existed stay identical
            out["fused"] = True
        return out


class Schedule(str, Enum):
    """How consumer warpgroups share output tiles (sm90_wgmma).

    cooperative: every consumer warpgroup computes its `warp` slice of each CTA tile.
    pingpong: two consumer warpgroups own whole alternate tiles (`warp` equals `cta`); their mainloops take
    turns, so one warpgroup's epilogue overlaps the other's mainloop.
    """

    COOPERATIVE = "cooperative"
    PINGPONG = "pingpong"


@dataclass(frozen=True)
class Cluster:
    """Thread-block cluster shape (Hopper). 1×1 means no cluster."""

    m: int = 1
    n: int = 1

    @property
    def size(self) -> int:
        return self.m * self.n

    def __str__(self) -> str:
        return f"{self.m}x{self.n}"


@dataclass(frozen=True)
class TileConfig:
    """One named point of the search space.

    For sm80_mma, `warp` is the tile of one warp and warps split the CTA tile in M and N.
    For sm90_wgmma, `warp` is the tile of one consumer warpgroup (128 threads), so the
    consumer-warpgroup arrangement is cta.m/warp.m × cta.n/warp.n.
    """

    family: Family
    cta: Shape3
    warp: Shape3
    mma: Shape3
    stages: int
    smem_layout: SmemLayout = SmemLayout.SWIZZLE
    raster: Raster = field(default_factory=Raster)
    decomposition: Decomposition = field(default_factory=Decomposition)
    cluster: Cluster = field(default_factory=Cluster)
    warp_specialized: bool = False
    persistent: bool = False
    schedule: Schedule = Schedule.COOPERATIVE
    # sm90_wgmma, cooperative data-parallel: D's TMA stores issued by a warp of the producer warpgroup, so the
    # consumers go from filling the store boxes straight to the next tile (docs/perf-notes.md, "The store warp").
    store_warp: bool = False
    # sm90_wgmma: the kernel computes D^T = B^T @ A^T, so the problem's M (a handful of rows, as in decoding)
    # becomes wgmma's N and its N fills the 64-row wgmma M; cta.m then tiles the problem's N and cta.n its M. The
    # staged epilogue (data-parallel) or the split-K reduction launch writes D in the caller's frame
    # (docs/perf-notes.md, "Operand swap").
    swap_ab: bool = False

    # --- derived quantities -------------------------------------------------------------
    @property
    def warps_m(self) -> int:
        return self.cta.m // self.warp.m

    @property
    def warps_n(self) -> int:
        return self.cta.n // self.warp.n

    @property
    def math_threads(self) -> int:
        per_unit = 128 if self.family is Family.SM90_WGMMA else 32
        # Ping-pong runs two consumer warpgroups over one warpgroup tile (= the CTA tile), alternating tiles.
        copies = 2 if self.schedule is Schedule.PINGPONG else 1
        return self.warps_m * self.warps_n * per_unit * copies

    @property
    def threads(self) -> int:
        producer = 128 if (self.family is Family.SM90_WGMMA and self.warp_specialized) else 0
        return self.math_threads + producer

    @property
    def tag(self) -> str:
        """Tiles, stages, swizzle, rasterization, decomposition, cluster: the config half of a kernel name."""
        parts = [self.family.value, f"cta{self.cta}", f"w{self.warp}", f"mma{self.mma}", f"s{self.stages}",
                 self.smem_layout.value, f"r{self.raster.tag}", self.decomposition.tag, f"cl{self.cluster}"]
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
        return "_".join(parts)

    # --- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "family": self.family.value,
            "cta": str(self.cta),
            "warp": str(self.warp),
            "mma": str(self.mma),
            "stages": self.stages,
            "smem_layout": self.smem_layout.value,
            "raster": {"order": self.raster.order.value, "group": self.raster.group},
            "decomposition": self.decomposition.to_dict(),
            "cluster": str(self.cluster.m) + "x" + str(self.cluster.n),
            "warp_specialized": self.warp_specialized,
            "persistent": self.persistent,
            "schedule": self.schedule.value,
            # omitted when false, so records written before the field existed stay identical
            **({"store_warp": True} if self.store_warp else {}),
            **({"swap_ab": True} if self.swap_ab else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "TileConfig":
        if not isinstance(d, dict):
            raise InvalidInput("a configuration must be a mapping of fields", type(d).__name__)
        known = {"family", "cta", "warp", "mma", "stages", "smem_layout", "raster", "decomposition",
                 "cluster", "warp_specialized", "persistent", "schedule", "store_warp", "swap_ab"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidInput(f"configuration fields must be among {sorted(known)}", unknown[0])
        for required in ("family", "cta", "warp", "mma", "stages"):
            if required not in d:
                raise InvalidInput("a configuration must give family, cta, warp, mma and stages", f"missing {required}")
        try:
            family = Family(str(d["family"]))
        except ValueError:
            raise InvalidInput(f"family must be one of {[f.value for f in Family]}", d["family"]) from None
        raster = d.get("raster", {}) or {}
        decomp = d.get("decomposition", {}) or {}
        cluster = d.get("cluster", "1x1")
        return cls(
            family=family,
            cta=Shape3.parse(d["cta"], "CTA tile"),
            warp=Shape3.parse(d["warp"], "warp tile"),
            mma=Shape3.parse(d["mma"], "MMA shape"),
            stages=_int("stages", d["stages"]),
            smem_layout=_enum(SmemLayout, "smem_layout", d.get("smem_layout", "swizzle")),
            raster=Raster(_enum(RasterOrder, "raster.order", raster.get("order", "row")),
                          _int("raster.group", raster.get("group", 1))),
            decomposition=Decomposition(_enum(DecompKind, "decomposition.kind", decomp.get("kind", "dp")),
                                        _int("decomposition.splits", decomp.get("splits", 1)),
                                        _bool("decomposition.fused", decomp.get("fused", False))),
            cluster=_cluster(cluster),
            warp_specialized=bool(d.get("warp_specialized", False)),
            persistent=bool(d.get("persistent", False)),
            schedule=_enum(Schedule, "schedule", d.get("schedule", "cooperative")),
            store_warp=_bool("store_warp", d.get("store_warp", False)),
            swap_ab=_bool("swap_ab", d.get("swap_ab", False)),
        )

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_text(cls, text: str, source: str = "<config>") -> "TileConfig":
        """Parse a configuration from YAML or JSON text (JSON is YAML)."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidInput("a configuration file must be valid YAML or JSON", source,
                               str(exc).splitlines()[0]) from None
        if isinstance(data, dict) and "config" in data and isinstance(data["config"], dict):
            data = data["config"]  # accept a launch manifest or tuning record as well
        return cls.from_dict(data)


@dataclass(frozen=True)
class Kernel:
    """A configuration bound to a target and operand description: what one cubin implements."""

    arch: Arch
    operands: Operands
    config: TileConfig

    @property
    def name(self) -> str:
        """Complete, deterministic, and a valid C identifier: the kernel's entry point and file stem."""
        return f"gemmgen_{self.arch.value}_{self.operands.tag}_{self.config.tag}".replace("-", "_")


def _int(what: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        raise InvalidInput(f"{what} must be an integer", value)
    return value


def _bool(what: str, value) -> bool:
    if isinstance(value, bool):
        return value
    raise InvalidInput(f"{what} must be true or false", value)


def _enum(enum_cls, what: str, value):
    try:
        return enum_cls(str(value).lower())
    except ValueError:
        raise InvalidInput(f"{what} must be one of {[e.value for e in enum_cls]}", value) from None


def _cluster(value) -> Cluster:
    if isinstance(value, dict):
        return Cluster(_int("cluster.m", value.get("m", 1)), _int("cluster.n", value.get("n", 1)))
    match = re.match(r"^\s*(\d+)\s*x\s*(\d+)\s*$", str(value))
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise InvalidInput("cluster must be written MxN, e.g. 2x1", value)
    return Cluster(int(match.group(1)), int(match.group(2)))
