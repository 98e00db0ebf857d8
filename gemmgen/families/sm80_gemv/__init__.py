"""sm80_gemv: a few rows of D times a row-major B on CUDA cores (decoding with x @ W, W stored K x N), sm_80+.

When M is a handful of rows, a GEMM is a read of B. sm80_skinny streams B when its columns are contiguous along K
(x @ W^T, torch's Linear); when B's rows are (K x N, N contiguous, as in x @ W), each of its rows is a run of N
elements, and a warp reads 256 of them per row with one 16-byte vector per lane (an unaligned row by one aligned
load per lane, the next lane's vector taken by shuffle and shifted into place, so any ldb runs at full width). Each thread keeps rows x 8 fp32 sums and adds
A[m][k] x B[k][n..n+7] with FMAs: at M <= 16 the CUDA cores keep up with the bytes, and nothing is staged but A
(fp32, [k][m], a chunk at a time in shared memory, read as broadcasts). Every CTA covers all M rows of
cta.n columns; warps split the columns and, with `k_warps`, the rows of B, meeting in shared memory; split-K over
CTAs adds a reduction launch, or, fused, the column block's last slice sums the partials. A in either layout (its few elements are read one by one); bias, activation,
alpha/beta. Templates: templates/sm80_gemv/. Search space: search_spaces/sm80_gemv.yaml.
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
from .config import GemvConfig

# Fraction of the GPU's fp32 FMA rate the loop sustains: each 16 bytes of B also take a load, eight conversions
# and rows / 4 shared-memory loads of A beside its rows x 8 FMAs. A guess until measured; M <= 16 stays far
# below the memory time either way.
SIMT_EFFICIENCY = 0.7
# What one SM's loads sustain, by whether every row of B is 16-byte aligned: bytes per second per resident warp,
# up to a cap per SM. Aligned: sm80_skinny's column-major B figures (the same 16-byte loads); against this
# family's own runs a refit moved the error from 0.227 to 0.224 and no pick, so they stay. Unaligned: refitted
# (benchmarks/gemv_model_fit.py --fit --records 'gemv-ragged-*/skinny.json', H100, 2026-11-26 22:21) after the
# ragged-end fix made those rows 1.3-1.6x faster; rms log error over that run's 80 records 0.325 -> 0.121.
SM_LOAD_RATE = {True: (4e9, 28e9), False: (1.6e9, 14e9)}


class Sm80Gemv(FewRowsFamily):
    name = "sm80_gemv"
    config_type = GemvConfig
    min_arch = Arch.SM80
    dtypes = frozenset({DType.BF16, DType.F16})
    decompositions = frozenset({DecompKind.DATA_PARALLEL, DecompKind.SPLIT_K})
    fused_splitk = True   # the column block's last slice sums the partials: no reduction launch
    # A few columns of D over a long K: 612 columns are 3 blocks of 256, which 16 slices make 48 CTAs on 132 SMs
    # (1x612x10469 rr, B's rows off 16-byte boundaries: the swapped sm90 tile, B packed first, ran 27.7 us where
    # cuBLAS took 10.4). Each slice still reads whole iterations of K (k_warps x cta.k rows).
    max_splits = 64
    template_root = paths.TEMPLATES
    template = "sm80_gemv/kernel.cu.j2"
    rules = _rules
    space_file = paths.SEARCH_SPACES / "sm80_gemv.yaml"
    specialist = True
    examples = (
        {"family": "sm80_gemv", "cta": "1x256x4", "warp": "1x256x4", "mma": "1x1x1", "stages": 1,
         "k_warps": 4, "decomposition": {"kind": "splitk", "splits": 8}},
        {"family": "sm80_gemv", "cta": "16x256x2", "warp": "16x256x2", "mma": "1x1x1", "stages": 1,
         "k_warps": 4, "decomposition": {"kind": "splitk", "splits": 8}},
    )

    def efficiency(self, gpu: Gpu) -> float:
        # The main loop's FMAs run on CUDA cores: its rate as a fraction of the 16-bit tensor peak the model
        # divides by.
        return SIMT_EFFICIENCY * gpu.fp32_simt_flops / gpu.tensor_peak(DType.BF16)

    def traits(self, config: TileConfig, gpu: Gpu) -> ModelTraits:
        return ModelTraits(tensor_efficiency=self.efficiency(gpu), smem_reads="fragments", tma_loads=False,
                           persistent=False, epilogue_hidden=False, epilogue_exposed=1.0,
                           consumer_tile=config.cta, stages_ahead=1)

    def bytes_in_flight(self, config: TileConfig, problem) -> float:
        # Each thread issues one 16-byte vector per row of its iteration before the FMAs that use them.
        return config.threads * config.cta.k * 16

    def sm_load_rate(self, config: TileConfig, problem, warps_per_sm: float) -> float:
        return warp_scaled_rate(SM_LOAD_RATE[problem.operands.align_b == 8], warps_per_sm)

    def context(self, kernel: Kernel) -> dict:
        return _context.context(kernel)

    def launches(self, kernel, problem, sm_count=None, max_clusters=None) -> Launches:
        return _launch.launches(kernel, problem)


FAMILY = register(Sm80Gemv())

__all__ = ["FAMILY", "GemvConfig", "Sm80Gemv"]
