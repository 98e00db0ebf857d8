"""Regressions of the CLI fuzzing pass: bad input is one line on stderr with exit status 2 (never a traceback, a
misleading failure or a silent exit 0), checked before long work, and a stored table survives a run that has
nothing to put in it."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gemmgen.cli import main  # noqa: E402
from cli_helpers import isolated_env, one_line_error  # noqa: E402,F401
from gemmgen.model.arch import lookup_gpu  # noqa: E402
from gemmgen.model.errors import InvalidInput  # noqa: E402
from gemmgen.model.problem import Problem  # noqa: E402

H100 = lookup_gpu("h100")
SHIPPED = HERE.parent / "results" / "h100-sxm"


@pytest.fixture(autouse=True)
def _isolated(isolated_env):
    return isolated_env


def store_record(m: int, n: int, k: int, tflops: float, cublas: float = 40.0) -> None:
    """A stored tune's record (the fields a suite table reads) in $GEMMGEN_RESULTS."""
    from gemmgen.model.tiles import TileConfig
    from gemmgen.tune.results import record_path
    from gemmgen import families

    config = TileConfig.from_dict(families.get("sm80_mma").examples[0])
    path = record_path(H100, Problem.create(m, n, k, "bf16"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"winner": {"tflops": tflops, "kernel": "k", "config": config.to_dict()},
                                "cublas": {"tflops": cublas}, "elapsed_s": 3.0}))


def suite_file(tmp_path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- 1: a stored table survives -------------------------------------------------------------------------------

def test_from_results_with_no_winner_refuses_and_keeps_the_stored_table(capsys, tmp_path):
    """Regression: a --from-results table of untuned shapes replaced results/<gpu>/suite.md, exit 0."""
    folder = tmp_path / "results" / "h100-sxm"
    folder.mkdir(parents=True)
    for suffix in (".md", ".json"):
        shutil.copy(SHIPPED / f"suite{suffix}", folder / f"suite{suffix}")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    path = suite_file(tmp_path, "mine.yaml", "shapes:\n  - {name: nope, M: 4096, N: 4096, K: 4104}\n")
    line = one_line_error(capsys, ["suite", str(path), "--gpu", "h100", "--dtypes", "bf16", "--from-results"])
    assert "--from-results needs a stored winner for at least one shape" in line and str(path) in line
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_another_suite_from_results_is_written_beside_the_stored_table_not_over_it(capsys, tmp_path):
    """Regression: one suite's table (a user's suite, partly tuned) replaced another's at results/<gpu>/suite.md;
    the suite that holds it still replaces its own there."""
    folder = tmp_path / "results" / "h100-sxm"
    store_record(256, 256, 256, 50.0)
    public = suite_file(tmp_path, "shapes.yaml", "shapes:\n  - {name: sq, M: 256, N: 256, K: 256}\n")
    assert main(["suite", str(public), "--gpu", "h100", "--dtypes", "bf16", "--from-results"]) == 0
    assert f"written: {folder / 'suite.md'}" in capsys.readouterr().out
    stored = (folder / "suite.md").read_text()
    mine = suite_file(tmp_path, "mine.yaml", "shapes:\n  - {name: sq, M: 256, N: 256, K: 256}\n"
                                             "  - {name: new, M: 512, N: 256, K: 256}\n")
    assert main(["suite", str(mine), "--gpu", "h100", "--dtypes", "bf16", "--from-results"]) == 0
    assert f"written: {folder / 'suite-mine.md'}" in capsys.readouterr().out
    assert (folder / "suite.md").read_text() == stored
    assert [r["name"] for r in json.loads((folder / "suite-mine.json").read_text())["rows"]] == ["sq", "new"]
    assert main(["suite", str(public), "--gpu", "h100", "--dtypes", "bf16", "--from-results"]) == 0
    assert f"written: {folder / 'suite.md'}" in capsys.readouterr().out


# --- 2: suite --dry-run --out ---------------------------------------------------------------------------------

def test_suite_dry_run_exports_each_pick_to_out(capsys, tmp_path):
    """Regression: suite --dry-run --out DIR ignored --out (nothing exported, no folder)."""
    from gemmgen.tune.results import problem_key

    path = suite_file(tmp_path, "tiny.yaml", "shapes:\n  - {name: tiny, M: 64, N: 64, K: 64}\n")
    out = tmp_path / "out"
    assert main(["suite", str(path), "--gpu", "h100", "--dry-run", "--dtypes", "bf16", "--top-k", "1",
                 "--out", str(out), "--no-progress"]) == 0
    assert "exported (not measured)" in capsys.readouterr().out
    manifests = list((out / problem_key(Problem.create(64, 64, 64, "bf16"))).glob("*.json"))
    assert len(manifests) == 1 and json.loads(manifests[0].read_text())["measured"] is None


def test_suite_dry_run_out_on_a_file_is_refused(capsys, tmp_path):
    path = suite_file(tmp_path, "tiny.yaml", "shapes:\n  - {name: tiny, M: 64, N: 64, K: 64}\n")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    line = one_line_error(capsys, ["suite", str(path), "--gpu", "h100", "--dry-run", "--out", str(blocker)])
    assert "--out must be a directory" in line and "Not a directory" in line


# --- 3: the compile cache -------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["tune", "256", "256", "256", "--gpu", "h100", "--dry-run", "--top-k", "1"],
                                  ["tune", "--m", "1..8", "--n", "64", "--k", "64", "--gpu", "h100", "--dry-run"],
                                  ["compile", "256", "256", "256", "--gpu", "h100", "--out", "OUT"]])
