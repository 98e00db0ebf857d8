"""The one parser for each kind of value a user gives gemmgen: integers, real numbers, names and text.

Every command-line flag, YAML/JSON field and API argument goes through these, so one rule holds everywhere:
ASCII decimal digits only (Python's int() and float() take '４０９６', '٤٠٩٦' and '1_000', which no shell user
means), no surrounding spaces, finite numbers within the range the value's use can take, and an empty string
is an error, never "unset". Each refusal is an InvalidInput naming the rule and the value.
"""
from __future__ import annotations

import math
import numbers
import re
from typing import Iterable, Mapping

from .errors import InvalidInput

INT64_MAX = 2**63 - 1
# Ranges of the tuning settings (flags and TuneOptions alike): a seed is what NumPy's and Optuna's samplers take;
# more compile processes than JOBS_MAX would only exhaust the machine (10^30 overflowed the pool's semaphore).
SEED_MAX = 2**32 - 1
JOBS_MAX = 1024
COUNT_MAX = 10**6  # trials, patience, top-k, finalists, rounds: far beyond any space gemmgen enumerates
SECONDS_MAX = 10**7  # a timeout or watchdog of ~4 months
_INT = re.compile(r"[+-]?[0-9]+\Z")
_REAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")
# Longer digit strings are out of any range gemmgen accepts; int() of >4300 digits raises, so never try.
_MAX_DIGITS = 40


def _range_text(lo, hi, lo_open: bool = False) -> str:
    if lo_open and lo is not None:
        return f" greater than {lo:g}" + (f" and at most {hi:g}" if hi is not None else "")
    if lo is not None and hi is not None:
        return f" from {lo:g} to {hi:g}" if isinstance(lo, float) or isinstance(hi, float) else f" from {lo} to {hi}"
    if lo is not None:
        return " of at least 1" if lo == 1 else f" of at least {lo}"
    if hi is not None:
        return f" of at most {hi}"
    return ""


def integer(what: str, value, lo: "int | None" = None, hi: "int | None" = INT64_MAX) -> int:
    """`value` (an int, or ASCII decimal text) as an int within [lo, hi]."""
    # The short rule leaves out the upper limit, so a number past it is told the limit ('M must be a positive
    # integer, but got 9223372036854775808' read as if the number were not one).
    too_big = ""
    if hi == INT64_MAX and lo in (0, 1):
        rule = f"{what} must be a {'positive' if lo else 'non-negative'} integer"
        too_big = f"at most 2^63-1 = {INT64_MAX}"
    else:
        rule = f"{what} must be an integer{_range_text(lo, hi)}"
    if isinstance(value, bool):
        raise InvalidInput(rule, value)
    if isinstance(value, numbers.Integral):  # a NumPy integer (a shape taken from an array) is an integer too
        number = int(value)
    elif isinstance(value, str) and _INT.match(value):
        if len(value.lstrip("+-").lstrip("0")) > _MAX_DIGITS:
            raise InvalidInput(rule, shown(value), too_big if not value.startswith("-") else "")
        number = int(value)
    else:
        raise InvalidInput(rule, shown(value))
    if lo is not None and number < lo:
        raise InvalidInput(rule, shown(value))
    if hi is not None and number > hi:
        raise InvalidInput(rule, shown(value), too_big)
    return number


def real(what: str, value, lo: "float | None" = None, hi: "float | None" = None, *, lo_open: bool = False) -> float:
    """`value` (an int, a float, or ASCII decimal text) as a finite float within [lo, hi] ((lo, hi] if
    lo_open): NaN and infinity are refused, as no setting gemmgen has means anything with them."""
    rule = f"{what} must be a finite number{_range_text(lo, hi, lo_open)}"
    if isinstance(value, bool):
        raise InvalidInput(rule, value)
    if isinstance(value, numbers.Real):  # int, float, NumPy's scalars
        try:
            number = float(value)
        except OverflowError:
            raise InvalidInput(rule, shown(value)) from None
    elif isinstance(value, str) and _REAL.match(value):
        number = float(value)
    else:
        raise InvalidInput(rule, shown(value))
    if not math.isfinite(number):
        raise InvalidInput(rule, shown(value))
    if (lo is not None and (number <= lo if lo_open else number < lo)) or (hi is not None and number > hi):
        raise InvalidInput(rule, shown(value))
    return number


def name(what: str, value, choices: Iterable[str], aliases: "Mapping[str, str] | None" = None,
         listed: "str | None" = None) -> str:
    """`value` as one of `choices` (case-insensitive; `aliases` map other spellings to a choice). The rule
    lists `listed` if given, else the choices."""
    choices = list(choices)
    rule = f"{what} must be one of {listed or ', '.join(choices)}"
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidInput(rule, shown(value))
    key = value.lower()
    key = (aliases or {}).get(key, key)
    if key not in choices:
        raise InvalidInput(rule, shown(value))
    return key


def text(what: str, value) -> str:
    """A non-empty string without control characters (a path, a URL, a list of names): the OS refuses a
    NUL byte with a ValueError, and an empty path silently means the current folder."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{what} must be non-empty text", shown(value))
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise InvalidInput(f"{what} must not contain control characters", shown(value))
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        raise InvalidInput(f"{what} must be valid UTF-8 text", shown(value))
    return value


def shown(value):
    """The value as an error message shows it: long text cut, so the error stays one readable line."""
    if isinstance(value, str) and len(value) > 60:
        return value[:40] + f"... ({len(value)} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {int(abs(value).bit_length() * 0.30103) + 1} digits"  # str() refuses >4300 digits
    return value


__all__ = ["COUNT_MAX", "INT64_MAX", "JOBS_MAX", "SECONDS_MAX", "SEED_MAX", "integer", "name", "real", "shown", "text"]
