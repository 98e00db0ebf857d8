"""Where the torch ops find kernels: a small source of loaded kernels keyed by the product's class.

A product (dtype, layouts, epilogue, M, N, K, GPU) is looked up among
  1. kernels registered in this process: `register(KernelClass, kernel)`;
  2. the store `gemmgen tune-linear` writes: <kernels dir>/<gpu key>/<class key>/ (model/paths.kernels_dir()),
     each folder loaded with `gemmgen.load(folder)` on first use.
Registrations for the pseudo-GPU key "cpu" (CPU) serve CPU tensors, and only those do: a CPU implementation of
one's own, or a test's or benchmark's fake kernel (the ops run CPU tensors on torch otherwise).
A hit is any callable `k(A, B, D, C=None, bias=None)` (for a class with row_sums, also `row_sums=`): a loaded
bundle (shape-generic within its manifest's `serves`) or a dispatch table loaded from a folder (one kernel per
token bucket): the ops never ask which.
`find` returns None when nothing fits; answers are cached per (class, shape, GPU), so a model's steady state
costs one dict lookup per op call.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from ..model import paths
from ..model.arch import DType
from ..model.linear import KernelClass, read_class
from ..model.problem import Activation, Layout

CPU = "cpu"  # the key of registrations that serve CPU tensors


@dataclass(frozen=True)
class Found:
    """A kernel for a product, and where it came from (a folder, or 'registered')."""

    kernel: object
    kernel_class: KernelClass
    origin: str


class KernelRegistry:
    """Registered kernels and the on-disk store, looked up by product; see the module docstring."""

    def __init__(self, root: "Path | None" = None):
        self._root = Path(root) if root is not None else None
        self._lock = threading.Lock()
        self._registered: "list[tuple[KernelClass, object, str | None]]" = []
        self._store: "dict[str, list[tuple[KernelClass, Path]]]" = {}  # gpu key -> classes held on disk
        self._loaded: "dict[Path, object]" = {}  # folder -> loaded callable, or the exception loading raised
        self._answers: "dict[tuple, Found | None]" = {}
        # The torch ops' per-call plans (plans.py), cleared (never replaced) whenever an answer may change.
        self.plans: dict = {}
        self.serves_cpu = False  # whether any registration is for CPU tensors

    @property
    def root(self) -> Path:
        """The store's root (read at call time, so GEMMGEN_DATA set after import counts)."""
        return self._root if self._root is not None else paths.kernels_dir()

    def register(self, kernel_class: KernelClass, kernel, gpu: "str | None" = None) -> None:
        """Use `kernel` (any k(A, B, D, C=None, bias=None)) for products of `kernel_class` (on GPU key `gpu`, or
        any GPU); registrations win over the store, the latest first."""
        if not callable(kernel):
            raise TypeError(f"a registered kernel must be callable as k(A, B, D, C=None, bias=None), "
                            f"but got {type(kernel).__name__}")
        with self._lock:
            self._registered.insert(0, (kernel_class, kernel, gpu))
            self.serves_cpu = self.serves_cpu or gpu == CPU
            self._answers.clear()
            self.plans.clear()

    def use_store(self, root: "str | Path | None") -> None:
        """Read kernels from `root` instead of the default store (None: back to model/paths.kernels_dir())."""
        with self._lock:
            self._root = Path(root) if root is not None else None
            self.refresh_locked()

    def refresh(self) -> None:
        """Forget what was read from disk (after a tune-linear run in another process)."""
        with self._lock:
            self.refresh_locked()

    def refresh_locked(self) -> None:
        self._store.clear()
        self._loaded.clear()
        self._answers.clear()
        self.plans.clear()

    def clear(self) -> None:
        """Drop registrations and everything read from disk."""
        with self._lock:
            self._registered.clear()
            self.serves_cpu = False
            self.refresh_locked()

    def find(self, dtype: DType, a_layout: Layout, b_layout: Layout, bias: bool, activation: Activation,
             m: int, n: int, k: int, gpu: "str | None", row_sums: bool = False) -> "Found | None":
        """The kernel for this product on GPU key `gpu` (None: an unknown GPU, registrations for any GPU
        only; "cpu": registrations for CPU tensors only), or None. row_sums: one that also writes the row sums
        of A."""
        key = (dtype, a_layout, b_layout, bias, activation, m, n, k, gpu, row_sums)
        try:
            return self._answers[key]
        except KeyError:
            pass
        with self._lock:
            operands = (dtype, a_layout, b_layout, bias, activation, row_sums)
            found = None
            for kernel_class, kernel, for_gpu in self._registered:
                if kernel_class.operands_key == operands and kernel_class.matches(m, n, k) and \
                        (for_gpu == gpu or (for_gpu is None and gpu != CPU)):
                    found = Found(kernel, kernel_class, "registered")
                    break
            if found is None and gpu is not None and gpu != CPU:
                for kernel_class, folder in self._scan(gpu):
                    if kernel_class.operands_key == operands and kernel_class.matches(m, n, k):
                        kernel = self._load(folder)
                        if not isinstance(kernel, Exception):
                            found = Found(kernel, kernel_class, str(folder))
                            break
            self._answers[key] = found
            return found

    def load_errors(self) -> "dict[str, str]":
        """Store folders that failed to load, and why (a stale or damaged bundle is skipped, not fatal)."""
        return {str(folder): str(err) for folder, err in self._loaded.items() if isinstance(err, Exception)}

    def _scan(self, gpu: str) -> "list[tuple[KernelClass, Path]]":
        held = self._store.get(gpu)
        if held is None:
            base = self.root / gpu
            held = []
            for folder in sorted(base.iterdir()) if base.is_dir() else ():
                if folder.name.startswith("."):
                    continue  # a tune-linear export still being swapped in
                read = read_class(folder)
                if read is not None:
                    held.append((read[0], folder))
            self._store[gpu] = held
        return held

    def _load(self, folder: Path):
        if folder not in self._loaded:
            import gemmgen

            try:
                self._loaded[folder] = gemmgen.load(folder)  # a bundle, or a dispatch table's folder
            except gemmgen.GemmgenError as exc:
                self._loaded[folder] = exc
        return self._loaded[folder]


REGISTRY = KernelRegistry()
_gpu_keys: "dict[int, str | None]" = {}


def gpu_key(device_index: int) -> "str | None":
    """The catalogue key of CUDA device `device_index` as torch sees it (None when the catalogue has no match)."""
    try:
        return _gpu_keys[device_index]
    except KeyError:
        pass
    import torch

    from ..runtime.detect import match_name

    props = torch.cuda.get_device_properties(device_index)
    gpu = match_name(props.name, props.multi_processor_count)
    _gpu_keys[device_index] = gpu.key if gpu is not None else None
    return _gpu_keys[device_index]


def register(kernel_class: KernelClass, kernel, gpu: "str | None" = None) -> None:
    """Use `kernel` for products of `kernel_class` in this process (see KernelRegistry.register)."""
    REGISTRY.register(kernel_class, kernel, gpu)


__all__ = ["CPU", "Found", "KernelRegistry", "REGISTRY", "gpu_key", "register"]
