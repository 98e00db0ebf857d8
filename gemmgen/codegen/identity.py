"""The digest of the code that turns a configuration into a kernel, so stored timings know which kernels they timed.

A trial's time is a property of the kernel the templates and the family modules rendered for its configuration,
not of the configuration alone: when either changes (a faster epilogue, a fixed cluster exit), trials measured
before are stale. The tuner keeps them out of its best-so-far and re-measures their best configurations first
(search.py); the study name carries this digest.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache

from ..model import paths


@lru_cache(maxsize=1)
def kernel_code_digest() -> str:
    """12 hex digits over templates/**/*.j2, gemmgen/families/*.py and gemmgen/render.py, in a fixed order."""
    files = sorted(paths.TEMPLATES.rglob("*.j2")) + sorted((paths.PACKAGE / "families").rglob("*.py")) + \
        [paths.PACKAGE / "codegen" / "render.py"]
    h = hashlib.sha256()
    for f in files:
        if f.is_file():
            # The path below templates/ (or the package), not the bare name: sm80_mma/ and sm90_wgmma/ share names.
            rel = f.relative_to(paths.TEMPLATES) if f.is_relative_to(paths.TEMPLATES) else f.relative_to(paths.PACKAGE)
            h.update(rel.as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


__all__ = ["kernel_code_digest"]
