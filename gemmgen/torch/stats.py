"""Counters of the torch ops: kernel calls per op and fallbacks to torch per reason, with one warning per reason.

Counted on the host when an op runs eagerly (or is captured): a CUDA graph's replays are not op calls.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings

_lock = threading.Lock()
_kernel_calls: "dict[str, int]" = {}
_fallbacks: "dict[str, int]" = {}
_warned: "set[str]" = set()


class FallbackWarning(UserWarning):
    """A gemmgen op ran on torch (aten) instead of a gemmgen kernel; issued once per reason."""


def kernel_call(op: str) -> None:
    with _lock:
        _kernel_calls[op] = _kernel_calls.get(op, 0) + 1


def fallback(op: str, reason: str, warn_key: "str | None" = None) -> None:
    """Count a fallback of `op` for `reason`, warning the first time its `warn_key` (default: the reason) is seen:
    reasons that name a call's shape share one key, so a changing token count does not warn per count."""
    key = reason if warn_key is None else warn_key
    with _lock:
        _fallbacks[reason] = _fallbacks.get(reason, 0) + 1
        first = key not in _warned
        _warned.add(key)
    if first:
        warnings.warn(f"gemmgen: {op} runs on torch instead of a gemmgen kernel: {reason} (warned once; "
                      "gemmgen.stats() counts these)", FallbackWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The stacklevel, for a warning issued in fallback(), of the first frame outside this package and torch: the
    model's line that made the call (not a line of plans.py, whose depth below the caller varies)."""
    inside = [os.path.dirname(os.path.abspath(__file__))]
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        inside.append(os.path.dirname(os.path.abspath(torch.__file__)))
    frame, level = sys._getframe(2), 2   # fallback()'s caller is stacklevel 2
    while frame is not None and any(os.path.abspath(frame.f_code.co_filename).startswith(d + os.sep) for d in inside):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


def stats() -> dict:
    """{'kernel_calls': total, 'kernel_calls_by_op': {op: n}, 'fallbacks': total, 'fallbacks_by_reason':
    {reason: n}} since the process started or the last reset_stats()."""
    with _lock:
        return {"kernel_calls": sum(_kernel_calls.values()), "kernel_calls_by_op": dict(_kernel_calls),
                "fallbacks": sum(_fallbacks.values()), "fallbacks_by_reason": dict(_fallbacks)}


def reset_stats(warnings_too: bool = False) -> None:
    """Zero the counters (and, with `warnings_too`, warn again for reasons already warned about)."""
    with _lock:
        _kernel_calls.clear()
        _fallbacks.clear()
        if warnings_too:
            _warned.clear()
