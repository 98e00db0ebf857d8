"""Helpers shared by the sm90_wgmma tests (tests/test_sm90*.py): configurations, operands, NVRTC and SASS counts."""
from __future__ import annotations

from gemmgen.model.arch import DType, lookup_gpu
from gemmgen.model.problem import Activation, Layout, Operands
from gemmgen.families.sm90_wgmma.config import Sm90Config
from gemmgen.model.tiles import Cluster, Kernel, Raster, RasterOrder, Shape3, TileConfig

H100 = lookup_gpu("h100")
LAYOUTS = [("row", "col"), ("row", "row"), ("col", "col"), ("col", "row")]


def hopper_config(cta="128x256x64", warp="64x256x64", stages=4, cluster=(1, 1), persistent=True) -> TileConfig:
    w = Shape3.parse(warp)
    return Sm90Config(Shape3.parse(cta), w, Shape3(64, w.n, 16), stages,
                      raster=Raster(RasterOrder.ROW, 8), cluster=Cluster(*cluster), warp_specialized=True,
                      persistent=persistent)


def ops(dtype="bf16", a="row", b="col", bias=False, activation="none") -> Operands:
    dt = DType.parse(dtype)
    return Operands(dt, dt, dt, DType.F32, Layout(a), Layout(b), 8, 8, 8, bias, Activation(activation))


def compile_sm90(kernel: Kernel):
    from gemmgen.codegen.nvrtc import compile_kernel
    return compile_kernel(kernel)


def sass_counts(cubin: bytes):
    from gemmgen.codegen.sass import dump_sass, instruction_counts
    return instruction_counts(dump_sass(cubin))


def count(counts, prefix: str) -> int:
    return sum(n for op, n in counts.items() if op == prefix or op.startswith(prefix + "."))


def clean_tma_sass(kernel: Kernel) -> str:
    """The SASS of `kernel` compiled, after checking what every sm90 kernel must show: no spilled bytes, no local
    memory (LDL/STL) and TMA loads (UTMALDG)."""
    from gemmgen.codegen.sass import dump_sass, instruction_counts
    compiled = compile_sm90(kernel)
    assert compiled.spill_bytes == 0
    sass = dump_sass(compiled.cubin)
    counts = instruction_counts(sass)
    assert count(counts, "LDL") == 0 and count(counts, "STL") == 0 and count(counts, "UTMALDG") > 0
    return sass


def splitk_config(splits: int, cta="128x256x64", warp="64x256x64", stages=4) -> TileConfig:
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    return replace(hopper_config(cta, warp, stages), decomposition=Decomposition(DecompKind.SPLIT_K, splits))
