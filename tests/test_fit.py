"""The model fit (gemmgen calibrate --fit): parameters recovered from synthetic measurements, the calibration
file's format checked on read and used by tuning's ranking, and the command end to end on stored records."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gemmgen.cli import main  # noqa: E402
from gemmgen.model.arch import lookup_gpu  # noqa: E402
from gemmgen.model.errors import InvalidInput  # noqa: E402
from gemmgen.model.problem import Problem  # noqa: E402
from gemmgen.rank.calibration import (CALIBRATION_FORMAT, params_for, params_from_dict, params_to_dict,  # noqa: E402
                                      read_calibration, user_calibration_path)
from gemmgen.rank.predict import DEFAULT_PARAMS, predict  # noqa: E402
from gemmgen.rank.space import enumerate_space  # noqa: E402
from gemmgen.tune import fit as F  # noqa: E402

GPU = lookup_gpu("h100")
TRUTH = replace(DEFAULT_PARAMS, tma_latency_clocks=3200.0, overlap_penalty=0.3,
                efficiency_scale=(("sm90_wgmma", 0.85),))
SHAPES = ((4096, 4096, 4096), (2048, 2048, 2048), (1024, 1024, 8192), (512, 4096, 4096))


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))


def synthetic_records(params=TRUTH, per_shape=14):
    """Records whose measured times are the model's under `params` (a GPU that behaves as those say)."""
    records = []
    for m, n, k in SHAPES:
        problem = Problem.create(m, n, k, "bf16")
        configs = enumerate_space("sm90_wgmma", GPU, problem=problem)[::37][:per_shape]
        trials = [{"state": "COMPLETE", "config": c.to_dict(), "time_s": predict(problem, c, GPU, params).time_s}
                  for c in configs]
        records.append({"format": "gemmgen-tune/1", "problem": problem.to_dict(), "simulated": False,
                        "trials": trials, "winner": {"kernel": "x"}})
    return records


def test_a_fit_to_measurements_the_model_can_express_moves_towards_the_truth_and_ranks_better():
    groups = F.groups_from_records(synthetic_records(), GPU)
    train, held = F.split(groups, holdout=("512x4096x4096",))
    assert len(train) == 3 and len(held) == 1
    fitted = F.fit(train, GPU, prior=0.0)
    assert F.loss(fitted, train, GPU, 0.0) < 0.25 * F.loss(DEFAULT_PARAMS, train, GPU, 0.0)
    # The latency the truth has doubled is identified (the efficiency trades off against other parameters).
    assert abs(fitted.tma_latency_clocks - 3200) < abs(DEFAULT_PARAMS.tma_latency_clocks - 3200) / 2
    before, after = F.summary(F.judge(DEFAULT_PARAMS, held, GPU)), F.summary(F.judge(fitted, held, GPU))
    assert after["median_spearman"] >= before["median_spearman"]


def test_the_held_out_split_is_by_shape_with_every_dtype_of_a_shape_together():
    records = synthetic_records(per_shape=4)
    f16 = json.loads(json.dumps(records[0]))
    f16["problem"].update(a_dtype="f16", b_dtype="f16", c_dtype="f16")
    groups = F.groups_from_records(records + [f16], GPU)
    train, held = F.split(groups, holdout=("4096x4096x4096",))
    assert sorted(g.problem.a_dtype.value for g in held) == ["bf16", "f16"]
    assert all(g.shape != "4096x4096x4096" for g in train)


def test_simulated_records_are_never_fitted():
    records = synthetic_records(per_shape=4)
    for r in records:
        r["simulated"] = True
    assert F.groups_from_records(records, GPU) == []


def test_the_calibration_file_round_trips_and_a_bad_one_names_the_field(tmp_path):
    assert params_from_dict(params_to_dict(TRUTH)) == TRUTH
    with pytest.raises(InvalidInput, match="params.tma_latency must be a model parameter"):
        params_from_dict({"tma_latency": 3})
    with pytest.raises(InvalidInput, match="params.overlap_penalty must be a non-negative number"):
        params_from_dict({"overlap_penalty": "high"})
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": "gemmgen-calibration/0", "params": {}}))
    with pytest.raises(InvalidInput, match="must have format gemmgen-calibration/1"):
        read_calibration(path)


def test_tuning_ranks_with_the_stored_calibration_when_there_is_one():
    from gemmgen.tune.engines import default_engines

    problem = Problem.create(4096, 4096, 4096, "bf16")
    config = enumerate_space("sm90_wgmma", GPU, problem=problem)[0]
    engines = default_engines(0)
    assert params_for(GPU) == (DEFAULT_PARAMS, None)
    assert engines.predict(problem, config, GPU).time_s == predict(problem, config, GPU).time_s
    path = user_calibration_path(GPU)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": CALIBRATION_FORMAT, "params": params_to_dict(TRUTH)}))
    assert params_for(GPU) == (TRUTH, path)
    assert engines.predict(problem, config, GPU).time_s == predict(problem, config, GPU, TRUTH).time_s


