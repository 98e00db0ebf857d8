"""sm80_skinny: rules, rendering, SASS (mma.sync on 16-byte streamed loads, no shared-memory staging, no local
memory), the launch description, and on the GPU correctness at shapes that are not tile multiples."""
from __future__ import annotations

import pytest

import gemmgen
from gemmgen.codegen.nvrtc import compile_kernel
from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts
from gemmgen.families import rules as constraints
from gemmgen.model.arch import Arch, lookup_gpu
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Kernel, TileConfig
from gemmgen.runtime.manifest import make_manifest
from space_helpers import broken, compile_cache, heaviest_compile_without_spills  # noqa: F401 (a fixture)

H100 = lookup_gpu("h100")
FAMILY = gemmgen.families.get("sm80_skinny")


def skinny(cta="16x128x128", warp="16x32x128", k_warps=1, splits=1, stages=1) -> TileConfig:
    d = {"family": "sm80_skinny", "cta": cta, "warp": warp, "mma": "16x8x16", "stages": stages, "k_warps": k_warps}
    if splits > 1:
        d["decomposition"] = {"kind": "splitk", "splits": splits}
    return TileConfig.from_dict(d)


def test_skinny_takes_row_major_a_and_either_b_and_names_the_rule_for_others():
    config = skinny()
    assert broken(config, Problem.create(16, 4096, 4095, "bf16", "row", "col")) == []
    # Row-major B goes through 128-byte rows per warp: warp tile N 64.
    assert broken(config, Problem.create(16, 4096, 4096, "bf16", "row", "row")) == [
        "sm80_skinny with row-major B needs warp tile N 64 (128-byte rows of B)"]
    assert broken(skinny("16x128x64", "16x64x64"), Problem.create(16, 4095, 4093, "bf16", "row", "row")) == []
    rules = broken(config, Problem.create(16, 4096, 4096, "bf16", "col", "col"))
    assert any("row-major A" in r for r in rules)


def test_row_major_b_stages_a_tile_per_warp_in_shared_memory():
    config = skinny("16x128x64", "16x64x64", k_warps=2)
    rr = Problem.create(16, 4096, 4096, "bf16", "row", "row").operands
    rc = Problem.create(16, 4096, 4096, "bf16", "row", "col").operands
    park = 1 * 2 * 32 * (8 * 4) * 4               # one K-split group parks 2 warps' 32 accumulators each
    assert FAMILY.smem_bytes(config, rc) == park
    assert FAMILY.smem_bytes(config, rr) == park + 4 * 2 * 32 * 128   # 4 warps x 2 K steps x 32 rows of 128 B


def test_every_row_of_d_must_fit_one_cta_tile():
    assert broken(skinny(), Problem.create(17, 4096, 4096, "bf16", "row", "col")) == [
        "sm80_skinny covers every row of D in one CTA tile: M must be at most CTA tile M"]
    assert broken(skinny("32x128x128", "32x32x128"), Problem.create(17, 4096, 4096, "bf16", "row", "col")) == []


def test_config_round_trips_and_names_its_k_warps():
    config = skinny(k_warps=2, splits=4)
    assert TileConfig.from_dict(config.to_dict()) == config
    assert config.tag.endswith("_kw2") and config.threads == 4 * 2 * 32
    odd = TileConfig.from_dict({**config.to_dict(), "k_warps": 3})
    assert "k_warps must be 1, 2 or 4" in broken(odd, Problem.create(16, 4096, 4096, "bf16", "row", "col"))


