"""Opt-in just-in-time kernels: a product no stored kernel serves gets the model's pick, compiled on first use.

Off by default (a stored miss runs on torch, counted by gemmgen.stats()). On with GEMMGEN_JIT=1 (or true, yes,
on; 0, false, no, off or empty: off; any other value is refused on first use) in the environment or
`gemmgen.torch.jit.enable()`: the first call of a product the registry cannot serve (CUDA tensors of a GPU in
gemmgen's catalogue, packed operands) ranks the space by the model, compiles its best-ranked configurations with
NVRTC and stores the pick in the kernels dir as `gemmgen tune-linear --dry-run` stores a product (one folder per
shape: <kernels dir>/<gpu key>/<class key>/), so later processes load it without compiling again. The token
count is built at the top of its bucket (bucket(): quarter octaves), whose kernel then serves the bucket's other
counts without compiling. That first call waits for the compile (0.6-3.6 s a new bucket on the H100 machine, the
first of a process the longest: benchmarks/jit_latency.py), and prints one line to stderr saying so. The kernel is the model's
pick, unmeasured: `gemmgen tune-linear` measures and replaces it. A product whose compile fails, or that no family
serves, is not tried again in the process; it runs on torch with the fallback's reason. Never during CUDA-graph
capture (compiling and loading a module there would break the capture): such a call runs on torch.

Needs the code generator's dependencies (jinja2, NVRTC through cuda-bindings), imported only when a kernel is built.
The build itself is the tuner's (tune/linear.store_pick); this layer never imports the tuner (tests/test_layers.py):
gemmgen's package installs it here on import (set_builder), as the one place that sees both layers.
"""
from __future__ import annotations

import os
import sys
import threading

from ..model.arch import DType
from ..model.problem import Activation, Layout

_enabled: "bool | None" = None   # None: $GEMMGEN_JIT decides, read on first use (_from_environment)
_lock = threading.Lock()
_failed: "dict[tuple, str]" = {}   # product -> why its build failed (not retried in this process)
_builder = None   # fn(problem, kernel_class, gpu, root) -> the stored folder or None (set_builder)


def set_builder(builder) -> None:
    """How a product's kernel is built and stored: builder(problem, kernel_class, gpu, root) -> its folder in the
    store at `root`, or None when nothing compiled."""
    global _builder
    _builder = builder


# GEMMGEN_JIT's spellings: the documented 1 and the common true/false words, any case; empty or unset is off, as
# for every GEMMGEN_* setting. Anything else ('2', 'enable', a typo) is refused rather than read as off.
_ENV_SPELLINGS = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}
_ENV_LISTED = "1, true, yes, on (JIT on) or 0, false, no, off, empty (off)"


def _from_environment() -> bool:
    """$GEMMGEN_JIT as on or off. Read on first use, not at import, so a bad value is an InvalidInput naming the
    variable, the value and the accepted spellings where the JIT is asked about, and `import gemmgen` still works."""
    from ..model import parse

    value = os.environ.get("GEMMGEN_JIT", "")
    if not value.strip():
        return False
    return parse.name("GEMMGEN_JIT", value.strip(), ("on", "off"), _ENV_SPELLINGS, listed=_ENV_LISTED) == "on"


def enabled() -> bool:
    """Whether a product no stored kernel serves is compiled on first use: as enable() last set it, else as
    $GEMMGEN_JIT says (an InvalidInput for a value it does not take)."""
    global _enabled
    if _enabled is None:
        _enabled = _from_environment()
    return _enabled


def enable(on: bool = True) -> None:
    """Turn just-in-time kernels on (or off); the environment's GEMMGEN_JIT sets the default (1, true, yes, on;
    0, false, no, off or unset: off)."""
    global _enabled
    _enabled = bool(on)


def failures() -> "dict[str, str]":
    """Products whose build failed in this process, and why."""
    return {" ".join(map(str, key)): why for key, why in _failed.items()}


# Token counts vary from call to call (a prompt's length, a batch): M is built at the top of its bucket and that
# kernel serves every M of the bucket that its rules allow (runtime/serve.check_serves). Buckets are quarter
# octaves (an octave's upper half split in four, tops rounded up to 16: ..., 80, 96, 112, 128, 160, 192, ...), so a
# kernel serves counts at least ~0.8 of the one it was picked for: power-of-two buckets served 2088 tokens with the
# pick for 4096 (0.57x torch on the H100 where the pick for 2088 itself ran 0.78x; docs/perf-notes.md, "The JIT's
# buckets"). N and K stay exact (a layer's widths), but for a product that writes A's row sums: that is a Linear
# layer's weight gradient with its bias gradient (dZ^T X: M the output width, K the token count), whose K is
# bucketed instead of M.
TOKEN_BUCKET_MIN, TOKEN_BUCKET_MAX = 16, 16384


