"""sm80_mma: mma.sync m16n8k16 tensor-core GEMM for sm_80 and newer.

cp.async multistage pipeline (2-5 stages) into an XOR-swizzled or padded shared-memory ring, ldmatrix
fragments double-buffered over k16 steps, warps tiling the CTA tile in M and N, grouped rasterization,
any layout and any M/N/K (bounds-checked edges), bias and activation epilogue, and split-K with a reduction
launch. Templates: templates/sm80_mma/. Search space: search_spaces/sm80_mma.yaml.
"""
from __future__ import annotations

import math

from ...model import paths
from ...model.arch import Arch, DType, Gpu
from ...model.problem import Layout
from ...model.tiles import DecompKind, Kernel, TileConfig
from .. import register
from ..base import KernelFamily, Launches, ModelTraits
from . import context as _context
from . import launch as _launch
from . import rules as _rules
from .config import Sm80Config

# Fraction of the datasheet tensor peak mma.sync sustains: on Hopper it cannot feed the tensor cores
# (about 65% reported); on sm_80/86/89 about 80%.
EFFICIENCY_HOPPER = 0.57
EFFICIENCY_OTHER = 0.80
# Rows that are not 16-byte aligned are copied by narrower cp.async (down to 2-byte copies through registers):
# on the H100 the best configurations ran 16x4096x4095 (rc) in 55.3 us, 16x4095x4095 (rr) in 61.0 and 1x4095x4095
# in 54.3, against 21.6-22.3 at the aligned shapes (docs/lab-data/h100-sxm/skinny-*-20261125-*.json): ~0.4 of the
# memory rate. Measured on skinny shapes only; refit when large unaligned shapes are measured.
UNALIGNED_LOAD_EFFICIENCY = 0.40
# The same copies on compute-bound products: the H100 ran the model's top sm80_mma configurations at 72-99 TFLOP/s
# on 4095³ (all four layouts) and 3001x5003x4093 (2-byte rows), against 430-441 on aligned 4096³ and 8192³
# (docs/lab-data/h100-sxm/misaligned-20261125-0406.json; docs/perf-notes.md, sm80_mma): the copies, issued per
# element and waited on, leave the main loop about a fifth of its aligned rate. Measured for 2-byte rows; rows of
# 4 or 8 bytes (narrower cp.async) are charged the same, unmeasured.
UNALIGNED_COMPUTE_EFFICIENCY = 0.20
# Copies of 2-byte rows (one element each, through registers) are latency-bound on how much of the ring is in
# flight: on the H100 (2026-11-27, docs/perf-notes.md "Ping-pong on short k-loops", `sweep-unaligned-*.txt`)
# 64x64x32 tiles with 4 stages (24 KB ahead) ran 1.35-3.5x their price on ten products with 2-byte rows
# (11x3256x8063 cc: 192 us, its sm90 alternatives 63), where tiles with 48 KB or more ahead ran 0.4-1.4x; with
# 4-byte rows (40x3150x12032 rr, B's 6300-byte rows) the same 64x64x32 tile ran 49.9 us where the sm90 kernel with
# B packed ran 93.5. So the rate of 2-byte rows is scaled by the ring's bytes ahead up to this many.
UNALIGNED_BYTES_AHEAD = 48 * 1024
# On Hopper the family's rate (EFFICIENCY_HOPPER, measured at 128-256 k-tiles) falls on short k-loops: each CTA
# fills its ring, runs its k-loop and writes its tile without overlapping the next tile (not persistent). Measured
# at 6096x7808x288 rc (27 GFLOP, 9 k-tiles of 32; H100 2026-11-27, `sweep-r41-*.txt`): 128x128 tiles ran 139-145
# us against 82 priced (1.7x), where the sm90 kernels beside them ran 0.9-1.3x; 88x8808x384 cc (6 k-tiles of 64)
# 1.27x. Charged as the tensor time of about this much of K lost per tile, on aligned rows (unaligned ones are
# charged UNALIGNED_COMPUTE_EFFICIENCY, which dwarfs it).
HOPPER_TILE_FILL_K = 192
# Rows of a K-major operand (row-major A, column-major B) that are not 16-byte aligned (odd K) cost more than
# UNALIGNED_*_EFFICIENCY (fitted at 4095^3, where every operand's rows are odd) on long k-loops: on the H100
# (2026-11-28, docs/lab-data/h100-sxm/m28-20261128-0340/seed67-losers.txt and the r41 sweeps) 64x64 split-K tiles
# ran 1.27-1.42x their price at 20x2392x6651, 12x1808x15099 and 32x4824x11851 rc and 11x3256x8063 cc (1.16-1.52x
# against the sm90 kernels timed beside them, which pack such operands first), where an N-major B with odd N
# (20x4499x6536 rr: 1.11x, as the sm90 kernels beside it; 88x11669x2853 cr: 0.92x) did not. Charged on the copies'
# compute and load rates alike. (Products of a few us at short K, 1x4064x486 cc and 5x352x380 cc, ran below their
# price either way: the launch and reduction dominate there.)
KMAJOR_UNALIGNED_SLOWDOWN = 1.25


