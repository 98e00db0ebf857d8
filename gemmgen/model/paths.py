"""Where gemmgen's data lives.

Read-only data (templates/, search_spaces/, the tuned records of results/) sits beside the package in a checkout
or an editable install, and under <prefix>/share/gemmgen in a wheel's install. What gemmgen writes goes to a
checkout's results/ (so tunes run in the repository add to its records), else to the per-user data directory:
$GEMMGEN_DATA, else $XDG_DATA_HOME/gemmgen, else ~/.local/share/gemmgen. $GEMMGEN_RESULTS names the one folder records (and the
Optuna studies beside them) are written to and read from.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
ROOT = PACKAGE.parent


def _data_dir(name: str) -> Path:
    """The repository's folder (a checkout or an editable install), else the copy a wheel installed under
    <prefix>/share/gemmgen: the running interpreter's prefix, or the prefix the package was installed into
    (pip install --prefix / --target)."""
    beside = ROOT / name
    if beside.is_dir():
        return beside
    prefixes = [Path(sys.prefix)] + ([PACKAGE.parents[3]] if len(PACKAGE.parents) > 3 else [])
    for prefix in prefixes:
        installed = prefix / "share" / "gemmgen" / name
        if installed.is_dir():
            return installed
    return beside


TEMPLATES = _data_dir("templates")
SEARCH_SPACES = _data_dir("search_spaces")
# The records shipped with gemmgen: the checkout's results/, or the copy a wheel installed.
SHIPPED_RESULTS = _data_dir("results")


def user_data_dir() -> Path:
    """The per-user data directory: $GEMMGEN_DATA, else $XDG_DATA_HOME/gemmgen, else ~/.local/share/gemmgen."""
    explicit = os.environ.get("GEMMGEN_DATA")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_DATA_HOME")
    return Path(xdg) / "gemmgen" if xdg else Path.home() / ".local" / "share" / "gemmgen"


def results_dir() -> Path:
    """Where new records go: $GEMMGEN_RESULTS, else a checkout's results/, else <user data dir>/results."""
    explicit = os.environ.get("GEMMGEN_RESULTS")
    if explicit:
        return Path(explicit)
    if (ROOT / "results").is_dir() and (ROOT / "pyproject.toml").is_file():
        return ROOT / "results"
    return user_data_dir() / "results"


def results_dirs() -> "list[Path]":
    """Where records are read, first match wins: where new ones go, then the records shipped with gemmgen
    (not when $GEMMGEN_RESULTS names the one database to use)."""
    out = [results_dir()]
    if os.environ.get("GEMMGEN_RESULTS"):
        return out
    if SHIPPED_RESULTS.is_dir() and SHIPPED_RESULTS.resolve() != out[0].resolve():
        out.append(SHIPPED_RESULTS)
    return out


def kernels_dir() -> Path:
    """Where `gemmgen tune-linear` stores kernels for gemmgen.torch to find: <user data dir>/kernels (cubins
    are build output, never a checkout's results/)."""
    return user_data_dir() / "kernels"


def studies_dir() -> Path:
    """Where the Optuna studies (SQLite) go by default: beside $GEMMGEN_RESULTS when it is set, else in the
    per-user data directory (never in the repository or the install: they are working state, not results)."""
    explicit = os.environ.get("GEMMGEN_RESULTS")
    return Path(explicit) if explicit else user_data_dir() / "studies"


def cache_dir() -> Path:
    """The on-disk compile cache: $GEMMGEN_CACHE, else ~/.cache/gemmgen."""
    base = os.environ.get("GEMMGEN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gemmgen")
    return Path(base)
