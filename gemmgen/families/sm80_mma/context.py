"""Template values of templates/sm80_mma/ (and the shared common headers), from a Kernel alone."""
from __future__ import annotations

from ...model.problem import Layout
from ..base import header_context
from ...model.tiles import DecompKind, Kernel, SmemLayout
from .launch import REDUCE_THREADS
from .rules import PAD_BYTES, smem_bytes


def context(kernel: Kernel) -> dict:
    cfg, ops = kernel.config, kernel.operands
    return {
        **header_context(kernel),
        "a_layout": ops.a_layout.value,
        "b_layout": ops.b_layout.value,
        "a_kmajor": ops.a_layout is Layout.ROW,  # A row-major: K contiguous
        "b_kmajor": ops.b_layout is Layout.COL,  # B col-major: K contiguous
        "align_a": ops.align_a,
        "align_b": ops.align_b,
        "align_c": ops.align_c,
        "bias": ops.bias,
        "activation": ops.activation.value,
        # tiles and pipeline
        "bm": cfg.cta.m, "bn": cfg.cta.n, "bk": cfg.cta.k,
        "wm": cfg.warp.m, "wn": cfg.warp.n,
        "mma_m": cfg.mma.m, "mma_n": cfg.mma.n, "mma_k": cfg.mma.k,
        "warps_m": cfg.warps_m, "warps_n": cfg.warps_n,
        "threads": cfg.threads,
        "stages": cfg.stages,
        "smem_layout": cfg.smem_layout.value,
        "swizzle": cfg.smem_layout is SmemLayout.SWIZZLE,
        "pad_elems": PAD_BYTES // 2,  # 16-bit elements
        "smem_bytes": smem_bytes(cfg, ops),
        "raster_order": cfg.raster.order.value,
        "raster_group": cfg.raster.group,
        "splitk": cfg.decomposition.kind is DecompKind.SPLIT_K,
        "splits": cfg.decomposition.splits,
        "reduce_threads": REDUCE_THREADS,
    }


__all__ = ["context"]
