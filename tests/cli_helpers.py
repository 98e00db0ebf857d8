"""What the CLI tests share: running `gemmgen` in-process and holding it to the bad-input rule."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402

from gemmgen.cli import main  # noqa: E402


@pytest.fixture
def isolated_env(tmp_path, monkeypatch):
    """Results, per-user data and the compile cache under tmp_path (never the checkout's or the user's); a short
    database timeout. Returns tmp_path."""
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMMGEN_DB_TIMEOUT", "0.5")
    return tmp_path


def one_line_error(capsys, argv) -> str:
    """Run the CLI, assert exit 2 with one line on stderr and no traceback; return that line."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors exit from inside parse_args
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]
