"""Composed stores for a 16-bit D whose rows are not 16-byte aligned (sm90_wgmma, launch.uses_composed_stores), on
the CPU: which kernels take them, the rendered path and the SASS. The GPU checks results and that nothing outside
D is written (tests/test_hopper_paths_gpu.py)."""
from __future__ import annotations

import pytest

from gemmgen.codegen.nvrtc import compile_kernel
from gemmgen.codegen.render import render
from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts
from gemmgen.families.sm90_wgmma.launch import uses_composed_stores, uses_tma_store
from gemmgen.model.arch import Arch, lookup_gpu
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Kernel, TileConfig

H100 = lookup_gpu("h100")
WIDE = dict(cta="128x256x64", warp="64x256x64", mma="64x256x16", stages=3, persistent=True, warp_specialized=True)


def kernel(problem: Problem, **fields) -> Kernel:
    return Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict({"family": "sm90_wgmma", **WIDE, **fields}))


@pytest.mark.parametrize("m,n,c_dtype,composed", [
    (4095, 4095, None, True),      # rows 2 bytes apart from 16-byte boundaries
    (4000, 4100, None, True),      # 8-byte aligned rows: still not TMA's 16
    (4096, 4096, None, False),     # aligned: TMA stores
    (4095, 4095, "f32", False),    # fp32 D keeps the staged fp32 stores
])
def test_which_kernels_compose_their_stores(m, n, c_dtype, composed):
    k = kernel(Problem.create(m, n, 4096, "bf16", "row", "row", c_dtype=c_dtype))
    assert uses_composed_stores(k) is composed
    assert uses_tma_store(k) is (n % 8 == 0 and c_dtype is None)


def test_a_warp_share_larger_than_its_store_boxes_keeps_the_element_stores():
    problem = Problem.create(4095, 4095, 4095, "bf16", "row", "row")
    assert uses_composed_stores(kernel(problem))                       # 3 stages: 8 boxes, the whole share
    assert not uses_composed_stores(kernel(problem, stages=4))         # 4 stages leave room for 4 of 8
    assert not uses_composed_stores(kernel(problem, cta="64x256x64", stages=5, schedule="pingpong"))


def test_split_k_and_swapped_kernels_keep_their_own_stores():
    problem = Problem.create(4095, 4095, 4095, "bf16", "row", "row")
    assert not uses_composed_stores(kernel(problem, decomposition={"kind": "splitk", "splits": 2}))
    swapped = Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict({
        "family": "sm90_wgmma", "cta": "128x32x64", "warp": "64x32x64", "mma": "64x32x16", "stages": 6,
        "warp_specialized": True, "persistent": True, "swap_ab": True}))
    assert not uses_composed_stores(swapped)


def test_the_rendered_kernel_stages_boxes_and_composes_aligned_stores():
    source = render(kernel(Problem.create(4095, 4095, 4095, "bf16", "row", "row", bias=True)), H100)
    assert "stmatrix.sync.aligned" in source and "store_row_composed(" in source
    assert "st.global.v4.b32" in source and "tma_store(&tmD" not in source and "TmaDesc tmD" not in source


@pytest.mark.parametrize("fields", [{}, {"cluster": "2x1"},
                                   {"cta": "128x64x64", "warp": "64x64x64", "mma": "64x64x16", "stages": 6}])
def test_the_sass_has_16_byte_stores_no_tma_store_and_no_local_memory(fields):
    problem = Problem.create(3001, 5003, 4093, "bf16", "row", "row", bias=True, activation="gelu", beta=0.5)
    compiled = compile_kernel(kernel(problem, **fields), H100)
    counts = instruction_counts(dump_sass(compiled.cubin))
    assert count_prefix(counts, "HGMMA") > 0 and count_prefix(counts, "STSM") > 0
    assert count_prefix(counts, "STG.E.128") > 0 and count_prefix(counts, "UTMASTG") == 0
    assert compiled.spill_bytes == 0 and count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
    assert "C7514" not in compiled.log
