"""Regression tests for issue 24 (bad input): each traceback and each accepted-but-meaningless input of the
report is now one line naming the rule, with exit status 2, before any work starts (no GPU needed)."""
from __future__ import annotations

import json
import os

import pytest

from gemmgen import families
from gemmgen.cli import main
from gemmgen.model import parse
from gemmgen.model.arch import Arch, DType, lookup_gpu
from gemmgen.model.errors import InvalidInput
from gemmgen.model.linear import LinearLayer
from gemmgen.model.problem import Problem


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))


def refused(capsys, *argv) -> str:
    """Run the CLI in-process: exit 2, exactly one line on stderr, no traceback; that line."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err.strip()


@pytest.fixture
def binary_file(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 8)
    return str(path)


@pytest.fixture
def replay(tmp_path):
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"timings": {}, "cublas_time_s": 1e-5}))
    return str(path)


# --- the nine tracebacks -------------------------------------------------------------------------

@pytest.mark.parametrize("command", [
    ["compile", "64", "64", "64", "--gpu", "h100", "--out", "OUT", "--config", "BIN"],
    ["render", "64", "64", "64", "--gpu", "h100", "--config", "BIN"],
    ["roofline", "64", "64", "64", "--gpu", "h100", "--config", "BIN"],
    ["bench", "64", "64", "64", "--config", "BIN"],
    ["suite", "BIN", "--gpu", "h100", "--dry-run"],
])
def test_a_binary_file_as_config_or_suite_is_refused_as_not_utf8(capsys, tmp_path, binary_file, command):
    argv = [binary_file if a == "BIN" else str(tmp_path / "o") if a == "OUT" else a for a in command]
    assert "UTF-8 text" in refused(capsys, *argv)


def test_in_memory_sqlite_storage_is_refused_with_replay(capsys, replay):
    for url in ("sqlite://", "sqlite:///:memory:"):
        line = refused(capsys, "tune", "256", "256", "256", "--gpu", "h100", "--replay", replay, "--storage", url)
        assert "not an in-memory SQLite database" in line


def test_a_5000_character_database_name_is_a_storage_error(capsys, tmp_path, replay):
    url = f"sqlite:///{tmp_path}/{'a' * 5000}.db"
    line = refused(capsys, "tune", "256", "256", "256", "--gpu", "h100", "--replay", replay, "--storage", url)
    assert "cannot use the storage path (File name too long)" in line and len(line) < 400


@pytest.mark.parametrize("flag, value", [("--jobs", "1e30"), ("--jobs", "1" + "0" * 30), ("--jobs", "-1"),
                                         ("--seed", "-1"), ("--seed", "1e30"), ("--seed", str(2**32)),
                                         ("--seed", "9" * 5000)])
def test_jobs_and_seed_out_of_range_are_refused(capsys, replay, flag, value):
    line = refused(capsys, "tune", "256", "256", "256", "--gpu", "h100", "--replay", replay, flag, value)
    assert f"{flag} must be an integer from" in line


def test_tune_options_from_the_api_keep_the_same_ranges():
    from gemmgen.tune.search import TuneOptions

    for bad in (dict(seed=-1), dict(seed=2**32), dict(jobs=10**30), dict(trials=0), dict(timeout_s=float("nan"))):
        with pytest.raises(InvalidInput):
            TuneOptions(**bad).validate()
    assert TuneOptions(seed=2**32 - 1, sampler="TPE").validate().sampler == "tpe"


# --- accepted inputs that could not work ---------------------------------------------------------

@pytest.mark.parametrize("m, n, k, gpu, rule", [
    ("4096000000", "64", "64", "h100", "M must fit family"),  # a dimension the ABI's int cannot hold
    ("3000000000", "1", "8", "h100", "must fit family"),  # one dimension alone (M, and so D)
    ("50000", "50000", "64", "a100", "D (M*N) must fit family"),  # the element offsets, on 32-bit families
])
def test_dimensions_beyond_32_bit_indexing_are_refused_naming_the_family_rule(capsys, tmp_path, m, n, k, gpu,
                                                                            rule):
    line = refused(capsys, "compile", m, n, k, "--gpu", gpu, "--out", str(tmp_path))
    assert rule in line and "32-bit indexing" in line
    assert not list(tmp_path.iterdir())  # no manifest written
    assert rule in refused(capsys, "tune", m, n, k, "--gpu", gpu, "--dry-run")


def test_operands_past_2_31_elements_run_on_the_family_with_64_bit_offsets(capsys):
    # 50000 x 50000 x 64: D holds 2.5e9 elements. sm90_wgmma computes offsets in 64 bits (its dimensions stay
    # int); the sm80 families index in 32 bits and say so in the refusal above.
    assert main(["tune", "50000", "50000", "64", "--gpu", "h100", "--dry-run", "--top-k", "1"]) == 0
    assert "sm90_wgmma" in capsys.readouterr().out
    # A view counts its leading dimension: 40000 rows 60000 apart reach past 2^31 though 40000 x 64 do not.
    line = refused(capsys, "tune", "40000", "64", "64", "--lda", "60000", "--gpu", "a100", "--dry-run")
    assert "A (M*K) must fit family" in line


def test_the_indexing_limit_is_the_familys_own(monkeypatch, sm80_default):
    from gemmgen.families.rules import check

    gpu = lookup_gpu("a100")
    wide = Problem.create(70000, 64, 40000, "bf16", "col", "row")  # A: 2.8e9 elements, lda = 70000
    broken = [v.rule for v in check(sm80_default, gpu, problem=wide)]
    assert any("A (M*K)" in r and "32-bit" in r for r in broken)
    monkeypatch.setattr(families.get("sm80_mma"), "offset_bits", 64)  # a family whose offsets are 64-bit
    assert not [r for r in (v.rule for v in check(sm80_default, gpu, problem=wide)) if "indexing" in r]


@pytest.mark.parametrize("flag, value", [("--alpha", "nan"), ("--alpha", "inf"), ("--beta", "-inf"),
                                         ("--beta", "NaN"), ("--alpha", "1e400")])
def test_alpha_and_beta_must_be_finite(capsys, flag, value):
    assert f"{flag} must be a finite number" in refused(capsys, "roofline", "64", "64", "64", "--gpu", "h100",
                                                         f"{flag}={value}")


def test_alpha_and_beta_must_be_finite_from_files_and_the_api():
    for bad in (float("nan"), float("inf"), "nan"):
        with pytest.raises(InvalidInput, match="finite"):
            Problem.create(64, 64, 64, alpha=bad)
        with pytest.raises(InvalidInput, match="finite"):
            Problem.from_dict({"M": 64, "N": 64, "K": 64, "beta": bad})


@pytest.mark.parametrize("config", ["sm80_mma_cta128x128x32_w64x64x32_mma16x8x16_s3_swizzle_rrow1_dp_cl1x1",
                                    {"family": "sm80_mma", "cta": "128x128x32"}])
def test_predict_given_a_tag_or_dict_names_the_tileconfig_it_wants(config):
    """Regression: predict(problem, <a kernel tag string>, "h100") raised a bare AttributeError ('str' object has
    no attribute 'family'); a dict did the same."""
    from gemmgen.rank.predict import predict

    with pytest.raises(InvalidInput, match="a configuration must be a TileConfig") as info:
        predict(Problem.create(4096, 4096, 4096), config, "h100")
    assert "TileConfig.from_dict" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("command", [["roofline"], ["render"], ["bench"], ["compile", "--out", "OUT"]])
def test_a_config_file_that_is_another_gemmgen_file_is_refused_naming_the_file_and_what_it_must_hold(
        capsys, tmp_path, command):
    """Regression: '--config results/h100-sxm/suite.json' (a suite table) was refused as 'a configuration must give
    family, cta, warp, mma and stages, but got 'missing family'', naming neither the file nor what it should hold."""
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"format": "gemmgen-suite/1", "gpu": "h100-sxm", "rows": []}))
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in command]
    line = refused(capsys, argv[0], "64", "64", "64", "--gpu", "h100", *argv[1:], "--config", str(suite))
    assert str(suite) in line and "gemmgen-suite/1" in line
    assert "must hold a configuration (family, cta, warp, mma, stages, ...), a launch manifest or a tuning record" \
        in line


