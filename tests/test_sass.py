"""SASS of the default configurations: tensor-core MMA, ldmatrix and cp.async present, no local memory."""
from __future__ import annotations

import pytest

from gemmgen.model.arch import Arch, lookup_gpu
from gemmgen.codegen.nvrtc import compile_kernel
from gemmgen.model.problem import Problem
from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts
from gemmgen.rank.space import default_config
from gemmgen.model.tiles import Kernel

H100 = lookup_gpu("h100")


@pytest.fixture(scope="module", autouse=True)
def compile_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMMGEN_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


SAMPLE = """
        Function : gemm
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 LDGSTS.E.BYPASS.LTC128B.128.ZFILL [R3], desc[UR8][R4.64] ;  /* 0x0 */
        /*0020*/                   LDSM.16.MT88.4 R8, [R2] ;                      /* 0x0 */
        /*0030*/                   HMMA.16816.F32.BF16 R4, R132.reuse, R136, R4 ;  /* 0x0 */
        /*0040*/                   HMMA.16816.F32.BF16 R8, R132, R138, R8 ;       /* 0x0 */
        /*0050*/              @!PT LDS RZ, [RZ] ;                                  /* 0x0 */
        /*0060*/                   STL.64 [R1], R4 ;                              /* 0x0 */
"""


def test_instruction_counts_parse_opcodes_with_modifiers_and_predicates():
    counts = instruction_counts(SAMPLE)
    assert counts["HMMA.16816.F32.BF16"] == 2
    assert counts["LDGSTS.E.BYPASS.LTC128B.128.ZFILL"] == 1
    assert count_prefix(counts, "LDSM") == 1
    assert count_prefix(counts, "STL") == 1 and count_prefix(counts, "LDL") == 0
    assert count_prefix(counts, "LDS") == 1  # LDSM is not LDS


# ptxas spells the bf16 MMA HMMA.16816.F32.BF16 and the f16 one plain HMMA.16816.F32.
@pytest.mark.parametrize("dtype,opcode", [("bf16", "HMMA.16816.F32.BF16"), ("f16", "HMMA.16816.F32")])
@pytest.mark.parametrize("a,b", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")])
def test_default_config_sass_uses_tensor_cores_and_no_local_memory(dtype, opcode, a, b):
    problem = Problem.create(4096, 4096, 4096, dtype, a, b)
    kernel = Kernel(Arch.SM80, problem.operands, default_config(problem, H100, Arch.SM80))
    compiled = compile_kernel(kernel, H100)
    counts = instruction_counts(dump_sass(compiled.cubin))
    assert counts[opcode] > 0 and count_prefix(counts, "HMMA.16816") == counts[opcode]
    assert count_prefix(counts, "LDSM") > 0
    assert count_prefix(counts, "LDGSTS") > 0
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0, compiled.resources
    assert compiled.spill_bytes == 0
