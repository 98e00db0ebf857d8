"""sm80_gemv's launch description: one launch (data-parallel), or the partial-sum kernel and its reduction.

ABI: (const T* A, const T* B, const T* C, T* D, const T* bias, float* workspace,
      int M, int N, int K, int lda, int ldb, int ldc, int ldd, float alpha, float beta), as sm80_mma.
Grid: (ceil(N / cta.n), 1, splits): every CTA covers all M rows of its columns. Split-K writes fp32 partials
to workspace[z][M][N], which the reduction launch (common/splitk_reduce.cuh.j2) sums; nothing needs zeroing.
"""
from __future__ import annotations

import math

from ...model.problem import Problem
from ...model.tiles import DecompKind, Kernel
from ..base import Launches, pointer_params, reduce_launch, scalar_params
from .rules import smem_bytes

REDUCE_THREADS = 256


def launches(kernel: Kernel, problem: Problem) -> Launches:
    cfg = kernel.config
    splitk = cfg.decomposition.kind is DecompKind.SPLIT_K
    splits = cfg.decomposition.splits if splitk else 1
    params = pointer_params(problem) + scalar_params(problem)
    main = {"entry": kernel.name, "grid": [math.ceil(problem.n / cfg.cta.n), 1, splits],
            "block": [cfg.threads, 1, 1], "cluster": [1, 1, 1], "dynamic_smem": smem_bytes(cfg, kernel.operands),
            "params": params}
    if not splitk:
        return Launches([main], 0, {"bytes": 0, "when": "run"})
    workspace = splits * problem.m * problem.n * 4
    return Launches([main, reduce_launch(kernel, problem, params, REDUCE_THREADS)], workspace,
                    {"bytes": 0, "when": "run"})


__all__ = ["REDUCE_THREADS", "launches"]
