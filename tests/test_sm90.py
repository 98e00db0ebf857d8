"""The sm90_wgmma family on the CPU: rendering, NVRTC for sm_90a, SASS, TMA specs, feasibility, split-K, epilogue.

Ping-pong, Stream-K and fused split-K: tests/test_sm90_schedules.py; the operand swap: tests/test_sm90_swap.py.
GPU correctness: benchmarks/space_check.py and the gpu-marked tests; the timing lab that was here is at
ac47e8f:scripts/hopper_lab.py (figures in docs/perf-notes.md).
"""
from __future__ import annotations

import pytest

from gemmgen.families import rules as constraints

from gemmgen.runtime import tma
from gemmgen.model.arch import Arch
from gemmgen.model.errors import CompileError, InvalidInput
from gemmgen.families.sm90_wgmma import context as sm90_context
from gemmgen.families.sm90_wgmma import launch as sm90
from gemmgen.families.sm90_wgmma import rules as sm90_rules
from gemmgen.model.problem import Problem
from gemmgen.codegen.render import render
from gemmgen.rank.space import all_configs, enumerate_space
from gemmgen.families.sm90_wgmma.config import Sm90Config
from gemmgen.model.tiles import Cluster, Kernel, Shape3, TileConfig
from sm90_helpers import H100, LAYOUTS, compile_sm90, count, hopper_config, ops, sass_counts, splitk_config


def render_lab(kernel: Kernel, **switches) -> str:
    """The sm90 template rendered with template parameters overridden (a store warp where none is served)."""
    from gemmgen.codegen.render import environment
    from gemmgen import families
    family = families.of(kernel.config)
    return environment(str(family.template_root)).get_template(family.template).render(
        **dict(sm90_context.context(kernel), **switches))


# --- rendering ------------------------------------------------------------------------------------
def test_render_opens_with_kernel_name_and_uses_the_configured_wgmma_shape():
    kernel = Kernel(Arch.SM90A, ops(), hopper_config())
    source = render(kernel)
    assert source.splitlines()[0] == f"// {kernel.name}"
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in source
    assert f"void __launch_bounds__(384, 1) {kernel.name}(" in source


@pytest.mark.parametrize("a,b", LAYOUTS)
def test_render_sets_wgmma_transpose_bits_from_operand_layouts(a, b):
    source = render(Kernel(Arch.SM90A, ops(a=a, b=b), hopper_config()))
    t_a, t_b = int(a == "col"), int(b == "row")  # MN-major operands are transposed
    assert f"p, 1, 1, {t_a}, {t_b};" in source


def test_setmaxnreg_only_with_two_consumer_warpgroups():
    two = render(Kernel(Arch.SM90A, ops(), hopper_config()))
    one = render(Kernel(Arch.SM90A, ops(), hopper_config("128x128x64", "128x128x64")))
    assert "setmaxnreg.inc.sync.aligned.u32 232" in two and "setmaxnreg.dec.sync.aligned.u32 40" in two
    assert "setmaxnreg" not in one.split("extern \"C\"")[1]


# --- feasibility ----------------------------------------------------------------------------------
# Swapped kernels' 16/32-wide tiles need the caller's A row-major (K-major in shared memory), so not every layout.
@pytest.mark.parametrize("a,b,swap", [(a, b, False) for a in ("row", "col") for b in ("row", "col")]
                         + [("row", "row", True), ("row", "col", True)])
