"""Opt-in just-in-time kernels: a product no stored kernel serves gets the model's pick, compiled on first use.

Off by default (a stored miss runs on torch, counted by gemmgen.stats()). On with GEMMGEN_JIT=1 in the environment
or `gemmgen.torch.jit.enable()`: the first call of a product the registry cannot serve (CUDA tensors of a GPU in
gemmgen's catalogue, packed operands) ranks the space by the model, compiles its best-ranked configurations with
NVRTC and stores the pick in the kernels dir as `gemmgen tune-linear --dry-run` stores a product (one folder per
exact shape: <kernels dir>/<gpu key>/<class key>/), so later processes load it without compiling again. That first
call waits for the compile (2.3-6.0 s with an empty compile cache, 0.9-1.7 s with the kernel in it: the H100 machine,
benchmarks/jit_latency.py), and prints one line to stderr saying so. The kernel is the model's pick, unmeasured: `gemmgen tune-linear`
measures and replaces it. A product whose compile fails, or that no family serves, is not tried again in the
process; it runs on torch with the fallback's reason. Never during CUDA-graph capture (compiling and loading a
module there would break the capture): such a call runs on torch.

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

_enabled = os.environ.get("GEMMGEN_JIT", "").strip().lower() in ("1", "true", "yes", "on")
_lock = threading.Lock()
_failed: "dict[tuple, str]" = {}   # product -> why its build failed (not retried in this process)
_builder = None   # fn(problem, kernel_class, gpu, root) -> the stored folder or None (set_builder)


def set_builder(builder) -> None:
    """How a product's kernel is built and stored: builder(problem, kernel_class, gpu, root) -> its folder in the
    store at `root`, or None when nothing compiled."""
    global _builder
    _builder = builder


def enabled() -> bool:
    """Whether a product no stored kernel serves is compiled on first use."""
    return _enabled


def enable(on: bool = True) -> None:
    """Turn just-in-time kernels on (or off); the environment's GEMMGEN_JIT sets the default."""
    global _enabled
    _enabled = bool(on)


def failures() -> "dict[str, str]":
    """Products whose build failed in this process, and why."""
    return {" ".join(map(str, key)): why for key, why in _failed.items()}


def build(dtype: DType, a_layout: Layout, b_layout: Layout, bias: bool, activation: Activation, m: int, n: int,
          k: int, gpu_key: str, row_sums: bool = False) -> bool:
    """Store the model's pick for this exact product on GPU `gpu_key` and make the registry see it; whether it
    did (False: a failure recorded in failures(), or an earlier one)."""
    key = (dtype.value, a_layout.letter + b_layout.letter, bias, activation.value, m, n, k, gpu_key, row_sums)
    with _lock:   # one build at a time: two threads missing the same product compile it once
        if key in _failed:
            return False
        from ..model.arch import lookup_gpu
        from ..model.errors import GemmgenError
        from ..model.linear import KernelClass
        from ..model.problem import Problem
        from .registry import REGISTRY

        kernel_class = KernelClass(dtype, a_layout, b_layout, bias, activation, m, n, k, row_sums)
        print(f"gemmgen: compiling the model's pick for {m}x{n}x{k} {dtype.value} "
              f"{a_layout.letter}{b_layout.letter} (GEMMGEN_JIT; stored for later runs)", file=sys.stderr)
        try:
            problem = Problem.create(m, n, k, dtype.value, a_layout.value, b_layout.value, bias=bias,
                                     activation=activation.value, row_sums=row_sums)
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


__all__ = ["build", "enable", "enabled", "failures", "set_builder"]
