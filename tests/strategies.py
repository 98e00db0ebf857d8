"""Hypothesis strategies over every registered kernel family, driven by the registry and the search spaces.

`feasible_configs()` draws (config, gpu) pairs that the feasibility check accepts, for every family: a point of
the family's space that is feasible on that GPU, with the axes no rule constrains (rasterization) redrawn.
`near_configs()` starts from a space point and moves one axis to a value that may break a rule, so the check's
boundary is exercised from both sides.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from hypothesis import strategies as st

from gemmgen import families
from gemmgen.model.arch import catalogue
from gemmgen.model.problem import Layout, Operands
from gemmgen.model.tiles import Cluster, DecompKind, Decomposition, Raster, RasterOrder, Shape3, SmemLayout
from gemmgen.rank.space import all_configs, enumerate_space

GPUS = tuple(sorted(catalogue().values(), key=lambda g: g.key))


LAYOUTS = tuple(Operands(a_layout=Layout(a), b_layout=Layout(b)) for a in ("row", "col") for b in ("row", "col"))


@lru_cache(maxsize=None)
def feasible_pairs(family: str) -> tuple:
    """Every (config, gpu) of `family`'s space the check accepts for some layout of A and B, over the catalogue's
    GPUs (a family may take only some layouts: sm80_skinny reads K-contiguous operands)."""
    fam = families.get(family)
    return tuple(dict.fromkeys((c, g) for g in GPUS if fam.supports_arch(g.arch) for ops in LAYOUTS
                               for c in enumerate_space(family, g, operands=ops)))


def family_names() -> "list[str]":
    return [f.name for f in families.all_families() if f.available()]


@st.composite
def feasible_configs(draw, family: "str | None" = None):
    name = family or draw(st.sampled_from(family_names()))
    config, gpu = draw(st.sampled_from(feasible_pairs(name)))
    raster = Raster(draw(st.sampled_from(list(RasterOrder))), draw(st.sampled_from([1, 2, 4, 8, 16])))
    return replace(config, raster=raster), gpu


def _moves(config) -> "list[st.SearchStrategy]":
    """One-axis changes of `config`, to values on both sides of the rules."""
    c = config
    moves = [
        st.builds(lambda s: replace(c, stages=s), st.integers(1, 14)),
        st.builds(lambda m, n: replace(c, cta=Shape3(m, n, c.cta.k)), st.sampled_from([16, 32, 64, 96, 128, 192, 256, 512]),
                  st.sampled_from([16, 32, 64, 96, 128, 192, 256, 512])),
        st.builds(lambda m, n: replace(c, warp=Shape3(m, n, c.warp.k)), st.sampled_from([16, 32, 64, 128, 256]),
                  st.sampled_from([16, 32, 64, 128, 256])),
        st.builds(lambda k: replace(c, cta=Shape3(c.cta.m, c.cta.n, k), warp=Shape3(c.warp.m, c.warp.n, k)),
                  st.sampled_from([16, 32, 64, 128, 256])),
        st.builds(lambda layout: replace(c, smem_layout=layout), st.sampled_from(list(SmemLayout))),
        st.builds(lambda kind, s, f: replace(c, decomposition=Decomposition(kind, s, f)),
                  st.sampled_from(list(DecompKind)), st.sampled_from([1, 2, 3, 4, 16, 32]), st.booleans()),
        st.builds(lambda m, n: replace(c, cluster=Cluster(m, n)), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2])),
        st.builds(lambda g: replace(c, raster=Raster(c.raster.order, g)), st.sampled_from([1, 2, 3, 4, 8, 16, 32])),
    ]
    for knob, default in type(c).KNOBS.items():
        if isinstance(default, bool):
            values = [True, False]
        elif isinstance(default, int):   # a count (fp8 promotion interval): valid and invalid values
            values = [0, 1, 2, 3, 4, 8]
        else:
            values = [type(getattr(c, knob))(e.value) for e in type(getattr(c, knob))]
        moves.append(st.builds(lambda v, knob=knob: replace(c, **{knob: v}), st.sampled_from(values)))
    return moves


@st.composite
def near_configs(draw, family: "str | None" = None):
    """A space point of `family` (feasible or not) with up to two axes moved: near the feasible region. Some draws
    move none, so that a family whose space points break a rule at almost any single move (the sm90 widths: warp N
    tied to CTA N, stages to shared memory) still shows its feasible side."""
    name = family or draw(st.sampled_from(family_names()))
    config = draw(st.sampled_from(all_configs(name)))
    for _ in range(draw(st.integers(0, 2))):
        config = draw(st.one_of(_moves(config)))
    return config


__all__ = ["GPUS", "family_names", "feasible_configs", "feasible_pairs", "near_configs"]
