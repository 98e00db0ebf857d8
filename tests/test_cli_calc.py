"""The calculator commands (intensity, roofline, gpus): output, --json, --plot and one-line bad-input errors."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gemmgen.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own usage errors, flag values included, exit from parse_args
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_intensity_without_warp_prints_the_seed_table_with_the_notes_bytes_at_6780(capsys):
    code, out, _ = run_cli(capsys, "intensity", "--peak-per-sm", "6780")
    assert code == 0
    for value in ("1695.000", "635.625", "688.594", "953.438", "900.469", "847.500", "741.562", "10.667", "9.846"):
        assert value in out


def test_intensity_default_uses_the_catalogue_rate_of_the_rtx3090(capsys):
    code, out, _ = run_cli(capsys, "intensity", "--json")
    data = json.loads(out)
    assert code == 0 and data["gpu"] == "rtx3090" and data["peak_per_sm"] == pytest.approx(512.0)
    assert [round(r["bytes_per_clock"], 3) for r in data["rows"]][:2] == [128.0, 48.0]


def test_intensity_with_warp_mma_and_cta_reports_every_level(capsys):
    code, out, _ = run_cli(capsys, "intensity", "--warp", "64x64x32", "--mma", "16x8x16", "--cta", "128x128x32",
                           "--json")
    data = json.loads(out)
    assert code == 0
    levels = {lv["level"]: lv for lv in data["levels"]}
    assert levels["global->shared"]["intensity"] == pytest.approx(64.0)
    assert levels["warp (seed note)"]["intensity"] == pytest.approx(32 / 3)
    assert set(levels) == {"global->shared", "shared->registers", "warp (seed note)", "registers->MMA"}


def test_intensity_text_output_names_the_gpu_and_peak(capsys):
    code, out, _ = run_cli(capsys, "intensity", "--cta", "128x256x64", "--dtype", "bf16", "--gpu", "H100")
    assert code == 0 and "h100-sxm" in out and "85.333" in out


def test_roofline_8192_cubed_on_h100_reports_compute_bound_and_its_kernel_power_bound(capsys):
    code, out, _ = run_cli(capsys, "roofline", "8192", "8192", "8192", "--gpu", "h100")
    assert code == 0
    assert "compute-bound" in out and "\nbound: power" in out
    assert "\npower: at the 700 W limit" in out and "power-bound, so fewer bytes moved per FLOP" in out
    code, out, _ = run_cli(capsys, "roofline", "16", "4096", "4096", "--gpu", "h100")
    assert code == 0 and "\nbound: memory" in out and "not binding" in out


@pytest.mark.parametrize("dtype", ["f32", "e4m3", "bf16"])
def test_roofline_answers_every_dtype_the_h100_runs_and_says_why_it_packs(capsys, dtype):
    # fp32 inputs run as tf32 (K-major only: the default row-major B is transposed by the pack); no --config needed.
    code, out, _ = run_cli(capsys, "roofline", "4096", "4096", "4096", "--gpu", "h100", "--dtype", dtype)
    assert code == 0 and ("\nbound: compute" in out or "\nbound: power" in out)
    if dtype == "bf16":
        assert "pack:" not in out   # wgmma transposes 16-bit operands itself
    else:
        assert "fp8 and tf32 run K-major" in out and "16-byte multiples" not in out
    code, out, _ = run_cli(capsys, "roofline", "4095", "4095", "4095", "--gpu", "h100", "--dtype", "bf16")
    assert code == 0 and "rows that are not 16-byte multiples apart are copied" in out


def test_roofline_skinny_on_h100_reports_memory_bound_in_json(capsys):
    code, out, _ = run_cli(capsys, "roofline", "16", "4096", "4096", "--gpu", "h100", "--json")
    data = json.loads(out)
    assert code == 0 and data["bound"] == "memory" and data["predicted_bound"] == "memory"
    assert data["predictions"][0]["time_s"] <= data["predictions"][-1]["time_s"]


def test_roofline_with_a_config_file_predicts_that_config(capsys, tmp_path, hopper_big):
    path = tmp_path / "big.yaml"
    path.write_text(hopper_big.to_yaml())
    code, out, _ = run_cli(capsys, "roofline", "4096", "4096", "4096", "--gpu", "h100", "--config", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and len(data["predictions"]) == 1
    assert data["predictions"][0]["config"] == hopper_big.to_dict()


def test_roofline_plot_writes_a_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    out_file = tmp_path / "roof.png"
    code, _, _ = run_cli(capsys, "roofline", "1024", "1024", "1024", "--gpu", "a100", "--plot", str(out_file))
    assert code == 0 and out_file.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_roofline_plot_without_matplotlib_says_how_to_install(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code, _, err = run_cli(capsys, "roofline", "64", "64", "64", "--gpu", "h100", "--plot", str(tmp_path / "r.png"))
    assert code == 2 and "pip install 'gemmgen[plot]'" in err and len(err.strip().splitlines()) == 1


def test_no_install_command_leaves_an_extra_unquoted():
    """Regression: messages said 'pip install gemmgen[plot]' (and gemmgen[test]), which zsh expands as a glob and
    refuses ('no matches found'); an extra is quoted, as the other install hints are."""
    root = Path(__file__).resolve().parents[1]
    unquoted = re.compile(r"pip install (-e )?[^'\"\s]*\[")
    files = [*root.glob("gemmgen/**/*.py"), *root.glob("benchmarks/**/*.py"), root / "README.md",
             *root.glob("docs/*.md")]
    found = [f"{f.relative_to(root)}:{n}" for f in files if f.exists()
             for n, line in enumerate(f.read_text().splitlines(), 1) if unquoted.search(line)]
    assert not found


def test_gpus_lists_the_catalogue_and_a_detection_line(capsys):
    code, out, _ = run_cli(capsys, "gpus")
    assert code == 0
    for key in ("h100-sxm", "h100-pcie", "h200", "a100-sxm", "a100-pcie", "l40s", "l20", "rtx4090", "rtx3090"):
        assert key in out
    assert "\ndetected: " in out


def test_gpus_json_has_every_entry_and_the_detection_result(capsys):
    code, out, _ = run_cli(capsys, "gpus", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["gpus"]) >= 9 and set(data["detected"]) == {"gpu", "reason", "props"}
    assert all(g["source"] for g in data["gpus"])


BAD_INPUT = [
    (["roofline", "0", "4096", "4096", "--gpu", "h100"], "M must be a positive integer"),
    (["roofline", "16", "-4", "4096", "--gpu", "h100"], "N must be a positive integer"),
    (["roofline", "16", "16", "1.5", "--gpu", "h100"], "K must be a positive integer"),
    (["roofline", "16", "16", "abc", "--gpu", "h100"], "K must be a positive integer"),
    (["roofline", "16", "16", "16", "--gpu", "h100", "--dtype", "int4"], "dtype must be one of"),
    (["roofline", "16", "16", "16", "--gpu", "v100"], "GPU must be one of the catalogue's"),
    (["roofline", "16", "16", "16", "--gpu", "h100", "--plot", "r.gif"], "--plot file must end in"),
    (["roofline", "16", "16", "16", "--gpu", "h100", "--config", "/nonexistent/c.yaml"], "--config must name a readable"),
    (["intensity", "--warp", "64x64"], "warp tile must be written MxNxK"),
    (["intensity", "--warp", "64x0x32"], "warp tile must be written MxNxK"),
    (["intensity", "--mma", "16by8by16"], "MMA shape must be written MxNxK"),
    (["intensity", "--warp", "60x64x32"], "warp tile M must be a multiple of MMA M"),
    (["intensity", "--warp", "64x64x32", "--cta", "96x128x32"], "CTA tile M must be a multiple of warp tile M"),
    # Regression: without --warp, a CTA tile smaller than the MMA instruction (8x8x8 over m16n8k16) was accepted.
    (["intensity", "--cta", "8x8x8", "--mma", "16x8x16"], "CTA tile M must be a multiple of MMA M"),
    (["intensity", "--cta", "128x128x8"], "CTA tile K must be a multiple of MMA K"),
    (["intensity", "--peak-per-sm", "zero"], "--peak-per-sm must be a finite number greater than 0"),
    (["intensity", "--peak-per-sm", "-1"], "--peak-per-sm must be a finite number greater than 0"),
    (["intensity", "--dtype", "e4m3"], "has no tensor-core rate for this dtype"),
    (["intensity", "--gpu", "gtx1080"], "GPU must be one of the catalogue's"),
    # argparse (3.11-3.12) turns `--flag=--` into an empty list without calling the flag's type (CLI fuzz, CI)
    (["intensity", "--peak-per-sm=--", "--warp=64x64x32", "--mma=64x64x32", "--gpu=h100"],
     "--peak-per-sm needs one value"),
    (["roofline", "16", "16", "16", "--gpu=--"], "--gpu needs one value"),
]


@pytest.mark.parametrize("argv,rule", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_naming_the_rule_with_exit_2(capsys, argv, rule):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert rule in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_config_breaking_a_rule_is_one_line_naming_rule_and_value(capsys, tmp_path, sm80_default):
    bad = sm80_default.to_dict() | {"stages": 9}
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(bad))
    code, _, err = run_cli(capsys, "roofline", "4096", "4096", "4096", "--gpu", "h100", "--config", str(path))
    assert code == 2 and "pipeline stages must be 2..5 for cp.async: got 9" in err
    assert len(err.strip().splitlines()) == 1


def test_malformed_config_file_is_one_line(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("family: sm80_mma\ncta: 128x128\nwarp: 64x64x32\nmma: 16x8x16\nstages: 4\n")
    code, _, err = run_cli(capsys, "roofline", "64", "64", "64", "--gpu", "h100", "--config", str(path))
    assert code == 2 and "CTA tile must be written MxNxK" in err and len(err.strip().splitlines()) == 1


def test_a_tuning_record_given_as_config_is_its_winners_configuration(capsys, tmp_path):
    # Regression: --config documents "a manifest or a record", but a gemmgen-tune/1 record (its configuration under
    # winner.config) was refused as "a configuration must give family, ... but got 'missing family'".
    from gemmgen import TileConfig

    record = {"format": "gemmgen-tune/1", "status": "complete",
              "winner": {"kernel": "k", "config": {"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32",
                                                    "mma": "16x8x16", "stages": 3}}}
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    assert TileConfig.from_text(path.read_text()).tag == TileConfig.from_dict(record["winner"]["config"]).tag
    code, out, _ = run_cli(capsys, "roofline", "4096", "4096", "4096", "--gpu", "a100", "--config", str(path))
    assert code == 0 and "sm80 128x128x32/64x64x32 s3" in out
    path.write_text(json.dumps(dict(record, status="failed", winner=None)))
    code, _, err = run_cli(capsys, "roofline", "64", "64", "64", "--gpu", "h100", "--config", str(path))
    assert code == 2 and "a tuning record given as a configuration must have a winner" in err


def _subprocess(*argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "gemmgen", *argv], capture_output=True, text=True, cwd=ROOT, env=env)


def test_python_m_gemmgen_bad_dimension_exits_2_with_one_line_and_no_traceback():
    result = _subprocess("roofline", "0", "4096", "4096", "--gpu", "h100")
    assert result.returncode == 2
    assert result.stderr.strip() == "gemmgen roofline: error: M must be a positive integer, but got '0'"
    assert result.stdout == ""


def test_python_m_gemmgen_intensity_reproduces_the_seed_table():
    result = _subprocess("intensity", "--peak-per-sm", "6780")
    assert result.returncode == 0 and "741.562" in result.stdout and "688.594" in result.stdout


def test_roofline_without_gpu_on_a_machine_without_one_says_so(capsys, monkeypatch):
    import gemmgen.runtime.detect as detect

    monkeypatch.setattr(detect, "read_props", lambda device=0: ({}, "no CUDA driver found (libcuda.so not loadable)"))
    code, _, err = run_cli(capsys, "roofline", "64", "64", "64")
    assert code == 2 and "no CUDA driver found" in err and "--gpu NAME" in err


def test_tune_says_when_a_product_would_run_power_limited_in_a_training_loop(capsys):
    from gemmgen.cli.tune import say_power
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.model.problem import Problem

    h100 = lookup_gpu("h100")
    say_power(Problem.create(8192, 8192, 8192, "bf16"), h100, "burst")
    err = capsys.readouterr().err
    assert err.startswith("note: at the 700 W board limit") and "--timing sustained" in err
    # Already timed sustained, too short to heat the card, or memory-bound: nothing to say.
    say_power(Problem.create(8192, 8192, 8192, "bf16"), h100, "sustained")
    say_power(Problem.create(1024, 1024, 1024, "bf16"), h100, "burst")
    say_power(Problem.create(16, 4096, 4096, "bf16"), h100, "burst")
    assert capsys.readouterr().err == ""


def test_roofline_predicts_with_the_gpus_calibration_as_the_dry_run_ranks(capsys, tmp_path, monkeypatch, hopper_big):
    """roofline priced a configuration with the model's defaults while tune --dry-run, compile and bench price it
    with the GPU's stored calibration: the dry run's pick read 685 TFLOP/s there and 601 here. Both now agree."""
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.model.problem import Problem
    from gemmgen.rank.calibration import CALIBRATION_FORMAT, calibrated_predict, user_calibration_path
    from gemmgen.rank.predict import predict

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))
    gpu = lookup_gpu("h100")
    calibration = user_calibration_path(gpu)
    calibration.parent.mkdir(parents=True)
    calibration.write_text(json.dumps({"format": CALIBRATION_FORMAT, "gpu": gpu.key,
                                       "params": {"efficiency_scale": {"sm90_wgmma": 0.5},
                                                  "terms": {"tail": 0.3}}}))
    path = tmp_path / "big.yaml"
    path.write_text(hopper_big.to_yaml())
    problem = Problem.create(4096, 4096, 4096, "bf16")
    calibrated = calibrated_predict(problem, hopper_big, gpu).time_s
    assert calibrated != pytest.approx(predict(problem, hopper_big, gpu).time_s)

    code, out, _ = run_cli(capsys, "roofline", "4096", "4096", "4096", "--gpu", "h100", "--config", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["predictions"][0]["time_s"] == pytest.approx(calibrated)
    assert data["calibration"] == str(calibration)
    code, out, err = run_cli(capsys, "roofline", "4096", "4096", "4096", "--gpu", "h100", "--config", str(path))
    assert code == 0 and f"calibration in {calibration}" in err
    assert f"{calibrated * 1e6:.1f}" in out


def test_intensity_help_lists_every_dtype_it_takes(capsys):
    """--dtype's help listed f16, bf16, f32 and e4m3 while e5m2 was taken too."""
    from gemmgen.model.arch import DType

    code, out, _ = run_cli(capsys, "intensity", "--help")
    dtype_help = " ".join(out.split()).split("--dtype DTYPE", 2)[2].split("--gpu", 1)[0]
    for dtype in DType:
        assert f" {dtype.value}" in dtype_help
        code, out, _ = run_cli(capsys, "intensity", "--warp", "64x64x32", "--dtype", dtype.value, "--gpu", "h100")
        assert code == 0
