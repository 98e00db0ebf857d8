"""What the device scripts share: the way they end, and how they write their record."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


def run_main(main: Callable[[], int], script: str) -> None:
    """Exit with main()'s status; an error the user can fix (no GPU, a bad argument) prints one line, exit 2."""
    from gemmgen.model.errors import UserError

    try:
        sys.exit(main())
    except UserError as exc:
        print(f"{Path(script).name}: {exc}", file=sys.stderr)
        sys.exit(2)


def write_report(out_dir, filename: str, report: dict) -> Path:
    """The script's JSON record under --out (created if missing); values JSON cannot hold are written as text."""
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / filename
    path.write_text(json.dumps(report, indent=1, default=str))
    return path