def test_calibrate_fit_end_to_end_writes_the_file_and_reports_before_and_after(capsys, tmp_path):
    tunes = tmp_path / "results" / "h100-sxm" / "tunes"
    tunes.mkdir(parents=True)
    for i, record in enumerate(synthetic_records(per_shape=8)):
        (tunes / f"r{i}.json").write_text(json.dumps(record))
    assert main(["calibrate", "--fit", "--gpu", "h100", "--holdout", "512x4096x4096"]) == 0
    printed = capsys.readouterr().out
    assert "held_out before" in printed and "held_out after" in printed and "top-16" in printed
    params, payload = read_calibration(user_calibration_path(GPU))
    assert payload["fit"]["held_out_problems"] == ["512x4096x4096_bf16_rr"] and "after" in payload["fit"]["held_out"] and params != DEFAULT_PARAMS


@pytest.mark.parametrize("argv, words", [
    (["calibrate", "--fit", "--gpu", "h100", "--holdout", "4096x4096"], "--holdout must be a comma-separated"),
    (["calibrate", "--fit", "--gpu", "h100", "--prior", "-1"], "--prior must be a finite number from 0"),
])
def test_bad_fit_input_is_one_line_and_exit_2(capsys, argv, words):
    from test_cli_tune import one_line_error

    tunes = Path(__import__("os").environ["GEMMGEN_RESULTS"]) / "h100-sxm" / "tunes"
    tunes.mkdir(parents=True)
    (tunes / "r.json").write_text(json.dumps(synthetic_records(per_shape=4)[0]))
    assert words in one_line_error(capsys, argv)


def test_a_refit_keeps_the_power_ceilings_energies_fitted_from_sustained_samples(capsys, tmp_path):
    """calibrate --fit fits the constants and terms from burst records; the power ceiling's energies come from
    sustained samples (benchmarks/power_model_fit.py --write-calibration) and must survive the refit."""
    from gemmgen.rank.calibration import POWER_FIELDS

    tunes = tmp_path / "results" / "h100-sxm" / "tunes"
    tunes.mkdir(parents=True)
    for i, record in enumerate(synthetic_records(per_shape=8)):
        (tunes / f"r{i}.json").write_text(json.dumps(record))
    path = user_calibration_path(GPU)
    path.parent.mkdir(parents=True, exist_ok=True)
    energies = {"static_power_w": 90.0, "energy_pj_per_flop": 0.9, "energy_pj_per_dram_byte": 40.0,
                "energy_pj_per_l2_byte": 12.0}
    path.write_text(json.dumps({"format": "gemmgen-calibration/1", "gpu": "h100-sxm", "params": energies}))
    assert main(["calibrate", "--fit", "--gpu", "h100", "--holdout", "512x4096x4096"]) == 0
    capsys.readouterr()
    params, _ = read_calibration(path)
    assert {name: getattr(params, name) for name in POWER_FIELDS} == energies


def test_calibrate_fit_out_elsewhere_says_tuning_does_not_rank_with_it(capsys, tmp_path):
    """`calibrate --fit --out FILE` said "tuning and --dry-run rank with it" of any FILE, though tuning reads only
    <data dir>/calibration/<gpu>.json and results/<gpu>/calibration.json (first found): a fit written elsewhere,
    or behind another calibration, was silently never used. It now says which file tuning ranks with."""
    tunes = tmp_path / "results" / "h100-sxm" / "tunes"
    tunes.mkdir(parents=True)
    for i, record in enumerate(synthetic_records(per_shape=6)):
        (tunes / f"r{i}.json").write_text(json.dumps(record))
    elsewhere = tmp_path / "fits" / "h100.json"
    assert main(["calibrate", "--fit", "--gpu", "h100", "--holdout", "512x4096x4096", "--out", str(elsewhere)]) == 0
    printed = capsys.readouterr().out
    assert elsewhere.is_file() and params_for(GPU) == (DEFAULT_PARAMS, None)
    assert "rank with it" not in printed
    assert "not used: tuning and --dry-run on h100-sxm rank with the model's defaults" in printed
    assert str(user_calibration_path(GPU)) in printed
    # At the path tuning reads first, the claim holds, in --json too.
    assert main(["calibrate", "--fit", "--gpu", "h100", "--holdout", "512x4096x4096", "--json",
                 "--out", str(user_calibration_path(GPU))]) == 0
    assert json.loads(capsys.readouterr().out)["used_by_tuning"] is True
    shadowed = tmp_path / "results" / "h100-sxm" / "calibration.json"
    assert main(["calibrate", "--fit", "--gpu", "h100", "--holdout", "512x4096x4096", "--out", str(shadowed)]) == 0
    assert f"rank with the calibration in {user_calibration_path(GPU)}" in capsys.readouterr().out