def test_a_cache_that_is_a_file_is_one_line_naming_gemmgen_cache(capsys, tmp_path, monkeypatch, argv):
    """Regression: GEMMGEN_CACHE on a file failed every compile as 'NVRTC failed ...', exit 1."""
    cache = tmp_path / "cache_file"
    cache.write_text("")
    monkeypatch.setenv("GEMMGEN_CACHE", str(cache))
    line = one_line_error(capsys, [str(tmp_path / "out") if a == "OUT" else a for a in argv])
    assert "GEMMGEN_CACHE must name a folder" in line and str(cache) in line and "Not a directory" in line


def test_an_unusable_path_names_gemmgen_cache_among_the_variables(capsys, monkeypatch):
    """Regression: the hint for an OSError on a path listed GEMMGEN_RESULTS, GEMMGEN_DATA, XDG_DATA_HOME only."""
    import gemmgen.cli.gpus as gpus

    def fail(args):
        raise PermissionError(13, "Permission denied", "/somewhere/nvrtc")

    monkeypatch.setattr(gpus, "run", fail)
    line = one_line_error(capsys, ["gpus"])
    assert "GEMMGEN_CACHE" in line and "/somewhere/nvrtc" in line


# --- 4: calibrate --fit --out ---------------------------------------------------------------------------------

