"""Regressions of an adversarial pass over the command line and the public API: each input here once ended in a
traceback, a misleading message or a silent success. Bad input is one line on stderr with exit status 2;
valid-but-unusual input works."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from cli_helpers import isolated_env, one_line_error  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _isolated(isolated_env, monkeypatch):
    monkeypatch.chdir(isolated_env)


@pytest.fixture
def replay(tmp_path):
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"timings": {}, "cublas_time_s": 1e-5}))
    return str(path)


@pytest.mark.parametrize("content", [b"hello\n", b'{"op_code": 0, "worker_id": "w"', b"[1, 2]\n"])
def test_a_journal_storage_that_does_not_end_in_an_entry_is_refused_untouched(capsys, tmp_path, replay, content):
    """Regression: a text file as --storage journal:FILE was opened, appended to, then a JSONDecodeError
    traceback (Optuna takes a bad last line for a write in progress)."""
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    line = one_line_error(capsys, ["tune", "256", "256", "256", "--gpu", "h100", "--replay", replay,
                                   "--trials", "2", "--no-progress", "--storage", f"journal:{path}"])
    assert "does not end in a journal entry" in line and "notes.txt" in line
    assert path.read_bytes() == content


def test_negative_numbers_in_exponent_form_are_values_not_flags(capsys):
    """Regression: argparse took '--beta -1e-3' for a flag ('expected one argument'), and '-inf' too, so the
    value never reached the number parser."""
    from gemmgen.cli import main

    assert main(["tune", "64", "64", "64", "--gpu", "h100", "--dry-run", "--alpha", "-2.5e-1", "--beta",
                 "-1E+2"]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, ["tune", "64", "64", "64", "--gpu", "h100", "--dry-run", "--alpha", "-inf"])
    assert "--alpha must be a finite number" in line and "'-inf'" in line
    line = one_line_error(capsys, ["roofline", "-1e3", "64", "64", "--gpu", "h100"])
    assert "M must be a positive integer" in line and "'-1e3'" in line
    line = one_line_error(capsys, ["tune", "--m", "-1..8", "--n", "64", "--k", "64", "--gpu", "h100", "--dry-run"])
    assert "--m must be LO..HI with positive integers" in line and "'-1..8'" in line


SM90_CONFIG = {"family": "sm90_wgmma", "cta": "128x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 4,
               "cluster": "2x1", "warp_specialized": True, "persistent": True, "schedule": "cooperative"}


@pytest.mark.parametrize("field, value, words", [
    ("decomposition", {"kind": "splitk", "split": 4}, "decomposition fields must be among"),
    ("raster", {"order": "row", "grp": 8}, "raster fields must be among"),
    ("cluster", {"m": 2, "k": 1}, "cluster fields must be among"),
    ("raster", [], "raster must be a mapping"),
])
def test_a_typo_in_a_nested_config_field_is_refused_not_ignored(capsys, tmp_path, field, value, words):
    """Regression: `decomposition: {kind: splitk, split: 4}` silently kept splits=1 (then 'split-K factor must be
    2..16: got 1'), `raster: {grp: 8}` silently group 1, and `raster: []` meant every default."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**SM90_CONFIG, field: value}))
    line = one_line_error(capsys, ["roofline", "4096", "4096", "4096", "--gpu", "h100", "--config", str(config)])
    assert words in line


@pytest.mark.parametrize("cubin", ["/dev/zero", "../outside.cubin", "sub/k.cubin", ".."])
def test_a_manifest_whose_cubin_is_a_path_is_refused_before_reading(tmp_path, cubin):
    """Regression: gemmgen.load read whatever path the manifest's `cubin` named, outside the bundle too: with
    /dev/zero it read until memory ran out (MemoryError after 8 s under a 3 GB limit)."""
    import gemmgen
    from gemmgen.model.errors import InvalidInput

    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "k.json").write_text(json.dumps({"format": "gemmgen-manifest/1", "name": "k",
                                                            "cubin": cubin}))
    with pytest.raises(InvalidInput, match="manifest field cubin must be a file name in the manifest's folder"):
        gemmgen.load(tmp_path / "bundle")


