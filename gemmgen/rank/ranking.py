"""The search space as Optuna parameters (categorical per axis) and the model's ranking of it."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

from .. import families
from ..model.arch import Gpu
from ..model.errors import InvalidInput, UserError
from ..model.problem import Problem
from ..model.tiles import Shape3, TileConfig


# Bump when the mapping between parameters and configurations changes: it is part of study names.
SPACE_FORMAT = 4  # 2: the schedule axis (cooperative | pingpong); 3: the store_warp axis; 4: swap_ab
# Axes every family has; each family's knobs follow (its config type's KNOBS, in their order).
BASE_AXES = ("cta", "warps", "mma", "stages", "smem_layout", "raster_order", "raster_group", "decomposition", "cluster")


def axes_for(family: str) -> "tuple[str, ...]":
    """The search axes of one family: the shared ones, then its knobs."""
    return BASE_AXES + tuple(families.get(family).config_type.KNOBS)


def _plain(value):
    return value.value if hasattr(value, "value") else value


def axis_values(config: TileConfig) -> dict:
    """A configuration as one value per axis: what Optuna samples and the dashboard shows."""
    return {
        "cta": str(config.cta), "warps": f"{config.warps_m}x{config.warps_n}", "mma": str(config.mma),
        "stages": config.stages, "smem_layout": config.smem_layout.value,
        "raster_order": config.raster.order.value, "raster_group": config.raster.group,
        "decomposition": config.decomposition.tag, "cluster": str(config.cluster),
        **{k: _plain(getattr(config, k)) for k in type(config).KNOBS},
    }


def _decomposition(tag: str) -> dict:
    """Inverse of Decomposition.tag (dp, streamk, splitk<S>, splitk<S>f: fused reduction), in dict form."""
    fused = tag.startswith("splitk") and tag.endswith("f")
    if fused:
        tag = tag[:-1]
    if tag.startswith("splitk"):
        return {"kind": "splitk", "splits": int(tag[len("splitk"):]), "fused": fused}
    return {"kind": tag, "splits": 1}


def config_from_axes(family: str, values: dict) -> TileConfig:
    """Inverse of axis_values; raises InvalidInput when the warp arrangement does not divide the tile."""
    cta = Shape3.parse(values["cta"], "CTA tile")
    wm, wn = (int(v) for v in str(values["warps"]).split("x"))
    if cta.m % wm or cta.n % wn:
        raise InvalidInput("the CTA tile must split evenly over the warp arrangement",
                           f"{cta} over {values['warps']}")
    knobs = families.get(family).config_type.KNOBS
    return TileConfig.from_dict({
        "family": family, "cta": str(cta), "warp": str(Shape3(cta.m // wm, cta.n // wn, cta.k)),
        "mma": values["mma"], "stages": int(values["stages"]), "smem_layout": values["smem_layout"],
        "raster": {"order": values["raster_order"], "group": int(values["raster_group"])},
        "decomposition": _decomposition(str(values["decomposition"])), "cluster": values["cluster"],
        **{k: values.get(k, default) for k, default in knobs.items()}})


def _sort_key(value):
    """Numeric order for '128x64x32'-style values, natural order otherwise; stable across runs."""
    if isinstance(value, str):
        parts = value.replace("splitk", "").split("x")
        if all(p.isdigit() for p in parts):
            return (0, tuple(int(p) for p in parts), value)
        return (1, (), value)
    return (0, (int(value),), str(value))


class SearchSpace:
    """Valid configurations, and their encoding as Optuna categorical parameters.

    Per family, an axis with a single value is fixed (not sampled). The MMA shape is not sampled
    when the other axes determine it (sm90: N equals the warpgroup tile), so TPE does not waste
    trials on mismatches. `check_fn(config) -> [Violation]` explains points outside the space.
    """

    def __init__(self, configs: "list[TileConfig]", check_fn: "Callable[[TileConfig], list]"):
        if not configs:
            raise InvalidInput("the search space must hold at least one valid configuration", 0)
        self.configs = tuple(dict.fromkeys(configs))
        self.check_fn = check_fn
        self.families = tuple(sorted({c.family for c in self.configs}))
        self.sampled: "dict[str, tuple[tuple[str, tuple], ...]]" = {}
        self.fixed: "dict[str, dict]" = {}
        self.index: "dict[tuple, TileConfig]" = {}
        self._mma_choices: "dict[str, tuple]" = {}
        for fam in self.families:
            members = [c for c in self.configs if c.family == fam]
            values = [axis_values(c) for c in members]
            all_axes = axes_for(fam)
            choices = {a: tuple(sorted({v[a] for v in values}, key=_sort_key)) for a in all_axes}
            keyed = [a for a in all_axes if a != "mma"]
            mma_derived = len({tuple(v[a] for a in keyed) for v in values}) == len(values)
            axes = [a for a in all_axes if len(choices[a]) > 1 and not (a == "mma" and mma_derived)]
            self.sampled[fam] = tuple((a, choices[a]) for a in axes)
            self.fixed[fam] = {a: choices[a][0] for a in all_axes if a not in axes}
            self._mma_choices[fam] = choices["mma"]
            for c, v in zip(members, values):
                self.index[self._key(fam, v, mma_derived)] = c
            self.fixed[fam]["_mma_derived"] = mma_derived

    @staticmethod
    def _key(fam: str, values: dict, mma_derived: bool) -> tuple:
        return (fam,) + tuple(values[a] for a in axes_for(fam) if not (mma_derived and a == "mma"))

    def __len__(self) -> int:
        return len(self.configs)

    @property
    def version(self) -> str:
        """Short hash of the valid set and its encoding: part of the study name."""
        text = f"{SPACE_FORMAT}|" + "|".join(sorted(c.tag for c in self.configs))
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    def param_names(self) -> "list[str]":
        names = ["family"] if len(self.families) > 1 else []
        return names + [f"{fam}.{a}" for fam in self.families for a, _ in self.sampled[fam]]

    def distributions(self, family: str) -> dict:
        from optuna.distributions import CategoricalDistribution

        out = {"family": CategoricalDistribution(list(self.families))} if len(self.families) > 1 else {}
        out.update({f"{family}.{a}": CategoricalDistribution(list(ch)) for a, ch in self.sampled[family]})
        return out

    def params(self, config: TileConfig) -> dict:
        """The parameters that make a trial sample `config` (for enqueue_trial and add_trial)."""
        fam, values = config.family, axis_values(config)
        out = {"family": fam} if len(self.families) > 1 else {}
        out.update({f"{fam}.{a}": values[a] for a, _ in self.sampled[fam]})
        return out

    def suggest(self, trial) -> "tuple[TileConfig | None, str]":
        """Sample a point through `trial`; (config, "") if valid, else (None, the broken rule)."""
        fam = trial.suggest_categorical("family", list(self.families)) if len(self.families) > 1 else self.families[0]
        values = {k: v for k, v in self.fixed[fam].items() if not k.startswith("_")}
        for axis, choices in self.sampled[fam]:
            values[axis] = trial.suggest_categorical(f"{fam}.{axis}", list(choices))
        return self.resolve(fam, values)

    def decode(self, params: dict) -> "TileConfig | None":
        """The configuration a finished trial's parameters name, or None if outside the space."""
        fam = params.get("family", self.families[0])
        if fam not in self.sampled:
            return None
        values = {k: v for k, v in self.fixed[fam].items() if not k.startswith("_")}
        for axis, _ in self.sampled[fam]:
            if f"{fam}.{axis}" not in params:
                return None
            values[axis] = params[f"{fam}.{axis}"]
        return self.resolve(fam, values)[0]

    def resolve(self, fam: str, values: dict) -> "tuple[TileConfig | None, str]":
        derived = self.fixed[fam]["_mma_derived"]
        if derived:
            values = dict(values, mma=self._guess_mma(fam, values))
        found = self.index.get(self._key(fam, values, derived))
        if found is not None:
            return found, ""
        try:
            candidate = config_from_axes(fam, values)
        except (InvalidInput, ValueError) as exc:
            return None, str(exc)
        violations = self.check_fn(candidate)
        if violations:
            return None, "; ".join(str(v) for v in violations)
        return None, f"not in the {fam} search space (search_spaces/{fam}.yaml)"

    def _guess_mma(self, fam: str, values: dict) -> str:
        """The family's MMA shape that fits this point's warp tile (widest N dividing it)."""
        choices = self._mma_choices[fam]
        try:
            cta = Shape3.parse(values["cta"])
            wm, wn = (int(v) for v in str(values["warps"]).split("x"))
            warp_n = cta.n // wn
        except (InvalidInput, ValueError, ZeroDivisionError):
            return choices[0]
        fitting = [m for m in choices if warp_n % Shape3.parse(m).n == 0]
        return max(fitting, key=lambda m: Shape3.parse(m).n) if fitting else choices[0]


