"""A kernel family registered from its own folder (tests/families/simt_f32) goes through space -> rank ->
render -> NVRTC -> launch description with no edit anywhere in gemmgen: the plug-in contract."""
from __future__ import annotations

import importlib

import pytest

from gemmgen import Arch, Kernel, Problem, families
from gemmgen.codegen.render import render
from gemmgen.model.arch import lookup_gpu
from gemmgen.rank.predict import predict
from gemmgen.rank.ranking import SearchSpace, rank_configs
from gemmgen.rank.space import default_config, enumerate_space, families_for
from gemmgen.runtime.manifest import make_manifest

H100 = lookup_gpu("h100")


@pytest.fixture
def simt():
    module = importlib.import_module("families.simt_f32")
    families.register(module.FAMILY)
    yield module.FAMILY
    families.unregister(module.FAMILY.name)


def test_an_extra_family_is_enumerated_ranked_and_picked_for_the_dtype_only_it_supports(simt):
    problem = Problem.create(1000, 700, 300, "f32")
    assert "simt_f32" in families_for(H100.arch)
    configs = enumerate_space("simt_f32", H100, problem=problem)
    assert configs and all(c.family == "simt_f32" for c in configs)
    ranked = rank_configs(configs, problem, H100, predict)
    assert [r.rank for r in ranked] == list(range(len(ranked))) and ranked[0].time_s > 0
    assert SearchSpace(configs, lambda c: []).param_names()  # the tuner can sample it
    # On sm_80 the built-in families take 16-bit inputs only (sm90_wgmma, which runs fp32 as tf32 in any layout
    # since its transposing pack, needs sm_90a): the model's pick for an fp32 product is the new family's.
    assert default_config(problem, H100, Arch.SM80).family == "simt_f32"
    # Row-major A and B only: the family's own rule removes it for other layouts.
    assert not enumerate_space("simt_f32", H100, problem=Problem.create(64, 64, 64, "f32", "col", "row"))


def test_an_extra_family_renders_compiles_to_ffma_without_spills_and_describes_its_launch(simt):
    problem = Problem.create(1000, 700, 300, "f32", bias=True)
    config = default_config(problem, H100, Arch.SM80)
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    source = render(kernel, H100)
    assert f"extern \"C\" __global__" in source and kernel.name in source
    manifest = make_manifest(kernel, problem)
    (launch,) = manifest["launches"]
    tiles = -(-problem.m // config.cta.m) * -(-problem.n // config.cta.n)
    assert launch["grid"] == [tiles, 1, 1] and launch["block"] == [config.threads, 1, 1]
    try:
        from gemmgen.codegen.nvrtc import compile_kernel
        from gemmgen.codegen.sass import dump_sass, instruction_counts
        compiled = compile_kernel(kernel)
        counts = instruction_counts(dump_sass(compiled.cubin))
    except Exception as exc:  # noqa: BLE001 - NVRTC or cuobjdump missing on this machine
        if "nvrtc" in str(exc).lower() or "cuobjdump" in str(exc).lower():
            pytest.skip(f"NVRTC/cuobjdump unavailable: {exc}")
        raise
    assert compiled.resources.spill_bytes == 0
    assert counts.get("FFMA", 0) > 0 and "LDL" not in counts and "STL" not in counts
