"""sm80_gemv's launch description: one launch (data-parallel), or the partial-sum kernel and its reduction.

ABI: (const T* A, const T* B, const T* C, T* D, const T* bias, float* workspace,
      int M, int N, int K, int lda, int ldb, int ldc, int ldd, float alpha, float beta), as sm80_mma.
Grid: (ceil(N / cta.n), 1, splits): every CTA covers all M rows of its columns. Split-K writes fp32 partials
to workspace[z][M][N], which the reduction launch (common/splitk_reduce.cuh.j2) sums; nothing needs zeroing.
"""
from __future__ import annotations

from ...model.problem import Problem
from ...model.tiles import Kernel
from ..base import Launches, column_block_launches
from .rules import smem_bytes

REDUCE_THREADS = 256


def launches(kernel: Kernel, problem: Problem) -> Launches:
    return column_block_launches(kernel, problem, smem_bytes(kernel.config, kernel.operands), REDUCE_THREADS)


__all__ = ["REDUCE_THREADS", "launches"]