def test_calibrate_fit_checks_out_before_fitting(capsys, tmp_path):
    """Regression: --out under a file failed after the whole fit, saying 'File exists'."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    line = one_line_error(capsys, ["calibrate", "--gpu", "h100", "--fit", "--out", str(blocker / "x.json")])
    assert "--out must be a file gemmgen can write" in line and "Not a directory" in line
    line = one_line_error(capsys, ["calibrate", "--gpu", "h100", "--fit", "--out", str(tmp_path)])
    assert "Is a directory" in line


# --- 5, 6: roofline and lookup validate as tune does ----------------------------------------------------------

REFUSED = [
    (["4096", "4096", "4096", "--gpu", "h100", "--dtype", "e4m3", "--out-dtype", "e4m3"], "no kernel family can run"),
    (["4096", "4096", "4096", "--gpu", "h100", "--dtype", "bf16", "--out-dtype", "f16"], "writes D in"),
    (["4096", "4096", "4096", "--gpu", "a100", "--dtype", "f32"], "dtype must be one the kernel families take"),
    (["4096", "4096", "4096", "--gpu", "l40s", "--dtype", "e4m3"], "dtype must be one the kernel families take"),
    (["2147483648", "1", "1", "--gpu", "h100"], "32-bit indexing"),
    (["4096", "4096", "4096", "--gpu", "h100", "--lda", "3000000000"], "32-bit indexing"),
]


@pytest.mark.parametrize("command", ["roofline", "lookup"])
@pytest.mark.parametrize("argv, words", REFUSED)
def test_roofline_and_lookup_refuse_what_tune_refuses(capsys, command, argv, words):
    """Regression: roofline printed 'no reference configuration supports ...' and lookup answered with a stored
    winner, both exit 0, for problems tune refuses with exit 2."""
    line = one_line_error(capsys, [command] + argv)
    assert words in line


@pytest.mark.parametrize("extra", [["--dtype", "e4m3", "--scaling", "block"], ["--dtype", "f32", "--math", "3xtf32"]])
def test_roofline_without_a_fitting_reference_predicts_the_models_pick(capsys, extra):
    """Regression: a valid problem no reference configuration fits was said to be an unsupported dtype."""
    assert main(["roofline", "4096", "4096", "4096", "--gpu", "h100"] + extra) == 0
    out = capsys.readouterr().out
    assert "no reference configuration supports" not in out
    assert "model's pick over the search space" in out and "TFLOP/s" in out


# --- 7: dimensions checked up front, naming the shape -----------------------------------------------------------

def test_a_suite_shape_past_every_familys_indexing_is_named(capsys, tmp_path):
    """Regression: M: 3000000000 in a suite reached the search as 'the search space must hold ...'."""
    path = suite_file(tmp_path, "big.yaml", "shapes:\n  - {name: ok, M: 64, N: 64, K: 64}\n"
                                            "  - {name: huge, M: 3000000000, N: 64, K: 64}\n")
    line = one_line_error(capsys, ["suite", str(path), "--gpu", "h100", "--dry-run", "--dtypes", "bf16"])
    assert "shape huge (bf16)" in line and "32-bit indexing" in line
    assert not (tmp_path / "results").exists()  # refused before the first shape was ranked


def test_a_shape_file_past_every_familys_indexing_is_named(capsys, tmp_path):
    path = suite_file(tmp_path, "shapes.yaml", "- [3000000000, 64, 64]\n")
    line = one_line_error(capsys, ["tune", "--shapes", str(path), "--gpu", "h100", "--dry-run"])
    assert "shape 3000000000x64x64" in line and "32-bit indexing" in line


def test_tune_linear_refuses_a_token_range_past_the_bucket_limit(capsys):
    """Regression: --tokens 1..99999999999 worked ~50 s, then failed without naming the rule."""
    from gemmgen.tune.buckets import MAX_M

    line = one_line_error(capsys, ["tune-linear", "4096", "4096", "--tokens", "1..99999999999", "--gpu", "h100",
                                   "--dry-run"])
    assert f"--tokens must stay at most {MAX_M}" in line
    line = one_line_error(capsys, ["tune-linear", "4096", "4096", "--tokens", "1..99999999999", "--buckets", "none",
                                   "--gpu", "h100", "--dry-run"])
    assert "forward product 99999999999x4096x4096" in line and "32-bit indexing" in line


# --- 8: YAML ----------------------------------------------------------------------------------------------------

def test_a_key_given_twice_in_a_suite_file_is_refused_with_its_line(capsys, tmp_path):
    """Regression: a second `shapes:` silently replaced the first."""
    path = suite_file(tmp_path, "dup.yaml", "shapes:\n  - {name: a, M: 64, N: 64, K: 64}\n"
                                            "shapes:\n  - {name: b, M: 128, N: 64, K: 64}\n")
    line = one_line_error(capsys, ["suite", str(path), "--gpu", "h100", "--dry-run"])
    assert "must not give a key twice" in line and "'shapes' again at line 3" in line


def test_yaml_merge_keys_may_still_be_overridden():
    from gemmgen.model.files import load_yaml

    assert load_yaml("x", "base: &b {M: 1, N: 2}\nshape: {<<: *b, M: 3}\n", "x.yaml")["shape"] == {"M": 3, "N": 2}
    with pytest.raises(InvalidInput, match="key twice"):
        load_yaml("x", "shape: {M: 1, M: 2}\n", "x.yaml")


def test_a_shape_name_with_a_pipe_is_refused(capsys, tmp_path):
    """Regression: '|' in a shape name split the markdown table's row."""
    path = suite_file(tmp_path, "pipe.yaml", 'shapes:\n  - {name: "a|b", M: 64, N: 64, K: 64}\n')
    line = one_line_error(capsys, ["suite", str(path), "--gpu", "h100", "--dry-run"])
    assert "without '|'" in line and "a|b" in line


# --- 9: --out before notes ------------------------------------------------------------------------------------

def test_tune_out_on_a_file_is_refused_before_any_note(capsys, tmp_path):
    """Regression: 'note: the model ranks with the calibration in ...' printed before the --out error."""
    folder = tmp_path / "results" / "h100-sxm"
    folder.mkdir(parents=True)
    shutil.copy(SHIPPED / "calibration.json", folder / "calibration.json")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    line = one_line_error(capsys, ["tune", "4096", "4096", "4096", "--gpu", "h100", "--dry-run", "--out",
                                   str(blocker)])
    assert "--out must be a directory" in line and "Not a directory" in line


# --- 10: small ones -------------------------------------------------------------------------------------------

def test_small_wordings(capsys):
    """Regressions: a Python dict, and 'but got None', in one-line errors; --top-k 0 silently 1 in a dry run."""
    line = one_line_error(capsys, ["tune", "--m", "1..8", "--gpu", "h100", "--dry-run"])
    assert "{" not in line and "--m 1..8" in line
    line = one_line_error(capsys, ["tune", "64", "64", "64", "--dry-run"])
    assert "None" not in line and "--dry-run needs --gpu NAME" in line
    line = one_line_error(capsys, ["tune", "64", "64", "64", "--gpu", "h100", "--dry-run", "--top-k", "0"])
    assert "--top-k must be at least 1" in line


@pytest.mark.parametrize("path, words", [("", "non-empty path"), (None, "type NoneType"), (123, "type int")])
def test_load_names_a_bad_path_argument(path, words):
    """Regression: load('') said got '.'; load(None) and load(123) raised a bare TypeError."""
    import gemmgen

    with pytest.raises(InvalidInput, match=words):
        gemmgen.load(path)