def test_a_cubin_that_is_not_a_regular_file_is_refused(tmp_path):
    """Regression: a folder (or a FIFO) named as the cubin was opened as one."""
    import gemmgen
    from gemmgen.model.errors import InvalidInput

    (tmp_path / "k.cubin").mkdir()
    (tmp_path / "k.json").write_text(json.dumps({"format": "gemmgen-manifest/1", "name": "k", "cubin": "k.cubin"}))
    with pytest.raises(InvalidInput, match="a bundle must hold the cubin its manifest names"):
        gemmgen.load(tmp_path / "k.json")


SHIPPED_RECORD = HERE.parent / "results" / "h100-sxm" / "tunes" / "4096x4096x4096_bf16_rr_bf16_linear.json"


def stored_record(tmp_path, edit) -> Path:
    """The shipped 4096^3 H100 record, edited, as the only record in $GEMMGEN_RESULTS."""
    record = json.loads(SHIPPED_RECORD.read_text())
    edit(record)
    path = tmp_path / "results" / "h100-sxm" / "tunes" / SHIPPED_RECORD.name
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize("argv", [["calibrate", "--gpu", "h100"], ["calibrate", "--gpu", "h100", "--fit"]])
@pytest.mark.parametrize("edit", [lambda r: r.pop("problem"), lambda r: r["problem"].pop("M"),
                                  lambda r: r.update(trials="x")], ids=["no problem", "no M", "trials text"])
def test_a_damaged_record_is_skipped_by_calibrate_not_a_keyerror(capsys, tmp_path, argv, edit):
    """Regression: a stored record without its problem (or M) ended `gemmgen calibrate` and `calibrate --fit` in
    a KeyError traceback; lookup already skipped such a record. Now every reader skips it."""
    stored_record(tmp_path, edit)
    line = one_line_error(capsys, argv)
    assert "needs measured tunes" in line


