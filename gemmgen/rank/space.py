"""Search spaces: each family's space file -> the valid configurations, and the model's default pick.

A space file lists values per axis. It is either one product (`axes:`) or a union of named products
(`spaces:`), each the cartesian product of its axes. Feasibility is never written in the file: every
configuration of the product is kept only if constraints.check accepts it.

Axes: tiles (list of {cta: MxN, warp: MxN}), bk, mma, stages, smem_layout, raster ({order, group}),
decomposition ({kind, splits}), cluster (MxN), and the family's own knobs (its config type's KNOBS, e.g. the
Hopper family's persistent, schedule, store_warp, swap_ab), each defaulting to the knob's default.
"""
from __future__ import annotations

import itertools
from functools import lru_cache
from pathlib import Path

from .. import families
from ..families import rules as constraints
from ..families.base import KernelFamily
from ..model.arch import Arch, DType, Gpu
from ..model.errors import InvalidInput, UserError
from ..model.problem import Operands, Problem
from ..model.tiles import TileConfig

REQUIRED_AXES = ("tiles", "bk", "mma", "stages")
OPTIONAL_AXES = {
    "smem_layout": ["swizzle"],
    "raster": [{"order": "row", "group": 1}],
    "decomposition": [{"kind": "dp"}],
    "cluster": ["1x1"],
}


def _family(family: "KernelFamily | str") -> KernelFamily:
    return family if isinstance(family, KernelFamily) else families.get(str(family))


def _axes(family: KernelFamily) -> "dict[str, list]":
    """Optional axes of `family`'s space file with their defaults: the shared ones, then its knobs."""
    return {**OPTIONAL_AXES, **{k: [v] for k, v in family.config_type.KNOBS.items()}}


def space_path(family: "KernelFamily | str") -> Path:
    return _family(family).space_file


def _bad(path: Path, rule: str, value) -> InvalidInput:
    return InvalidInput(f"{path.name}: {rule}", value, str(path))


@lru_cache(maxsize=None)
def _products(path_text: str, family_value: str) -> "tuple[TileConfig, ...]":
    """Every configuration the file spells out (before the feasibility check), in file order, deduplicated."""
    import yaml  # only the tuner reads space files; the runtime never does

    path = Path(path_text)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise _bad(path, "search space file must be readable", exc.strerror) from None
    except yaml.YAMLError as exc:
        raise _bad(path, "search space file must be valid YAML", str(exc).splitlines()[0]) from None
    if not isinstance(raw, dict):
        raise _bad(path, "search space must be a mapping with 'family' and 'axes' or 'spaces'", type(raw).__name__)
    if raw.get("family") != family_value:
        raise _bad(path, f"search space 'family' must be {family_value}", raw.get("family"))
    if ("axes" in raw) == ("spaces" in raw):
        raise _bad(path, "search space must have exactly one of 'axes' or 'spaces'", sorted(raw))
    products = [raw["axes"]] if "axes" in raw else raw["spaces"]
    if not isinstance(products, list) or not products:
        raise _bad(path, "'spaces' must be a non-empty list of axis mappings", products)
    seen: dict[str, TileConfig] = {}
    for index, axes in enumerate(products):
        where = f"space {index}" + (f" ({axes.get('name')})" if isinstance(axes, dict) and "name" in axes else "")
        for config in _expand(path, where, family_value, axes):
            seen.setdefault(config.tag, config)
    return tuple(seen.values())


def _expand(path: Path, where: str, family_value: str, axes) -> "list[TileConfig]":
    if not isinstance(axes, dict):
        raise _bad(path, f"{where} must map axis names to value lists", axes)
    optional = _axes(families.get(family_value))
    known = set(REQUIRED_AXES) | set(optional)
    unknown = sorted(set(axes) - known - {"name"})
    if unknown:
        raise _bad(path, f"{where}: axes must be among {sorted(known)}", unknown[0])
    values = {}
    for axis in REQUIRED_AXES:
        if axis not in axes:
            raise _bad(path, f"{where} must list axis '{axis}'", sorted(axes))
        values[axis] = axes[axis]
    for axis, default in optional.items():
        values[axis] = axes.get(axis, default)
    for axis, options in values.items():
        if not isinstance(options, list) or not options:
            raise _bad(path, f"{where}: axis '{axis}' must be a non-empty list", options)
    out = []
    order = list(values)
    for combo in itertools.product(*(values[a] for a in order)):
        point = dict(zip(order, combo))
        tile = point["tiles"]
        if not isinstance(tile, dict) or set(tile) != {"cta", "warp"}:
            raise _bad(path, f"{where}: each tiles entry must be {{cta: MxN, warp: MxN}}", tile)
        bk = point["bk"]
        try:
            cta = _mxn(tile["cta"]) + f"x{int(bk)}"
            warp = _mxn(tile["warp"]) + f"x{int(bk)}"
            fields = {k: v for k, v in point.items() if k not in ("tiles", "bk")}
            config = TileConfig.from_dict({"family": family_value, **fields, "cta": cta, "warp": warp})
        except (UserError, ValueError, TypeError) as exc:
            raise _bad(path, f"{where}: every value must form a configuration ({exc})", point) from None
        out.append(config)
    return out