@pytest.mark.parametrize("flag, value, rule", [
    ("--tokens", " 1..8", "--tokens must be a positive count or a range LO..HI of them"),
    ("--tokens", "1..8 ", "--tokens must be a positive count or a range LO..HI of them"),
    ("--tokens", "8 ", "--tokens must be a positive count or a range LO..HI of them"),
    ("--dtype", "bf16 ", "dtype must be one of"), ("--activation", " relu", "activation must be one of")])
def test_surrounding_spaces_are_refused_in_tokens_as_in_names(capsys, flag, value, rule):
    """Regression: '--tokens " 1..8"' was stripped and accepted while '--dtype "bf16 "' (and every name and
    number) is refused; the token range now follows the one rule of model/parse.py: no surrounding spaces."""
    line = refused(capsys, "tune-linear", "64", "64", "--gpu", "h100", "--dry-run", flag, value)
    assert rule in line and repr(value) in line
    if flag == "--tokens":
        with pytest.raises(InvalidInput, match="--tokens must be"):
            LinearLayer.create(64, 64, tokens=value)


@pytest.mark.parametrize("text", ["４０９６", "٤٠٩٦", "४०९६", "4_096", " 4096", "4096\n", "0x1000", "4096.0", ""])
def test_digits_from_other_scripts_and_loose_numbers_are_refused(capsys, text):
    assert "M must be a positive integer" in refused(capsys, "roofline", text, "64", "64", "--gpu", "h100")
    assert "--trials must be an integer" in refused(capsys, "tune", "64", "64", "64", "--trials", text)
    with pytest.raises(InvalidInput):
        parse.real("x", text.replace("4096", "٤٠٩٦") if text.isascii() and text.strip() else text)


