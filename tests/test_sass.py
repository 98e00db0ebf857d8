"""SASS of the default configurations: tensor-core MMA, ldmatrix and cp.async present, no local memory."""
from __future__ import annotations

import re

import pytest

from gemmgen.model.arch import Arch, lookup_gpu
from gemmgen.codegen.nvrtc import compile_kernel
from gemmgen.model.problem import Problem
from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts
from gemmgen.rank.space import default_config
from gemmgen.model.tiles import Kernel
from space_helpers import compile_cache  # noqa: F401 (an autouse fixture: this module's compiles get their own cache)

H100 = lookup_gpu("h100")


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


def _sass_of_functions(cubin: bytes) -> "dict[str, dict]":
    """Instruction counts per function of a cubin (the GEMM, and its pack or reduction entries)."""
    text = dump_sass(cubin)
    out = {}
    for part in text.split("Function : ")[1:]:
        out[part.split()[0]] = instruction_counts(part)
    return out


# fp8 wgmma shows as QGMMA (e4m3/e5m2 in its name, A's type then B's); the Hopper kernels load through TMA
# (UTMALDG). Mixed pairs (issue 22's gradient GEMMs) run QGMMA with the two types.
@pytest.mark.parametrize("dtype,b_dtype", [("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e5m2"), ("e5m2", "e4m3")])
def test_fp8_default_config_sass_runs_qgmma_through_tma_with_no_local_memory(dtype, b_dtype):
    problem = Problem.create(4096, 4096, 4096, dtype, "row", "col", b_dtype=b_dtype)
    kernel = Kernel(Arch.SM90A, problem.operands, default_config(problem, H100, Arch.SM90A))
    compiled = compile_kernel(kernel, H100)
    text = dump_sass(compiled.cubin)
    counts = instruction_counts(text)
    # instruction_counts stops an opcode at its lower-case shape ("QGMMA.64"); the operand types follow it.
    shapes = set(re.findall(r"QGMMA\.64x\d+x32\.F32\.(\w+)\.(\w+)", text))
    assert count_prefix(counts, "QGMMA") > 0 and shapes == {(dtype.upper(), b_dtype.upper())}, shapes
    assert count_prefix(counts, "HGMMA") == 0 and count_prefix(counts, "UTMALDG") > 0
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0, compiled.resources
    assert compiled.spill_bytes == 0


def test_misaligned_operands_sass_packs_with_vector_copies_then_runs_hgmma_through_tma():
    # lda = ldb = 4095 bf16: the pack entry copies rows with 16-byte loads and stores, the GEMM reads the copies
    # through TMA; neither touches local memory.
    problem = Problem.create(4095, 4095, 4095, "bf16", "row", "row")
    kernel = Kernel(Arch.SM90A, problem.operands, default_config(problem, H100, Arch.SM90A))
    compiled = compile_kernel(kernel, H100)
    funcs = _sass_of_functions(compiled.cubin)
    pack, gemm = funcs[kernel.name + "_pack"], funcs[kernel.name]
    assert count_prefix(pack, "LDG.E.128") > 0 and count_prefix(pack, "STG.E.128") > 0
    assert count_prefix(gemm, "HGMMA") > 0 and count_prefix(gemm, "UTMALDG") > 0
    for counts in funcs.values():
        assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
    assert compiled.spill_bytes == 0


def test_tf32_default_config_sass_runs_hgmma_tf32_through_tma_with_no_local_memory():
    problem = Problem.create(4096, 4096, 4096, "f32", "row", "col")
    kernel = Kernel(Arch.SM90A, problem.operands, default_config(problem, H100, Arch.SM90A))
    compiled = compile_kernel(kernel, H100)
    text = dump_sass(compiled.cubin)
    counts = instruction_counts(text)
    assert set(re.findall(r"HGMMA\.64x\d+x8\.F32\.(\w+)", text)) == {"TF32"}
    assert count_prefix(counts, "UTMALDG") > 0
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0, compiled.resources
    assert compiled.spill_bytes == 0


@pytest.mark.parametrize("fields", [
    # A pair of 64-row tiles sharing B by multicast (skinny_clusters, M <= 128), and a 64x192 tile on one
    # consumer warpgroup (n192_one): the tiles this space gained for products of 65-128 rows.
    {"cta": "64x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 6, "cluster": "2x1"},
    {"cta": "64x192x64", "warp": "64x192x64", "mma": "64x192x16", "stages": 6},
    # Tiles as wide as the batch (batch_swap, batch_narrow): N not a multiple of 64, B K-major in one box (or one
    # 48-row slice per CTA of a 2x1 pair), the staged epilogue's 16-column chunks; the 1x2 pair multicasts A.
    {"cta": "64x96x64", "warp": "64x96x64", "mma": "64x96x16", "stages": 10, "cluster": "2x1"},
    {"cta": "64x48x64", "warp": "64x48x64", "mma": "64x48x16", "stages": 12, "cluster": "1x2", "swap_ab": True},
    {"cta": "64x112x64", "warp": "64x112x64", "mma": "64x112x16", "stages": 8, "swap_ab": True},
])
def test_the_m128_tiles_sass_runs_hgmma_through_tma_multicast_with_no_local_memory(fields):
    from gemmgen.model.tiles import TileConfig

    problem = Problem.create(96, 5000, 3000, "bf16", "row", "col")
    config = TileConfig.from_dict({"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, **fields})
    compiled = compile_kernel(Kernel(Arch.SM90A, problem.operands, config), H100)
    text = dump_sass(compiled.cubin)
    counts = instruction_counts(text)
    assert count_prefix(counts, "HGMMA") > 0 and count_prefix(counts, "UTMALDG") > 0
    assert set(re.findall(r"HGMMA\.64x(\d+)x16", text)) == {str(config.warp.n)}
    # The pair's shared operand arrives through multicast TMA loads (2x1: B); a lone CTA issues none.
    assert (count_prefix(counts, "UTMALDG.2D.MULTICAST") > 0) == (config.cluster.size > 1)
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
    assert compiled.spill_bytes == 0