def test_operands_tma_cannot_read_are_packed_into_the_workspace_first(a, b, swap):
    # lda/ldb 4095 bf16 are not 16-byte multiples: TMA cannot describe them in place, so each misaligned operand
    # is copied to a 128-byte-multiple leading dimension in the workspace and the GEMM's tensor map reads the copy.
    m = 24 if swap else 1000
    problem = Problem.create(m, 3001, 4095, "bf16", a, b)
    config = TileConfig.from_dict({"family": "sm90_wgmma", "cta": "128x32x64", "warp": "64x32x64",
                                   "mma": "64x32x16", "stages": 6, "warp_specialized": True, "persistent": True,
                                   "swap_ab": True}) if swap else hopper_config()
    assert constraints.check(config, H100, Arch.SM90A, problem) == []
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    runs, workspace, _ = sm90.manifest_launches(kernel, problem)
    gemm = next(r for r in runs if r["entry"] == kernel.name)
    packs = [r for r in runs if r["entry"] == kernel.name + "_pack"]
    ops = problem.swapped().operands if swap else problem.operands
    expected = [name for name, align in (("A", ops.align_a), ("B", ops.align_b)) if align * 2 < 16]
    # One launch copies every misaligned operand (blockIdx.z picks the copy), before the GEMM reads them.
    assert len(packs) == (1 if expected else 0) and runs[:len(packs)] == packs
    maps = {p["name"]: p for p in gemm["params"] if p["kind"] == "tensormap"}
    scalars = {p["name"]: p["value"] for p in gemm["params"] if p["kind"] == "scalar"}
    copies = []
    for pack in packs:
        params = {p["name"]: p for p in pack["params"]}
        assert pack["grid"][2] == len(expected)
        for z in range(pack["grid"][2]):
            rows, cols = params[f"rows{z}"]["value"], params[f"cols{z}"]["value"]
            ld_dst, offset = params[f"ld_dst{z}"]["value"], params[f"dst{z}"]["offset_bytes"]
            assert ld_dst >= cols and ld_dst * 2 % 128 == 0 and offset % 1024 == 0
            assert offset + rows * ld_dst * 2 <= workspace
            assert pack["grid"][0] * 256 * 8 >= cols and pack["grid"][1] * 4 >= min(rows, 4 * 65535)
            tm = next(t for t in maps.values() if t.get("offset_bytes") == offset)
            assert tm["tensor"] == "workspace" and tm["strides_bytes"] == [ld_dst * 2] and tm["dims"] == [cols, rows]
            tma.validate_spec(tm)
            assert scalars["lda" if tm["name"] == "tmA" else "ldb"] == ld_dst
            copies.append((offset, rows * ld_dst * 2))
    copies.sort()
    assert all(a_off + a_len <= b_off for (a_off, a_len), (b_off, _) in zip(copies, copies[1:]))  # no overlap
    assert len(copies) == len(expected)
    source = render(kernel)
    assert (kernel.name + "_pack(") in source if packs else "_pack(" not in source


def test_odd_k_is_fine_when_both_operands_are_mn_major():
    # A col-major (lda = M) and B row-major (ldb = N): K only sets extents, which TMA zero-fills.
    problem = Problem.create(1000, 3000, 4097, "bf16", "col", "row")
    assert constraints.check(hopper_config(), H100, Arch.SM90A, problem) == []


def test_multicast_slices_need_64_wide_pieces():
    bad = hopper_config("128x128x64", "64x128x64", cluster=(1, 2))  # A (BM=128) splits into 2x64: fine
    assert constraints.check(bad, H100, Arch.SM90A) == []
    worse = Sm90Config(Shape3(64, 128, 64), Shape3(64, 128, 64), Shape3(64, 128, 16), 4,
                       cluster=Cluster(1, 2), warp_specialized=True, persistent=True)
    assert any("cluster along N multicasts A" in v.rule for v in constraints.check(worse, H100, Arch.SM90A))


def test_a_1x2_cluster_multicasts_a_k_major_a_in_96_row_slices_but_mn_major_a_only_in_64_wide_blocks():
    config = hopper_config("192x192x64", "64x192x64", stages=3, cluster=(1, 2))
    assert not constraints.check(config, H100, Arch.SM90A, operands=ops(a="row", b="row"))
    violations = constraints.check(config, H100, Arch.SM90A, operands=ops(a="col", b="row"))
    assert any("64-wide slices" in v.rule for v in violations)
    problem = Problem.create(3000, 3000, 3000, "bf16", "row", "row")
    tm_a, tm_b = sm90.tensormap_specs(Kernel(Arch.SM90A, problem.operands, config), problem)
    assert tm_a["box"] == [64, 96] and tm_b["box"] == [64, 64]   # each CTA loads and multicasts 96 of A's rows
    assert sm90_context.context(Kernel(Arch.SM90A, problem.operands, config))["consumers"] == 3
    assert sm90_context.context(Kernel(Arch.SM90A, problem.operands, config))["consumer_regs"] == 152


# --- launch manifest and tensor maps --------------------------------------------------------------
@pytest.mark.parametrize("a,b", LAYOUTS)
def test_tensormap_boxes_cover_exactly_the_bytes_the_kernel_expects(a, b):
    config = hopper_config(cluster=(2, 1))
    problem = Problem.create(3000, 1000, 2056, "bf16", a, b)
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    tm_a, tm_b = sm90.tensormap_specs(kernel, problem)
    for spec in (tm_a, tm_b):
        tma.validate_spec(spec)
        assert spec["box"][0] == 64 and spec["swizzle"] == "128B"
    # A: K-major boxes are 64 K x BM rows; MN-major boxes are 64 M x 64 K (BM/64 of them).
    assert tm_a["dims"] == ([2056, 3000] if a == "row" else [3000, 2056])
    assert tm_a["box"][1] == (128 if a == "row" else 64)
    # B is multicast over the 2x1 cluster: each CTA loads half of a K-major tile.
    assert tm_b["dims"] == ([2056, 1000] if b == "col" else [1000, 2056])
    assert tm_b["box"][1] == (128 if b == "col" else 64)
    assert tm_a["strides_bytes"] == [problem.lda * 2] and tm_b["strides_bytes"] == [problem.ldb * 2]


