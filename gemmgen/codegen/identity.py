"""One kernel identity: a hash of the rendered CUDA source, the NVRTC options and the NVRTC (toolkit) version.

A trial's time is a property of the cubin that was built, not of its configuration: any change that shapes the
kernel (a template, a family's context or rules, the model's tiles, the compiler options, the toolkit) changes
this identity, and the tuner trusts a stored time only for the identity it was measured with (tune/search: each
measured trial records `kernel_id`; trials of another identity are re-measured, never served).
"""
from __future__ import annotations

import hashlib

from ..model.tiles import Kernel
from .render import render


def kernel_identity(source: str, options, nvrtc_version: "str | None") -> str:
    """16 hex digits over the source, the options in order and the NVRTC version."""
    h = hashlib.sha256()
    for part in (source, "\0".join(options), nvrtc_version or "no-nvrtc"):
        h.update(part.encode() + b"\0\1")
    return h.hexdigest()[:16]


def identity_of(kernel: Kernel) -> str:
    """The identity `kernel` would be compiled with here (renders it; compiles nothing)."""
    from .nvrtc import nvrtc_version, options_for  # NVRTC bindings only when asked

    try:
        version = nvrtc_version()
    except Exception:  # noqa: BLE001 - no NVRTC here: the identity still covers source and options
        version = None
    return kernel_identity(render(kernel), options_for(kernel), version)


__all__ = ["identity_of", "kernel_identity"]