@pytest.mark.parametrize("argv, flag", [
    (["roofline", "64", "64", "64", "--gpu", ""], "--gpu"),
    (["tune", "64", "64", "64", "--gpu", "h100", "--storage", ""], "--storage"),
    (["tune", "64", "64", "64", "--gpu", "h100", "--dry-run", "--out", ""], "--out"),
    (["compile", "64", "64", "64", "--gpu", "h100", "--out", ""], "--out"),
    (["space", "--gpu", "h100", "--arch", ""], "--arch"),
    (["space", "--gpu", "h100", "--dtype", ""], "--dtype"),
    (["render", "64", "64", "64", "--gpu", "h100", "--config", ""], "--config"),
    (["suite", "", "--gpu", "h100", "--dry-run"], "FILE.yaml"),
])
def test_an_empty_string_is_an_error_not_unset(capsys, argv, flag):
    assert f"{flag} must be non-empty text" in refused(capsys, *argv)


@pytest.mark.parametrize("cta", ["128 x 128 x 32", "128X128X32", "128*128*32", "128,128,32", "0128x128x32",
                                 "128x128x32 ", "１２８x128x32", "128×128×32"])
def test_loosely_written_tile_strings_are_refused(capsys, tmp_path, cta):
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"family": "sm80_mma", "cta": cta, "warp": "64x64x32", "mma": "16x8x16",
                                  "stages": 3}))
    assert "CTA tile must be written MxNxK" in refused(capsys, "render", "--gpu", "a100", "--config", str(config))
    assert "warp tile must be written" in refused(capsys, "intensity", "--warp", cta.replace("128", "64", 2))


@pytest.mark.parametrize("argv, pair", [
    (["tune", "64", "64", "64", "--gpu", "h100", "--dry-run", "--replay", "r.json"], "--dry-run and --replay"),
    (["tune", "64", "64", "64", "--gpu", "h100", "--dry-run", "--storage", "sqlite:///s.db"], "--dry-run and --storage"),
    (["tune", "64", "64", "64", "--gpu", "h100", "--dry-run", "--sampler", "random"], "--dry-run and --sampler"),
    (["suite", "s.yaml", "--gpu", "h100", "--from-results", "--dry-run"], "--from-results and --dry-run"),
    (["suite", "s.yaml", "--gpu", "h100", "--from-results", "--trials", "5"], "--from-results and --trials"),
    (["suite", "s.yaml", "--gpu", "h100", "--dry-run", "--timeout-per-shape", "5"],
     "--dry-run and --timeout-per-shape"),
])
def test_conflicting_flags_are_refused_naming_both(capsys, argv, pair):
    assert f"{pair} cannot be used together" in refused(capsys, *argv)