def test_manifest_launch_is_persistent_and_clustered():
    problem = Problem.create(4096, 4096, 4096)
    persistent = Kernel(Arch.SM90A, problem.operands, hopper_config(cluster=(2, 1)))
    entry = sm90.launch(persistent, problem, sm_count=132)
    assert entry["grid"] == [132, 1, 1] and entry["cluster"] == [2, 1, 1] and entry["block"] == [384, 1, 1]
    assert entry["dynamic_smem"] == constraints.smem_bytes(persistent.config, persistent.operands)
    # The driver may fit fewer clusters than SMs/2; the grid follows cuOccupancyMaxActiveClusters then.
    assert sm90.launch(persistent, problem, sm_count=132, max_clusters=60)["grid"] == [120, 1, 1]
    one_shot = Kernel(Arch.SM90A, problem.operands, hopper_config(persistent=False))
    assert sm90.launch(one_shot, problem, sm_count=132)["grid"] == [32 * 16, 1, 1]
    names = [p["name"] for p in entry["params"]]
    # A K-major A has an edge map (tmAe); the row-major (MN-major, 64-column boxes) B has none.
    assert names == ["tmA", "tmB", "tmAe", "tmD", "B", "C", "D", "bias", "workspace", "M", "N", "K", "lda", "ldb",
                     "ldc", "ldd", "alpha", "beta"]


@pytest.mark.parametrize("m,n,cluster,b,want", [
    (129, 4096, (1, 1), "col", {"tmAe": 1, "tmBe": 256}),    # one row past 128 (128x256 tiles): a box of 1 row
    (4096, 1000, (1, 1), "col", {"tmAe": 128, "tmBe": 1000 - 3 * 256}),
    (4096, 1000, (2, 1), "col", {"tmAe": 128, "tmBe": 1000 - 7 * 128}),   # B multicast over the pair in 128-row
    (4096, 1000, (1, 2), "col", {"tmAe": 64, "tmBe": 1000 - 3 * 256}),    # slices: the slice holding N's edge; A's
    (1000, 1000, (1, 2), "col", {"tmAe": 1000 - 15 * 64, "tmBe": 1000 - 3 * 256}),   # 64-row slices (M 4096: whole)
    (200, 1000, (1, 1), "row", {"tmAe": 200 - 128}),         # row-major B is MN-major: 64-wide boxes, no edge map
])
def test_edge_maps_cut_the_last_tiles_box_to_the_rows_left(m, n, cluster, b, want):
    problem = Problem.create(m, n, 4096, b=b)
    kernel = Kernel(Arch.SM90A, problem.operands, hopper_config(cluster=cluster))
    params = {p["name"]: p for p in sm90.launch(kernel, problem, sm_count=132)["params"]}
    assert {name: params[name]["box"][1] for name in params if name in ("tmAe", "tmBe")} == want
    for name in want:
        assert {k: v for k, v in params[name].items() if k not in ("name", "box")} == \
            {k: v for k, v in params[name[:-1]].items() if k not in ("name", "box")}
    source = render(kernel)
    assert ("tmAe" in source) == ("tmAe" in want) and ("tmBe" in source) == ("tmBe" in want)


def _encode_with_fake_driver(monkeypatch, spec):
    """tma.encode against a stand-in driver: the L2 promotion it passed to cuTensorMapEncodeTiled."""
    from types import SimpleNamespace
    seen = []
    enum = lambda *names: SimpleNamespace(**{n: n for n in names})  # noqa: E731

    def encode_tiled(*args):
        seen.append(args[9])
        return "ok", SimpleNamespace(opaque=[0] * 16)
    fake = SimpleNamespace(
        CUresult=SimpleNamespace(CUDA_SUCCESS="ok"), cuTensorMapEncodeTiled=encode_tiled,
        cuuint64_t=int, cuuint32_t=int,
        CUtensorMapDataType=enum("CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
                                 "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"),
        CUtensorMapSwizzle=enum("CU_TENSOR_MAP_SWIZZLE_128B", "CU_TENSOR_MAP_SWIZZLE_64B",
                                "CU_TENSOR_MAP_SWIZZLE_32B", "CU_TENSOR_MAP_SWIZZLE_NONE"),
        CUtensorMapL2promotion=enum("CU_TENSOR_MAP_L2_PROMOTION_NONE", "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
                                    "CU_TENSOR_MAP_L2_PROMOTION_L2_128B", "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"),
        CUtensorMapInterleave=enum("CU_TENSOR_MAP_INTERLEAVE_NONE"),
        CUtensorMapFloatOOBfill=enum("CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"))
    monkeypatch.setattr(tma, "_driver", lambda: fake)
    assert len(tma.encode(spec, 1 << 20)) == tma.TENSORMAP_BYTES
    return seen[0]