def _kmajor_slowdown(problem) -> float:
    """KMAJOR_UNALIGNED_SLOWDOWN where an operand read along K (row-major A, column-major B) has rows off 16-byte
    boundaries, else 1."""
    a_ok, b_ok = problem.operands.rows_aligned
    unaligned = (problem.a_layout is Layout.ROW and not a_ok) or (problem.b_layout is Layout.COL and not b_ok)
    return KMAJOR_UNALIGNED_SLOWDOWN if unaligned else 1.0


class Sm80Mma(KernelFamily):
    name = "sm80_mma"
    config_type = Sm80Config
    min_arch = Arch.SM80
    dtypes = frozenset({DType.BF16, DType.F16})
    decompositions = frozenset({DecompKind.DATA_PARALLEL, DecompKind.SPLIT_K})
    template_root = paths.TEMPLATES
    template = "sm80_mma/kernel.cu.j2"
    rules = _rules
    space_file = paths.SEARCH_SPACES / "sm80_mma.yaml"
    examples = (
        {"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16", "stages": 4,
         "raster": {"order": "row", "group": 8}},
        {"family": "sm80_mma", "cta": "128x64x32", "warp": "64x32x32", "mma": "16x8x16", "stages": 4},
        {"family": "sm80_mma", "cta": "64x64x64", "warp": "32x32x64", "mma": "16x8x16", "stages": 4},
        {"family": "sm80_mma", "cta": "64x64x64", "warp": "32x32x64", "mma": "16x8x16", "stages": 4,
         "decomposition": {"kind": "splitk", "splits": 4}},
        {"family": "sm80_mma", "cta": "32x64x64", "warp": "16x32x64", "mma": "16x8x16", "stages": 4,
         "decomposition": {"kind": "splitk", "splits": 4}},
        {"family": "sm80_mma", "cta": "16x64x64", "warp": "16x16x64", "mma": "16x8x16", "stages": 4,
         "decomposition": {"kind": "splitk", "splits": 8}},
    )

    def efficiency(self, gpu: Gpu) -> float:
        return EFFICIENCY_HOPPER if gpu.arch.cc >= 90 else EFFICIENCY_OTHER

    def traits(self, config: TileConfig, gpu: Gpu) -> ModelTraits:
        return ModelTraits(tensor_efficiency=self.efficiency(gpu),
                           smem_reads="fragments", tma_loads=False, persistent=False, epilogue_hidden=False,
                           epilogue_exposed=1.0, consumer_tile=config.cta, stages_ahead=config.stages - 1)

    def load_efficiency(self, config: TileConfig, problem) -> float:
        if all(problem.operands.rows_aligned):
            return 1.0
        ops, cta = problem.operands, config.cta
        rate = UNALIGNED_LOAD_EFFICIENCY / _kmajor_slowdown(problem)
        if min(ops.align_a * ops.a_dtype.bytes, ops.align_b * ops.b_dtype.bytes) > 2:
            return rate
        ahead = (cta.m + cta.n) * cta.k * problem.a_dtype.bytes * (config.stages - 1)
        return rate * min(1.0, ahead / UNALIGNED_BYTES_AHEAD)

    def compute_efficiency(self, config: TileConfig, problem, gpu: "Gpu | None" = None) -> float:
        if not all(problem.operands.rows_aligned):
            return UNALIGNED_COMPUTE_EFFICIENCY / _kmajor_slowdown(problem)
        if gpu is None or gpu.arch.cc < 90:
            return 1.0
        k_per_tile = math.ceil(problem.k / config.cta.k / (config.decomposition.splits or 1)) * config.cta.k
        return 1.0 / (1.0 + HOPPER_TILE_FILL_K / k_per_tile)

    def context(self, kernel: Kernel) -> dict:
        return _context.context(kernel)

    def launches(self, kernel, problem, sm_count=None, max_clusters=None) -> Launches:
        return _launch.launches(kernel, problem)


FAMILY = register(Sm80Mma())

__all__ = ["FAMILY", "Sm80Config", "Sm80Mma"]
