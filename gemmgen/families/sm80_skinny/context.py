"""Template values of templates/sm80_skinny/ (and the shared common headers), from a Kernel alone."""
from __future__ import annotations

from ...model.problem import Layout
from ..base import header_context
from ...model.tiles import DecompKind, Kernel
from .launch import REDUCE_THREADS
from .rules import K_STEP, smem_bytes


def context(kernel: Kernel) -> dict:
    cfg, ops = kernel.config, kernel.operands
    return {
        **header_context(kernel),
        "b_kmajor": ops.b_layout is Layout.COL,
        "align_a": ops.align_a,
        "align_b": ops.align_b,
        "align_c": ops.align_c,
        "bias": ops.bias,
        "activation": ops.activation.value,
        "bm": cfg.cta.m, "bn": cfg.cta.n, "bk": cfg.cta.k, "wn": cfg.warp.n,
        "k_step": K_STEP,
        "warps_n": cfg.warps_n,
        "k_warps": cfg.k_warps,
        "threads": cfg.threads,
        "stages": cfg.stages,
        "smem_bytes": smem_bytes(cfg, ops),
        "splitk": cfg.decomposition.kind is DecompKind.SPLIT_K,
        "splits": cfg.decomposition.splits,
        "reduce_threads": REDUCE_THREADS,
    }


__all__ = ["context"]