def test_the_producer_loads_no_box_that_starts_past_the_edge():
    # A cluster's padding CTA (a pair's second tile past M), a multicast slice and an MN-major tile's 64-wide blocks
    # past the edge are not loaded, and a stage expects only the bytes that come (GPU: tests/test_sm90_swap.py and
    # tests/test_hopper_paths_gpu.py run pairs at M from 3 up, D poisoned; the cost: docs/perf-notes.md).
    kernel = Kernel(Arch.SM90A, ops(b="col"), hopper_config("64x48x64", "64x48x64", 12, cluster=(1, 2)))
    source = render(kernel)
    assert "if (m0 + b * A_BOX_STEP >= M) continue;" in source
    assert "if (n0 + b * B_BOX_STEP >= N) continue;" in source
    assert "if (m0 + b * A_BOX_STEP < M)" in source
    assert "mbar_arrive_expect_tx(bar, STAGE_BYTES)" not in source


def test_the_model_charges_box_rows_past_the_edge_only_where_no_edge_map_cuts_them():
    from gemmgen.families.sm90_wgmma import EDGE_FILL_RATE, Sm90Wgmma
    from gemmgen.rank.predict import predict

    family = Sm90Wgmma()
    tile = hopper_config("64x128x64", "64x128x64", 6)
    # K-major A and B, unshared: both edge boxes cut, nothing charged.
    assert family.edge_fill_s(tile, Problem.create(129, 4096, 4096, b="col"), 132) == 0.0
    # Column-major A (MN-major boxes, 64 wide): the last tile row covers 63 columns past M on each of 64 k-tiles;
    # its 32 edge tiles fit on 132 CTAs at once. Measured 10.5-13 us on H100 and H200 (docs/perf-notes.md).
    cc = Problem.create(129, 4096, 4096, a="col", b="col")
    assert family.edge_fill_s(tile, cc, 132) == pytest.approx(63 * 128 * 64 / EDGE_FILL_RATE)
    assert family.edge_fill_s(tile, cc, 16) == pytest.approx(2 * 63 * 128 * 64 / EDGE_FILL_RATE)  # two per CTA
    # A split-K slice fills its own k-tiles' rows: half as many per slice, twice the units to deal out.
    sliced = splitk_config(2, "64x128x64", "64x128x64", 6)
    assert family.edge_fill_s(sliced, cc, 132) == pytest.approx(family.edge_fill_s(tile, cc, 132) / 2)
    # Every row of the last tile past M counts, also a 64-wide block wholly past it that is no longer loaded:
    # charging only the straddling block ranked worse, 6 of 6 changed picks slower (docs/perf-notes.md).
    wide = hopper_config("128x128x64", "64x128x64", 6)
    assert family.edge_fill_s(wide, cc, 132) == pytest.approx(127 * 128 * 64 / EDGE_FILL_RATE)
    # A multicast operand is not charged (its slices were not measured apart); M a tile multiple has no edge.
    assert family.edge_fill_s(hopper_config("64x128x64", "64x128x64", 6, cluster=(1, 2)), cc, 132) == 0.0
    assert family.edge_fill_s(tile, Problem.create(192, 4096, 4096, a="col", b="col"), 132) == 0.0
    # The predicted time carries it where the loads are the bound.
    assert predict(cc, tile, H100).memory_s > predict(Problem.create(192, 4096, 4096, a="col", b="col"), tile,
                                                      H100).memory_s


def test_tensormap_specs_record_the_l2_promotion_and_encode_uses_it(monkeypatch):
    problem = Problem.create(3000, 3000, 3000, "bf16", "row", "row")
    kernel = Kernel(Arch.SM90A, problem.operands, hopper_config())
    for spec in sm90.tensormap_specs(kernel, problem):
        assert spec["l2_promotion"] == sm90.L2_PROMOTION == "128B"
        assert _encode_with_fake_driver(monkeypatch, spec) == "CU_TENSOR_MAP_L2_PROMOTION_L2_128B"
    # A manifest written before the key existed keeps the promotion it was encoded with.
    legacy = {k: v for k, v in spec.items() if k != "l2_promotion"}
    assert _encode_with_fake_driver(monkeypatch, legacy) == "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"
    assert _encode_with_fake_driver(monkeypatch, dict(legacy, l2_promotion="none")) == \
        "CU_TENSOR_MAP_L2_PROMOTION_NONE"
    with pytest.raises(InvalidInput, match="l2_promotion"):
        tma.validate_spec(dict(legacy, l2_promotion="512B"))


def test_tma_spec_with_unaligned_stride_is_refused():
    spec = {"name": "tmA", "dtype": "bf16", "dims": [4097, 1000], "strides_bytes": [4097 * 2], "box": [64, 128],
            "swizzle": "128B"}
    with pytest.raises(InvalidInput, match="16 bytes"):
        tma.validate_spec(spec)


