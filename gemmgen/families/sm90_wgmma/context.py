"""Template values of templates/sm90_wgmma/: every value the kernel's templates read, from a Kernel alone."""
from __future__ import annotations

from ...model.tiles import Kernel
from .config import Schedule
from .launch import (PACK_CHUNK, PACK_ROWS, PACK_THREADS, REDUCE_THREADS, TRANSPOSE_TILE_ROWS, a_is_kmajor,
                     b_is_kmajor, edge_boxes, gemm_operands, has_scales, is_fused, is_streamk, mainloop_operands,
                     packed, splits, tile_pack, transposed, uses_box_epilogue, uses_composed_stores, uses_store_warp,
                     uses_tma_store)
from .rules import PRODUCER_REGS, epi_boxes, epi_warp_bytes, mn_blocks

CONSUMER_REGS = 232  # 128*40 + 256*232 = 64512 <= 65536: the pool a 384-thread CTA is launched with


def consumer_regs(consumers: int) -> int:
    """Registers per consumer thread after setmaxnreg: what the producer warpgroup's release leaves of the
    65536-register file, in setmaxnreg's steps of 8 (232 for two consumer warpgroups, 152 for three)."""
    if consumers == 2:
        return CONSUMER_REGS
    return (65536 - 128 * PRODUCER_REGS) // (128 * max(1, consumers)) // 8 * 8


def context(kernel: Kernel) -> dict:
    """Every value templates/sm90_wgmma/*.j2 read, derived from a validated Kernel."""
    cfg, ops = kernel.config, gemm_operands(kernel)
    consumers = cfg.math_threads // 128   # ping-pong: two warpgroups over one warpgroup tile
    a_k, b_k = a_is_kmajor(mainloop_operands(kernel)), b_is_kmajor(mainloop_operands(kernel))
    # An MN-major tile's blocks (rules.mn_blocks); a K-major one is 128-byte rows, all "main".
    a_blocks = (cfg.cta.m, 128, 0, 0) if a_k else mn_blocks(cfg.cta.m, ops.a_dtype.bytes)
    b_blocks = (cfg.cta.n, 128, 0, 0) if b_k else mn_blocks(cfg.cta.n, ops.b_dtype.bytes)
    return {
        "name": kernel.name,
        # fp32 operands run on the tensor cores as tf32 (wgmma reads the top 19 bits of each 32-bit element).
        "ab": "tf32" if ops.a_dtype.bytes == 4 else ops.a_dtype.ptx,
        "bb": "tf32" if ops.b_dtype.bytes == 4 else ops.b_dtype.ptx,
        "elt": ops.a_dtype.bytes, "mma_k": cfg.mma.k,
        # fp8 kernels take scales of A and B (launch.has_scales): device scalars folded into alpha (tensor),
        # vectors over D's rows and columns applied to the accumulators before the epilogue (rowcol), or per
        # 128-K block scales applied to each k-tile's partial sums as they are promoted (block).
        "scales": has_scales(kernel),
        "scaling": kernel.operands.scaling.value,
        "promote": cfg.promote, "promote_stagger": cfg.promote_stagger,
        "split3": cfg.split3,
        "cd": ops.c_dtype.ptx,
        "bm": cfg.cta.m, "bn": cfg.cta.n, "bk": cfg.cta.k,
        "wm": cfg.warp.m, "wn": cfg.warp.n, "wg_n": cfg.warps_n,
        "nacc": cfg.warp.n // 2,
        "consumers": consumers,
        "threads": cfg.threads,
        "stages": cfg.stages,
        # fp8 and tf32 operands stored MN-major reach the main loop K-major, transposed by the pack launch.
        "a_kmajor": a_k, "b_kmajor": b_k,
        "a_transposed": transposed(kernel)[0], "b_transposed": transposed(kernel)[1],
        # An MN-major tile's blocks (rules.mn_blocks): the main columns' swizzle span (128 bytes, or 64 / 32 for a
        # tile narrower than 64 columns), and the remainder's columns and span (a second wgmma reads them).
        "a_swz": a_blocks[1], "b_swz": b_blocks[1],
        "b_main": b_blocks[0], "b_rem": b_blocks[2], "b_rem_swz": b_blocks[3],
        # The last tile row (column) loads A (B) through a second tensor map whose box ends at M (N).
        "edge_a": edge_boxes(kernel)[0], "edge_b": edge_boxes(kernel)[1],
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
        # Programmatic dependent launch: the next kernel may be scheduled as soon as this one starts, which saved
        # 0.4-2.8 us a call at 512^3-4096^3 and at 128x4096x4096 (and 0.6 us for M = 128 on swapped 1x2 pairs),
        # but cost the unclustered swapped tiles of M <= 64 (decoding, 64 CTAs streaming the weights) 0.4-1.0 us
        # a call (H100, benchmarks/pdl.py --edits, 2026-11-27 07:12, 13:13, 13:15): those let the next kernel
        # start only when they end.
        "early_dependents": not (cfg.swap_ab and cfg.cta.n <= 64 and cfg.cluster.size == 1),
        # D's rows start on 16-byte boundaries: the swapped epilogue writes each lane's run of a D row in 16-byte
        # stores (otherwise four-element pieces, any alignment).
        "d_vec16": ops.align_c * ops.c_dtype.bytes >= 16,
        "streamk": is_streamk(kernel),
        "tma_store": uses_tma_store(kernel),
        # D staged in the 16 x 32 boxes: TMA-stored, or (a 16-bit D whose rows are not 16-byte aligned) written by
        # the consumers as aligned 16-byte stores composed from the staged rows (composed_stores).
        "box_epilogue": uses_box_epilogue(kernel), "composed_stores": uses_composed_stores(kernel),
        # TMA-store boxes (16 x 32) per consumer warp and the warp's staging bytes: rules.epi_boxes.
        "epi_boxes": epi_boxes(cfg, ops),
        "epi_warp_bytes": epi_warp_bytes(cfg, ops),
        # The producer warpgroup's warp 1 issues D's TMA stores (the configuration's store_warp).
        "epi_store_warp": uses_store_warp(kernel),
        # Operands TMA cannot read in place are copied first by <name>_pack (launch.pack_plan): 16-bit rows by the
        # row copy, fp8 and tf32 ones (transposes, 3xTF32's split on the way) by the shared-memory tile copy.
        "pack": any(packed(kernel)) and not tile_pack(kernel), "tile_pack": tile_pack(kernel),
        "split3_pass": cfg.split3 and not tile_pack(kernel), "pack_elt": ops.a_dtype.bytes,
        "pack_tile_rows": TRANSPOSE_TILE_ROWS,
        # The row sums of A (Epilogue.row_sums), written by two producer warps (rowsum.cuh.j2).
        "row_sums": kernel.operands.row_sums,
        "pack_threads": PACK_THREADS, "pack_chunk": PACK_CHUNK, "pack_rows": PACK_ROWS,
    }




__all__ = ["CONSUMER_REGS", "consumer_regs", "context"]
