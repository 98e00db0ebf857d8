"""sm80_skinny: a B-streaming tensor-core GEMM for few rows of D (decoding, skinny M), sm_80 and newer.

When M is a handful of rows, a GEMM is a read of B: 16 x 4096 x 4096 in bf16 moves 33.5 MB for 0.5 GFLOP.
This kernel spends nothing on staging: each thread loads 8 contiguous elements along K of one column of B
(16-byte loads; an unaligned column is read as two aligned vectors shifted into place, so any ldb runs at
full width) and of two rows of A, and feeds them to mma.sync m16n8k16 with K permuted inside each 32-wide
step (the sum over K does not care which K pairs with which, as long as A and B agree). Every CTA covers all
M rows (M <= cta.m) of cta.n columns; warps split the columns and, with `k_warps`, the K range, meeting in
shared memory; split-K over CTAs adds a reduction launch. Row-major A; column-major B (K contiguous: the
forward of a Linear layer, x @ W^T) straight into the fragments, or row-major B through a per-warp swizzled
shared-memory tile and ldmatrix.trans (warp tile N 64); any M <= 64, N, K and alignment; bias, activation,
alpha/beta.
Templates: templates/sm80_skinny/. Search space: search_spaces/sm80_skinny.yaml.
"""
from __future__ import annotations

from ...model import paths
from ...model.arch import Arch, DType, Gpu
from ...model.tiles import DecompKind, Kernel, TileConfig
from .. import register
from ..base import FewRowsFamily, Launches, ModelTraits, warp_scaled_rate
from . import context as _context
from . import launch as _launch
from . import rules as _rules
from .config import SkinnyConfig

# mma.sync on Hopper sustains about 65% of the wgmma peak (sm80_mma's figure); this kernel is bound by
# reading B long before that matters.
EFFICIENCY_HOPPER = 0.65
EFFICIENCY_OTHER = 0.80
# What one SM's loads sustain, by B's layout and whether every row is 16-byte aligned: bytes per second per resident
# warp, up to a cap per SM. Fitted on the H100 (docs/perf-notes.md, "sm80_skinny"; 2026-11-25): the best
# configurations, on every SM, read 33.5 MB in 19.1 us (aligned, column-major B), 29.1 (unaligned: shifted pairs
# double the L1 requests; 16 warps per SM), 21.1 and 60.5 us (row-major B through shared memory; ~8 warps per SM),
# less ~4 us of launch and wave; unaligned grids with a quarter of those warps ran 2.4x slower (70 us). Unaligned
# column-major B's per-warp rate was 0.65e9 until 2026-11-27: at 16 warps a SM that reached the cap, so the model
# priced 16 and 32 warps alike, where the same CTA ran 41.0 us on 16 warps a SM and 30.0 on 32 at 16 x 4096 x 4095
# (0.43e9 a warp at 16); 0.5e9 ranks them as measured (benchmarks/skinny_model_fit.py: that case's pick 1.41 ->
# 1.03 of the best, no other case moves). Refit when more shapes are measured.
SM_LOAD_RATE = {("col", True): (4e9, 28e9), ("col", False): (0.5e9, 11e9),
                ("row", True): (1.9e9, 16e9), ("row", False): (0.56e9, 5e9)}


class Sm80Skinny(FewRowsFamily):
    name = "sm80_skinny"
    config_type = SkinnyConfig
    min_arch = Arch.SM80
    dtypes = frozenset({DType.BF16, DType.F16})
    decompositions = frozenset({DecompKind.DATA_PARALLEL, DecompKind.SPLIT_K})
    template_root = paths.TEMPLATES
    template = "sm80_skinny/kernel.cu.j2"
    rules = _rules
    space_file = paths.SEARCH_SPACES / "sm80_skinny.yaml"
    specialist = True
    examples = (   # the best measured on the H100 at 1..16 x 4096 x 4096 (aligned) and 16 x 4096 x 4095
        {"family": "sm80_skinny", "cta": "16x64x64", "warp": "16x16x64", "mma": "16x8x16", "stages": 1,
         "k_warps": 2, "decomposition": {"kind": "splitk", "splits": 8}},
        {"family": "sm80_skinny", "cta": "16x64x64", "warp": "16x16x64", "mma": "16x8x16", "stages": 1,
         "k_warps": 4, "decomposition": {"kind": "splitk", "splits": 4}},
    )

    def efficiency(self, gpu: Gpu) -> float:
        return EFFICIENCY_HOPPER if gpu.arch.cc >= 90 else EFFICIENCY_OTHER

    def traits(self, config: TileConfig, gpu: Gpu) -> ModelTraits:
        return ModelTraits(tensor_efficiency=self.efficiency(gpu), smem_reads="fragments", tma_loads=False,
                           persistent=False, epilogue_hidden=False, epilogue_exposed=1.0,
                           consumer_tile=config.cta, stages_ahead=1)

    def bytes_in_flight(self, config: TileConfig, problem) -> float:
        # Each thread issues an iteration's B vectors before its MMAs (two iterations' with two stages): K steps x
        # (one 16-byte vector per n8 group, or 8 per thread for row-major B). A is re-read from L1/L2.
        steps = config.cta.k // 32
        vectors = (config.warp.n // 8) if problem.b_layout.value == "col" else 8
        return config.threads * config.stages * steps * vectors * 16

    def sm_load_rate(self, config: TileConfig, problem, warps_per_sm: float) -> float:
        rate = warp_scaled_rate(SM_LOAD_RATE[(problem.b_layout.value, all(problem.operands.rows_aligned))],
                                warps_per_sm)
        # A tile of MI m16 blocks loads A for every block (2 vectors per block and K step, beside B's one per n8
        # group): the warp's loads that carry B are NI / (NI + 2 MI) of them, against NI / (NI + 2) on the one-block
        # tiles SM_LOAD_RATE was fitted on, whatever rows D needs. Without it the model picked 64-row tiles at
        # 16 x 65536 x 4096 (321 against 191 us); priced relative to the rows D needs (NI + 2 need) instead, the
        # 32-row tiles at M 17-32 ran 1.7-2.3x their price (20x2392x6651 and 32x4824x11851 rc, H100 2026-11-28:
        # 66 and 267 us against 37 and 115).
        ni, mi = config.warp.n // 8, config.cta.m // 16
        return rate * (ni + 2) / (ni + 2 * mi)

    def context(self, kernel: Kernel) -> dict:
        return _context.context(kernel)

    def launches(self, kernel, problem, sm_count=None, max_clusters=None) -> Launches:
        return _launch.launches(kernel, problem)


FAMILY = register(Sm80Skinny())

__all__ = ["FAMILY", "SkinnyConfig", "Sm80Skinny"]