def test_kernel_params_pack_tensormaps_by_value():
    entry = sm90.launch(Kernel(Arch.SM90A, ops(), hopper_config()), Problem.create(256, 256, 64), sm_count=132)
    values = {"tmA": bytes(range(128)), "tmB": bytes(128), "tmAe": bytes(128), "tmBe": bytes(128), "tmD": bytes(128),
              "B": 0x800, "C": 0, "D": 0x1000, "bias": 0, "workspace": 0}
    pointers, holders = tma.pack_params(entry["params"], values)
    assert len(pointers) == len(entry["params"]) == len(holders)
    assert bytes(holders[0].data) == bytes(range(128))
    assert holders[5].value == 0x800 and holders[7].value == 0x1000 and holders[10].value == 256


def test_aligned_d_leaves_through_a_tma_store_map_matching_the_template_box():
    problem = Problem.create(1000, 3000, 200)
    kernel = Kernel(Arch.SM90A, problem.operands, hopper_config())
    params = sm90.launch(kernel, problem, sm_count=132)["params"]
    tm_d = next(p for p in params if p["name"] == "tmD")
    assert [p["name"] for p in params][:5] == ["tmA", "tmB", "tmAe", "tmD", "B"]
    assert tm_d["tensor"] == "D" and tm_d["dims"] == [3000, 1000] and tm_d["strides_bytes"] == [6000]
    assert tm_d["box"] == [32, 16] and tm_d["swizzle"] == "64B"
    tma.validate_spec(tm_d)
    source = render(kernel)
    assert "TmaDesc tmD" in source and "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in source
    assert "constexpr int EPI_COLS = 32;" in source and "EPI_BOX_BYTES = 16 * EPI_COLS * 2;" in source   # the map's box


@pytest.mark.parametrize("problem,config", [
    (Problem.create(1000, 3001, 200, "bf16", "row", "col"), hopper_config()),   # ldc 3001: D rows unaligned
    (Problem.create(1024, 1024, 65536), None),                          # split-K: D comes from the reduction
])
def test_d_without_tma_store_has_no_d_map(problem, config):
    config = config or splitk_config(4)
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    assert not sm90.uses_tma_store(kernel)
    assert all(p["name"] != "tmD" for p in sm90.launch(kernel, problem, sm_count=132)["params"])
    assert "TmaDesc tmD" not in render(kernel)


def test_swizzled_tma_box_must_fit_the_swizzle_span():
    spec = {"name": "tmD", "dtype": "bf16", "dims": [64, 64], "strides_bytes": [128], "box": [64, 16],
            "swizzle": "64B"}
    with pytest.raises(InvalidInput, match="64B swizzle"):
        tma.validate_spec(spec)


# --- NVRTC and SASS -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("a,b", LAYOUTS)
def test_default_kernels_compile_to_hgmma_and_tma_without_local_memory(dtype, a, b):
    kernel = Kernel(Arch.SM90A, ops(dtype, a, b), hopper_config())
    compiled = compile_sm90(kernel)
    counts = sass_counts(compiled.cubin)
    assert count(counts, "HGMMA") > 0, "wgmma did not become HGMMA"
    assert count(counts, "UTMALDG") > 0, "cp.async.bulk.tensor did not become UTMALDG"
    assert count(counts, "UTMASTG") > 0, "the TMA-store epilogue did not become UTMASTG"
    assert count(counts, "STSM") > 0, "the store boxes are not filled with stmatrix"
    assert count(counts, "LDL") == 0 and count(counts, "STL") == 0, "local memory (spills or dynamic indexing)"
    assert compiled.resources.spill_bytes == 0


@pytest.mark.parametrize("cta,warp,stages", [("128x144x64", "64x144x64", 4), ("192x112x64", "64x112x64", 4),
                                              ("256x160x64", "128x160x64", 3)])
def test_width_tiles_compile_to_hgmma_of_their_width_without_local_memory(cta, warp, stages):
    """The `widths` space (tile N a multiple of 16, not of 64: K-major B, staged epilogue): wgmma of the tile's own N
    in the SASS, B through TMA, no local memory; a row-major (MN-major) B is read in 16- or 32-column blocks
    (tests/test_sm90_swap.py compiles and verifies those)."""
    config = hopper_config(cta, warp, stages)
    kernel = Kernel(Arch.SM90A, ops(), config)
    compiled = compile_sm90(kernel)
    from gemmgen.codegen.sass import dump_sass

    counts = sass_counts(compiled.cubin)
    assert f"HGMMA.64x{Shape3.parse(warp).n}x16.F32.BF16" in dump_sass(compiled.cubin)
    assert count(counts, "UTMALDG") > 0
    assert count(counts, "LDL") == 0 and count(counts, "STL") == 0
    assert compiled.resources.spill_bytes == 0
    problem = Problem.create(513, 4096, 4096, "bf16", "row", "row")
    assert constraints.check(config, H100, Arch.SM90A, problem) == []


