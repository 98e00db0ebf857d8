"""Template values of templates/sm80_gemv/ (and the shared common headers), from a Kernel alone."""
from __future__ import annotations

from ...model.problem import Layout
from ...model.tiles import DecompKind, Kernel
from ..base import header_context
from .launch import REDUCE_THREADS
from .rules import VEC, a_chunk, smem_bytes


def context(kernel: Kernel) -> dict:
    cfg, ops = kernel.config, kernel.operands
    return {
        **header_context(kernel),
        "a_row": ops.a_layout is Layout.ROW,
        "align_b": ops.align_b,
        "align_c": ops.align_c,
        "bias": ops.bias,
        "activation": ops.activation.value,
        "bm": cfg.cta.m, "bn": cfg.cta.n, "unroll": cfg.cta.k, "vec": VEC,
        "warps_n": cfg.warps_n,
        "k_warps": cfg.k_warps,
        "threads": cfg.threads,
        "a_chunk": a_chunk(cfg),
        "smem_bytes": smem_bytes(cfg, ops),
        "splitk": cfg.decomposition.kind is DecompKind.SPLIT_K,
        "fused": cfg.decomposition.kind is DecompKind.SPLIT_K and cfg.decomposition.fused,
        "splits": cfg.decomposition.splits,
        "reduce_threads": REDUCE_THREADS,
    }


__all__ = ["context"]
