"""`gemmgen tune`, `lookup` and `suite` on the command line: bad input, storage failures, the dry
run end to end (real NVRTC), and a replayed tune end to end (simulation mode, no GPU)."""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gemmgen.cli import main  # noqa: E402
from cli_helpers import one_line_error  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMMGEN_DB_TIMEOUT", "0.5")


def replay_file(tmp_path, problem_args=("256", "256", "256"), dtype="bf16", hang=()):
    """Replayed timings for the real search space: the real model's time x 1.5 (synthetic)."""
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.model.problem import Problem
    from gemmgen.tune.search import default_engines

    gpu = lookup_gpu("h100")
    problem = Problem.create(*problem_args, dtype)
    engines = default_engines(0)
    timings = {c.tag: engines.predict(problem, c, gpu).time_s * 1.5
               for c in engines.enumerate(problem, gpu, gpu.arch)}
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"synthetic": "model x 1.5", "cublas_time_s": 1e-5, "timings": timings}))
    return path


# --- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["tune", "0", "4096", "4096", "--gpu", "h100", "--dry-run"], "M must be a positive integer"),
    (["tune", "64", "-3", "64", "--gpu", "h100", "--dry-run"], "N must be a positive integer"),
    (["tune", "64", "64", "1.5", "--gpu", "h100", "--dry-run"], "K must be a positive integer"),
    (["tune", "64", "64", "64", "--dtype", "f64", "--gpu", "h100", "--dry-run"], "dtype must be one of"),
    (["tune", "64", "64", "64", "--a", "diagonal", "--gpu", "h100", "--dry-run"], "layout must be"),
    (["tune", "64", "64", "64", "--gpu", "h900", "--dry-run"], "GPU must be one of"),
    (["tune", "64", "64", "64", "--dry-run"], "--dry-run needs --gpu"),
    (["tune", "64", "64", "64", "--gpu", "h100", "--trials", "0", "--dry-run"], "--trials must be"),
    (["tune", "64", "64", "64", "--gpu", "h100", "--sampler", "annealing"], "--sampler must be"),
    (["tune", "64", "64", "64", "--gpu", "h100", "--timeout", "soon"], "--timeout must be a finite number"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, words):
    assert words in one_line_error(capsys, argv)


def test_without_a_gpu_tune_exits_2_and_says_how_to_dry_run(capsys):
    from conftest import cuda_device_reason

    if not cuda_device_reason():
        pytest.skip("a GPU is present: tune would run")
    line = one_line_error(capsys, ["tune", "4096", "4096", "4096", "--gpu", "h100"])
    assert "no GPU available" in line and "--dry-run" in line


@pytest.mark.parametrize("argv, hint", [
    (["tune", "64", "64", "64", "--gpu", "h100"], "gemmgen tune M N K --gpu h100 --dry-run --out DIR"),
    (["suite", str(HERE.parent / "results" / "shapes.yaml"), "--gpu", "h100", "--no-progress"],
     "gemmgen suite FILE.yaml --gpu h100 --dry-run --out DIR"),
    (["tune-linear", "64", "128", "--tokens", "1..64", "--gpu", "h100"],
     "gemmgen tune-linear IN OUT --tokens LO..HI --gpu h100 --dry-run"),
])
def test_without_a_gpu_each_measuring_command_names_its_own_dry_run(capsys, monkeypatch, tmp_path, argv, hint):
    """suite and tune-linear without a GPU pointed at `gemmgen tune M N K ... --dry-run`, another command with
    other arguments; each now names its own dry run."""
    from gemmgen.runtime import detect

    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(detect, "detect_gpu", lambda device=0: detect.Detected(None, "no CUDA driver found", {}))
    line = one_line_error(capsys, argv)
    assert "no GPU available" in line and line.endswith(f"without a GPU: {hint})")


# --- storage ---------------------------------------------------------------------------------

def _storage_error(capsys, tmp_path, url) -> str:
    replay = replay_file(tmp_path)
    return one_line_error(capsys, ["tune", "256", "256", "256", "--gpu", "h100", "--replay", str(replay),
                                   "--storage", url, "--no-progress"])