def test_plot_refuses_a_record_file_with_storage_naming_both(capsys, tmp_path):
    """Regression: 'plot RECORD --storage URL' plotted the record and never opened the storage, without a word."""
    record = tmp_path / "tune.json"
    record.write_text(json.dumps({"format": "gemmgen-tune/1", "trials": []}))
    db = tmp_path / "s.db"
    line = refused(capsys, "plot", str(record), "--storage", f"sqlite:///{db}", "--out", str(tmp_path))
    assert "a tuning record file and --storage cannot be used together" in line and str(record) in line
    assert not db.exists()


def test_space_for_an_arch_beyond_the_gpu_is_exit_2_naming_why(capsys):
    line = refused(capsys, "space", "--gpu", "rtx3090", "--arch", "sm_90a")
    assert "arch must not exceed the GPU's (sm_86 on rtx3090)" in line


@pytest.mark.parametrize("argv, words", [
    (["--dtype", "fp64"], "dtype must be one of"),
    (["--b-dtype", "int8"], "dtype must be one of"),
    (["--a", "diag"], "layout must be one of"),
    (["--arch", "sm_70"], "arch must be one of"),
    (["--dtype", "bf16", "--b-dtype", "e4m3"], "A and B must have the same dtype unless both are fp8"),
])
def test_space_checks_its_input_before_looking_for_a_gpu(capsys, monkeypatch, argv, words):
    # Regression: without --gpu, 'gemmgen space --dtype fp64' on a machine without a GPU said 'no GPU available'.
    import gemmgen.cli.space as space
    from gemmgen.model.errors import NoGpu

    def no_gpu(name):
        if name is None:
            raise NoGpu("no CUDA driver found (test)")
        return lookup_gpu(name)

    monkeypatch.setattr(space, "resolve_gpu", no_gpu)
    assert words in refused(capsys, "space", *argv)


def test_bench_checks_its_input_before_looking_for_a_gpu(capsys, tmp_path):
    assert "dtype must be one of" in refused(capsys, "bench", "64", "64", "64", "--dtype", "int4")
    assert "M must be a positive integer" in refused(capsys, "bench", "0", "64", "64")
    assert "--config must name a readable file" in refused(capsys, "bench", "64", "64", "64", "--config",
                                                           str(tmp_path / "missing.yaml"))
    assert "arch must be one of" in refused(capsys, "bench", "64", "64", "64", "--arch", "sm_70")


def test_bench_refuses_what_the_named_gpu_cannot_run_before_looking_for_a_gpu(capsys):
    # Regression: with --gpu given, a problem no family of that GPU runs (fp8 on an A100, M past every family's
    # indexing) was reported as "no GPU available" on a machine without one: bad input, named as such, on any machine.
    assert "dtype must be one the kernel families take on a100-sxm" in refused(
        capsys, "bench", "64", "64", "64", "--gpu", "a100", "--dtype", "e4m3")
    assert "no kernel family can run this problem" in refused(capsys, "bench", "2147483648", "1", "1", "--gpu", "h100")


def test_bench_refuses_a_config_the_named_gpu_cannot_run_before_looking_for_a_gpu(capsys, tmp_path):
    # Regression: with --gpu and --config, a configuration breaking that GPU's rules (an sm80_mma kernel for fp8,
    # an sm90_wgmma kernel on an A100) was reported as "no GPU available" on a machine without one.
    sm80 = tmp_path / "sm80.json"
    sm80.write_text(json.dumps({"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16",
                                "stages": 3}))
    sm90 = tmp_path / "sm90.json"
    sm90.write_text(json.dumps({"family": "sm90_wgmma", "cta": "128x128x64", "warp": "64x128x64",
                                "mma": "64x128x16", "stages": 4, "warp_specialized": True, "persistent": True}))
    line = refused(capsys, "bench", "64", "64", "64", "--gpu", "h100", "--dtype", "e4m3", "--config", str(sm80))
    assert "is infeasible" in line and "family sm80_mma supports dtypes: got e4m3" in line
    line = refused(capsys, "bench", "64", "64", "64", "--gpu", "a100", "--config", str(sm90))
    assert "is infeasible" in line and "family sm90_wgmma needs arch: got sm_80" in line