def test_split_k_launches_partials_then_the_shared_reduction():
    problem = Problem.create(16, 4096, 4096, "bf16", "row", "col")
    kernel = Kernel(Arch.SM90A, problem.operands, skinny(k_warps=2, splits=4))
    manifest = make_manifest(kernel, problem)
    main, reduce = manifest["launches"]
    assert main["grid"] == [4096 // 128, 1, 4] and main["block"] == [256, 1, 1]
    assert main["dynamic_smem"] == FAMILY.smem_bytes(kernel.config, problem.operands) > 0
    assert reduce["entry"] == kernel.name + "_reduce"
    assert manifest["workspace_bytes"] == 4 * 16 * 4096 * 4
    assert manifest["serves"]["m_max"] == 16


def test_unaligned_rows_want_32_warps_a_sm_rather_than_16():
    # Measured on the H100 at 16 x 4096 x 4095 rc (docs/lab-data/h100-sxm/skinny-wide-20261125-1522.json): the
    # same CTA with 2 warps along K ran 41.0 us over 4 splits (256 CTAs, 16 warps a SM) and 30.0 us over 8 (32
    # warps a SM); shifted pairs of unaligned rows need the extra warps in flight.
    from gemmgen.rank.predict import predict

    problem = Problem.create(16, 4096, 4095, "bf16", "row", "col")
    gpu = lookup_gpu("h100")
    t16 = predict(problem, skinny("16x64x64", "16x16x64", k_warps=2, splits=4), gpu).time_s
    t32 = predict(problem, skinny("16x64x64", "16x16x64", k_warps=2, splits=8), gpu).time_s
    assert t32 < t16


def test_k_split_warps_fit_two_ctas_a_sm_as_compiled():
    # 16x64x64 with 16x16 warps compiled to 64 registers at 2 and 4 warps along K (ptxas, sm_90a): 512 threads
    # x 64 leave room for two CTAs a SM, which the model must see (it priced 4 warps along K at one CTA).
    from gemmgen.families.rules import ctas_per_sm

    gpu = lookup_gpu("h100")
    config = skinny("16x64x64", "16x16x64", k_warps=4, splits=4)
    assert FAMILY.regs_estimate(config) <= 64 and ctas_per_sm(config, gpu) == 2
    assert FAMILY.regs_estimate(skinny("16x64x64", "16x16x64")) > 64   # one warp along K: 79 compiled


def test_a_tile_taller_than_the_rows_of_d_is_priced_slower():
    # Taller tiles load A for every m16 block; they lost in every stored skinny case (16 x 65536 x 4096: a 64-row
    # tile 321 us against 191 for a 16-row one).
    from gemmgen.rank.predict import predict

    problem = Problem.create(16, 65536, 4096, "bf16", "row", "col")
    gpu = lookup_gpu("h100")
    tall = predict(problem, skinny("64x64x64", "64x16x64"), gpu).time_s
    fitting = predict(problem, skinny("16x64x64", "16x16x64", k_warps=4), gpu).time_s
    assert tall > 1.2 * fitting


def test_a_tile_of_two_m16_blocks_pays_for_both_where_d_needs_them():
    # The per-SM rates were fitted on one-block tiles; a 32-row tile loads A for both blocks whatever the rows D
    # needs. Priced against the rows D needs (no charge at M 17-32), the 32-row tiles ran 1.7-2.3x their price on
    # the H100 (20x2392x6651 rc 66 us against 37; 32x4824x11851 rc 267 against 115, 2026-11-28).
    from gemmgen.families.sm80_skinny import FAMILY

    problem = Problem.create(32, 4824, 11851, "bf16", "row", "col")
    one, two = skinny("16x64x64", "16x16x64"), skinny("32x64x64", "32x16x64")
    ni = 2   # n8 groups of a 16-column warp
    assert FAMILY.sm_load_rate(two, problem, 8.0) == pytest.approx(
        FAMILY.sm_load_rate(one, problem, 8.0) * (ni + 2) / (ni + 4))


@pytest.mark.parametrize("k,dtype,b", [(4096, "bf16", "col"), (4095, "bf16", "col"), (4093, "f16", "col"),
                                       (4096, "bf16", "row"), (4095, "f16", "row")])
def test_sass_streams_b_into_mma_sync_without_local_memory(k, dtype, b):
    """Aligned rows load 16 bytes at a time; unaligned ones too (shifted pairs), never element by element in
    the main loop; column-major B goes straight to the MMAs, row-major B through ldmatrix.trans; nothing in
    local memory."""
    problem = Problem.create(16, 4096, k, dtype, "row", b, bias=True, activation="gelu")
    config = skinny(k_warps=2, splits=2) if b == "col" else skinny("16x128x64", "16x64x64", k_warps=2, splits=2,
                                                                    stages=2)
    compiled = compile_kernel(Kernel(Arch.SM90A, problem.operands, config), H100)
    counts = instruction_counts(dump_sass(compiled.cubin))
    assert count_prefix(counts, "HMMA.16816") > 0
    assert sum(v for op, v in counts.items() if op.startswith("LDG") and ".128" in op) > 0
    assert (count_prefix(counts, "LDSM") > 0) == (b == "row") and count_prefix(counts, "LDGSTS") == 0
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0, compiled.resources
    assert compiled.spill_bytes == 0


@pytest.mark.slow
def test_the_heaviest_configs_of_the_space_compile_without_spills():
    problem = Problem.create(16, 4095, 4095, "bf16", "row", "col")
    # The space's register-heaviest configurations (one per CTA tile M and stage count): where a spill would show.
    heaviest_compile_without_spills(FAMILY, H100, problem, lambda c: (c.cta.m, c.stages), at_least=50)


ROW_B = skinny("16x128x64", "16x64x64")
GPU_CASES = [  # (M, N, K, bias, activation, alpha, beta, config[, B layout])
    (1, 4096, 4096, False, "none", 1.0, 0.0, skinny()),
    (16, 4096, 4096, True, "none", 1.0, 0.0, ROW_B, "row"),
    (9, 4095, 4093, False, "gelu", 1.0, 0.5, skinny("16x128x64", "16x64x64", k_warps=2, stages=2, splits=3), "row"),
    (1, 130, 77, False, "none", 1.0, 0.0, ROW_B, "row"),
    (40, 1000, 999, True, "relu", 1.0, 0.0, skinny("48x64x32", "48x64x32", k_warps=2), "row"),
    # tiny and degenerate: every load in the K tail, a single column, a single element
    (3, 5, 7, True, "gelu", 1.0, 0.0, skinny(k_warps=2), "col"),
    (1, 1, 1, False, "none", 1.0, 0.0, skinny(), "col"),
    (2, 9, 13, False, "none", 1.0, 0.5, ROW_B, "row"),
    (7, 1001, 999, True, "gelu", 1.0, 0.0, skinny(k_warps=2)),
    (11, 999, 1001, True, "silu", 1.0, 0.5, skinny(k_warps=2, splits=2)),
    (16, 4095, 4095, False, "relu", 0.5, 1.5, skinny(splits=4)),
    (13, 777, 4100, True, "none", 1.0, 0.0, skinny("16x64x64", "16x16x64", k_warps=4, splits=3)),
    (33, 520, 333, False, "none", 2.0, 0.0, skinny("64x64x128", "64x16x128", k_warps=2)),
    (16, 4096, 4096, True, "none", 1.0, 0.0, skinny(stages=2, k_warps=2, splits=2)),
    (5, 3001, 2999, False, "gelu", 1.0, 0.0, skinny("16x64x128", "16x16x128", stages=2, k_warps=2)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"{c[0]}x{c[1]}x{c[2]}_{(c[8:] or ['col'])[0]}" for c in GPU_CASES])
def test_skinny_matches_the_reference_on_the_gpu(case):
    from gemmgen.tune.bench import GpuBenchmark

    m, n, k, bias, activation, alpha, beta, config, *layout = case
    problem = Problem.create(m, n, k, "bf16", "row", layout[0] if layout else "col", alpha=alpha, beta=beta, bias=bias,
                             activation=activation)
    assert constraints.check(config, H100, Arch.SM90A, problem) == []
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    bench = GpuBenchmark(seed=m * 7 + n)
    try:
        result = bench.verify(make_manifest(kernel, problem), compile_kernel(kernel).cubin, problem)
    finally:
        bench.close()
    assert result.ok, result