@pytest.mark.parametrize("url, words", [
    ("not a url", "must be an SQLAlchemy URL"),
    ("nosuchdb://host/db", "must name a database SQLAlchemy knows"),
    ("postgresql+psycopg2://user@localhost/db", "driver that is not installed"),
])
def test_bad_storage_urls_are_one_line_errors(capsys, tmp_path, url, words):
    if "psycopg2" in url:
        pytest.importorskip("sqlalchemy")
        try:
            import psycopg2  # noqa: F401

            pytest.skip("psycopg2 is installed here")
        except ImportError:
            pass
    assert words in _storage_error(capsys, tmp_path, url)


def test_a_corrupt_database_file_is_a_one_line_error(capsys, tmp_path):
    db = tmp_path / "studies.db"
    db.write_bytes(b"this is not sqlite at all" * 100)
    assert "corrupt or not an SQLite file" in _storage_error(capsys, tmp_path, f"sqlite:///{db}")
    assert db.read_bytes().startswith(b"this is not sqlite")  # left as it was


def test_a_truncated_sqlite_file_is_a_one_line_error(capsys, tmp_path):
    db = tmp_path / "studies.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table t(x)")
        conn.executemany("insert into t values (?)", [("x" * 500,)] * 200)
    db.write_bytes(db.read_bytes()[:3000])  # header intact, pages missing
    line = _storage_error(capsys, tmp_path, f"sqlite:///{db}")
    assert "storage" in line or "database" in line


def test_a_locked_database_is_a_one_line_error(capsys, tmp_path):
    from gemmgen.tune.search import open_storage

    db = tmp_path / "studies.db"
    open_storage(f"sqlite:///{db}").engine.dispose()  # a valid Optuna database
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert "locked by another process" in _storage_error(capsys, tmp_path, f"sqlite:///{db}")
    finally:
        holder.execute("ROLLBACK")
        holder.close()


# --- end to end ------------------------------------------------------------------------------

def _sass_tools():
    try:
        from gemmgen.codegen.sass import find_tool

        find_tool("cuobjdump")
        find_tool("nvdisasm")
        import gemmgen.codegen.nvrtc  # noqa: F401
        from cuda.bindings import nvrtc  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any missing piece means: skip, saying which
        return f"{type(exc).__name__}: {exc}"
    return ""


def test_dry_run_exports_the_models_pick_with_sass_of_its_family(capsys, tmp_path):
    missing = _sass_tools()
    if missing:
        pytest.skip(f"NVRTC or cuobjdump unavailable: {missing}")
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.model.problem import Problem
    from gemmgen.codegen.sass import dump_sass, instruction_counts
    from gemmgen.rank.space import default_config

    out = tmp_path / "bundle"
    assert main(["tune", "4096", "4096", "4096", "--gpu", "h100", "--dry-run", "--out", str(out),
                 "--top-k", "2", "--jobs", "2"]) == 0
    printed = capsys.readouterr().out
    assert "nothing measured" in printed and "exported (not measured)" in printed
    [manifest_path] = out.glob("*.json")
    manifest = json.loads(manifest_path.read_text())
    assert manifest["measured"] is None and manifest["verification"] is None
    assert manifest["note"] == "not measured (dry run)"
    expected = default_config(Problem.create(4096, 4096, 4096), lookup_gpu("h100"))
    assert manifest["config"] == expected.to_dict()  # the model's pick, as `gemmgen compile` picks it
    counts = instruction_counts(dump_sass((out / manifest["cubin"]).read_bytes()))
    mnemonics = " ".join(counts)
    if expected.family == "sm90_wgmma":
        assert "HGMMA" in mnemonics and "UTMALDG" in mnemonics
    else:
        assert "HMMA" in mnemonics and "LDGSTS" in mnemonics
    assert (out / manifest["source"]).read_text().strip()