def test_a_trial_with_a_damaged_time_is_skipped_by_calibrate(capsys, tmp_path):
    """Regression: a trial whose time_s was text ended calibrate in a ValueError traceback from float()."""
    from gemmgen.cli import main

    stored_record(tmp_path, lambda r: r["trials"][0].update(time_s="fast"))
    assert main(["calibrate", "--gpu", "h100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tunes"][0]["problem"] == "4096x4096x4096_bf16_rr"


def test_a_manifest_problem_without_m_is_invalid_input_not_a_keyerror(tmp_path):
    """Regression: Problem.from_dict({...without M}) raised KeyError: 'M' out of gemmgen.load."""
    from gemmgen import Problem
    from gemmgen.model.errors import InvalidInput

    with pytest.raises(InvalidInput, match="a problem must give M, N and K.*missing M"):
        Problem.from_dict({"N": 64, "K": 64})
    with pytest.raises(InvalidInput, match="a problem must be a mapping"):
        Problem.from_dict(None)


@pytest.mark.parametrize("argv", [["lookup", "4096", "4096", "4096", "--gpu", "h100"],
                                  ["lookup", "4000", "4096", "4096", "--gpu", "h100", "--json"]])
@pytest.mark.parametrize("edit", [lambda r: r["winner"].pop("config"), lambda r: r["winner"].pop("kernel"),
                                  lambda r: r["winner"].update(tflops="x"), lambda r: r.pop("gpu"),
                                  lambda r: r["cublas"].pop("tflops")],
                         ids=["no config", "no kernel", "tflops text", "no gpu", "no cublas tflops"])
def test_lookup_skips_a_damaged_record_instead_of_a_traceback(capsys, tmp_path, argv, edit):
    """Regression: lookup answered from a record whose winner lacked its config or kernel, or held tflops as
    text, and ended in a KeyError or ValueError traceback; now such a record is skipped as unreadable."""
    stored_record(tmp_path, edit)
    line = one_line_error(capsys, argv)
    assert "no tuning results stored" in line


@pytest.mark.parametrize("edit, words", [
    (lambda r: r["winner"].pop("tflops"), "winner must give its kernel and a positive tflops"),
    (lambda r: r["winner"].update(tflops="x"), "winner must give its kernel and a positive tflops"),
    (lambda r: r.update(environment=None), "environment and search must be mappings"),
    (lambda r: r.update(elapsed_s="x"), "elapsed_s must be a non-negative number"),
])
def test_suite_from_results_names_a_damaged_record_instead_of_a_traceback(capsys, tmp_path, edit, words):
    """Regression: suite --from-results read a record's winner.tflops, environment and elapsed_s unchecked
    (KeyError, TypeError, AttributeError, ValueError tracebacks); now the row says the record is damaged, and a
    suite with no readable winner writes nothing and exits 2."""
    from gemmgen.cli import main

    stored_record(tmp_path, edit)
    (tmp_path / "one.yaml").write_text("shapes:\n  - {name: a, M: 4096, N: 4096, K: 4096}\n")
    line = one_line_error(capsys, ["suite", str(tmp_path / "one.yaml"), "--from-results", "--gpu", "h100",
                                   "--dtypes", "bf16"])
    assert "--from-results needs a stored winner" in line
    from gemmgen.tune.suite import _unreadable

    record = json.loads((tmp_path / "results" / "h100-sxm" / "tunes" / SHIPPED_RECORD.name).read_text())
    assert _unreadable(record) == words


@pytest.mark.parametrize("call, words", [
    (lambda c: c.cta_level(c.Shape3(0, 256, 64)), "CTA tile M must be an integer from 1"),
    (lambda c: c.smem_level(c.Shape3(0, 0, 0)), "warp tile M must be an integer from 1"),
    (lambda c: c.warp_level(c.Shape3(64, 64, 32), c.Shape3(16, 8, 0)), "MMA shape K must be an integer from 1"),
    (lambda c: c.cta_level(c.Shape3(128, 256, 64), 0), "element bytes must be an integer from 1 to 8"),
    (lambda c: c.cta_level(c.Shape3(128, 256, 64), "bf16", "x"), "peak_per_sm must be a finite number"),
    (lambda c: c.cta_level(c.Shape3(128, 256, 64), "bf16", float("nan")), "peak_per_sm must be a finite number"),
    (lambda c: c.cta_level(c.Shape3(128, 256, 64), "bf16", 1.0, 0), "multicast_m must be a finite number"),
    (lambda c: c.mma_level(c.Shape3(16, 8, 16), "bf16", 1.0, 0), "acc_bytes must be an integer from 1 to 8"),
    (lambda c: c.roofline(None, "h100"), "roofline needs a Problem"),
    (lambda c: c.peak_per_sm(None, "bf16"), "GPU must be one of the catalogue's"),
])
def test_the_calculator_refuses_bad_arguments_naming_them(call, words):
    """Regression: from Python, a zero extent, element size or multicast was a ZeroDivisionError, a negative one a
    negative intensity, a text peak a TypeError, and roofline(None, gpu) an AttributeError."""
    import types

    from gemmgen import Shape3
    from gemmgen.calc import intensity
    from gemmgen.model.errors import InvalidInput

    calc = types.SimpleNamespace(Shape3=Shape3, **{n: getattr(intensity, n) for n in intensity.__all__})
    with pytest.raises(InvalidInput, match=words):
        call(calc)


def test_the_calculator_takes_tile_strings_and_gpu_names():
    """Regression: cta_level('128x256x64') and roofline(problem, 'h100') were AttributeErrors; the CLI's spellings
    now work from Python too, with the same results as Shape3 and Gpu arguments."""
    from gemmgen import Problem, Shape3, lookup_gpu
    from gemmgen.calc.intensity import cta_level, peak_per_sm, roofline

    h100 = lookup_gpu("h100")
    assert cta_level("128x256x64", "bf16", peak_per_sm("h100", "bf16")) == \
        cta_level(Shape3(128, 256, 64), "bf16", peak_per_sm(h100, "bf16"))
    assert cta_level((128, 256, 64)).intensity == pytest.approx(85.333, abs=1e-3)
    problem = Problem.create(4096, 4096, 4096)
    assert roofline(problem, "h100") == roofline(problem, h100)


def test_numpy_scalars_are_numbers_to_the_api():
    """Regression: Problem.create(*array.shape-like NumPy integers) was refused ('M must be a positive integer, but
    got np.int64(64)'), and alpha=np.float32(2) ('must be a finite number'); NumPy's bool is still no number."""
    import numpy as np

    from gemmgen import Problem
    from gemmgen.model.errors import InvalidInput

    problem = Problem.create(np.int64(64), np.int32(128), np.uint16(32), alpha=np.float32(2.0), beta=np.int8(1))
    assert (problem.m, problem.n, problem.k, problem.epilogue.alpha) == (64, 128, 32, 2.0)
    assert type(problem.m) is int and type(problem.epilogue.alpha) is float
    with pytest.raises(InvalidInput, match="M must be a positive integer"):
        Problem.create(np.bool_(True), 64, 64)
    with pytest.raises(InvalidInput, match="alpha must be a finite number"):
        Problem.create(64, 64, 64, alpha=np.float32("inf"))


@pytest.mark.parametrize("text", ["9223372036854775808", "9" * 45])
def test_a_dimension_past_2_63_names_the_limit(capsys, text):
    """Regression: 'M must be a positive integer, but got 9223372036854775808' read as if the value were not a
    positive integer; the message now says the limit."""
    line = one_line_error(capsys, ["roofline", text, "1", "1", "--gpu", "h100"])
    assert "M must be a positive integer" in line and "at most 2^63-1 = 9223372036854775807" in line


@pytest.mark.parametrize("argv, prog", [(["space", "--gpu", "h100", "--math", "3xtf32"], "gemmgen space"),
                                        (["tune", "64", "64", "64", "64", "--gpu", "h100", "--dry-run"], "gemmgen tune"),
                                        (["--bogus"], "gemmgen")])
def test_an_unknown_argument_is_named_by_its_commands_parser(capsys, argv, prog):
    """Regression: 'gemmgen space --math 3xtf32' said 'gemmgen: error: unrecognized arguments ... (see gemmgen
    --help)', which does not list the command's flags; now the command's own parser says it."""
    line = one_line_error(capsys, argv)
    assert line.startswith(f"{prog}: error: unrecognized arguments") and f"(see {prog} --help)" in line


@pytest.mark.parametrize("text, words", [("{not json", "k.json is not readable JSON"),
                                         ('{"format": "gemmgen-manifest/2"}', "k.json has format 'gemmgen-manifest/2'")])
def test_a_bundle_folder_whose_manifest_was_skipped_says_why(tmp_path, text, words):
    """Regression: a folder whose only manifest was cut short or of a newer format said only 'must hold exactly one
    gemmgen-manifest/1 .json', as if it held none; the error now names the file and why it was passed over."""
    import gemmgen
    from gemmgen.model.errors import InvalidInput

    (tmp_path / "k.json").write_text(text)
    (tmp_path / "notes.json").write_text('{"format": "something else"}')  # not a manifest at all: not mentioned
    with pytest.raises(InvalidInput, match="exactly one gemmgen-manifest/1") as caught:
        gemmgen.load(tmp_path)
    assert words in str(caught.value) and "notes.json" not in str(caught.value)


@pytest.mark.parametrize("text, words", [("shapes: []\n", "got shapes: []"), ("shapes:\n", "got shapes: None"),
                                         ("shape:\n  - {name: a, M: 1, N: 1, K: 1}\n", "got no 'shapes' key")])
def test_a_suite_without_a_shapes_list_says_what_it_holds(capsys, tmp_path, text, words):
    """Regression: `shapes: []`, `shapes:` and a misspelt `shape:` were all reported as '(got dict)', the type of
    the file's top level, not what stood where the list should."""
    (tmp_path / "s.yaml").write_text(text)
    line = one_line_error(capsys, ["suite", str(tmp_path / "s.yaml"), "--gpu", "h100", "--dry-run"])
    assert "must map 'shapes' to a non-empty list" in line and words in line


def test_a_config_files_boolean_knob_given_as_text_is_refused_not_read_as_true():
    # bool("false") is True: `persistent: "false"` in a config file named the kernel _pers (found 2026-11-27).
    from gemmgen import TileConfig
    from gemmgen.model.errors import InvalidInput

    base = {"family": "sm90_wgmma", "cta": "128x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 4,
            "warp_specialized": True, "persistent": True}
    for knob in ("persistent", "warp_specialized"):
        for text in ("false", "no", 0):
            with pytest.raises(InvalidInput, match=f"{knob} must be true or false"):
                TileConfig.from_dict({**base, knob: text})
    assert not TileConfig.from_dict({**base, "persistent": False}).persistent


def test_a_kernel_class_with_bias_as_text_is_refused():
    from gemmgen.model.errors import InvalidInput
    from gemmgen.model.linear import KernelClass

    with pytest.raises(InvalidInput, match="bias must be true or false"):
        KernelClass.from_dict({"dtype": "bf16", "a_layout": "row", "b_layout": "col", "bias": "false"})


@pytest.mark.parametrize("blocked", ["data", "data/kernels/h100-sxm"])
def test_tune_linear_names_gemmgen_data_when_its_kernel_store_is_a_file(capsys, isolated_env, blocked):
    """Regression: a kernel store under a file (GEMMGEN_DATA itself, or its kernels/<gpu>) was found only at the
    first export, after every bucket was ranked, and reported as '--out must be a directory' (a flag tune-linear
    does not have) naming a hidden staging folder."""
    target = isolated_env / blocked
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("")
    line = one_line_error(capsys, ["tune-linear", "64", "64", "--tokens", "1..64", "--gpu", "h100", "--dry-run",
                                   "--top-k", "1"])
    assert "GEMMGEN_DATA must name a folder" in line and "kernels/h100-sxm" in line and "Not a directory" in line
    assert "--out" not in line


def test_a_replayed_suite_never_replaces_the_gpus_measured_table(capsys, isolated_env):
    """Regression: `suite FILE --replay T` wrote its simulated figures to results/<gpu>/suite.md, over the table
    measured on the GPU (run in a checkout, the shipped H100 table), unmarked and headed 'cuBLAS measured in the
    same run'. A replayed run's table is now suite-replay.md beside it, each row noted as simulated."""
    from gemmgen.cli import main
    from test_cli_tune import replay_file

    folder = isolated_env / "results" / "h100-sxm"
    folder.mkdir(parents=True)
    shapes = isolated_env / "shapes.yaml"
    shapes.write_text("shapes:\n  - {name: tiny, M: 256, N: 256, K: 256}\n")
    measured = {"format": "gemmgen-suite/1", "rows": [{"suite": "shapes", "name": "tiny"}]}
    (folder / "suite.json").write_text(json.dumps(measured))
    (folder / "suite.md").write_text("the table measured on the GPU\n")
    assert main(["suite", str(shapes), "--gpu", "h100", "--replay", str(replay_file(isolated_env)), "--dtypes",
                 "bf16", "--trials", "2", "--top-k", "2", "--finalists", "1", "--rounds", "1", "--jobs", "1",
                 "--no-progress"]) == 0
    assert f"written: {folder / 'suite-replay.md'}" in capsys.readouterr().out
    assert (folder / "suite.md").read_text() == "the table measured on the GPU\n"
    assert json.loads((folder / "suite.json").read_text()) == measured
    [row] = json.loads((folder / "suite-replay.json").read_text())["rows"]
    assert row["note"].startswith("simulated (replayed timings)")


def test_a_storage_path_under_a_file_says_the_folder_is_a_file(capsys, tmp_path):
    # Found 2026-11-27: sqlite:////<file>/x.db was refused as 'must be in a folder that exists', which it is not.
    blocker = tmp_path / "afile"
    blocker.write_text("")
    replay = str(HERE / "data" / "recorded_timings.json")
    line = one_line_error(capsys, ["tune", "256", "256", "256", "--gpu", "h100", "--replay", replay, "--trials", "2",
                                   "--storage", f"sqlite:///{blocker}/x.db"])
    assert "folder must be a folder" in line and str(blocker) in line


def test_gemmgen_results_naming_a_file_is_named_in_the_storage_error(capsys, tmp_path, monkeypatch):
    # Found 2026-11-27: 'cannot use the storage path (Not a directory)' did not say where the path came from.
    blocker = tmp_path / "afile"
    blocker.write_text("")
    monkeypatch.setenv("GEMMGEN_RESULTS", str(blocker))
    replay = str(HERE / "data" / "recorded_timings.json")
    line = one_line_error(capsys, ["tune", "256", "256", "256", "--gpu", "h100", "--replay", replay, "--trials", "2"])
    assert "GEMMGEN_RESULTS" in line
