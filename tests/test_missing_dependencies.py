"""A Python that lacks one of gemmgen's dependencies (PYTHONPATH to a checkout, gemmgen never installed): the command
that needs it is refused in one line, exit status 2, naming the package to install. Regression: `tune` without
Optuna, `render` without jinja2 and every command without PyYAML ended in a ModuleNotFoundError traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The module made unimportable, as in a Python where it was never installed; then the CLI.
WITHOUT = ("import sys; sys.modules[sys.argv[1]] = None; from gemmgen.cli import main; "
           "sys.exit(main(sys.argv[2:]))")


@pytest.mark.parametrize("module, package, command", [
    ("optuna", "optuna>=3.6", ["tune", "256", "256", "256", "--gpu", "h100", "--replay", "REPLAY", "--jobs", "0"]),
    ("optuna", "optuna>=3.6", ["plot", "study", "--storage", "STORAGE"]),
    ("jinja2", "jinja2>=3.1", ["render", "64", "64", "64", "--gpu", "h100"]),
    ("yaml", "pyyaml>=6", ["gpus"]),
], ids=lambda value: value if isinstance(value, str) and "=" not in value else None)
def test_a_missing_dependency_is_one_line_naming_the_package(tmp_path, module, package, command):
    replay = tmp_path / "replay.json"
    replay.write_text('{"timings": {}, "cublas_time_s": 1e-5}')
    argv = [str(replay) if a == "REPLAY" else f"sqlite:///{tmp_path}/s.db" if a == "STORAGE" else a for a in command]
    env = dict(os.environ, PYTHONPATH=str(ROOT), GEMMGEN_RESULTS=str(tmp_path / "results"),
               GEMMGEN_CACHE=str(tmp_path / "cache"), GEMMGEN_DATA=str(tmp_path / "data"))
    proc = subprocess.run([sys.executable, "-c", WITHOUT, module, *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"{module} is not installed in this Python" in proc.stderr
    assert f"pip install '{package}'" in proc.stderr


def test_a_missing_module_that_is_not_a_dependency_is_still_a_bug(monkeypatch):
    from gemmgen import cli

    assert cli.missing_dependency(ModuleNotFoundError("No module named 'scipy'", name="scipy")) is None
    assert "pyyaml" in cli.missing_dependency(ModuleNotFoundError("No module named 'yaml'", name="yaml"))
    assert "cuda-bindings[all]" in cli.missing_dependency(ModuleNotFoundError("x", name="cuda.bindings"))