def test_replayed_tune_end_to_end_then_lookup(capsys, tmp_path):
    if _sass_tools():
        pytest.skip("NVRTC unavailable")
    replay = replay_file(tmp_path)
    out = tmp_path / "bundle"
    argv = ["tune", "256", "256", "256", "--gpu", "h100", "--replay", str(replay), "--trials", "3",
            "--top-k", "3", "--finalists", "2", "--rounds", "2", "--jobs", "2", "--no-progress", "--out", str(out),
            "--storage", f"sqlite:///{tmp_path / 'studies.db'}"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "winner:" in printed and "vs cuBLAS" in printed and "reached --trials 3" in printed
    [manifest_path] = out.glob("*.json")
    manifest = json.loads(manifest_path.read_text())
    assert manifest["measured"]["rounds"] == 2 and manifest["simulated"] is True

    # Re-running the same command resumes the finished study: nothing left to search.
    assert main(argv) == 0
    assert "0 measured this run" in capsys.readouterr().out

    assert main(["lookup", "256", "256", "256", "--gpu", "h100"]) == 0
    answer = capsys.readouterr().out
    assert answer.startswith("exact match: 256x256x256_bf16_rr") and "simulated" in answer
    assert main(["lookup", "256", "256", "300", "--gpu", "h100"]) == 0
    assert "nearest held: 256x256x256_bf16_rr" in capsys.readouterr().out


def test_replayed_tune_with_sustained_timing_reports_each_finalist_round(capsys, tmp_path):
    if _sass_tools():
        pytest.skip("NVRTC unavailable")
    replay = replay_file(tmp_path)
    argv = ["tune", "256", "256", "256", "--gpu", "h100", "--replay", str(replay), "--trials", "3",
            "--top-k", "3", "--finalists", "2", "--rounds", "2", "--jobs", "2", "--timing", "sustained",
            "--storage", f"sqlite:///{tmp_path / 'studies.db'}"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "re-measuring the best 2 interleaved, 2 rounds (sustained timing, after one settling round)" in err
    assert "  round 1/2; leading " in err and "  round 2/2; leading " in err
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.model.problem import Problem
    from gemmgen.tune.results import record_path
    record = json.loads(record_path(lookup_gpu("h100"), Problem.create(256, 256, 256), simulated=True).read_text())
    assert record["search"]["finalist_timing"] == "sustained"


def test_lookup_with_nothing_stored_is_one_line(capsys):
    assert "no tuning results stored for h100-sxm" in one_line_error(capsys, ["lookup", "64", "64", "64",
                                                                               "--gpu", "h100"])


# --- suite files -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, words", [
    ("shapes: [", "must be valid YAML"),
    ("shapes: []", "must map 'shapes' to a non-empty list"),
    ("- {M: 1, N: 2, K: 3}", "must map 'shapes' to a non-empty list"),
    ("shapes:\n  - {name: a, M: 64, N: 0, K: 64}", "shapes[0]: N must be a positive integer"),
    ("shapes:\n  - {name: a, M: 64, N: 64}", "shapes[0]: K must be a positive integer"),
    ("shapes:\n  - {name: a, M: 64, N: 64, K: 64, dtype: bf16}", "shapes[0] keys must be among"),
    ("shapes:\n  - {name: a, M: 64, N: 64, K: 64}\n  - {name: a, M: 8, N: 8, K: 8}", "names must be unique"),
])
def test_malformed_suite_files_name_the_file_and_rule(capsys, tmp_path, text, words):
    path = tmp_path / "shapes.yaml"
    path.write_text(text)
    line = one_line_error(capsys, ["suite", str(path), "--gpu", "h100", "--dry-run"])
    assert str(path) in line and words in line


