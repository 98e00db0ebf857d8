"""SiLU (x * sigmoid(x)) fused into every family's epilogue: parsing, the references, the rendered source and SASS
on the CPU; each family's kernel verified against the reference on the GPU."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gemmgen.codegen.nvrtc import compile_kernel
from gemmgen.codegen.render import render
from gemmgen.codegen.sass import dump_sass
from gemmgen.families import rules as constraints
from gemmgen.model.arch import Arch
from gemmgen.model.errors import InvalidInput
from gemmgen.model.linear import kernel_activation
from gemmgen.model.problem import Activation, Problem
from gemmgen.model.tiles import Kernel, TileConfig
from gemmgen.tune.reference import epilogue_numpy
from sm90_helpers import H100

# One configuration of each family that serves the problems below (rules checked in the tests).
CONFIGS = {
    "sm90_wgmma": {"family": "sm90_wgmma", "cta": "128x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 4,
                   "raster": {"order": "row", "group": 8}, "warp_specialized": True, "persistent": True},
    "sm80_mma": {"family": "sm80_mma", "cta": "64x64x32", "warp": "32x32x32", "mma": "16x8x16", "stages": 4,
                 "raster": {"order": "row", "group": 8}},
    "sm80_skinny": {"family": "sm80_skinny", "cta": "16x128x128", "warp": "16x32x128", "mma": "16x8x16",
                    "stages": 1, "k_warps": 1, "raster": {"order": "row", "group": 1}},
    "sm80_gemv": {"family": "sm80_gemv", "cta": "8x256x4", "warp": "8x256x4", "mma": "1x1x1", "stages": 1,
                  "k_warps": 2, "raster": {"order": "row", "group": 1}},
}
PROBLEMS = {
    "sm90_wgmma": Problem.create(1000, 777, 520, "bf16", "row", "col", beta=0.5, bias=True, activation="silu"),
    "sm80_mma": Problem.create(333, 1001, 777, "f16", "col", "row", alpha=2.0, bias=True, activation="silu"),
    "sm80_skinny": Problem.create(13, 999, 1001, "bf16", "row", "col", beta=-1.0, bias=True, activation="silu"),
    "sm80_gemv": Problem.create(5, 1003, 517, "bf16", "row", "row", bias=True, activation="silu"),
}


def test_silu_parses_and_a_linear_layer_fuses_it():
    assert Problem.create(8, 8, 8, activation="silu").epilogue.activation is Activation.SILU
    assert kernel_activation("silu") is Activation.SILU
    with pytest.raises(InvalidInput, match="activation must be one of none, relu, gelu, silu"):
        Problem.create(8, 8, 8, activation="swish")


def test_numpy_reference_is_x_times_sigmoid_and_finite_far_below_zero():
    problem = Problem.create(1, 5, 1, activation="silu")
    x = np.array([-200.0, -1.0, 0.0, 1.5, 90.0], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        got = epilogue_numpy(x, problem)
    want = [v / (1 + math.exp(-v)) if v > -100 else 0.0 for v in x.tolist()]
    assert np.allclose(got, want, rtol=1e-6, atol=1e-30) and np.isfinite(got).all()


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_every_family_renders_and_compiles_the_silu_epilogue(family):
    """The activation is the family's epilogue function (sm90: ex2 and rcp approximations; sm80: __expf and a fast
    division), in SASS as MUFU.EX2 and MUFU.RCP, without local memory."""
    problem = PROBLEMS[family]
    config = TileConfig.from_dict(CONFIGS[family])
    assert constraints.check(config, H100, Arch.SM90A, problem) == []
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    source = render(kernel)
    assert ("ex2.approx.ftz.f32" in source) if family == "sm90_wgmma" else ("__expf(-x)" in source)
    compiled = compile_kernel(kernel, H100)
    text = dump_sass(compiled.cubin)
    assert "MUFU.EX2" in text and "MUFU.RCP" in text and compiled.spill_bytes == 0
    assert " LDL" not in text and " STL" not in text


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_every_family_verifies_silu_against_the_reference(family):
    """Fresh random operands, D poisoned, against the float64 / cuBLAS-based reference (GpuBenchmark.verify)."""
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.tune.bench import GpuBenchmark

    problem = PROBLEMS[family]
    kernel = Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict(CONFIGS[family]))
    bench = GpuBenchmark(seed=11)
    try:
        result = bench.verify(make_manifest(kernel, problem), compile_kernel(kernel).cubin, problem)
    finally:
        bench.close()
    assert result.ok, result.reason
