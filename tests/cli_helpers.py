"""What the CLI tests share: running `gemmgen` in-process and holding it to the bad-input rule."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gemmgen.cli import main  # noqa: E402


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
