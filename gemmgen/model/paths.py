"""Where the repository's data lives: templates/, search_spaces/, results/ beside the package."""
from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
ROOT = PACKAGE.parent


def _data_dir(name: str) -> Path:
    """The repository's folder (a checkout or an editable install), else the copy a wheel installed under
    <prefix>/share/gemmgen."""
    beside = ROOT / name
    if beside.is_dir():
        return beside
    installed = Path(sys.prefix) / "share" / "gemmgen" / name
    return installed if installed.is_dir() else beside


TEMPLATES = _data_dir("templates")
SEARCH_SPACES = _data_dir("search_spaces")
# The tuning database: the repository's results/ in a checkout, ./results for an installed wheel.
RESULTS = Path(os.environ.get("GEMMGEN_RESULTS") or (ROOT / "results" if (ROOT / "results").is_dir() else "results"))


def cache_dir() -> Path:
    """The on-disk compile cache: $GEMMGEN_CACHE, else ~/.cache/gemmgen."""
    base = os.environ.get("GEMMGEN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gemmgen")
    return Path(base)
