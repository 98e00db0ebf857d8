"""simt_f32: a small SIMT fp32 GEMM family, defined entirely in this folder (config, rules, space, template).

It exists to prove the plug-in contract: importing this package registers the family, and gemmgen then
enumerates, ranks, renders and compiles it with no edit anywhere else (tests/test_extra_family.py).

Each thread computes an `mma` = TM x TN x 1 block of outputs with FFMA; a warp is 4 x 8 threads, so the warp
tile is 4*TM x 8*TN; A and B tiles go through static shared memory, K-major for A. Row-major A and B only.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gemmgen import families
from gemmgen.families.base import KernelFamily, Launches, ModelTraits, pointer_params, scalar_params
from gemmgen.model.arch import Arch, DType
from gemmgen.model.tiles import DecompKind, TileConfig

HERE = Path(__file__).resolve().parent
STATIC_SMEM_LIMIT = 48 * 1024  # static __shared__ arrays: no opt-in above 48 KB


@dataclass(frozen=True)
class SimtConfig(TileConfig, family="simt_f32"):
    """CTA tile, warp tile (4 x 8 threads) and the per-thread output block (`mma`, K = 1)."""

    @property
    def math_threads(self) -> int:
        return self.warps_m * self.warps_n * 32


class SimtF32(KernelFamily):
    name = "simt_f32"
    config_type = SimtConfig
    min_arch = Arch.SM80
    dtypes = frozenset({DType.F32})
    decompositions = frozenset({DecompKind.DATA_PARALLEL})
    template_root = HERE
    template = "kernel.cu.j2"
    space_file = HERE / "space.yaml"

    def check(self, config, gpu, arch, problem, operands, rule):
        rule(config.mma.k == 1, "simt_f32 computes one K step per FFMA: MMA K must be 1", config.mma.k, 1)
        rule(config.warp.m == 4 * config.mma.m and config.warp.n == 8 * config.mma.n,
             "simt_f32 warps are 4 x 8 threads: warp tile must be 4*TM x 8*TN", f"{config.warp}", "4TMx8TN")
        rule(config.stages == 1, "simt_f32 has one shared-memory stage", config.stages, 1)
        rule(config.cluster.size == 1, "simt_f32 runs without clusters", str(config.cluster), "1x1")
        if operands is not None:
            rule(operands.a_layout.value == "row" and operands.b_layout.value == "row",
                 "simt_f32 reads row-major A and B", f"{operands.a_layout.value}/{operands.b_layout.value}", "row/row")
            rule(operands.activation.value == "none", "simt_f32 has no activation epilogue",
                 operands.activation.value, "none")
        rule(self.smem_bytes(config) <= STATIC_SMEM_LIMIT, "simt_f32 tiles must fit 48 KB of static shared memory",
             self.smem_bytes(config), STATIC_SMEM_LIMIT)

    def smem_bytes(self, config, operands=None):
        return (config.cta.m + config.cta.n) * config.cta.k * 4

    def regs_estimate(self, config):
        tm, tn = config.mma.m, config.mma.n
        return tm * tn + tm + tn + 32

    def efficiency(self, gpu):
        # FFMA runs at the SIMT rate, far below the tensor cores' fp32 (tf32) peak the model scales from.
        return 0.7 * gpu.fp32_simt_flops / gpu.tensor_peak(DType.F32)

    def traits(self, config, gpu):
        return ModelTraits(tensor_efficiency=self.efficiency(gpu), smem_reads="fragments", tma_loads=False,
                           persistent=False, epilogue_hidden=False, epilogue_exposed=1.0,
                           consumer_tile=config.cta, stages_ahead=1)

    def context(self, kernel):
        cfg, ops = kernel.config, kernel.operands
        return {"name": kernel.name, "bm": cfg.cta.m, "bn": cfg.cta.n, "bk": cfg.cta.k, "tm": cfg.mma.m,
                "tn": cfg.mma.n, "warps_n": cfg.warps_n, "wm": cfg.warp.m, "wn": cfg.warp.n,
                "threads": cfg.threads, "bias": ops.bias}

    def launches(self, kernel, problem, sm_count=None, max_clusters=None):
        cfg = kernel.config
        tiles = -(-problem.m // cfg.cta.m) * -(-problem.n // cfg.cta.n)
        main = {"entry": kernel.name, "grid": [tiles, 1, 1], "block": [cfg.threads, 1, 1], "cluster": [1, 1, 1],
                "dynamic_smem": 0, "params": pointer_params(problem) + scalar_params(problem)}
        return Launches([main], 0, {"bytes": 0, "when": "run"})


FAMILY = families.register(SimtF32())
