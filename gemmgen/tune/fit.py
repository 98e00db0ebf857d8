"""Fitting the performance model's free parameters (rank/predict.ModelParams) to the measured trials stored for one
GPU, and judging the fit on shapes it never saw.

What is fitted: every measured configuration of every stored tune (the best time of each), grouped per problem.
The loss is, per problem, the spread of log(predicted / measured) around that problem's own mean (what ranking
configurations of one shape depends on), plus a quarter weight on the mean itself (the absolute level, which the
comparison with cuBLAS and across families reads), plus a small pull towards the default constants (few shapes,
many parameters). Minimised by coordinate descent in log space over each parameter's bounds (no scipy).

How it is judged, before and after, on held-out shapes (both dtypes of a shape held out together):
  Spearman   rank correlation of predicted and measured time over the measured configurations of one problem
  top-16     whether the measured best configuration is among the model's top 16 (the tuner's diverse top-k)
             over the problem's whole current space
  zero-shot  measured best / measured time of the configuration the model ranks first among those measured
             (a tie for first: the geometric mean of the tied configurations' times)
Caveat: the stored trials are what earlier tunes chose to measure (the old model's picks and the sampler's), not
a random sample of the space, and one to five dozen per problem.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, fields, replace

from .. import families
from ..model.arch import Gpu
from ..model import parse
from ..model.errors import UserError
from ..model.problem import Problem
from ..model.tiles import TileConfig
from ..rank.predict import DEFAULT_PARAMS, ModelParams, predict
from ..rank.terms import features, fit_terms
from .calibrate import spearman

# Shapes no fit sees, fixed before any fit was run (issue 20): a mid square, a skinny M, an odd size, a long K.
HOLDOUT_SHAPES = ("2048x2048x2048", "128x8192x8192", "3000x3000x3000", "4096x4096x14336")
TOP_K = 16
OFFSET_WEIGHT = 0.25
PRIOR_WEIGHT = 0.02
# (field, low, high): the parameters the fit moves, within bounds that keep them physical.
BOUNDS = (("tma_latency_clocks", 200.0, 8000.0), ("overlap_penalty", 0.01, 1.0),
          ("l2_bytes_per_clock_per_sm", 16.0, 256.0), ("smem_bytes_per_clock_per_sm", 64.0, 256.0),
          ("dram_efficiency", 0.5, 1.0), ("dram_latency_s", 2e-7, 5e-6), ("launch_overhead_s", 5e-7, 1e-5),
          ("l2_usable_fraction", 0.1, 1.0), ("l2_skew_k_tiles", 1.0, 32.0), ("sk_fixup_s", 5e-7, 5e-5),
          ("sk_range_fixup_s", 1e-6, 6e-5), ("tma_unaligned_slowdown", 1.0, 3.0), ("fused_arrive_s", 5e-7, 2e-5))
EFFICIENCY_BOUNDS = (0.5, 1.15)  # a main loop above ~100% of peak means nothing (predict caps it)
TERMS_RIDGE = 1.0  # L2 weight on the learned terms, per unit of group weight (each problem weighs 1)
STEPS = ((0.5, 0.7, 1.4, 2.0), (0.8, 0.9, 1.1, 1.25), (0.95, 1.05))


@dataclass(frozen=True)
class Group:
    """One stored tune: its problem and (configuration, best measured seconds) of each measured configuration."""

    problem: Problem
    samples: "tuple[tuple[TileConfig, float], ...]"

    @property
    def shape(self) -> str:
        return f"{self.problem.m}x{self.problem.n}x{self.problem.k}"


def groups_from_records(records: "list[dict]", gpu: Gpu) -> "list[Group]":
    """Every non-simulated record with at least 3 measured configurations the current model can still price."""
    out = []
    for record in records:
        if record.get("simulated"):
            continue
        problem = Problem.from_dict(record["problem"])
        best: "dict[str, tuple[TileConfig, float]]" = {}
        for trial in record.get("trials", []):
            if trial.get("state") != "COMPLETE" or not trial.get("time_s") or not trial.get("config"):
                continue
            try:
                config = TileConfig.from_dict(trial["config"])
                predict(problem, config, gpu)
                time_s = parse.real("time_s", trial["time_s"], 0.0, lo_open=True)
            except UserError:
                continue  # a configuration the current space or rules no longer accept, or a damaged time
            if config.tag not in best or time_s < best[config.tag][1]:
                best[config.tag] = (config, time_s)
        if len(best) >= 3:
            out.append(Group(problem, tuple(best.values())))
    return out


def merge_groups(groups: "list[Group]") -> "list[Group]":
    """One group per problem: records of the same problem (a burst and a sustained tune, a re-run) pooled, each
    configuration's time the geometric mean of its records' best times (independent timings of one kernel on the
    H100 differ by 2-5%; their mean is the steadier figure)."""
    pooled: "dict[str, dict[str, list]]" = {}
    problems: "dict[str, Problem]" = {}
    for g in groups:
        key = json.dumps(g.problem.to_dict(), sort_keys=True)
        problems.setdefault(key, g.problem)
        for config, time_s in g.samples:
            pooled.setdefault(key, {}).setdefault(config.tag, [config, []])[1].append(time_s)
    return [Group(problems[key], tuple((config, math.exp(statistics.fmean(math.log(t) for t in times)))
                                       for config, times in by_tag.values()))
            for key, by_tag in pooled.items()]


def term_rows(groups: "list[Group]", gpu: Gpu, params: ModelParams) -> "list[tuple[int, dict, float]]":
    """(group index, features, log(measured / physical predicted)) of every sample: what fit_terms fits."""
    physical = replace(params, terms=())
    rows = []
    for i, g in enumerate(groups):
        for config, time_s in g.samples:
            pred = predict(g.problem, config, gpu, physical)
            problem = g.problem.swapped() if families.of(config).traits(config, gpu).swapped else g.problem
            rows.append((i, features(config, problem, pred.wave_efficiency), math.log(time_s / pred.time_s)))
    return rows


def fit_with_terms(groups: "list[Group]", params: ModelParams, gpu: Gpu, ridge: float = TERMS_RIDGE) -> ModelParams:
    """`params` with its learned terms refitted (rank/terms.py) on `groups`."""
    return replace(params, terms=tuple(sorted(fit_terms(term_rows(groups, gpu, params), ridge).items())))


def split(groups: "list[Group]", holdout=HOLDOUT_SHAPES) -> "tuple[list[Group], list[Group]]":
    """(train, held out): by shape, every dtype of a held-out shape held out."""
    held = set(holdout)
    return [g for g in groups if g.shape not in held], [g for g in groups if g.shape in held]


def loss(params: ModelParams, groups: "list[Group]", gpu: Gpu, prior: float = PRIOR_WEIGHT) -> float:
    total, count = 0.0, 0
    for g in groups:
        logs = [math.log(predict(g.problem, c, gpu, params).time_s / t) for c, t in g.samples]
        mean = statistics.fmean(logs)
        total += sum((x - mean) ** 2 for x in logs) + OFFSET_WEIGHT * len(logs) * mean * mean
        count += len(logs)
    pull = sum(math.log(_value(params, name, gpu) / _value(DEFAULT_PARAMS, name, gpu)) ** 2
               for name, _, _ in BOUNDS) + sum(math.log(f) ** 2 for _, f in params.efficiency_scale)
    return total / max(1, count) + prior * pull


def _value(params: ModelParams, name: str, gpu: Gpu) -> float:
    return params.l2_rate(gpu) if name == "l2_bytes_per_clock_per_sm" else getattr(params, name)


def _with(params: ModelParams, name: str, value: float) -> ModelParams:
    if name.startswith("efficiency:"):
        scale = dict(params.efficiency_scale)
        scale[name.split(":", 1)[1]] = value
        return replace(params, efficiency_scale=tuple(sorted(scale.items())))
    return replace(params, **{name: value})


def fit(groups: "list[Group]", gpu: Gpu, start: ModelParams = DEFAULT_PARAMS, on_round=None,
        prior: float = PRIOR_WEIGHT) -> ModelParams:
    """Coordinate descent: each parameter in turn multiplied by each step factor (clamped to its bounds), the best
    kept when it lowers the loss; the steps shrink round by round."""
    params = start
    families = sorted({c.family for g in groups for c, _ in g.samples})
    axes = [(name, low, high, lambda p, n=name: _value(p, n, gpu)) for name, low, high in BOUNDS]
    axes += [(f"efficiency:{f}", *EFFICIENCY_BOUNDS, lambda p, f=f: p.scale_of(f)) for f in families]
    current = loss(params, groups, gpu, prior)
    for r, steps in enumerate(STEPS):
        for _ in range(2):
            improved = False
            for name, low, high, get in axes:
                value = get(params)
                for factor in steps:
                    candidate = _with(params, name, min(high, max(low, value * factor)))
                    score = loss(candidate, groups, gpu, prior)
                    if score < current - 1e-12:
                        params, current, improved = candidate, score, True
                        value = get(params)
            if not improved:
                break
        if on_round is not None:
            on_round(r + 1, current)
    return params


@dataclass(frozen=True)
class Judged:
    """How a parameter set ranks one held-out problem."""

    label: str
    configs: int
    spearman: "float | None"
    top_k_hit: "bool | None"  # None: the measured best is not in today's space
    zero_shot: float  # measured best / measured time of the model's first among the measured


def judge(params: ModelParams, groups: "list[Group]", gpu: Gpu, top_k: int = TOP_K) -> "list[Judged]":
    from ..rank.ranking import model_top, rank_configs
    from ..rank.space import enumerate_space, families_for, heuristic_time

    out = []
    for g in groups:
        predicted = [predict(g.problem, c, gpu, params).time_s for c, _ in g.samples]
        measured = [t for _, t in g.samples]
        best_config = min(g.samples, key=lambda s: s[1])[0]
        # The model's first pick; where several configurations tie for it (knobs the model does not price), the
        # tie is worth the geometric mean over them: the records' order must not break it (it follows the tune).
        fastest = min(predicted)
        tied = [t for p, t in zip(predicted, measured) if p <= fastest * (1 + 1e-9)]
        pick_time = math.exp(statistics.fmean(math.log(t) for t in tied))
        space = [c for family in families_for(gpu.arch)
                 for c in enumerate_space(family, gpu, gpu.arch, problem=g.problem, operands=g.problem.operands)]
        ranking = rank_configs(space, g.problem, gpu, lambda p, c, gg: predict(p, c, gg, params), heuristic_time)
        top = {r.config.tag for r in model_top(ranking, top_k)}
        hit = best_config.tag in top if any(c.tag == best_config.tag for c in space) else None
        out.append(Judged(g.problem.label, len(g.samples), spearman(predicted, measured), hit,
                          min(measured) / pick_time))
    return out


def summary(judged: "list[Judged]") -> dict:
    """Median Spearman, top-k hits over the problems whose best is in the space, geomean zero-shot ratio."""
    rhos = [j.spearman for j in judged if j.spearman is not None]
    hits = [j.top_k_hit for j in judged if j.top_k_hit is not None]
    return {"problems": len(judged), "median_spearman": statistics.median(rhos) if rhos else None,
            "mean_spearman": statistics.fmean(rhos) if rhos else None,
            "top_k_hits": sum(hits), "top_k_of": len(hits),
            "zero_shot_geomean": math.exp(statistics.fmean(math.log(j.zero_shot) for j in judged)) if judged else None,
            "zero_shot_within_10pct": sum(j.zero_shot >= 1 / 1.1 for j in judged)}


def changed(params: ModelParams, gpu: Gpu) -> "dict[str, tuple[float, float]]":
    """Parameter -> (default, fitted) for each the fit moved."""
    out = {}
    for f in fields(ModelParams):
        if f.name in ("efficiency_scale", "terms"):
            continue
        before, after = _value(DEFAULT_PARAMS, f.name, gpu), _value(params, f.name, gpu)
        if before != after:
            out[f.name] = (before, after)
    for family, scale in params.efficiency_scale:
        if scale != 1.0:
            out[f"efficiency_scale.{family}"] = (1.0, scale)
    return out


__all__ = ["BOUNDS", "Group", "HOLDOUT_SHAPES", "Judged", "TERMS_RIDGE", "TOP_K", "changed", "fit", "fit_with_terms",
           "groups_from_records", "judge", "loss", "merge_groups", "split", "summary", "term_rows"]
