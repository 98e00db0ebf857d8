"""CPU checks of the device scripts whose figures docs/perf-notes.md quotes: what they build is what they claim."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def test_space_check_covers_every_sm90_configuration_twice_with_feasible_layouts():
    import space_check
    from gemmgen import constraints
    from gemmgen.arch import Arch, lookup_gpu
    from gemmgen.problem import Problem
    from gemmgen.space import enumerate_space
    from gemmgen.tiles import Family

    runs = space_check.cases(0)
    configs = enumerate_space(Family.SM90_WGMMA, lookup_gpu("h100"), Arch.SM90A, operands=Problem.create(8, 8, 8).operands)
    per_config = Counter(index for index, _, _ in runs)
    assert len(per_config) == len(configs) and set(per_config.values()) == {2}
    for _, problem, kernel in runs:
        assert constraints.check(kernel.config, lookup_gpu("h100"), Arch.SM90A, operands=problem.operands) == []
    assert {p.a_layout.value + p.b_layout.value for _, p, _ in runs} == {"rowrow", "rowcol", "colrow", "colcol"}
    assert any(p.epilogue.beta != 0 and p.epilogue.bias for _, p, _ in runs)   # the general epilogue path runs too


@pytest.mark.slow
def test_mma_ceiling_kernels_are_mma_sync_and_ldmatrix_without_local_memory():
    import mma_ceiling
    from gemmgen.nvrtc import compile_source
    from gemmgen.sass import count_prefix, dump_sass, instruction_counts

    cubin, log = compile_source("mma_loop", f"#define CHAINS {mma_ceiling.CHAINS}\n" + mma_ceiling.SOURCE,
                                ("--gpu-architecture=sm_90a", "-std=c++17", "--ptxas-options=-v"))
    counts = instruction_counts(dump_sass(cubin))
    assert count_prefix(counts, "HMMA.16816") >= mma_ceiling.CHAINS + 32 and count_prefix(counts, "LDSM") >= 8
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
    assert "0 bytes spill stores" in log
