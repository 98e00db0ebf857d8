"""A non-editable `pip install .` carries the templates, search spaces and tuned records: from another directory,
`gemmgen lookup` answers from the shipped records and a dry-run tune
compiles, and nothing is written into the current directory but the bundle asked for. (A --prefix install, with
the dependencies of the test environment, so that the test downloads nothing but the build backend.)"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_data_folder_is_listed_for_the_wheel():
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    patterns = {p for globs in listed.values() for p in globs}
    folders = {str(p.parent.relative_to(ROOT)) for top in ("templates", "search_spaces", "results")
               for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in (".j2", ".yaml", ".json", ".md")}
    covered = {str(Path(p).parent) for p in patterns}
    assert folders <= covered, sorted(folders - covered)


def test_every_data_file_is_listed_for_the_wheel():
    """A folder listed with some of its files named leaves the others out of the wheel: results/h100-sxm's
    calibration.json was, so an installed gemmgen ranked with the model's defaults where a checkout ranked with
    the shipped H100 calibration (other dry-run picks than the README's)."""
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    shipped = {path.resolve() for globs in listed.values() for pattern in globs for path in ROOT.glob(pattern)}
    files = {p.resolve() for top in ("templates", "search_spaces", "results") for p in (ROOT / top).rglob("*")
             if p.is_file() and p.suffix in (".j2", ".yaml", ".json", ".md")}
    assert not files - shipped, sorted(str(p.relative_to(ROOT)) for p in files - shipped)


@pytest.mark.slow
def test_lookup_and_dry_run_work_after_a_plain_pip_install_from_another_directory(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".ci-venv", ".venv", "*.egg-info", "build",
                                                              "__pycache__", ".pytest_cache", ".hypothesis", ".whl"))
    prefix = tmp_path / "prefix"
    # Only gemmgen itself is installed (from a wheel pip builds); its dependencies are the test environment's.
    # --ignore-installed: without it pip uninstalls the test environment's own gemmgen first (even with --prefix),
    # which left the environment without its `gemmgen` command after a test run.
    built = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed",
                            "--prefix", str(prefix), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (site,) = prefix.glob("lib/python*/site-packages")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMMGEN_")}
    env["PYTHONPATH"] = str(site)  # ahead of the test environment's editable gemmgen
    env["GEMMGEN_DATA"] = str(tmp_path / "data")
    env["GEMMGEN_CACHE"] = str(tmp_path / "cache")
    gemmgen = [sys.executable, "-m", "gemmgen"]
    where = subprocess.run([sys.executable, "-c", "import gemmgen, sys; print(gemmgen.__file__)"], cwd=elsewhere,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(site)), where  # the installed copy, not the source tree
    found = subprocess.run(gemmgen + ["lookup", "4096", "4096", "4096", "--gpu", "h100"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    assert "sm90_wgmma" in found.stdout and "4096x4096x4096" in found.stdout
    tuned = subprocess.run(gemmgen + ["tune", "512", "512", "512", "--gpu", "h100", "--dry-run", "--top-k", "1",
                            "--out", "bundle"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert tuned.returncode == 0, tuned.stderr
    # It ranks with the shipped H100 calibration, as a checkout does.
    assert "calibration in " in tuned.stderr and "h100-sxm/calibration.json" in tuned.stderr, tuned.stderr
    assert sorted(p.suffix for p in (elsewhere / "bundle").iterdir()) == [".cu", ".cubin", ".json"]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["bundle"]
