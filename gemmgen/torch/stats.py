"""Counters of the torch ops: kernel calls per op and fallbacks to torch per reason, with one warning per reason.

Counted on the host when an op runs eagerly (or is captured): a CUDA graph's replays are not op calls.
"""
from __future__ import annotations

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
                      "gemmgen.stats() counts these)", FallbackWarning, stacklevel=3)


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