def test_cluster_kernel_uses_multicast_tma():
    compiled = compile_sm90(Kernel(Arch.SM90A, ops(), hopper_config(cluster=(2, 1))))
    counts = sass_counts(compiled.cubin)
    assert any(op.startswith("UTMALDG") and "MULTICAST" in op for op in counts), sorted(counts)


@pytest.mark.slow
def test_every_config_of_the_space_compiles_or_is_rejected():
    from gemmgen.codegen.nvrtc import compile_many
    configs = all_configs("sm90_wgmma")
    valid = enumerate_space("sm90_wgmma", H100, Arch.SM90A, operands=ops())
    assert len(valid) >= 40, "the space should offer the tuner real choices"
    for config in configs:
        if config not in valid:
            assert constraints.check(config, H100, Arch.SM90A, operands=ops()), config.tag
    results = compile_many([Kernel(Arch.SM90A, ops(), c) for c in valid])
    failures = [r for r in results if isinstance(r, CompileError)]
    assert not failures, str(failures[0])
    spills = [r.name for r in results if r.spill_bytes]
    assert not spills, spills
    # ptxas' advisory C7511/C7514: a wait after every wgmma halves the tensor pipe's rate without a spill to show.
    serialized = [r.name for r in results if r.resources.wgmma_serialized or any(e.wgmma_serialized for _, e in r.entries)]
    assert not serialized, serialized


