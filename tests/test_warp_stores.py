"""The store warp's element stores for a D whose rows are not 16-byte aligned (sm90_wgmma, launch.uses_warp_stores),
on the CPU: which kernels take them, the rule for fp32 D, the rendered path and the SASS. The GPU checks results
against a reference and the consumers' own stores (tests/test_hopper_paths_gpu.py)."""
from __future__ import annotations

import pytest

from gemmgen.codegen.nvrtc import compile_kernel
from gemmgen.codegen.render import render
from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts
from gemmgen.families import rules
from gemmgen.families.sm90_wgmma.launch import uses_store_warp, uses_tma_store, uses_warp_stores
from gemmgen.model.arch import Arch, lookup_gpu
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Kernel, TileConfig

H100 = lookup_gpu("h100")
WIDE = dict(cta="128x256x64", warp="64x256x64", mma="64x256x16", stages=3, persistent=True, warp_specialized=True,
            store_warp=True)


def kernel(problem: Problem, **fields) -> Kernel:
    return Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict({"family": "sm90_wgmma", **WIDE, **fields}))


@pytest.mark.parametrize("a,b", [("row", "row"), ("col", "col")])
def test_an_unaligned_16_bit_d_takes_the_store_warp_s_element_stores(a, b):
    problem = Problem.create(4095, 4095, 4095, "bf16", a, b)
    k = kernel(problem)
    assert not rules.check(k.config, H100, problem=problem)
    assert uses_warp_stores(k) and uses_store_warp(k) and not uses_tma_store(k)
    # Aligned D keeps its TMA stores; without the knob the consumers store D themselves.
    aligned = kernel(Problem.create(4096, 4096, 4096, "bf16", a, b))
    assert uses_tma_store(aligned) and not uses_warp_stores(aligned)
    assert not uses_warp_stores(kernel(problem, store_warp=False))


def test_an_unaligned_fp32_d_refuses_a_store_warp_by_the_named_rule():
    problem = Problem.create(4095, 4095, 4095, "bf16", "row", "row", c_dtype="f32")
    names = [v.rule for v in rules.check(kernel(problem).config, H100, problem=problem)]
    assert names == ["a store warp issues TMA stores, or stores a 16-bit D element by element: an fp32 D's leading "
                     "dimension must be a multiple of 16 bytes"]


def test_the_rendered_kernel_stages_boxes_and_stores_elements_from_the_store_warp():
    source = render(kernel(Problem.create(4095, 4095, 4095, "bf16", "row", "row", bias=True)), H100)
    assert "stmatrix.sync.aligned" in source and "ld.shared.u16" in source
    assert "tma_store(&tmD" not in source and "TmaDesc tmD" not in source


@pytest.mark.parametrize("extra", [{}, {"cluster": "2x1"}])
def test_the_sass_has_no_tma_store_and_no_local_memory(extra):
    problem = Problem.create(3001, 5003, 4093, "bf16", "row", "row", bias=True, activation="gelu", beta=0.5)
    compiled = compile_kernel(kernel(problem, **extra), H100)
    counts = instruction_counts(dump_sass(compiled.cubin))
    assert count_prefix(counts, "HGMMA") > 0 and count_prefix(counts, "STSM") > 0
    assert count_prefix(counts, "UTMASTG") == 0 and count_prefix(counts, "UTMALDG") > 0
    assert compiled.spill_bytes == 0 and count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