@pytest.mark.parametrize("command", ["tune", "suite"])
@pytest.mark.parametrize("value", ["a,b", "-1", "0..3", ",", "0,,1"])
def test_a_malformed_gpus_list_is_refused_before_looking_for_gpus(capsys, tmp_path, command, value):
    # Regression: '--gpus a,b' (or -1, 0..3, ',') was 'no GPU available' on a machine without one: the list was read
    # only once the driver had answered. Its syntax is now checked first, on any machine.
    suite = tmp_path / "suite.yaml"
    suite.write_text("shapes:\n  - {M: 64, N: 64, K: 64}\n")
    argv = ["tune", "64", "64", "64"] if command == "tune" else ["suite", str(suite)]
    line = refused(capsys, *argv, "--gpu", "h100", f"--gpus={value}")
    assert "--gpus must be 'all' or comma-separated CUDA ordinals" in line


@pytest.mark.parametrize("command", ["tune", "compile"])
def test_a_3xtf32_problem_past_the_k_limit_is_refused_naming_the_k_rule(capsys, tmp_path, command):
    """Regression: `tune 128 128 800000000 --dtype f32 --math 3xtf32` (3 x K past the int the three K segments
    share) was refused for '3xTF32 (split3) kernels serve --math 3xtf32 problems, tf32 kernels the others', the rule
    the family's tf32 kernels break, while --config with a 3xTF32 kernel named the K rule; compile without --config
    named the same wrong rule. Both now name the K rule and its value."""
    argv = [command, "128", "128", "800000000", "--dtype", "f32", "--math", "3xtf32", "--gpu", "h100"]
    argv += ["--dry-run"] if command == "tune" else ["--out", str(tmp_path / "out")]
    line = refused(capsys, *argv)
    assert "no kernel family can run this problem" in line
    wgmma = line.partition("sm90_wgmma: ")[2].partition(";")[0]
    assert wgmma.startswith("3xTF32 (split3) passes its three K segments"), line
    assert "got 2400000000, limit 2147483647" in wgmma, line
    assert "tf32 kernels the others" not in line


def registry_dtypes(gpu: str) -> str:
    """What the registry says the families for this GPU's arch take, as the error lists them."""
    arch = lookup_gpu(gpu).arch
    return ", ".join(sorted({d.value for f in families.for_arch(arch) for d in f.dtypes}))


@pytest.mark.parametrize("argv", [
    ["space", "--gpu", "a100", "--dtype", "f32"],   # (on an H100, f32 runs as tf32 since 2026-11-25)
    ["space", "--gpu", "a100", "--dtype", "fp8"],
    ["tune", "64", "64", "64", "--gpu", "rtx4090", "--dtype", "e5m2", "--dry-run"],
    ["compile", "64", "64", "64", "--gpu", "a100", "--dtype", "f32", "--out", "o"],
])
def test_dtypes_no_family_takes_are_refused_up_front_listing_the_supported_ones(capsys, argv):
    line = refused(capsys, *argv)
    gpu = argv[argv.index("--gpu") + 1]
    assert f"dtype must be one the kernel families take on {lookup_gpu(gpu).key}" in line
    assert f"({lookup_gpu(gpu).arch.value}): {registry_dtypes(gpu)}, but got" in line


def test_the_supported_dtypes_come_from_the_family_registry(monkeypatch):
    from gemmgen.rank.space import check_target
    from gemmgen.tune.suite_file import parse_dtypes

    h100 = lookup_gpu("h100")
    hopper = families.get("sm90_wgmma")
    monkeypatch.setattr(hopper, "dtypes", hopper.dtypes - {DType.F32})  # as before the family added tf32
    with pytest.raises(InvalidInput, match=registry_dtypes("h100")):
        check_target(h100, Arch.SM90A, DType.F32)
    monkeypatch.setattr(hopper, "dtypes", hopper.dtypes | {DType.F32})
    check_target(h100, Arch.SM90A, DType.F32)
    assert parse_dtypes("bf16,f32") == ["bf16", "f32"]
    with pytest.raises(InvalidInput, match=f"{registry_dtypes('a100')}, but got 'f32'"):
        check_target(lookup_gpu("a100"), Arch.SM80, DType.F32)  # the Hopper family does not run on sm_80


