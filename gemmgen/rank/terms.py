"""Learned correction terms on top of the physical model: named features of a configuration, each with a fitted
weight in log time (`ModelParams.terms`, fitted by `gemmgen calibrate --fit`).

predicted time = physical time (predict.py: roofline, waves, latency, overheads) x exp(sum of weight x feature).

Why: the physical model prices tiles, waves and traffic, but not what the hardware does with choices it cannot see
(raster order against cluster orientation, a store warp, stage counts beyond covering the latency, the warpgroup
tile shape). Those show up in measured records of other shapes as consistent ratios; a feature per choice with
its weight states each such ratio in the calibration file, where a person can read it (`tile:128x256 -0.031`: that
CTA tile runs 3% faster than the physical model says, against the average of the tiles measured). Every feature is
built from the configuration's generic fields (no family is named), and a feature never seen in a fit has weight
0: the physical model alone.
"""
from __future__ import annotations

import math

from ..model.problem import Problem
from ..model.tiles import TileConfig


def features(config: TileConfig, problem: Problem, wave_eff: float) -> "dict[str, float]":
    """The configuration's features on `problem` (name -> value; absent means 0). One-hot choices name their value;
    `wave_eff` is the physical model's fraction of the last wave's slots doing work."""
    cta, warp, cl = config.cta, config.warp, config.cluster
    order = config.raster.order.value
    out = {
        f"tile:{cta.m}x{cta.n}": 1.0,
        f"bk:{cta.k}": 1.0,
        f"warp:{warp.m}x{warp.n}": 1.0,
        f"stages:{config.stages}": 1.0,
        f"raster:{order}{config.raster.group}": 1.0,
        f"cluster:{cl.m}x{cl.n}/{order}": 1.0,
        f"decomp:{config.decomposition.kind.value}{'_fused' if config.decomposition.fused else ''}": 1.0,
        # How much of the last wave idles: the physical model charges it in full; measured tails cost less
        # where the next tile's prologue overlaps (persistent kernels) and more where the tail CTAs are slower.
        "tail": 1.0 - wave_eff,
        "family:" + config.family: 1.0,
    }
    for knob, value in config.knob_values().items():
        if value != type(config).KNOBS.get(knob):
            out[f"knob:{knob}={value}"] = 1.0
    # Tile against problem: a tile wider than the problem in M or N computes padding the waves term does not see
    # on a small grid.
    out["pad_m"] = math.ceil(problem.m / cta.m) * cta.m / problem.m - 1.0
    out["pad_n"] = math.ceil(problem.n / cta.n) * cta.n / problem.n - 1.0
    # Clusters launch whole: tiles past the problem's edge that a cluster still covers are CTAs that hold an SM
    # and do nothing (a 2x1 cluster over one tile row launches twice the CTAs).
    tiles_m, tiles_n = math.ceil(problem.m / cta.m), math.ceil(problem.n / cta.n)
    out["cluster_pad"] = (math.ceil(tiles_m / cl.m) * cl.m * math.ceil(tiles_n / cl.n) * cl.n) / (tiles_m * tiles_n) - 1
    return out


def correction(terms: "tuple[tuple[str, float], ...]", config: TileConfig, problem: Problem, wave_eff: float) -> float:
    """exp(sum of weight x feature): the factor the terms put on the physical time (1 with no terms)."""
    if not terms:
        return 1.0
    weights = dict(terms)
    return math.exp(sum(weights.get(name, 0.0) * value for name, value in features(config, problem, wave_eff).items()))


__all__ = ["correction", "features"]


def fit_terms(rows: "list[tuple[object, dict, float]]", ridge: float) -> "dict[str, float]":
    """Weights that best explain, within each group (one problem), log(measured / physical) by the features.

    rows: (group key, features, log(measured / physical predicted)). Each group is centred on its own mean, so only
    differences between configurations of one problem are fitted (what ranking reads; a problem's overall level is
    the physical model's). Groups weigh equally whatever their size. Ridge (L2, `ridge` per unit of group weight)
    keeps a feature seen in few configurations near 0."""
    import numpy as np   # the fit only: predicting with fitted terms needs no numpy

    names = sorted({name for _, feats, _ in rows for name in feats})
    index = {name: i for i, name in enumerate(names)}
    by_group: "dict[object, list[tuple[dict, float]]]" = {}
    for key, feats, y in rows:
        by_group.setdefault(key, []).append((feats, y))
    xs, ys, ws = [], [], []
    for members in by_group.values():
        if len(members) < 2:
            continue
        x = np.zeros((len(members), len(names)))
        for r, (feats, _) in enumerate(members):
            for name, value in feats.items():
                x[r, index[name]] = value
        y = np.array([y for _, y in members])
        xs.append(x - x.mean(axis=0))
        ys.append(y - y.mean())
        ws.append(np.full(len(members), 1.0 / len(members)))
    if not xs:
        return {}
    x, y, w = np.vstack(xs), np.concatenate(ys), np.concatenate(ws)
    xw = x * w[:, None]
    weights = np.linalg.solve(x.T @ xw + ridge * np.eye(len(names)), xw.T @ y)
    return {name: float(v) for name, v in zip(names, weights) if abs(v) > 1e-6}


__all__ += ["fit_terms"]