def test_replayed_suite_writes_the_side_by_side_table(capsys, tmp_path):
    if _sass_tools():
        pytest.skip("NVRTC unavailable")
    replay = replay_file(tmp_path)
    shapes = tmp_path / "shapes.yaml"
    # "twin" is tiny's product under another name (as llm_o is sq4096): tuned once, one row each.
    shapes.write_text("shapes:\n  - {name: tiny, M: 256, N: 256, K: 256}\n  - {name: twin, M: 256, N: 256, K: 256}\n")
    assert main(["suite", str(shapes), "--gpu", "h100", "--replay", str(replay), "--dtypes", "bf16",
                 "--trials", "2", "--top-k", "2", "--finalists", "1", "--rounds", "1", "--jobs", "2",
                 "--no-progress", "--storage", f"sqlite:///{tmp_path / 'studies.db'}"]) == 0
    printed = capsys.readouterr().out
    assert "tiny" in printed and "geomean ratio to cuBLAS" in printed
    [js] = (tmp_path / "results" / "h100-sxm").glob("suite*.json")
    assert js.name == "suite-replay.json"  # simulated: beside the GPU's table, never over it
    report = json.loads(js.read_text())
    row, twin = report["rows"]
    assert row["tflops"] and row["cublas_tflops"] and row["ratio"] == pytest.approx(row["tflops"] / row["cublas_tflops"])
    assert report["geomean_ratio"]["all"] == pytest.approx(row["ratio"])
    assert js.with_suffix(".md").read_text().count("| tiny |") == 1
    assert row["note"] == "simulated (replayed timings)"
    assert twin["name"] == "twin" and twin["note"] == "same problem as tiny; simulated (replayed timings)"
    assert twin["tuning_s"] == 0
    assert (twin["tflops"], twin["cublas_tflops"], twin["kernel"]) == (row["tflops"], row["cublas_tflops"], row["kernel"])

    # A suite tuned in parts: the table is rebuilt from the stored records, and lookup answers each shape.
    js.unlink()
    shapes.write_text("shapes:\n  - {name: tiny, M: 256, N: 256, K: 256}\n")
    assert main(["suite", str(shapes), "--gpu", "h100", "--dtypes", "bf16,f16", "--from-results"]) == 0
    [js] = (tmp_path / "results" / "h100-sxm").glob("suite*.json")
    assert js.name == "suite-replay.json"  # built from a replayed record: beside the GPU's table, never over it
    bf16, f16 = json.loads(js.read_text())["rows"]
    assert bf16["tflops"] == pytest.approx(row["tflops"]) and bf16["ratio"] == pytest.approx(row["ratio"])
    assert f16["tflops"] is None and f16["note"] == "not tuned yet"
    capsys.readouterr()
    assert main(["lookup", "256", "256", "256", "--gpu", "h100"]) == 0
    assert capsys.readouterr().out.startswith("exact match")


def test_suite_only_must_name_shapes_of_the_file(capsys, tmp_path):
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text("shapes:\n  - {name: tiny, M: 256, N: 256, K: 256}\n")
    line = one_line_error(capsys, ["suite", str(shapes), "--gpu", "h100", "--dry-run", "--only", "tiny,huge"])
    assert "--only must name shapes of the file (tiny)" in line and "huge" in line


def test_a_dry_run_refuses_storage_naming_both_flags_and_creates_nothing(capsys, tmp_path):
    """Regression (issue 24): `--dry-run --storage URL` ignored the storage with a note; a dry run opens none,
    so the pair is refused, as is every other flag a dry run would ignore."""
    ok = tmp_path / "s.db"
    line = one_line_error(capsys, ["tune", "64", "64", "64", "--gpu", "h100", "--dry-run", "--top-k", "1",
                                   "--storage", f"sqlite:///{ok}"])
    assert "--dry-run and --storage cannot be used together" in line
    assert not ok.exists()
    assert "--dry-run and --seed" in one_line_error(capsys, ["tune", "64", "64", "64", "--gpu", "h100",
                                                             "--dry-run", "--seed", "3"])
    assert not ok.exists()


def test_a_replayed_tune_never_overwrites_a_gpu_record_nor_joins_its_study(capsys, tmp_path):
    """Regression (2026-11-22): a `--replay` run wrote its record over the H100 record of the same problem.
    Simulated tunes now keep their own records (tunes-replay/) and default study file."""
    if _sass_tools():
        pytest.skip("NVRTC unavailable")
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.model.problem import Problem
    from gemmgen.tune.results import record_path

    gpu, problem = lookup_gpu("h100"), Problem.create(256, 256, 256)
    real = record_path(gpu, problem)
    real.parent.mkdir(parents=True)
    real.write_text('{"a GPU measurement": true}')
    assert main(["tune", "256", "256", "256", "--gpu", "h100", "--replay", str(replay_file(tmp_path)),
                 "--trials", "2", "--top-k", "2", "--finalists", "1", "--rounds", "1", "--jobs", "2",
                 "--no-progress"]) == 0
    assert real.read_text() == '{"a GPU measurement": true}'
    assert record_path(gpu, problem, simulated=True).is_file()
    assert not (real.parent.parent / "studies.db").exists()
    assert (real.parent.parent / "replay-studies.db").exists()
