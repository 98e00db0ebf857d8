"""What the device scripts share: the way they end."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


def run_main(main: Callable[[], int], script: str) -> None:
    """Exit with main()'s status; an error the user can fix (no GPU, a bad argument) prints one line, exit 2."""
    from gemmgen.errors import UserError

    try:
        sys.exit(main())
    except UserError as exc:
        print(f"{Path(script).name}: {exc}", file=sys.stderr)
        sys.exit(2)
