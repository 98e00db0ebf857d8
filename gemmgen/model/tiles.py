"""The tile-hierarchy model: CTA tile, warp (or warpgroup) tile, MMA instruction, pipeline,
shared-memory layout, rasterization, work decomposition and Hopper cluster shape.

Everything here is a frozen dataclass with a procedural name and a dict form that round-trips
through YAML and JSON. Each kernel family's own knobs and rules live in its package under
gemmgen/families/; this module holds what every family shares.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

from .arch import Arch
from .errors import InvalidInput
from . import parse
from .problem import Operands

# One spelling: 128x128x32 (ASCII digits, a lower-case x, no spaces, no leading zeros); or a list of 3 ints.
_SHAPE = re.compile(r"([1-9][0-9]{0,5})x([1-9][0-9]{0,5})x([1-9][0-9]{0,5})\Z")


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
        if isinstance(text, (list, tuple)) and len(text) == 3:
            shape = cls(*(parse.integer(f"{what} {axis}", v, 1, 2**20) for axis, v in zip("MNK", text)))
        else:
            match = _SHAPE.match(text) if isinstance(text, str) else None
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


# Fields every configuration has, in the order of its dict form; each family's type adds its own knobs.
BASE_FIELDS = ("family", "cta", "warp", "mma", "stages", "smem_layout", "raster", "decomposition", "cluster")
REQUIRED_FIELDS = BASE_FIELDS[:5]   # the rest have defaults


@dataclass(frozen=True)
class TileConfig:
    """One named point of a family's search space: the tile fields every kernel family shares.

    A family subclasses this with its own knobs (`class MyConfig(TileConfig, family="my_family")`),
    sets how many threads its tiles take (`math_threads`, `threads`) and names its knobs in `knob_tags`.
    `warp` is the tile of one warp (sm80) or one consumer warpgroup (sm90): the family says which.
    """

    cta: Shape3
    warp: Shape3
    mma: Shape3
    stages: int
    smem_layout: SmemLayout = SmemLayout.SWIZZLE
    raster: Raster = field(default_factory=Raster)
    decomposition: Decomposition = field(default_factory=Decomposition)
    cluster: Cluster = field(default_factory=Cluster)

    family: ClassVar[str] = ""
    # Family name -> config type, filled as family packages define their types (from_dict dispatches on it).
    _types: ClassVar["dict[str, type[TileConfig]]"] = {}
    # The family's own knobs: field name -> the value a dict without the field means.
    KNOBS: ClassVar["dict[str, object]"] = {}
    # Knobs older records wrote for every family (one flat type): accepted when they hold these defaults.
    LEGACY_KNOBS: ClassVar["dict[str, object]"] = {
        "warp_specialized": False, "persistent": False, "schedule": "cooperative", "store_warp": False,
        "swap_ab": False}

    def __init_subclass__(cls, family: str = "", **kwargs):
        super().__init_subclass__(**kwargs)
        if family:
            cls.family = family
            TileConfig._types[family] = cls

    # --- derived quantities -------------------------------------------------------------
    @property
    def warps_m(self) -> int:
        return self.cta.m // self.warp.m

    @property
    def warps_n(self) -> int:
        return self.cta.n // self.warp.n

    @property
    def math_threads(self) -> int:
        """Threads that run the MMA main loop."""
        raise NotImplementedError(f"{type(self).__name__} must say how many threads its tiles take")

    @property
    def threads(self) -> int:
        """Threads per CTA (math threads plus any producer)."""
        return self.math_threads

    def knob_tags(self) -> "list[str]":
        """Name parts for the family's knobs (only those not at their default, so old names stay)."""
        return []

    def knob_values(self) -> dict:
        """The family's knobs as plain values (dict form, search axes)."""
        return {}

    @property
    def tag(self) -> str:
        """Tiles, stages, swizzle, rasterization, decomposition, cluster: the config half of a kernel name."""
        parts = [self.family, f"cta{self.cta}", f"w{self.warp}", f"mma{self.mma}", f"s{self.stages}",
                 self.smem_layout.value, f"r{self.raster.tag}", self.decomposition.tag, f"cl{self.cluster}"]
        return "_".join(parts + self.knob_tags())

    # --- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "family": self.family,
            "cta": str(self.cta),
            "warp": str(self.warp),
            "mma": str(self.mma),
            "stages": self.stages,
            "smem_layout": self.smem_layout.value,
            "raster": {"order": self.raster.order.value, "group": self.raster.group},
            "decomposition": self.decomposition.to_dict(),
            "cluster": str(self.cluster.m) + "x" + str(self.cluster.n),
            **self.knob_values(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "TileConfig":
        """Parse a configuration of any registered family (the `family` field picks the type)."""
        if not isinstance(d, dict):
            raise InvalidInput("a configuration must be a mapping of fields", type(d).__name__)
        for required in REQUIRED_FIELDS:
            if required not in d:
                raise InvalidInput("a configuration must give family, cta, warp, mma and stages", f"missing {required}")
        config_type = TileConfig._types.get(str(d["family"]))
        if config_type is None:
            raise InvalidInput(f"family must be one of {sorted(TileConfig._types)}", d["family"])
        if cls is not TileConfig and not issubclass(config_type, cls):
            raise InvalidInput(f"a {cls.family} configuration must name family {cls.family}", d["family"])
        known = set(BASE_FIELDS) | set(config_type.KNOBS)
        for name, default in cls.LEGACY_KNOBS.items():
            if name in d and name not in config_type.KNOBS:
                if d[name] != default:
                    raise InvalidInput(f"family {config_type.family} has no knob {name} (only its default "
                                       f"{default!r} is accepted)", d[name])
                known.add(name)
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidInput(f"configuration fields must be among {sorted(known)}", unknown[0])
        raster = _sub_fields("raster", d.get("raster"), ("order", "group"))
        decomp = _sub_fields("decomposition", d.get("decomposition"), ("kind", "splits", "fused"))
        base = dict(
            cta=Shape3.parse(d["cta"], "CTA tile"),
            warp=Shape3.parse(d["warp"], "warp tile"),
            mma=Shape3.parse(d["mma"], "MMA shape"),
            stages=parse_int("stages", d["stages"]),
            smem_layout=parse_enum(SmemLayout, "smem_layout", d.get("smem_layout", "swizzle")),
            raster=Raster(parse_enum(RasterOrder, "raster.order", raster.get("order", "row")),
                          parse_int("raster.group", raster.get("group", 1))),
            decomposition=Decomposition(parse_enum(DecompKind, "decomposition.kind", decomp.get("kind", "dp")),
                                        parse_int("decomposition.splits", decomp.get("splits", 1)),
                                        parse_bool("decomposition.fused", decomp.get("fused", False))),
            cluster=_cluster(d.get("cluster", "1x1")),
        )
        knobs = {name: d.get(name, default) for name, default in config_type.KNOBS.items()}
        return config_type(**base, **config_type.parse_knobs(knobs))

    @classmethod
    def parse_knobs(cls, raw: dict) -> dict:
        """The family's knobs from their dict form (a family type checks its own; here a knob whose default is a
        bool must be one: bool() of the text "false" is True)."""
        return {name: parse_bool(name, value) if isinstance(cls.KNOBS.get(name), bool) else value
                for name, value in raw.items()}

    def to_yaml(self) -> str:
        import yaml  # the model is imported by the runtime, which must not need PyYAML

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_text(cls, text: str, source: str = "<config>") -> "TileConfig":
        """Parse a configuration from YAML or JSON text (JSON is YAML)."""
        from .files import load_yaml

        data = load_yaml("a configuration file", text, source)
        if isinstance(data, dict) and "config" in data and isinstance(data["config"], dict):
            data = data["config"]  # accept a launch manifest as well
        elif isinstance(data, dict) and "winner" in data and "family" not in data:
            # a tuning record (gemmgen-tune/1): its winner's configuration; it was refused as 'missing family'
            winner = data["winner"]
            if not (isinstance(winner, dict) and isinstance(winner.get("config"), dict)):
                raise InvalidInput("a tuning record given as a configuration must have a winner", source,
                                   f"its status is {data.get('status')!r}")
            data = winner["config"]
        if not isinstance(data, dict):
            raise InvalidInput("a configuration file must hold a mapping of fields (family, cta, warp, mma, "
                               "stages, ...)", source, f"it holds {type(data).__name__}")
        missing = [f for f in REQUIRED_FIELDS if f not in data]
        if missing:
            # Another of gemmgen's files (a suite table, a calibration) was refused as 'missing family' without
            # naming the file or what it should hold.
            kind = (f"it is a {parse.shown(data['format'])!r} file" if isinstance(data.get("format"), str)
                    else "it has no " + ", ".join(missing))
            raise InvalidInput("a configuration file must hold a configuration (family, cta, warp, mma, stages, "
                               "...), a launch manifest or a tuning record", source, kind)
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


def parse_int(what: str, value) -> int:
    """A configuration's integer field (stages, splits, group, cluster extent, a family's integer knob): 0 to 2^20.
    The rules say which values work; beyond 2^20 none does, and the resource arithmetic would only overflow."""
    return parse.integer(what, value, 0, 2**20)


def parse_bool(what: str, value) -> bool:
    if isinstance(value, bool):
        return value
    raise InvalidInput(f"{what} must be true or false", value)


def parse_enum(enum_cls, what: str, value):
    return enum_cls(parse.name(what, value, [e.value for e in enum_cls]))


def _sub_fields(what: str, value, known: "tuple[str, ...]") -> dict:
    """A nested field of a configuration (raster, decomposition, cluster) as a mapping of its known keys; absent
    (None) is every default. An unknown key (a typo: `split: 4`, `grp: 8`) used to be ignored silently, leaving
    the default in its place."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a mapping of {', '.join(known)}", value)
    unknown = sorted(str(key) for key in value if key not in known)
    if unknown:
        raise InvalidInput(f"{what} fields must be among {list(known)}", unknown[0])
    return value


def _cluster(value) -> Cluster:
    if isinstance(value, dict):
        _sub_fields("cluster", value, ("m", "n"))
        return Cluster(parse_int("cluster.m", value.get("m", 1)), parse_int("cluster.n", value.get("n", 1)))
    match = re.match(r"([1-9][0-9]{0,5})x([1-9][0-9]{0,5})\Z", value) if isinstance(value, str) else None
    if not match:
        raise InvalidInput("cluster must be written MxN, e.g. 2x1", value)
    return Cluster(int(match.group(1)), int(match.group(2)))
