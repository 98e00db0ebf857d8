"""The calibration report: rank correlation and measured/predicted ratios from stored tunes."""

import json

import pytest

from gemmgen.model.arch import lookup_gpu
from gemmgen.tune.calibrate import calibrate, ranks, spearman
from gemmgen.rank.predict import predict
from gemmgen.model.problem import Problem
from gemmgen.rank.space import enumerate_space


GPU = lookup_gpu("h100")


def test_ranks_share_ties_and_spearman_is_one_for_any_monotone_relation():
    assert ranks([3.0, 1.0, 3.0]) == [2.5, 1.0, 2.5]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 400]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None  # too few points to rank


def _record(problem, configs, slowdown):
    trials = [{"state": "COMPLETE", "config": c.to_dict(), "time_s": predict(problem, c, GPU).time_s * slowdown(i)}
              for i, c in enumerate(configs)]
    trials.append({"state": "FAIL", "config": configs[0].to_dict(), "time_s": None})  # ignored
    return {"problem": problem.to_dict(), "trials": trials}


def test_a_model_that_is_right_up_to_a_constant_gets_rho_one_and_that_constant_as_ratio():
    problem = Problem.create(4096, 4096, 4096)
    configs = enumerate_space("sm90_wgmma", GPU, problem=problem)[:8]
    tunes, families = calibrate([_record(problem, configs, lambda i: 1.25)], GPU)
    [tune] = tunes
    assert tune.trials == len(configs) and tune.median_ratio == pytest.approx(1.25)
    [fam] = families
    assert fam.family == "sm90_wgmma" and fam.efficiency_suggested == pytest.approx(fam.efficiency_now / 1.25)
    if tune.spearman is not None:  # predictions may tie; where they do not, the order is exact
        assert tune.spearman == pytest.approx(1.0)


def test_simulated_tunes_are_left_out_and_the_cli_says_when_nothing_is_stored(tmp_path, monkeypatch, capsys):
    problem = Problem.create(1024, 1024, 1024)
    configs = enumerate_space("sm90_wgmma", GPU, problem=problem)[:4]
    record = dict(_record(problem, configs, lambda i: 1.0), simulated=True)
    assert calibrate([record], GPU) == ([], [])

    from gemmgen.cli import main

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path))  # read at call time: an empty database
    assert main(["calibrate", "--gpu", "h100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "calibration needs measured tunes" in err[0]


def test_a_gpu_without_its_own_calibration_ranks_with_its_chips(tmp_path, monkeypatch):
    """An H200 (the H100 SXM's chip, SM count and power) uses the H100 SXM's calibration when it has none; a
    GPU of another chip (an A100) does not borrow it."""
    from gemmgen.model import paths
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.rank import calibration

    results = tmp_path / "results"
    (results / "h100-sxm").mkdir(parents=True)
    fitted = {"format": calibration.CALIBRATION_FORMAT, "params": {"dram_efficiency": 0.77}}
    (results / "h100-sxm" / "calibration.json").write_text(json.dumps(fitted))
    monkeypatch.setattr(paths, "results_dirs", lambda: [results])
    monkeypatch.setattr(paths, "user_data_dir", lambda: tmp_path / "user")
    params, path = calibration.params_for(lookup_gpu("h200"))
    assert path == results / "h100-sxm" / "calibration.json" and params.dram_efficiency == 0.77
    assert calibration.params_for(lookup_gpu("a100"))[1] is None
    (results / "h200").mkdir()
    (results / "h200" / "calibration.json").write_text(json.dumps({**fitted, "params": {"dram_efficiency": 0.8}}))
    assert calibration.params_for(lookup_gpu("h200"))[0].dram_efficiency == 0.8   # its own comes first


def test_the_report_ranks_with_the_calibration_tuning_uses_and_names_it(tmp_path, monkeypatch, capsys):
    """Without --fit, calibrate priced every trial with the model's defaults while tune and --dry-run rank with the
    GPU's calibration, so its rho and ratios judged a model nobody ranked with. It now uses params_for(gpu), says
    which file in the text and in --json, and --defaults gives the defaults' report to compare."""
    from gemmgen.cli import main
    from gemmgen.rank.calibration import CALIBRATION_FORMAT, params_from_dict
    from gemmgen.tune.results import RECORD_FORMAT

    results = tmp_path / "results"
    (results / "h100-sxm" / "tunes").mkdir(parents=True)
    monkeypatch.setenv("GEMMGEN_RESULTS", str(results))
    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))
    fitted = {"efficiency_scale": {"sm90_wgmma": 0.8}}
    calibration = results / "h100-sxm" / "calibration.json"
    calibration.write_text(json.dumps({"format": CALIBRATION_FORMAT, "params": fitted}))
    params = params_from_dict(fitted)
    problem = Problem.create(4096, 4096, 4096)
    configs = enumerate_space("sm90_wgmma", GPU, problem=problem)[:8]
    # measured = 1.25 x what the calibrated model predicts
    trials = [{"state": "COMPLETE", "config": c.to_dict(), "time_s": predict(problem, c, GPU, params).time_s * 1.25}
              for c in configs]
    record = {"format": RECORD_FORMAT, "problem": problem.to_dict(), "trials": trials, "winner": trials[0]}
    (results / "h100-sxm" / "tunes" / f"{problem.label}.json").write_text(json.dumps(record))

    assert main(["calibrate", "--gpu", "h100", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["calibration"] == str(calibration) and report["parameters"] == "calibration"
    assert report["tunes"][0]["median_measured_over_predicted"] == pytest.approx(1.25)
    [family] = report["families"]
    assert family["efficiency_now"] == pytest.approx(0.8 * calibrate([record], GPU)[1][0].efficiency_now)

    assert main(["calibrate", "--gpu", "h100"]) == 0
    assert f"parameters: {calibration}" in capsys.readouterr().out

    assert main(["calibrate", "--gpu", "h100", "--json", "--defaults"]) == 0
    defaults = json.loads(capsys.readouterr().out)
    assert defaults["calibration"] is None and defaults["parameters"] == "defaults"
    assert defaults["tunes"][0]["median_measured_over_predicted"] != pytest.approx(1.25)
    assert main(["calibrate", "--gpu", "h100", "--defaults", "--fit"]) == 2