def _mxn(text) -> str:
    parts = str(text).lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"tile must be written MxN, got {text!r}")
    return f"{int(parts[0])}x{int(parts[1])}"


def all_configs(family: "KernelFamily | str") -> "tuple[TileConfig, ...]":
    """The file's configurations, feasible or not."""
    family = _family(family)
    path = space_path(family)
    if not path.is_file():
        raise InvalidInput(f"kernel family {family.name} must have a search space file", str(path))
    return _products(str(path), family.name)


def enumerate_space(family: "KernelFamily | str", gpu: Gpu, arch: "Arch | None" = None, problem: "Problem | None" = None,
                    operands: "Operands | None" = None) -> "list[TileConfig]":
    """The configurations of `family`'s space that constraints.check accepts on `gpu` for `arch`."""
    arch = arch or gpu.arch
    if operands is None:
        operands = problem.operands if problem is not None else Operands()
    return [c for c in all_configs(family) if not constraints.check(c, gpu, arch, problem, operands)]


def _count_rules(counts: "dict[str, tuple[int, str]]", broken) -> None:
    """Adds each broken rule of one configuration to `counts` (rule -> (times broken, the first message))."""
    for v in broken:
        n, text = counts.get(v.rule, (0, str(v)))
        counts[v.rule] = (n + 1, text)


def _most_broken(counts: "dict[str, tuple[int, str]]") -> str:
    """The message of the rule broken most often; of rules broken equally often, the one the rules check first
    (a family's dtype rule before the output-dtype rule every fp8 problem also breaks), not the last in sort
    order of their messages."""
    return max(counts.values(), key=lambda entry: entry[0])[1]


def excluded_families(problem: "Problem | None", gpu: Gpu, arch: "Arch | None" = None,
                      operands: "Operands | None" = None) -> "list[tuple[str, str]]":
    """Families the target supports that this problem (or, without one, these operands) rules out entirely, each
    with the rule that does it most often (e.g. a family whose kernels take no fp8 when the problem is e4m3)."""
    arch = arch or gpu.arch
    operands = operands or problem.operands
    out = []
    for family in families_for(arch):
        counts: "dict[str, tuple[int, str]]" = {}
        feasible = False
        for config in all_configs(family):
            broken = constraints.check(config, gpu, arch, problem, operands)
            if not broken:
                feasible = True
                break
            _count_rules(counts, broken)
        if not feasible and counts:
            out.append((family, _most_broken(counts)))
    return out


# Dimensions past this are shrunk (keeping their residue mod 128, hence every alignment) to find the configurations
# that serve a problem's kind: its dtypes, layouts, epilogue and math.
SMALL_DIM = 4096


def binding_rule(family: str, problem: Problem, gpu: Gpu, arch: "Arch | None" = None) -> "str | None":
    """The rule (with its value and limit) that rules out `family`'s configurations serving this kind of problem:
    the one most often broken by those that run the same problem at small dimensions; None when none do, or when
    the problem is small already. The rule broken most often over the whole space (excluded_families) can instead
    be one that only sorts kernels by kind: a 3xTF32 problem past the K limit was refused for '3xTF32 (split3)
    kernels serve --math 3xtf32 problems, tf32 kernels the others' (broken by every tf32 kernel) rather than for
    its K."""
    import dataclasses

    arch = arch or gpu.arch
    small = dataclasses.replace(problem, **{axis: SMALL_DIM + getattr(problem, axis) % 128 for axis in "mnk"
                                            if getattr(problem, axis) > SMALL_DIM + 128})
    if small == problem:
        return None
    counts: "dict[str, tuple[int, str]]" = {}
    for config in all_configs(family):
        if constraints.check(config, gpu, arch, small, small.operands):
            continue  # not a kernel for this kind of problem at any size
        _count_rules(counts, constraints.check(config, gpu, arch, problem, problem.operands))
    return _most_broken(counts) if counts else None


def families_for(arch: "Arch | str") -> "list[str]":
    """Names of the kernel families that can be compiled for `arch` and have a template and a search space."""
    return [f.name for f in families.for_arch(arch)]


