"""Where the repository's data lives: templates/, search_spaces/, results/ beside the package."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent
TEMPLATES = ROOT / "templates"
SEARCH_SPACES = ROOT / "search_spaces"
RESULTS = Path(os.environ.get("GEMMGEN_RESULTS", ROOT / "results"))


def cache_dir() -> Path:
    """The on-disk compile cache: $GEMMGEN_CACHE, else ~/.cache/gemmgen."""
    base = os.environ.get("GEMMGEN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gemmgen")
    return Path(base)
