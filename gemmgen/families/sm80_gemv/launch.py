"""sm80_gemv's launch description: one launch (data-parallel or fused split-K), or the partial-sum kernel and its
reduction.

ABI: (const T* A, const T* B, const T* C, T* D, const T* bias, float* workspace,
      int M, int N, int K, int lda, int ldb, int ldc, int ldd, float alpha, float beta), as sm80_mma.
Grid: (ceil(N / cta.n), 1, splits): every CTA covers all M rows of its columns. Split-K writes fp32 partials
to workspace[z][M][N], which the reduction launch (common/splitk_reduce.cuh.j2) sums, or, fused, the column
block's last slice to arrive (arrival counters at the workspace's head, zeroed once when it is bound).
"""
from __future__ import annotations

import math

from ...model.problem import Problem
from ...model.tiles import DecompKind, Kernel
from ..base import Launches, column_block_launches
from .rules import smem_bytes

REDUCE_THREADS = 256


def counter_bytes(kernel: Kernel, problem: Problem) -> int:
    """Fused split-K: one u32 arrival counter per column block at the workspace's head, padded to 64 words (the
    template computes the same from gridDim.x)."""
    blocks = math.ceil(problem.n / kernel.config.cta.n)
    return -(-blocks // 64) * 64 * 4


def launches(kernel: Kernel, problem: Problem) -> Launches:
    plain = column_block_launches(kernel, problem, smem_bytes(kernel.config, kernel.operands), REDUCE_THREADS)
    decomp = kernel.config.decomposition
    if not (decomp.kind is DecompKind.SPLIT_K and decomp.fused):
        return plain
    # One launch: the block's last slice sums the partials. The counters are zeroed once, when the workspace is
    # bound; each block's last slice puts its counter back to zero.
    counters = counter_bytes(kernel, problem)
    return Launches(plain.launches[:1], counters + plain.workspace_bytes, {"bytes": counters, "when": "bind"})


__all__ = ["REDUCE_THREADS", "counter_bytes", "launches"]