# --- the model's ranking -----------------------------------------------------------------------

@dataclass(frozen=True)
class Ranked:
    """A configuration with the model's prediction and its place in the ranking (0 = best)."""

    config: TileConfig
    time_s: float
    tflops: float
    bound: str
    rank: int


def rank_configs(configs, problem: Problem, gpu: Gpu, predict, tiebreak=None) -> "list[Ranked]":
    """Every configuration, fastest predicted first.

    The model ties on axes it does not price (stages, layout, rasterization): `tiebreak` (space's
    heuristic, as default_config uses) orders those, then the name, so the order is stable and the
    first is the same pick as `gemmgen compile`'s. A configuration the model rejects is left out.
    """
    scored = []
    for c in configs:
        try:
            p = predict(problem, c, gpu)
        except UserError:
            continue
        t = float(p.time_s)
        second = float(tiebreak(problem, c, gpu)) if tiebreak else 0.0
        scored.append(((t, second, c.tag), c, float(getattr(p, "tflops", problem.flops / t / 1e12)),
                       str(getattr(p, "bound", ""))))
    scored.sort(key=lambda s: s[0])
    return [Ranked(c, key[0], tf, b, i) for i, (key, c, tf, b) in enumerate(scored)]


def model_top(ranking: "list[Ranked]", k: int, diverse: bool = True, skip=None) -> "list[Ranked]":
    """The model's top-k in model order, without the ones `skip` rejects (quarantined kernels).

    The model does not price stages, layout or rasterization, so its top ranks are often one tile
    in many variants. With `diverse`, at most max(2, k/4) per (family, CTA tile, warp tile) are
    taken, so the first trials also test the model's choice of tile; the sampler covers variants.
    """
    per_tile = max(2, k // 4) if diverse else k
    picks, per = [], {}
    for r in ranking:
        if len(picks) >= k:
            break
        tile = (r.config.family, r.config.cta, r.config.warp)
        if per.get(tile, 0) >= per_tile or (skip is not None and skip(r)):
            continue
        per[tile] = per.get(tile, 0) + 1
        picks.append(r)
    return picks


# --- engines: what the search drives (injectable, so tests run without NVRTC or a GPU) -----------