# --- split-K ----------------------------------------------------------------------------------------
def test_split_k_manifest_runs_partials_then_reduce_over_one_workspace():
    from gemmgen.runtime.manifest import make_manifest
    problem = Problem.create(1024, 1024, 65536, "bf16", "row", "row")
    kernel = Kernel(Arch.SM90A, problem.operands, splitk_config(4))
    manifest = make_manifest(kernel, problem)
    main, reduce = manifest["launches"]
    assert manifest["workspace_bytes"] == 4 * 1024 * 1024 * 4
    # 32 tiles x 4 slices = 128 units: a persistent grid of 128 CTAs, one unit each.
    assert main["entry"] == kernel.name and main["grid"] == [128, 1, 1]
    assert reduce["entry"] == f"{kernel.name}_reduce" and reduce["block"] == [sm90.REDUCE_THREADS, 1, 1]
    assert reduce["grid"] == [1024 * 512 // sm90.REDUCE_THREADS, 1, 1] and reduce["dynamic_smem"] == 0
    assert reduce["params"] == main["params"]


def test_split_k_is_feasible_for_sm90_up_to_the_k_tiles():
    config = splitk_config(8)
    assert not constraints.check(config, H100, Arch.SM90A, operands=ops())
    short_k = Problem.create(1024, 1024, 256)  # 4 K tiles of 64
    assert any("K tiles" in v.rule for v in constraints.check(config, H100, Arch.SM90A, problem=short_k))


def test_split_k_slices_cover_every_k_tile_once():
    # The template's unit_work: slice z takes K tiles [z*T/S, (z+1)*T/S).
    for tiles in (1, 4, 33, 65, 1024):
        for splits in (2, 3, 4, 8):
            bounds = [z * tiles // splits for z in range(splits + 1)]
            sizes = [b - a for a, b in zip(bounds, bounds[1:])]
            assert sum(sizes) == tiles and max(sizes) - min(sizes) <= 1
            assert min(sizes) >= 1 or splits > tiles
    source = render(Kernel(Arch.SM90A, ops(), splitk_config(4)))
    assert "(long long)w.z * k_tiles / SPLITS" in source


def test_split_k_kernel_compiles_with_reduce_entry_and_no_local_memory():
    kernel = Kernel(Arch.SM90A, ops(b="row"), splitk_config(4, "128x128x64", "64x128x64", 6))
    compiled = compile_sm90(kernel)
    assert compiled.spill_bytes == 0 and not compiled.resources.wgmma_serialized  # C7511/C7514
    counts = sass_counts(compiled.cubin)
    assert count(counts, "HGMMA") > 0 and count(counts, "LDL") == 0 and count(counts, "STL") == 0
    from gemmgen.codegen.sass import dump_sass
    assert f"{kernel.name}_reduce" in dump_sass(compiled.cubin)


# --- the epilogue -------------------------------------------------------------------------------------
def test_cluster_kernels_exit_after_the_producer_saw_every_stage_released_not_through_a_cluster_barrier():
    source = render(Kernel(Arch.SM90A, ops(), hopper_config(cluster=(2, 1))))
    # One cluster barrier, at the start (barrier initialisation must be visible before any multicast).
    assert source.count("if (CLUSTER_BARRIERS) cluster_sync();") == 1
    tail = source[source.index("if (RING_CTAS > 1 && threadIdx.x == 0)"):]
    assert "for (int i = 0; i < STAGES; ++i)" in tail[:800] and "mbar_wait(empty_bar + 8 * s, phase ^ 1);" in tail[:800]
    # The TMA-store epilogue only waits for its boxes to be read before the CTA's shared memory goes.
    assert "cp.async.bulk.wait_group.read 0;" in source and "cp.async.bulk.wait_group 0;" not in source


def test_fast_epilogue_is_rendered_by_default_and_compiles_without_spills():
    # Measured on the H100 (docs/perf-notes.md, "The short epilogue"): interior tiles with beta == 0 skip C and bounds.
    from gemmgen.codegen.nvrtc import compile_source, options_for
    kernel = Kernel(Arch.SM90A, ops(bias=True, activation="relu"), hopper_config())
    source = render(kernel)
    assert "finish_fast(" in source and "if (beta == 0.0f && m0 + wm + WM <= M && n0 + wn + WN <= N)" in source
    cubin, log = compile_source(kernel.name, source, options_for(kernel))
    assert "0 bytes spill stores" in log


def test_store_boxes_fill_the_shared_memory_the_ring_leaves():
    # 128x256 s3 leaves room for each warp's whole share (8 boxes); s4 for half of it; 128x64's share is 2.
    assert sm90_rules.epi_boxes(hopper_config(stages=3)) == 8
    assert sm90_rules.epi_boxes(hopper_config(stages=4)) == 4
    small = hopper_config(cta="128x64x64", warp="64x64x64", stages=8)
    assert sm90_rules.epi_boxes(small) == 2
    for config in enumerate_space("sm90_wgmma", H100, Arch.SM90A, operands=ops()):
        assert constraints.smem_bytes(config, ops()) <= H100.smem_per_block_optin, config.tag
        boxes = sm90_rules.epi_boxes(config, ops())
        share = config.warp.m // 64 * (config.warp.n // 32)
        assert boxes == share or (boxes % 2 == 0 and share % (boxes // 2) == 0), config.tag


def test_whole_share_epilogue_fences_once_and_streamk_runs_the_same_epilogue():
    source = render(Kernel(Arch.SM90A, ops(), hopper_config(stages=3)))
    assert "constexpr int EPI_BOXES = 8;" in source and "constexpr int EPI_COLS = 32;" in source
    # Stream-K kernels stage the whole share and take the short interior path too (since the tile origin is
    # computed after the fix-up, nothing spills: 2.3% at 4096^3, docs/perf-notes.md "Stream-K range mode").
    streamk = TileConfig.from_dict({**hopper_config(stages=4).to_dict(), "decomposition": {"kind": "streamk"}})
    sk = render(Kernel(Arch.SM90A, ops(), streamk))
    boxes = sm90_rules.epi_boxes(hopper_config(stages=4))
    assert boxes > 2 and sm90_rules.epi_boxes(streamk) == boxes
    assert f"constexpr int EPI_BOXES = {boxes};" in sk and "finish_fast(" in sk
    s3 = TileConfig.from_dict({**hopper_config(stages=3).to_dict(), "decomposition": {"kind": "streamk"}})
    assert sm90_rules.epi_boxes(s3) == sm90_rules.epi_boxes(hopper_config(stages=3)) == 8
    assert constraints.smem_bytes(s3) == constraints.smem_bytes(hopper_config(stages=3))


# --- the store warp (config.store_warp) -------------------------------------------------------------
def store_warp_config(**changes) -> TileConfig:
    from dataclasses import replace
    return replace(hopper_config(stages=3), store_warp=True, **changes)


def test_store_warp_is_named_only_when_chosen_and_round_trips():
    from gemmgen.rank.ranking import axis_values, config_from_axes
    config = store_warp_config()
    plain = hopper_config(stages=3)
    assert config.tag == plain.tag + "_sw" and not plain.tag.endswith("_sw")
    assert config.to_dict()["store_warp"] is True and "store_warp" not in plain.to_dict()   # old records unchanged
    assert TileConfig.from_dict(config.to_dict()) == config
    assert TileConfig.from_text(config.to_yaml()) == config
    assert config_from_axes("sm90_wgmma", axis_values(config)) == config
    assert config_from_axes("sm90_wgmma", axis_values(plain)) == plain
    with pytest.raises(InvalidInput):
        TileConfig.from_dict(dict(config.to_dict(), store_warp="yes"))


@pytest.mark.parametrize("changes,operands,rule", [
    ({"schedule": "pingpong"}, None, "a store warp serves the cooperative schedule"),
    ({"decomposition": "splitk"}, None, "a store warp serves data-parallel tiles"),
    ({"decomposition": "streamk"}, None, "a store warp serves data-parallel tiles"),
    ({}, "unaligned_c", "a store warp issues TMA stores"),
])
def test_store_warp_rejects_what_the_template_does_not_implement(changes, operands, rule):
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    from gemmgen.families.sm90_wgmma.config import Schedule
    config = store_warp_config()
    if changes.get("schedule"):
        config = replace(config, schedule=Schedule.PINGPONG, cta=Shape3(128, 128, 64), warp=Shape3(128, 128, 64),
                         mma=Shape3(64, 128, 16))
    if changes.get("decomposition") == "splitk":
        config = replace(config, decomposition=Decomposition(DecompKind.SPLIT_K, 2))
    if changes.get("decomposition") == "streamk":
        config = replace(config, decomposition=Decomposition(DecompKind.STREAM_K, 1))
    operand_set = ops()
    if operands == "unaligned_c":
        operand_set = Problem.create(4096, 4097, 4096, "bf16", "row", "col").operands   # N = 4097: ldc not 16 B
    violations = constraints.check(config, H100, Arch.SM90A, operands=operand_set)
    assert any(rule in v.rule for v in violations), [v.rule for v in violations]


def test_store_warp_is_accepted_for_cooperative_data_parallel_tiles_and_rejected_for_sm80():
    assert constraints.check(store_warp_config(), H100, Arch.SM90A, operands=ops()) == []
    with pytest.raises(InvalidInput, match="family sm80_mma has no knob store_warp"):
        TileConfig.from_dict({"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16",
                              "stages": 3, "store_warp": True})


def test_store_warp_renders_the_store_loop_in_the_producer_warpgroup_and_hands_boxes_over():
    kernel = Kernel(Arch.SM90A, ops(), store_warp_config())
    source = render(kernel)
    assert "constexpr bool STORE_WARP = true;" in source
    assert "else if (threadIdx.x / 32 == 1) {" in source                       # the producer's warp 1
    assert "const int box_half = epi_g % EPI_HALVES;" in source                 # the store warp's count picks
    assert "mbar_arrive_local(store_bar + 8 * box_half);" in source              # the half; consumers hand it over
    plain = render(Kernel(Arch.SM90A, ops(), hopper_config(stages=3)))
    assert "constexpr bool STORE_WARP = false;" in plain and "store_bar" not in plain
    # The lab switch on a kernel the store warp does not serve is a compile-time error, never a silent kernel.
    pingpong = TileConfig.from_dict({"family": "sm90_wgmma", "cta": "128x128x64", "warp": "128x128x64",
                                     "mma": "64x128x16", "stages": 6, "warp_specialized": True, "persistent": True,
                                     "schedule": "pingpong"})
    assert "#error" in render_lab(Kernel(Arch.SM90A, ops(), pingpong), epi_store_warp=True)


@pytest.mark.parametrize("stages,cluster", [(3, (2, 1)), (4, (1, 1))])
def test_store_warp_kernel_stores_through_tma_without_local_memory(stages, cluster):
    # s3: the warp's whole share of boxes in one group; s4: two halves alternating (EPI_HALVES == 2).
    config = store_warp_config(stages=stages, cluster=Cluster(*cluster))
    assert sm90_rules.epi_boxes(config, ops()) == (8 if stages == 3 else 4)
    compiled = compile_sm90(Kernel(Arch.SM90A, ops(), config))
    counts = sass_counts(compiled.cubin)
    assert count(counts, "HGMMA") > 0 and count(counts, "UTMALDG") > 0 and count(counts, "UTMASTG") > 0
    assert count(counts, "LDL") == 0 and count(counts, "STL") == 0
    assert compiled.resources.spill_bytes == 0


def test_model_exposes_less_epilogue_with_a_store_warp():
    from gemmgen.families.sm90_wgmma import STORE_WARP_EXPOSED
    from gemmgen.rank.predict import predict
    problem = Problem.create(4096, 4096, 4096)
    with_sw, without = predict(problem, store_warp_config(), H100), predict(problem, hopper_config(stages=3), H100)
    assert 0 < STORE_WARP_EXPOSED < 1
    assert with_sw.overhead_s < without.overhead_s and with_sw.compute_s == without.compute_s


def test_space_offers_store_warp_variants_of_the_large_cooperative_tiles():
    valid = enumerate_space("sm90_wgmma", H100, Arch.SM90A, operands=ops())
    sw = [c for c in valid if c.store_warp]
    assert sw and {str(c.cta) for c in sw} == {"128x256x64", "256x128x64"}
    assert all(c.schedule.value == "cooperative" and c.decomposition.kind.value == "dp" for c in sw)