def bucket(count: int) -> int:
    """The dimension a JIT kernel for `count` is built at: the top of its quarter-octave bucket (at least
    TOKEN_BUCKET_MIN, a multiple of 16), or `count` itself past TOKEN_BUCKET_MAX."""
    if count > TOKEN_BUCKET_MAX:
        return count
    if count <= TOKEN_BUCKET_MIN:
        return TOKEN_BUCKET_MIN
    quarter = 1 << ((count - 1).bit_length() - 3)   # a quarter of the octave's lower edge (half < count <= 2 half)
    top = -(-count // quarter) * quarter
    return -(-top // 16) * 16


def build(dtype: DType, a_layout: Layout, b_layout: Layout, bias: bool, activation: Activation, m: int, n: int,
          k: int, gpu_key: str, row_sums: bool = False) -> bool:
    """Make the registry serve this product on GPU `gpu_key`: with the kernel stored for its bucket (bucket(m) x n
    x k, or m x n x bucket(k) for a product with row sums; built now if missing) where that kernel serves it, else
    with one built for the exact shape; whether it did (False: a failure recorded in failures(), or before)."""
    from ..model.errors import GemmgenError
    from ..model.linear import KernelClass
    from .registry import REGISTRY

    operands = (dtype, a_layout, b_layout, bias, activation)
    with _lock:   # one build at a time: two threads missing the same product compile it once
        # (A weight gradient's M is the layer's output width: kept; its K is the token count.)
        top_m, top_k = (m, bucket(k)) if row_sums else (bucket(m), k)
        if (top_m, top_k) != (m, k):
            found = REGISTRY.find(*operands, top_m, n, top_k, gpu_key, row_sums)
            if found is None and _build_exact(*operands, top_m, n, top_k, gpu_key, row_sums):
                found = REGISTRY.find(*operands, top_m, n, top_k, gpu_key, row_sums)
            compiled = getattr(getattr(found, "kernel", None), "kernel", None)   # a loaded bundle's Kernel
            if compiled is not None:
                from ..runtime.serve import check_serves

                try:
                    check_serves(compiled, _problem(*operands, m, n, k, row_sums))
                except GemmgenError:
                    pass   # the bucket's kernel does not take this count: build the exact shape below
                else:
                    REGISTRY.register(KernelClass(*operands, m, n, k, row_sums), found.kernel, gpu_key)
                    return True
        return _build_exact(*operands, m, n, k, gpu_key, row_sums)


def _problem(dtype: DType, a_layout: Layout, b_layout: Layout, bias: bool, activation: Activation, m: int, n: int,
             k: int, row_sums: bool):
    """The packed Problem of a product (InvalidInput naming a rule it breaks, e.g. a dimension past 32 bits)."""
    from ..model.problem import Problem

    return Problem.create(m, n, k, dtype.value, a_layout.value, b_layout.value, bias=bias,
                          activation=activation.value, row_sums=row_sums)


def _build_exact(dtype: DType, a_layout: Layout, b_layout: Layout, bias: bool, activation: Activation, m: int,
                 n: int, k: int, gpu_key: str, row_sums: bool) -> bool:
    """Store the model's pick for this exact product and make the registry read it again; whether it did."""
    key = (dtype.value, a_layout.letter + b_layout.letter, bias, activation.value, m, n, k, gpu_key, row_sums)
    if key in _failed:
        return False
    from ..model.arch import lookup_gpu
    from ..model.errors import GemmgenError
    from ..model.linear import KernelClass
    from .registry import REGISTRY

    kernel_class = KernelClass(dtype, a_layout, b_layout, bias, activation, m, n, k, row_sums)
    print(f"gemmgen: compiling the model's pick for {m}x{n}x{k} {dtype.value} "
          f"{a_layout.letter}{b_layout.letter} (GEMMGEN_JIT; stored for later runs)", file=sys.stderr)
    try:
        problem = _problem(dtype, a_layout, b_layout, bias, activation, m, n, k, row_sums)
        if _builder is None:
            folder, why = None, "no kernel builder installed (importing gemmgen installs one)"
        else:
            folder, why = _builder(problem, kernel_class, lookup_gpu(gpu_key), REGISTRY.root), \
                "no configuration compiled"
    except GemmgenError as exc:
        folder, why = None, str(exc)
    if folder is None:
        _failed[key] = why
        return False
    REGISTRY.refresh()   # the store changed: read it again (answers and plans too)
    return True


__all__ = ["TOKEN_BUCKET_MAX", "TOKEN_BUCKET_MIN", "bucket", "build", "enable", "enabled", "failures", "set_builder"]