def check_target(gpu: Gpu, arch: Arch, dtype: "DType | None" = None, b_dtype: "DType | None" = None) -> None:
    """InvalidInput before any work when nothing could come of it: `arch` beyond what `gpu` runs, no family
    compiling for it, or an input dtype (A's `dtype`, B's `b_dtype`, default A's) none of those families takes
    (the registry says which dtypes and A/B pairs they take, so a family that adds one widens this with no edit
    here)."""
    if arch.cc > gpu.arch.cc or (arch.has_wgmma and not gpu.arch.has_wgmma):
        raise InvalidInput(f"arch must not exceed the GPU's ({gpu.arch.value} on {gpu.key})", arch.value)
    able = families.for_arch(arch)
    if not able:
        raise InvalidInput("arch must be one a kernel family compiles for", arch.value)
    if dtype is not None:
        taken = sorted({d.value for f in able for d in f.dtypes})
        if dtype.value not in taken:
            raise InvalidInput(f"dtype must be one the kernel families take on {gpu.key} ({arch.value}): "
                               f"{', '.join(taken)}", dtype.value)
        if b_dtype is not None and b_dtype is not dtype:
            if not any((dtype, b_dtype) in f.dtype_pairs() for f in able):
                mixed = constraints.mixed_text({p for f in able for p in f.mixed_dtypes})
                raise InvalidInput(f"A/B dtype pair must be one the kernel families take on {gpu.key} "
                                   f"({arch.value}): {mixed or 'matching A and B dtypes only'}",
                                   constraints.pair_text(dtype, b_dtype))


def heuristic_time(problem: Problem, config: TileConfig, gpu: Gpu, operands: "Operands | None" = None) -> float:
    """A relative cost without the roofline model (fallback only; smaller is better).

    Work rounded up to whole tiles and whole waves, over a per-tile efficiency that grows with the
    tile's arithmetic intensity (BM*BN/(BM+BN)) and is discounted for shallow pipelines and for the
    extra reduction pass of split-K, for padding instead of the swizzle and for ungrouped rasterization.
    """
    import math

    ops = operands or problem.operands
    cta = config.cta
    splits = config.decomposition.splits
    tiles = math.ceil(problem.m / cta.m) * math.ceil(problem.n / cta.n) * splits
    slots = max(1, constraints.ctas_per_sm(config, gpu, ops)) * gpu.sm_count
    waves = math.ceil(tiles / slots)
    k_per_cta = math.ceil(math.ceil(problem.k / cta.k) / splits) * cta.k
    intensity = cta.m * cta.n / (cta.m + cta.n)
    pipeline = {2: 0.8, 3: 0.95, 4: 1.0, 5: 1.0}.get(config.stages, 0.9)
    layout = 1.0 if config.smem_layout.value == "swizzle" else 0.97
    layout *= 1.0 if config.raster.group >= 4 else 0.98  # grouped rasterization: better L2 reuse
    work = waves * slots / gpu.sm_count * cta.m * cta.n * k_per_cta
    reduction = 0.0 if splits == 1 else 2.0 * problem.m * problem.n * splits * 64
    return (work + reduction) / (intensity * pipeline * layout)


def default_config(problem: Problem, gpu: Gpu, arch: "Arch | None" = None) -> TileConfig:
    """The configuration the model ranks first for `problem` on `gpu` (for `arch`), with the GPU's calibration
    where one is stored, as a tune and a dry run rank (`gemmgen compile`, `render` and `bench` without --config)."""
    arch = arch or gpu.arch
    candidates = [c for family in families_for(arch)
                  for c in enumerate_space(family, gpu, arch, problem, problem.operands)]
    if not candidates:
        why = "; ".join(f"{family}: {rule}" for family, rule in excluded_families(problem, gpu, arch))
        raise InvalidInput("no configuration of the search spaces fits this problem and GPU",
                           f"{problem.label} on {gpu.key} for {arch.value}", why)
    from .calibration import calibrated_predict
    from .ranking import rank_configs

    # The model ties on axes it does not price (layout, rasterization): the heuristic breaks those ties, then the
    # name, so the pick is deterministic; a configuration the model rejects is skipped, never fatal.
    ranked = rank_configs(candidates, problem, gpu, calibrated_predict, heuristic_time)
    if ranked:
        return ranked[0].config
    return min(candidates, key=lambda c: (heuristic_time(problem, c, gpu), c.tag))


__all__ = ["all_configs", "check_target", "default_config", "enumerate_space", "families_for", "heuristic_time", "space_path"]