def test_a_storage_in_a_folder_that_does_not_exist_is_refused_and_nothing_is_created(capsys, tmp_path, replay):
    deep = tmp_path / "deep" / "path"
    line = refused(capsys, "tune", "256", "256", "256", "--gpu", "h100", "--replay", replay,
                   "--storage", f"sqlite:///{deep}/db")
    assert "must be in a folder that exists" in line
    assert not (tmp_path / "deep").exists()


def test_control_characters_and_nul_bytes_in_paths_are_refused(capsys):
    assert "control characters" in refused(capsys, "render", "--gpu", "h100", "--config", "a\x00b")
    assert "control characters" in refused(capsys, "suite", "s\n.yaml", "--gpu", "h100", "--dry-run")


def test_a_huge_or_deeply_nested_yaml_file_is_one_line(capsys, tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 20000 + "]" * 20000)
    assert "deep.yaml" in refused(capsys, "suite", str(deep), "--gpu", "h100", "--dry-run")
    huge = tmp_path / "huge.yaml"
    huge.write_text("shapes:\n  - {M: " + "9" * 5000 + ", N: 64, K: 64}\n")
    assert "huge.yaml" in refused(capsys, "suite", str(huge), "--gpu", "h100", "--dry-run")
    if os.path.exists("/dev/zero"):
        assert "at most 64 MiB" in refused(capsys, "render", "--gpu", "h100", "--config", "/dev/zero")


@pytest.mark.parametrize("payload, words", [
    ({"timings": {"t": "fast"}}, "timings['t'] must be a finite number"),
    ({"timings": {"t": float("nan")}}, "timings['t'] must be a finite number"),
    ({"timings": {"t": []}}, "timings['t'] must be a finite number"),
    ({"timings": {"t": {"speed": 1}}}, "keys must be among"),
    ({"timings": {"t": {"rel_error": "big"}}}, "rel_error must be a finite number"),
    ({"timings": {}, "delay_s": "slow"}, "delay_s must be a finite number"),
    ({"timings": {}, "cublas_time_s": -1}, "cublas_time_s must be a finite number"),
])
def test_a_replay_file_is_checked_when_read_not_in_the_worker(capsys, tmp_path, payload, words):
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(payload))
    assert words in refused(capsys, "tune", "256", "256", "256", "--gpu", "h100", "--replay", str(path))


def test_a_bad_lock_timeout_in_the_environment_is_one_line(capsys, monkeypatch, replay):
    monkeypatch.setenv("GEMMGEN_DB_TIMEOUT", "soon")
    assert "GEMMGEN_DB_TIMEOUT must be a finite number" in refused(
        capsys, "tune", "256", "256", "256", "--gpu", "h100", "--replay", replay, "--trials", "1")


def test_a_suite_shape_name_must_be_printable_text(capsys, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("shapes:\n  - {name: [1, 2], M: 64, N: 64, K: 64}\n")
    assert "a shape name must be printable text" in refused(capsys, "suite", str(path), "--gpu", "h100", "--dry-run")


@pytest.mark.parametrize("argv,flag", [(["render", "64", "64", "64", "--gpu", "h100", "--out", "x"], "--out x"),
                                       (["roofline", "64", "64", "64", "--gpu", "h100", "--dtyp", "bf16"], "--dtyp bf16")])
def test_a_prefix_of_a_flag_is_an_unknown_flag_not_the_flag_it_begins(capsys, argv, flag):
    # Regression: argparse took prefixes of flags, so 'render ... --out x' (render has no --out) was read as
    # --out-dtype x and refused as a bad dtype, naming neither the flag typed nor the one it became.
    line = refused(capsys, *argv)
    assert f"unrecognized arguments: {flag}" in line
