"""The model's learned terms (rank/terms.py) and how they are judged: a term moves exactly the configurations whose
feature it names, the ridge fit recovers planted weights, calibration files carry terms and refuse bad ones, the
unaligned-TMA slowdown is shared by a cluster's multicast, the held-out list is the fit's, and on the stored H100
records the shipped calibration picks within 10% of the tuned best on the held-out shapes."""
from __future__ import annotations

import json
import math
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gemmgen.model.arch import lookup_gpu  # noqa: E402
from gemmgen.model.errors import InvalidInput  # noqa: E402
from gemmgen.model.problem import Problem  # noqa: E402
from gemmgen.model.tiles import TileConfig  # noqa: E402
from gemmgen.rank.calibration import params_from_dict, params_to_dict, read_calibration  # noqa: E402
from gemmgen.rank.predict import DEFAULT_PARAMS, predict  # noqa: E402
from gemmgen.rank.space import enumerate_space  # noqa: E402
from gemmgen.rank.terms import features, fit_terms  # noqa: E402
from gemmgen.tune import fit as F  # noqa: E402

GPU = lookup_gpu("h100")
SQ = Problem.create(4096, 4096, 4096, "bf16")


def sm90_configs(problem, count=40):
    configs = [c for c in enumerate_space("sm90_wgmma", GPU, problem=problem)]
    assert len(configs) >= count
    return random.Random(7).sample(configs, count)


def test_no_terms_leave_the_physical_time_unchanged():
    for config in sm90_configs(SQ, 10):
        pred = predict(SQ, config, GPU)
        assert pred.correction == 1.0
        assert pred.time_s == pytest.approx(max(pred.compute_s, pred.memory_s, pred.power_bound_s) + pred.overhead_s,
                                            rel=1e-12)


def test_a_term_scales_exactly_the_configurations_whose_feature_it_names():
    params = replace(DEFAULT_PARAMS, terms=(("tile:128x256", math.log(1.25)),))
    for config in sm90_configs(SQ, 30):
        ratio = predict(SQ, config, GPU, params).time_s / predict(SQ, config, GPU).time_s
        expected = 1.25 if (config.cta.m, config.cta.n) == (128, 256) else 1.0
        assert ratio == pytest.approx(expected, rel=1e-9), config.tag


def test_features_name_no_family_in_code_but_come_from_the_config():
    config = sm90_configs(SQ, 1)[0]
    feats = features(config, SQ, 1.0)
    assert feats[f"tile:{config.cta.m}x{config.cta.n}"] == 1.0
    assert feats[f"family:{config.family}"] == 1.0
    assert feats["tail"] == 0.0


def test_fit_terms_recovers_planted_weights_within_each_group():
    rng = random.Random(3)
    truth = {"a": 0.2, "b": -0.1}
    rows = []
    for group in range(12):
        level = rng.uniform(-1, 1)  # each group's own level: must not leak into the weights
        for _ in range(15):
            feats = {name: float(rng.random() < 0.5) for name in truth}
            rows.append((group, feats, level + sum(truth[n] * v for n, v in feats.items())))
    fitted = fit_terms(rows, ridge=1e-6)
    assert fitted["a"] == pytest.approx(0.2, abs=1e-3)
    assert fitted["b"] == pytest.approx(-0.1, abs=1e-3)


def test_calibration_file_carries_terms_and_refuses_non_numeric_weights():
    params = replace(DEFAULT_PARAMS, terms=(("stages:4", -0.02), ("tile:128x256", 0.03)))
    assert params_from_dict(json.loads(json.dumps(params_to_dict(params)))) == params
    with pytest.raises(InvalidInput, match="terms must map feature names to finite weights"):
        params_from_dict({"terms": {"tile:128x256": "fast"}})
    with pytest.raises(InvalidInput, match="terms must map"):
        params_from_dict({"terms": [0.1]})


def _with_cluster(config: TileConfig, cluster: str) -> TileConfig:
    return TileConfig.from_dict(dict(config.to_dict(), cluster=cluster))


def test_a_multicasting_cluster_pays_a_smaller_share_of_the_unaligned_tma_slowdown():
    """docs/perf-notes.md (odd3000): a 1x2 cluster gained more at unaligned rows than at aligned ones."""
    odd, even = Problem.create(3000, 3000, 3000, "bf16"), Problem.create(3072, 3072, 3072, "bf16")
    base = next(c for c in enumerate_space("sm90_wgmma", GPU, problem=odd)
                if (c.cta.m, c.cta.n) == (128, 256) and str(c.cluster) == "1x1" and c.decomposition.kind.value == "dp")
    gain = {}
    for name, problem in (("odd", odd), ("even", even)):
        one = predict(problem, base, GPU).time_s
        two = predict(problem, _with_cluster(base, "1x2"), GPU).time_s
        gain[name] = one / two
    assert gain["odd"] > gain["even"] * 1.03


def test_the_held_out_file_is_the_fits_default_holdout():
    from calibration_eval import heldout_shapes

    assert heldout_shapes(ROOT / "benchmarks/suites/heldout.yaml") == F.HOLDOUT_SHAPES


def test_merged_records_take_the_geometric_mean_of_one_configurations_times():
    config = sm90_configs(SQ, 1)[0]
    other = sm90_configs(SQ, 2)[1]
    merged = F.merge_groups([F.Group(SQ, ((config, 1e-4), (other, 2e-4))), F.Group(SQ, ((config, 4e-4),))])
    assert len(merged) == 1
    times = {c.tag: t for c, t in merged[0].samples}
    assert times[config.tag] == pytest.approx(2e-4) and times[other.tag] == pytest.approx(2e-4)


def test_the_shipped_h100_calibration_picks_within_10pct_on_the_held_out_shapes():
    """The issue's zero-shot goal on stored records (benchmarks/calibration_eval.py): within 10% of the tuned best
    on >= 85% of the held-out problems and a geomean >= 0.95, with the calibration fitted without them."""
    from calibration_eval import DEFAULT_RECORDS, load_groups

    params, payload = read_calibration(ROOT / "results/h100-sxm/calibration.json")
    assert set(payload["fit"]["holdout"]) == set(F.HOLDOUT_SHAPES)
    assert not any(p.split("_")[0] in F.HOLDOUT_SHAPES for p in payload["fit"]["train_problems"])
    _, held = F.split(load_groups(DEFAULT_RECORDS, GPU))
    judged = F.judge(params, held, GPU)
    assert len(judged) == 8
    within = sum(j.zero_shot >= 1 / 1.1 for j in judged)
    assert within >= 0.85 * len(judged)
    assert math.exp(sum(math.log(j.zero_shot) for j in judged) / len(judged)) >= 0.95


def test_zero_shot_plan_has_a_pick_and_a_stored_tuned_winner_for_every_suite_problem():
    from zero_shot import plan, shapes, tuned_records

    files = [str(ROOT / "results/shapes.yaml"), str(ROOT / "benchmarks/suites/heldout.yaml")]
    problems, kernels = plan(files, ["bf16"], GPU, {"zero_shot": DEFAULT_PARAMS}, tuned_records(GPU.key))
    assert len(problems) == len(shapes(files)) == 11   # llm_o is sq4096; the held-out shapes are suite shapes
    assert sum(p["held_out"] for p in problems) == 4
    for p in problems:
        assert p["kernels"]["zero_shot"] and p["kernels"]["tuned"], p["name"]
    assert all(k.name in kernels for p in problems for ks in p["kernels"].values() for k in ks)
