"""Tune (or dry-run) the three products of a Linear layer and store each winner where gemmgen.torch finds it.

    <kernels dir>/<gpu key>/<kernel class key>/   a bundle (manifest .json, .cubin, .cu), or a dispatch folder
                                                  (several bundles + dispatch.json), + class.json

The forward and data-grad products have the token count as M: over a token range they are tuned per M bucket
(tune/dispatch.py: power-of-two buckets, or `auto` merging) into a dispatch folder, which `gemmgen.load` turns
into one callable picking the kernel per call. The weight gradient has the token count as K, which dispatch tables
do not bucket: it is tuned once, at the top of the range.

A layer with a bias gets its bias gradient from the weight-gradient kernel (LinearLayer.bias_grad 'fused', the
default): that product is tuned as one that also writes the row sums of dZᵀ, timed with them and verified on them,
against cuBLAS followed by torch's reduction (a row-sums kernel also serves the plain product, called without
them: a frozen bias). Where no family writes row sums for the GPU, or with --bias-grad separate, the plain
product is tuned and gemmgen.nn.Linear reduces dZ on torch.

The kernels dir is model/paths.kernels_dir() (the per-user data directory). class.json names the class (dtype,
layouts, epilogue, fixed dimensions), the layer role and the token count tuned at. A folder is replaced whole:
the new bundle is exported next to it and swapped in, so a reader never sees two manifests or none.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..model import paths
from ..model.arch import Gpu
from ..model.linear import CLASS_FILE, CLASS_FORMAT, ROLES, KernelClass, LinearLayer
from ..model.problem import Problem
from .results import now, write_json_atomic


@dataclass(frozen=True)
class LinearProduct:
    """One product of the layer after tuning: where its kernel went (None when nothing was exported)."""

    role: str
    problem: Problem
    kernel_class: KernelClass
    folder: Path
    kernel: "str | None"
    measured: bool
    result: object  # the TuneResult or DryRunResult


def class_folder(gpu: "Gpu | str", kernel_class: KernelClass, root: "Path | None" = None) -> Path:
    key = gpu.key if isinstance(gpu, Gpu) else str(gpu)
    return Path(root or paths.kernels_dir()) / key / kernel_class.key


def tune_linear(layer: LinearLayer, gpu: Gpu, *, dry_run: bool = True, measurer=None, options=None,
                top_k: int = 8, jobs: int = 1, device: "dict | None" = None, on_event=None,
                root: "Path | None" = None, roles: "tuple[str, ...]" = ROLES,
                bucketing: "str | None" = "pow2") -> "list[LinearProduct]":
    """Tune each product of `layer` (a GPU `measurer` and TuneOptions `options`), or with `dry_run` export the
    model's picks unmeasured; store each in its class folder. Products with the token count as M are tuned per
    M bucket over the layer's token range (`bucketing` 'pow2' or 'auto'; None: once, at the top of the range)."""
    from .buckets import pow2_buckets
    from .dispatch import model_buckets, tune_buckets
    from ..rank.space import enumerate_space, families_for
    from .dryrun import dry_run as run_dry
    from .search import tune

    if layer.fused_bias_grad and "wgrad" in roles:
        fused = layer.problems()["wgrad"]
        if not any(enumerate_space(name, gpu, problem=fused) for name in families_for(gpu.arch)):
            layer = layer.without_fused_bias_grad()  # no family writes the row sums here: torch reduces dZ
    problems, classes = layer.problems(), layer.classes()
    out = []
    for role in (r for r in roles if r in problems):   # 'preact' only for GELU and SiLU layers
        problem, kernel_class = problems[role], classes[role]
        folder = class_folder(gpu, kernel_class, root)
        staging = folder.with_name(f".{folder.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        bucketed = bucketing is not None and kernel_class.m is None and layer.tokens_min < layer.tokens_max
        if bucketed:
            buckets = pow2_buckets(layer.tokens_min, layer.tokens_max, problem.n, problem.k)
            if dry_run:
                result = model_buckets(problem, buckets, gpu, jobs=jobs, bucketing=bucketing, out=str(staging))
            else:
                result = tune_buckets(problem, buckets, gpu, measurer, options, on_event=on_event, device=device,
                                      bucketing=bucketing, out=str(staging))
            kernel = ", ".join(result.kernels) if result.folder is not None else None
        elif dry_run:
            result = run_dry(problem, gpu, top_k=max(1, top_k), out=str(staging), jobs=jobs)
            kernel = result.pick.kernel.name if result.pick is not None else None
        else:
            from dataclasses import replace

            result = tune(problem, gpu, measurer, replace(options, out=str(staging)), on_event=on_event,
                          device=device)
            kernel = result.winner.kernel if result.winner is not None else None
        if kernel is not None:
            _store(staging, folder, kernel_class, role, gpu, problem, kernel, dispatch=bucketed, measured=not dry_run,
                   layer={"in_features": layer.in_features, "out_features": layer.out_features, "bias": layer.bias,
                          "activation": layer.activation, "bias_grad": layer.bias_grad,
                          "tokens": [layer.tokens_min, layer.tokens_max]})
        else:
            shutil.rmtree(staging, ignore_errors=True)
        out.append(LinearProduct(role, problem, kernel_class, folder, kernel, not dry_run, result))
    return out


def store_pick(problem: Problem, kernel_class: KernelClass, gpu: Gpu, *, role: str, top_k: int = 3, jobs: int = 1,
               root: "Path | None" = None) -> "Path | None":
    """The model's pick for `problem` (ranked, its top-k compiled, the best-ranked that compiled exported
    unmeasured) stored as `kernel_class`'s folder, as tune-linear --dry-run stores a product; its folder, or None
    when nothing compiled. What gemmgen.torch's opt-in JIT calls for a product no stored kernel serves."""
    from .dryrun import dry_run as run_dry

    folder = class_folder(gpu, kernel_class, root)
    staging = folder.with_name(f".{folder.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    result = run_dry(problem, gpu, top_k=max(1, top_k), out=str(staging), jobs=jobs)
    if result.pick is None:
        shutil.rmtree(staging, ignore_errors=True)
        return None
    _store(staging, folder, kernel_class, role, gpu, problem, result.pick.kernel.name, dispatch=False, measured=False)
    return folder


def _store(staging: Path, folder: Path, kernel_class: KernelClass, role: str, gpu: Gpu, problem: Problem, kernel: str,
           *, dispatch: bool, measured: bool, layer: "dict | None" = None) -> None:
    """`staging` (an export) given its class.json, then swapped in as `folder`."""
    write_json_atomic(staging / CLASS_FILE, {
        "format": CLASS_FORMAT, "class": kernel_class.to_dict(), "role": role, "gpu": gpu.key,
        **({"layer": layer} if layer is not None else {}),
        "tuned_at": problem.to_dict(), "kernel": kernel, "dispatch": dispatch, "measured": measured, "date": now()})
    _swap_in(staging, folder)


def _swap_in(staging: Path, folder: Path) -> None:
    """Replace `folder` by `staging` (the old folder is moved aside first, then removed)."""
    old = folder.with_name(f".{folder.name}.old.{os.getpid()}")
    if folder.exists():
        folder.rename(old)
    staging.rename(folder)
    shutil.rmtree(old, ignore_errors=True)

