"""How well the roofline model predicts what the GPU measured: rank correlation per tune, and the
measured/predicted ratio per kernel family with the efficiency constant it suggests.

Pure: reads tuning records (results/<gpu>/tunes/*.json) and re-predicts each measured trial with the
current model and the parameters given (the CLI passes what tuning ranks with: the GPU's calibration, else the
defaults), so the answer reflects the model as it is now, not as it was when the trial ran.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..model.arch import Gpu
from ..model import parse
from ..model.errors import UserError
from ..rank.predict import ModelParams, predict, tensor_efficiency
from ..model.problem import Problem
from ..model.tiles import TileConfig


@dataclass(frozen=True)
class TuneFit:
    """One tune: how many measured trials, Spearman's rho between predicted and measured time, and the
    median of measured/predicted time (above 1: slower than the model said)."""

    label: str
    trials: int
    spearman: "float | None"
    median_ratio: float


@dataclass(frozen=True)
class FamilyFit:
    family: str
    trials: int
    median_ratio: float  # measured time / predicted time over every trial of the family
    efficiency_now: float
    efficiency_suggested: float  # to first order (compute-bound trials), the constant that centres them


def ranks(values: "list[float]") -> "list[float]":
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: "list[float]", y: "list[float]") -> "float | None":
    """Spearman's rank correlation; None with fewer than 3 points or no spread."""
    if len(x) < 3:
        return None
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def measured_pairs(record: dict, gpu: Gpu, params: "ModelParams | None" = None) -> "list[tuple[str, float, float]]":
    """(family, predicted s, measured s) for every completed, measured trial the model can still price (with
    `params`, by default the model's defaults)."""
    problem = Problem.from_dict(record["problem"])
    out = []
    for trial in record.get("trials", []):
        if trial.get("state") != "COMPLETE" or not trial.get("time_s") or not trial.get("config"):
            continue
        try:
            config = TileConfig.from_dict(trial["config"])
            predicted = predict(problem, config, gpu, params).time_s
            measured = parse.real("time_s", trial["time_s"], 0.0, lo_open=True)
        except UserError:
            continue  # a configuration the current space or model no longer accepts, or a damaged time
        out.append((config.family, predicted, measured))
    return out


def calibrate(records: "list[dict]", gpu: Gpu,
              params: "ModelParams | None" = None) -> "tuple[list[TuneFit], list[FamilyFit]]":
    """Every measured tune's fit and every family's, predicted with `params` (default: the model's defaults); a
    family's efficiency now is the one those parameters give it (its constant times their scale on it)."""
    tunes, by_family = [], {}
    for record in records:
        if record.get("simulated"):
            continue  # replayed timings say nothing about the GPU
        pairs = measured_pairs(record, gpu, params)
        if not pairs:
            continue
        label = Problem.from_dict(record["problem"]).label
        tunes.append(TuneFit(label, len(pairs), spearman([p for _, p, _ in pairs], [m for _, _, m in pairs]),
                             statistics.median(m / p for _, p, m in pairs)))
        for family, p, m in pairs:
            by_family.setdefault(family, []).append(m / p)
    families = []
    for family, ratios in sorted(by_family.items(), key=lambda kv: kv[0]):
        ratio = statistics.median(ratios)
        now = tensor_efficiency(family, gpu) * (params.scale_of(family) if params is not None else 1.0)
        families.append(FamilyFit(family, len(ratios), ratio, now, now / ratio))
    return tunes, families
