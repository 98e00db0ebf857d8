"""The sm90_wgmma operand swap (D^T = B^T @ A^T for skinny M) and narrow 16/32-column tiles, on the CPU and GPU."""
from __future__ import annotations

import pytest

from gemmgen.families import rules as constraints

from gemmgen.model.arch import Arch
from gemmgen.families.sm90_wgmma import launch as sm90
from gemmgen.model.problem import Layout, Problem
from gemmgen.codegen.render import render
from gemmgen.families.sm90_wgmma.config import Sm90Config
from gemmgen.model.tiles import Cluster, Kernel, Raster, RasterOrder, Shape3, TileConfig
from sm90_helpers import H100, LAYOUTS, compile_sm90, count, hopper_config, ops, sass_counts, splitk_config


# --- operand swap (D^T = B^T @ A^T for skinny M) ------------------------------------------------------------
def swap_config(cta="128x16x64", warp="64x16x64", stages=8, splits=4, fused=False) -> TileConfig:
    """A swapped configuration: split-K over `splits` slices (summed in the launch when `fused`),
    data-parallel for splits=1."""
    from gemmgen.model.tiles import DecompKind, Decomposition
    w = Shape3.parse(warp)
    decomposition = Decomposition(DecompKind.SPLIT_K, splits, fused=fused) if splits > 1 else Decomposition()
    return Sm90Config(Shape3.parse(cta), w, Shape3(64, w.n, 16), stages,
                      raster=Raster(RasterOrder.ROW, 8), decomposition=decomposition,
                      warp_specialized=True, persistent=True, swap_ab=True)


def verify_on_gpu(problem: Problem, config: TileConfig, seed: int):
    """Feasible, then verified by GpuBenchmark.verify: fresh random operands, D poisoned, compared with the
    float64 / cuBLAS reference."""
    from gemmgen.tune.bench import GpuBenchmark
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.codegen.nvrtc import compile_kernel
    assert constraints.check(config, H100, Arch.SM90A, problem) == []
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    bench = GpuBenchmark(seed=seed)
    try:
        return bench.verify(make_manifest(kernel, problem), compile_kernel(kernel).cubin, problem)
    finally:
        bench.close()


def test_swap_is_named_only_when_chosen_and_round_trips():
    from dataclasses import replace
    from gemmgen.rank.ranking import axis_values, config_from_axes
    config = swap_config()
    plain = replace(config, swap_ab=False)
    assert config.tag == plain.tag + "_swap" and "swap_ab" not in plain.to_dict()
    assert TileConfig.from_dict(config.to_dict()) == config
    assert config_from_axes("sm90_wgmma", axis_values(config)) == config


def test_swapped_problem_exchanges_and_transposes_the_operands():
    for a, b in LAYOUTS:
        p = Problem.create(16, 4096, 1024, "bf16", a, b)
        s = p.swapped()
        assert (s.m, s.n, s.k) == (4096, 16, 1024)
        assert s.a_layout is Layout(b).flipped and s.b_layout is Layout(a).flipped
        assert (s.lda, s.ldb) == (p.ldb, p.lda)          # the same memory, read transposed
        assert p.operands.swapped() == s.operands.__class__(**{**s.operands.__dict__, "align_c": p.operands.align_c})


