"""Template values of templates/sm90_wgmma/: every value the kernel's templates read, from a Kernel alone."""
from __future__ import annotations

from ...model.tiles import Kernel
from .config import Schedule
from .launch import (EPI_BOX_COLS, EPI_FAST, PREFETCH_TENSORMAPS, REDUCE_THREADS, a_is_kmajor, b_is_kmajor,
                     gemm_operands, is_fused, is_streamk, splits, uses_store_warp, uses_tma_store)
from .rules import PRODUCER_REGS, epi_boxes, epi_warp_bytes

CONSUMER_REGS = 232  # 128*40 + 256*232 = 64512 <= 65536: the pool a 384-thread CTA is launched with


def consumer_regs(consumers: int) -> int:
    """Registers per consumer thread after setmaxnreg: what the producer warpgroup's release leaves of the
    65536-register file, in setmaxnreg's steps of 8 (232 for two consumer warpgroups, 152 for three)."""
    if consumers == 2:
        return CONSUMER_REGS
    return (65536 - 128 * PRODUCER_REGS) // (128 * max(1, consumers)) // 8 * 8


def context(kernel: Kernel) -> dict:
    """Every value templates/sm90_wgmma.cu.j2 reads, derived from a validated Kernel."""
    cfg, ops = kernel.config, gemm_operands(kernel)
    consumers = cfg.math_threads // 128   # ping-pong: two warpgroups over one warpgroup tile
    return {
        "name": kernel.name,
        "ab": ops.a_dtype.ptx,
        "cd": ops.c_dtype.ptx,
        "bm": cfg.cta.m, "bn": cfg.cta.n, "bk": cfg.cta.k,
        "wm": cfg.warp.m, "wn": cfg.warp.n, "wg_n": cfg.warps_n,
        "nacc": cfg.warp.n // 2,
        "consumers": consumers,
        "threads": cfg.threads,
        "stages": cfg.stages,
        "a_kmajor": a_is_kmajor(ops), "b_kmajor": b_is_kmajor(ops),
        "cl_m": cfg.cluster.m, "cl_n": cfg.cluster.n, "cl_size": cfg.cluster.size,
        "persistent": cfg.persistent,
        "pingpong": cfg.schedule is Schedule.PINGPONG,
        "raster_order": cfg.raster.order.value, "raster_group": cfg.raster.group,
        "bias": ops.bias, "activation": ops.activation.value,
        "align_c": ops.align_c,
        # setmaxnreg only pays with two or three consumer warpgroups (384 or 512 threads launched at 168 or 128
        # registers); one consumer warpgroup (256 threads) already gets the most a thread may have.
        "setmaxnreg": consumers >= 2,
        "producer_regs": PRODUCER_REGS, "consumer_regs": consumer_regs(consumers),
        "splitk": splits(kernel) > 1, "splits": splits(kernel), "reduce_threads": REDUCE_THREADS,
        "splitk_fused": is_fused(kernel),
        # The main loop ran on D^T = B^T @ A^T: the epilogue writes D transposed, or the reduction reads partial
        # (row, col) of D at [col][row].
        "swap_ab": cfg.swap_ab,
        "streamk": is_streamk(kernel),
        "prefetch_tensormaps": PREFETCH_TENSORMAPS,
        "tma_store": uses_tma_store(kernel),
        "stmatrix": True,   # False only in scripts/ab_lab.py: the TMA-store boxes filled with 4-byte st.shared
        # A short epilogue path for interior tiles when beta == 0 (False only in scripts/ab_lab.py, to A/B it).
        # TMA-store boxes per consumer warp and the warp's staging bytes come from constraints.sm90_epi_boxes.
        "epi_fast": EPI_FAST,
        "epi_boxes": epi_boxes(cfg, ops),
        "epi_warp_bytes": epi_warp_bytes(cfg, ops),
        "epi_box_cols": EPI_BOX_COLS,   # 64 only in scripts/ab_lab.py (16 x 64 boxes, 128B swizzle: a tie)
        # 1 or 2 only in scripts/ab_lab.py: D's stores issued after the next tile's first MMAs (1), or one box per k-tile (2)
        "epi_defer_store": 0,
        # The producer warpgroup's warp 1 issues D's TMA stores (the configuration's store_warp).
        "epi_store_warp": uses_store_warp(kernel),
        # 1, 2 or 3 only in scripts/ab_lab.py: that many producer warps (from warp 1) copy the staged boxes to D with
        # ld.shared/st.global.v4 instead of one warp issuing TMA stores (keeps D's stores off the TMA unit)
        "sw_lsu": 0,
        "timeline": False,   # True only in scripts/timeline.py: %globaltimer stamps per CTA into the workspace
        "epi_no_wait": False,   # True only in scripts/ab_lab.py: boxes refilled without waiting (D may be wrong)
        "cluster_barriers": True,   # False only in scripts/ab_lab.py, with multicast False
        "b_cpasync": False, "cpasync_producer_fence": False,
        "multicast": True,   # False only in scripts/ab_lab.py, which then widens the tensor maps' boxes
        # Only scripts/ab_lab.py sets these: 1 skips the epilogue, 2 only its global stores (times without D),
        # 3 fills the TMA-store boxes but issues no store.
        "skip_epilogue": 0,
        # True only in scripts/ab_lab.py: Stream-K's range mode without its fix-up (no partials, flags or adds;
        # D is wrong), to time the range schedule apart from the fix-up.
        "sk_no_fixup": False,
    }




__all__ = ["CONSUMER_REGS", "consumer_regs", "context"]