def test_swapped_manifest_maps_b_through_tma_a_and_runs_in_the_transposed_frame():
    problem = Problem.create(16, 4096, 4096, "bf16", "row", "row", bias=True, beta=0.5)
    kernel = Kernel(Arch.SM90A, problem.operands, swap_config())
    runs, workspace, zero = sm90.manifest_launches(kernel, problem, sm_count=132)
    main, reduce = runs
    tm_a, tm_b = main["params"][0], main["params"][1]
    assert (tm_a["tensor"], tm_b["tensor"]) == ("B", "A")
    assert tm_a["dims"] == [4096, 4096] and tm_a["box"] == [64, 64]      # B^T: MN-major, 64-wide boxes
    assert tm_b["dims"] == [4096, 16] and tm_b["box"] == [64, 16]        # A^T: K-major, one 16-row box
    scalars = {p["name"]: p["value"] for p in main["params"] if p["kind"] == "scalar"}
    assert (scalars["M"], scalars["N"], scalars["ldc"], scalars["ldd"]) == (4096, 16, 4096, 4096)
    assert main["grid"] == [128, 1, 1]                 # 32 tiles of 128 x 16, 4 slices each
    assert reduce["entry"].endswith("_reduce") and reduce["grid"] == [(16 * 2048 + 255) // 256, 1, 1]
    assert workspace == 4 * 16 * 4096 * 4 and zero["bytes"] == 0


@pytest.mark.parametrize("changes,problem,rule", [
    ({"streamk": True}, None, "a swapped kernel writes D transposed"),
    # a 2x1 pair shares the activations' tile, so it holds no more of M than one tile (a 1x2 pair holds two)
    ({"cluster": True}, Problem.create(24, 4096, 4096), "the operand swap serves skinny products"),
    ({}, Problem.create(64, 4096, 4096), "the operand swap serves skinny products"),
])
def test_swap_rejects_what_the_template_does_not_implement(changes, problem, rule):
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    config = swap_config()
    if changes.get("streamk"):
        config = replace(config, decomposition=Decomposition(DecompKind.STREAM_K, 1))
    if changes.get("cluster"):
        config = replace(config, cluster=Cluster(2, 1))
    problem = problem or Problem.create(16, 4096, 4096)
    violations = constraints.check(config, H100, Arch.SM90A, problem)
    assert any(rule in v.rule for v in violations), [v.rule for v in violations]
    assert constraints.check(swap_config(), H100, Arch.SM90A, Problem.create(16, 4096, 4096)) == []


def test_narrow_tiles_take_the_staged_epilogue_with_dp_or_split_k_and_k_major_b():
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    from gemmgen.families.sm90_wgmma.config import Schedule
    narrow = replace(swap_config(), swap_ab=False)
    tall = Problem.create(4096, 16, 4096, b="col")
    assert constraints.check(narrow, H100, Arch.SM90A, tall) == []
    dp = replace(narrow, decomposition=Decomposition())
    assert constraints.check(dp, H100, Arch.SM90A, tall) == []
    assert not sm90.uses_tma_store(Kernel(Arch.SM90A, tall.operands, dp))    # 16 columns: no 32-column boxes
    streamk = replace(narrow, decomposition=Decomposition(DecompKind.STREAM_K, 1))
    assert any("use the staged epilogue" in v.rule for v in constraints.check(streamk, H100, Arch.SM90A, operands=ops()))
    pp = replace(dp, cta=Shape3(64, 16, 64), schedule=Schedule.PINGPONG)
    assert any("cooperative schedule, no store warp" in v.rule for v in constraints.check(pp, H100, Arch.SM90A, operands=ops()))
    wide40 = replace(narrow, cta=Shape3(128, 40, 64), warp=Shape3(64, 40, 64), mma=Shape3(64, 40, 16))
    assert any("must be a multiple of 16" in v.rule for v in constraints.check(wide40, H100, Arch.SM90A, operands=ops()))
    wide48 = replace(wide40, cta=Shape3(128, 48, 64), warp=Shape3(64, 48, 64), mma=Shape3(64, 48, 16))
    assert constraints.check(wide48, H100, Arch.SM90A, operands=ops()) == []


def test_data_parallel_swapped_kernel_stores_d_transposed_without_tma_store_or_workspace():
    from dataclasses import replace
    from gemmgen.model.tiles import Decomposition
    problem = Problem.create(16, 4096, 4096, "bf16", "row", "row")
    kernel = Kernel(Arch.SM90A, problem.operands, replace(swap_config("64x16x64", "64x16x64", 10), decomposition=Decomposition()))
    runs, workspace, _ = sm90.manifest_launches(kernel, problem, sm_count=132)
    assert len(runs) == 1 and workspace == 0 and runs[0]["grid"] == [64, 1, 1]
    assert not any(p["name"] == "tmD" for p in runs[0]["params"])
    source = render(kernel)
    # D's rows are 16-byte aligned: each lane writes a run of one D row in 16-byte stores, not four-element pieces.
    assert "D + (size_t)drow * ldd + dcol" in source and "D[(size_t)(col + e) * ldd + row]" not in source
    odd = Problem.create(16, 4095, 4096, "bf16", "row", "row")   # ldd 4095: element stores of D^T's staged rows
    assert "D[(size_t)(col + e) * ldd + row]" in render(Kernel(Arch.SM90A, odd.operands, kernel.config))
    compiled = compile_sm90(kernel)
    counts = sass_counts(compiled.cubin)
    assert compiled.spill_bytes == 0 and count(counts, "LDL") == 0 and count(counts, "STL") == 0
    # The staged rows are read down a column (32-bit LDS, not a row's LDS.128) and leave as 16-byte stores.
    assert counts.get("STG.E.128", 0) >= 1 and counts.get("LDS", 0) >= 8 and counts.get("LDS.128", 0) == 0


@pytest.mark.parametrize("problem,cta,swap,maps", [
    (Problem.create(14, 1105, 272, "bf16", "col", "col"), "64x16x64", True, {"tmB": ([16, 64], "32B")}),
    (Problem.create(29, 333, 4104, "f16", "col", "row"), "64x32x64", True, {"tmB": ([32, 64], "64B")}),
    (Problem.create(4096, 48, 4096, "bf16", "col", "row"), "128x48x64", False, {"tmB": ([16, 64], "32B")}),
    # wider than 64 columns: 64-column blocks under the 128B swizzle, the remainder in narrow blocks (tmBr)
    (Problem.create(513, 4096, 4096, "bf16", "col", "col"), "128x144x64", True,
     {"tmB": ([64, 64], "128B"), "tmBr": ([16, 64], "32B")}),
    (Problem.create(1432, 1680, 1000, "bf16", "row", "row"), "128x160x64", False,
     {"tmB": ([64, 64], "128B"), "tmBr": ([32, 64], "64B")}),
])
def test_mn_major_b_of_any_width_is_read_in_narrow_swizzled_blocks(problem, cta, swap, maps):
    """A row-major B (or, swapped, a column-major A) whose tile is not whole 64-column blocks: TMA boxes of 16 or
    32 columns under the 32B or 64B swizzle for the narrow part (all of a tile under 64 columns, the remainder of a
    wider one, read by a second wgmma of its width), descriptors of the same mode, wgmma reading B transposed."""
    from dataclasses import replace
    from gemmgen.families.sm90_wgmma.rules import mn_blocks
    n = int(cta.split("x")[1])
    config = replace(swap_config(cta, f"64x{n}x64", 4, splits=1), swap_ab=swap)
    assert constraints.check(config, H100, Arch.SM90A, problem) == []
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    runs, _, _ = sm90.manifest_launches(kernel, problem, sm_count=132)
    specs = {p["name"]: (p["box"], p["swizzle"]) for p in runs[-1]["params"] if p.get("kind") == "tensormap"}
    assert {name: specs.get(name) for name in ("tmB", "tmBr")} == {"tmB": maps["tmB"], "tmBr": maps.get("tmBr")}
    main, _, rem, _ = mn_blocks(n, 2)
    assert main + rem == n and main % 64 in (0, n % 64) and (rem == 0 or main % 64 == 0)
    source = render(kernel)
    assert f"B_SWZ = {maps['tmB'][0][0] * 2};" in source and "A_SWZ = 128," in source
    compiled = compile_sm90(kernel)
    from gemmgen.codegen.sass import dump_sass
    sass = dump_sass(compiled.cubin)
    counts = sass_counts(compiled.cubin)
    widths = (main, rem) if rem else (n,)
    assert all(f"HGMMA.64x{w}x16.F32" in sass for w in widths) and count(counts, "UTMALDG") > 0
    assert compiled.spill_bytes == 0 and count(counts, "LDL") == 0 and count(counts, "STL") == 0


def test_a_multicast_b_tile_keeps_whole_64_column_blocks():
    """A 2x1 pair multicasts B's tile in slices of whole blocks: an MN-major B of a narrow width is refused by name."""
    from dataclasses import replace
    config = replace(swap_config("128x48x64", "64x48x64", 6, splits=1), swap_ab=False, cluster=Cluster(2, 1))
    violations = constraints.check(config, H100, Arch.SM90A, Problem.create(4096, 48, 4096, "bf16", "row", "row"))
    assert any("64-wide slices per CTA" in v.rule for v in violations), [v.rule for v in violations]


@pytest.mark.parametrize("cta,warp,stages", [("128x16x64", "64x16x64", 10), ("64x32x64", "64x32x64", 8)])
def test_swapped_kernel_compiles_to_narrow_hgmma_without_local_memory_and_reduces_transposed(cta, warp, stages):
    problem = Problem.create(16, 4096, 4096, "bf16", "row", "row")
    kernel = Kernel(Arch.SM90A, problem.operands, swap_config(cta, warp, stages))
    source = render(kernel)
    assert "workspace + (size_t)col * N + row" in source and "constexpr int EPI_CW = WN % 32 == 0 ? 32 : 16;" in source
    compiled = compile_sm90(kernel)
    assert compiled.spill_bytes == 0
    from gemmgen.codegen.sass import dump_sass
    text = dump_sass(compiled.cubin)
    counts = sass_counts(compiled.cubin)
    assert f"HGMMA.64x{Shape3.parse(warp).n}x16.F32.BF16" in text and count(counts, "UTMALDG") > 0
    assert count(counts, "LDL") == 0 and count(counts, "STL") == 0


def test_decode_sized_swapped_tiles_let_the_next_kernel_start_only_when_they_end():
    """Programmatic dependent launch: every kernel lets its dependents be scheduled at its start except the
    unclustered swapped tiles of M <= 64, which measured 0.4-1.0 us a call faster letting them start at the end
    (docs/perf-notes.md)."""
    problem = Problem.create(16, 4096, 4096, "bf16", "row", "col")
    decode = render(Kernel(Arch.SM90A, problem.operands, swap_config("64x16x64", "64x16x64", 12, splits=1)))
    batch = render(Kernel(Arch.SM90A, Problem.create(513, 4096, 4096, "bf16", "row", "col").operands,
                          swap_config("128x144x64", "64x144x64", 6, splits=1)))
    square = render(Kernel(Arch.SM90A, Problem.create(4096, 4096, 4096).operands, hopper_config()))
    from dataclasses import replace
    pair = render(Kernel(Arch.SM90A, Problem.create(128, 4096, 4096, "bf16", "row", "col").operands,
                         replace(swap_config("64x64x64", "64x64x64", 10, splits=1), cluster=Cluster(1, 2))))
    assert "    allow_dependents();" not in decode and "griddepcontrol.wait" in decode
    assert all("    allow_dependents();" in s for s in (batch, square, pair))   # 1x2 pairs: M = 128 ran faster early


@pytest.mark.parametrize("splits", [2, 4])
def test_fused_swapped_split_k_sums_its_partials_transposed_in_one_launch(splits):
    """The tile's last slice sums the partials in D^T's frame and stores D's rows: one launch, no spills."""
    problem = Problem.create(16, 4096, 4095, "bf16", "row", "col", bias=True)
    config = swap_config("64x16x64", "64x16x64", 10, splits, fused=True)
    assert constraints.check(config, H100, Arch.SM90A, problem) == []
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    source = render(kernel)
    assert "D[(size_t)col * ldd + row] = pack1(finish(v, col, row" in source and "_reduce(" not in source
    compiled = compile_sm90(kernel)
    counts = sass_counts(compiled.cubin)
    assert compiled.spill_bytes == 0 and count(counts, "LDL") == 0 and count(counts, "STL") == 0
    assert count(counts, "HGMMA") > 0 and count(counts, "UTMALDG") > 0


def test_space_offers_swapped_tiles_to_skinny_m_and_a_few_token_columns_and_the_model_ranks_one_first():
    from gemmgen.rank.predict import predict
    from gemmgen.rank.space import enumerate_space
    skinny = [c for c in enumerate_space("sm90_wgmma", H100, Arch.SM90A, Problem.create(16, 4096, 4096))
              if c.swap_ab]
    assert {16, 32, 64} <= {c.cta.n for c in skinny} and all(c.cta.n * c.cluster.n >= 16 for c in skinny)
    # At large M only the wide unclustered swapped tiles (the transposed product's widths) remain.
    large = [c for c in enumerate_space("sm90_wgmma", H100, Arch.SM90A, Problem.create(4096, 4096, 4096, b="col"))
             if c.swap_ab]
    assert not large   # M = 4096 is more than four columns of any wide swapped tile
    tokens = [c for c in enumerate_space("sm90_wgmma", H100, Arch.SM90A, Problem.create(513, 4096, 4096, b="col"))
              if c.swap_ab]
    assert tokens and all(c.cta.m >= 128 and c.cta.n >= 128 and c.cluster.size == 1 for c in tokens)
    # Column-major A: the swapped main loop reads A^T MN-major, narrow where not 64-column blocks (rules.mn_blocks).
    assert [c for c in enumerate_space("sm90_wgmma", H100, Arch.SM90A, Problem.create(513, 4096, 4096, a="col"))
            if c.swap_ab]
    p = Problem.create(16, 4096, 4096)
    # 4x fewer wasted wgmma rows than the 64-row tile: the model must not price the swap above it.
    assert predict(p, swap_config(), H100).time_s <= predict(p, splitk_config(4, "64x128x64", "64x128x64", 6), H100).time_s


@pytest.mark.gpu
@pytest.mark.parametrize("problem,cta,splits", [
    (Problem.create(16, 4096, 4096, "bf16", "row", "row"), "128x16x64", 4),
    (Problem.create(16, 4096, 4096, "bf16", "row", "row"), "64x16x64", 1),
    (Problem.create(7, 1000, 1000, "f16", "row", "col", alpha=2.0, beta=0.5, bias=True, activation="relu"), "128x16x64", 1),
    (Problem.create(29, 333, 4104, "bf16", "row", "col", bias=True), "64x32x64", 1),
    (Problem.create(13, 1000, 3000, "f16", "row", "col", alpha=0.5, beta=-1.5, bias=True, activation="gelu"), "128x16x64", 8),
    (Problem.create(32, 4104, 1032, "bf16", "row", "row", bias=True, activation="relu"), "64x32x64", 2),
    (Problem.create(1, 520, 4096, "f16", "row", "col", beta=1.0), "64x16x64", 4),
    (Problem.create(24, 777, 520, "bf16", "row", "col"), "128x32x64", 2),
    (Problem.create(16, 4096, 4096, "bf16", "row", "col"), "64x16x64", -2),
    (Problem.create(11, 1001, 3001, "f16", "row", "col", alpha=0.5, beta=1.0, bias=True, activation="gelu"),
     "64x16x64", -4),
    (Problem.create(27, 520, 4104, "bf16", "row", "row", bias=True), "128x32x64", -2),
    (Problem.create(64, 4096, 4096, "bf16", "row", "col"), "64x64x64", -2),
    (Problem.create(45, 1001, 2003, "f16", "row", "col", beta=1.0, bias=True, activation="relu"), "128x64x64", 1),
    (Problem.create(61, 777, 1000, "bf16", "row", "row"), "64x64x64", 4),
    (Problem.create(16, 4104, 1032, "bf16", "row", "col", beta=0.5, bias=True, activation="silu"), "64x16x64", 1),
])
def test_swapped_kernels_verify_against_the_reference(problem, cta, splits):
    """Fresh random operands, D poisoned, compared with the float64 / cuBLAS reference (GpuBenchmark.verify).
    Negative splits: split-K summed in the launch (fused), transposed by the last slice."""
    n = int(cta.split("x")[1])
    config = swap_config(cta, f"64x{n}x64", 6, abs(splits), fused=splits < 0)
    result = verify_on_gpu(problem, config, seed=5)
    assert result.ok, result.reason


@pytest.mark.gpu
@pytest.mark.parametrize("problem,cta,splits,swap,cluster", [
    # swapped: A column-major, read as the main loop's MN-major B in 16- (32B swizzle) or 32-column (64B) blocks
    (Problem.create(14, 1105, 272, "bf16", "col", "col"), "64x16", 1, True, "1x1"),      # lda 14: A packed
    (Problem.create(16, 11752, 510, "bf16", "col", "row"), "64x16", 1, True, "1x1"),
    (Problem.create(7, 1000, 1000, "f16", "col", "col", alpha=2.0, beta=0.5, bias=True, activation="relu"),
     "128x16", 4, True, "1x1"),
    (Problem.create(29, 333, 4104, "bf16", "col", "row", bias=True), "64x32", 1, True, "1x1"),
    (Problem.create(45, 1001, 2003, "f16", "col", "col", beta=1.0, bias=True, activation="gelu"), "128x48", 1, True,
     "1x1"),
    (Problem.create(94, 1306, 566, "bf16", "col", "col"), "64x48", 1, True, "1x2"),
    (Problem.create(11, 1001, 3001, "f16", "col", "row", alpha=0.5, beta=1.0, bias=True), "64x16", -4, True, "1x1"),
    (Problem.create(513, 4096, 4096, "bf16", "col", "col"), "128x144", 1, True, "1x1"),
    (Problem.create(600, 1000, 520, "f16", "col", "row", bias=True, activation="silu"), "128x160", 1, True, "1x1"),
    # unswapped: B row-major
    (Problem.create(1432, 1680, 1000, "bf16", "row", "row"), "128x144", 1, False, "1x1"),
    (Problem.create(200, 5000, 3000, "bf16", "row", "row", c_dtype="f32", bias=True), "128x80", 1, False, "1x1"),
    (Problem.create(300, 3000, 2048, "bf16", "col", "row"), "128x80", 1, False, "1x2"),
    (Problem.create(1000, 30, 2000, "f16", "col", "row", beta=1.0, bias=True), "128x32", 2, False, "1x1"),
    (Problem.create(4096, 16, 4096, "bf16", "row", "row"), "64x16", 1, False, "1x1"),
    (Problem.create(777, 1000, 520, "f16", "row", "row", alpha=0.5, beta=1.0, bias=True, activation="gelu"),
     "192x112", 1, False, "1x1"),
    (Problem.create(999, 1000, 1000, "bf16", "row", "row", beta=1.0), "128x240", 1, False, "1x1"),
    # split-K through the reduction launch, which takes the GEMM's parameters (tmBr among them)
    (Problem.create(500, 1000, 2000, "bf16", "row", "row", bias=True), "128x96", 2, False, "1x1"),
    (Problem.create(100, 4096, 8192, "bf16", "col", "col"), "128x144", 2, True, "1x1"),
])
def test_mn_major_b_in_narrow_swizzled_blocks_verifies(problem, cta, splits, swap, cluster):
    """Tiles whose B is MN-major and not whole 64-column blocks (rules.mn_blocks), swapped and not, at shapes
    that are not tile multiples: fresh operands, D poisoned, against the reference. Negative splits: fused."""
    from dataclasses import replace
    n = int(cta.split("x")[1])
    stages = 6 if n <= 144 and not cta.startswith("192") else 4   # what the shared memory holds
    config = swap_config(f"{cta}x64", f"64x{n}x64", stages, abs(splits), fused=splits < 0)
    config = replace(config, swap_ab=swap, cluster=Cluster(*map(int, cluster.split("x"))))
    result = verify_on_gpu(problem, config, seed=11)
    assert result.ok, result.reason


@pytest.mark.gpu
@pytest.mark.parametrize("problem,n,stages", [
    (Problem.create(513, 4096, 4096, "bf16", "row", "col"), 144, 6),
    (Problem.create(777, 1000, 520, "f16", "row", "row", alpha=0.5, beta=1.0, bias=True, activation="gelu"), 208, 4),
    (Problem.create(300, 4104, 1032, "bf16", "row", "col", c_dtype="f32", bias=True), 160, 4),
    (Problem.create(901, 2003, 776, "f16", "row", "col", beta=-1.0, bias=True, activation="relu"), 240, 4),
    (Problem.create(513, 520, 264, "bf16", "row", "col", ldc=528), 144, 4),
    (Problem.create(600, 1000, 520, "f16", "row", "col", bias=True, activation="silu"), 160, 4),
])
def test_wide_swapped_tiles_verify_at_several_token_columns(problem, n, stages):
    """Wide swapped tiles (rules.swap_m_max) at M over several tiles and not a tile multiple: the transposed
    epilogue's 16-byte runs of D's rows (fp32 D, a view of D whose rows are wider) and its element stores (D's
    rows not 16-byte aligned: N 2003); fresh operands, D poisoned, against the reference."""
    config = swap_config(f"128x{n}x64", f"64x{n}x64", stages, splits=1)
    result = verify_on_gpu(problem, config, seed=8)
    assert result.ok, result.reason


@pytest.mark.gpu
@pytest.mark.parametrize("problem,splits", [
    (Problem.create(4096, 16, 4096, "bf16", "row", "col"), 1),
    (Problem.create(1000, 30, 2000, "f16", "col", "col", beta=1.0, bias=True), 2),
])
def test_narrow_unswapped_tiles_verify_against_the_reference(problem, splits):
    """A 16- or 32-column tile without the swap (N itself skinny, B K-major): the staged epilogue's narrow chunks."""
    from dataclasses import replace
    n = 16 if problem.n <= 16 else 32
    config = replace(swap_config(f"128x{n}x64", f"64x{n}x64", 6, splits), swap_ab=False)
    result = verify_on_gpu(problem, config, seed=6)
    assert result.ok, result.reason



def test_a_pair_of_swapped_tiles_whose_second_tile_is_half_empty_serves_but_is_priced_below_one_tile():
    """96x4096x4096 on 64x48 pairs ran 16.9 us against 18.2 for one 64x96 tile, but M 40-64 on the same pairs ran
    19-35% slower than one tile as wide as M (H100): the model, not a rule, keeps the pair to M above 1.5 tiles, so a
    pair's bundle still serves every M it holds (a dispatch bucket's smallest M included)."""
    from dataclasses import replace
    from gemmgen.families.sm90_wgmma import HALF_EMPTY_PAIR_LOAD_EFFICIENCY
    from gemmgen.rank.calibration import params_for
    from gemmgen.rank.predict import predict
    params, _ = params_for(H100)
    # (B column-major: the pair multicasts the weights, the swapped kernel's A, K-major in 32-row slices.)
    pair = replace(swap_config("64x48x64", "64x48x64", 12, splits=1), cluster=Cluster(1, 2))
    one = replace(swap_config("64x64x64", "64x64x64", 12, splits=1))
    for m in (40, 64, 96):
        assert constraints.check(pair, H100, Arch.SM90A, Problem.create(m, 4096, 4096, b="col")) == []
    half_empty = Problem.create(64, 4096, 4096, b="col")
    assert predict(half_empty, pair, H100, params).time_s > predict(half_empty, one, H100, params).time_s
    full = Problem.create(96, 4096, 4096, b="col")
    assert predict(full, pair, H100, params).dram_rate > predict(half_empty, pair, H100, params).dram_rate
    assert HALF_EMPTY_PAIR_LOAD_EFFICIENCY < 1


@pytest.mark.parametrize("problem,cta,splits,swap,fused", [
    (Problem.create(500, 1000, 2000, "bf16", "row", "row"), "128x96", 2, False, False),      # tmBr, reduce launch
    (Problem.create(100, 4096, 8192, "bf16", "col", "col"), "128x144", 2, True, False),      # swapped, tmBr
    (Problem.create(777, 1000, 520, "f16", "row", "row", bias=True), "128x80", 3, False, True),
    (Problem.create(1001, 30, 2003, "bf16", "col", "row"), "128x32", 2, False, False),       # all narrow, no tmBr
    (Problem.create(4095, 3001, 4093, "bf16", "row", "row"), "128x112", 2, False, False),    # B packed, tmBr on it
])
def test_every_launch_declares_the_manifest_s_parameters_in_order(problem, cta, splits, swap, fused):
    """The manifest passes one parameter list to the GEMM and its split-K reduction (and the pack entry its own):
    every entry point of the rendered source declares exactly its launch's parameters, in order, the remainder's
    tensor map tmBr included (the reduction once lacked it and read every later argument 128 bytes off)."""
    import re
    from dataclasses import replace
    from gemmgen.runtime.manifest import make_manifest
    n = int(cta.split("x")[1])
    config = replace(swap_config(f"{cta}x64", f"64x{n}x64", 4, splits, fused=fused), swap_ab=swap)
    assert constraints.check(config, H100, Arch.SM90A, problem) == []
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    source = render(kernel)
    launches = make_manifest(kernel, problem)["launches"]
    assert {kernel.name} <= {launch["entry"] for launch in launches}
    for launch in launches:
        signature = re.search(rf"{launch['entry']}\((.*?)\)\s*{{", source, re.S).group(1)
        declared = [re.sub(r"\[.*\]", "", part).split()[-1].lstrip("*") for part in signature.split(",")]
        assert declared == [p["name"] for p in launch["params"]], launch["entry"]
