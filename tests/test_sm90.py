"""The sm90_wgmma family on the CPU: rendering, NVRTC for sm_90a, SASS, TMA specs and feasibility.

GPU correctness: benchmarks/space_check.py and the gpu-marked tests; the timing lab that was here is at
ac47e8f:scripts/hopper_lab.py (figures in docs/perf-notes.md).
"""
from __future__ import annotations

import pytest

from gemmgen.families import rules as constraints

from gemmgen.runtime import tma
from gemmgen.tune import utility
from gemmgen.model.arch import Arch, DType, lookup_gpu
from gemmgen.model.errors import CompileError, InvalidInput
from gemmgen.families.sm90_wgmma import context as sm90_context
from gemmgen.families.sm90_wgmma import launch as sm90
from gemmgen.families.sm90_wgmma import rules as sm90_rules
from gemmgen.model.problem import Activation, Layout, Operands, Problem
from gemmgen.codegen.render import render
from gemmgen.rank.space import all_configs, enumerate_space
from gemmgen.families.sm80_mma.config import Sm80Config
from gemmgen.families.sm90_wgmma.config import Sm90Config
from gemmgen.model.tiles import Cluster, Kernel, Raster, RasterOrder, Shape3, TileConfig

H100 = lookup_gpu("h100")
LAYOUTS = [("row", "col"), ("row", "row"), ("col", "col"), ("col", "row")]


def hopper_config(cta="128x256x64", warp="64x256x64", stages=4, cluster=(1, 1), persistent=True) -> TileConfig:
    w = Shape3.parse(warp)
    return Sm90Config(Shape3.parse(cta), w, Shape3(64, w.n, 16), stages,
                      raster=Raster(RasterOrder.ROW, 8), cluster=Cluster(*cluster), warp_specialized=True,
                      persistent=persistent)


def ops(dtype="bf16", a="row", b="col", bias=False, activation="none") -> Operands:
    dt = DType.parse(dtype)
    return Operands(dt, dt, dt, DType.F32, Layout(a), Layout(b), 8, 8, 8, bias, Activation(activation))


def compile_sm90(kernel: Kernel):
    from gemmgen.codegen.nvrtc import compile_kernel
    return compile_kernel(kernel)


def sass_counts(cubin: bytes):
    from gemmgen.codegen.sass import dump_sass, instruction_counts
    return instruction_counts(dump_sass(cubin))


def render_lab(kernel: Kernel, **switches) -> str:
    """The sm90 template rendered with template parameters overridden (a store warp where none is served)."""
    from gemmgen.codegen.render import environment
    from gemmgen import families
    family = families.of(kernel.config)
    return environment(str(family.template_root)).get_template(family.template).render(
        **dict(sm90_context.context(kernel), **switches))


def count(counts, prefix: str) -> int:
    return sum(n for op, n in counts.items() if op == prefix or op.startswith(prefix + "."))


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
    assert any("1x2 cluster" in v.rule for v in constraints.check(worse, H100, Arch.SM90A))


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
    assert names == ["tmA", "tmB", "tmD", "B", "C", "D", "bias", "workspace", "M", "N", "K", "lda", "ldb", "ldc", "ldd",
                     "alpha", "beta"]


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
    values = {"tmA": bytes(range(128)), "tmB": bytes(128), "tmD": bytes(128), "B": 0x800, "C": 0, "D": 0x1000,
              "bias": 0, "workspace": 0}
    pointers, holders = tma.pack_params(entry["params"], values)
    assert len(pointers) == len(entry["params"]) == len(holders)
    assert bytes(holders[0].data) == bytes(range(128))
    assert holders[3].value == 0x800 and holders[5].value == 0x1000 and holders[8].value == 256


def test_aligned_d_leaves_through_a_tma_store_map_matching_the_template_box():
    problem = Problem.create(1000, 3000, 200)
    kernel = Kernel(Arch.SM90A, problem.operands, hopper_config())
    params = sm90.launch(kernel, problem, sm_count=132)["params"]
    tm_d = next(p for p in params if p["name"] == "tmD")
    assert [p["name"] for p in params][:4] == ["tmA", "tmB", "tmD", "B"]
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
def splitk_config(splits: int, cta="128x256x64", warp="64x256x64", stages=4) -> TileConfig:
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    return replace(hopper_config(cta, warp, stages), decomposition=Decomposition(DecompKind.SPLIT_K, splits))


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


# --- ping-pong schedule -------------------------------------------------------------------------------
def pingpong_config(cta="128x128x64", stages=6, **changes) -> TileConfig:
    from dataclasses import replace
    from gemmgen.families.sm90_wgmma.config import Schedule
    return replace(hopper_config(cta, cta, stages), schedule=Schedule.PINGPONG, **changes)


def test_pingpong_is_named_only_when_chosen_and_round_trips():
    cooperative = hopper_config()
    assert "_pp" not in cooperative.tag and not cooperative.tag.endswith("pp")
    assert cooperative.to_dict()["schedule"] == "cooperative"
    config = pingpong_config()
    assert config.tag == cooperative.tag.replace("cta128x256x64_w64x256x64_mma64x256x16_s4",
                                                 "cta128x128x64_w128x128x64_mma64x128x16_s6") + "_pp"
    assert TileConfig.from_dict(config.to_dict()) == config
    assert TileConfig.from_text(config.to_yaml()) == config
    legacy = cooperative.to_dict()
    del legacy["schedule"]  # records written before the field read as cooperative
    assert TileConfig.from_dict(legacy) == cooperative


def test_pingpong_runs_two_consumer_warpgroups_over_one_warpgroup_tile():
    config = pingpong_config()
    assert config.warps_m * config.warps_n == 1 and config.threads == 384
    assert constraints.check(config, H100, Arch.SM90A, operands=ops()) == []
    # Two warpgroups' epilogue staging, as the cooperative 128x256 (8 consumer warps).
    # Six 32 KB stages leave each of the 8 consumer warps 4 store boxes (4 KB) of its 8-box share.
    assert sm90_rules.epi_boxes(config, ops()) == 4
    assert constraints.smem_bytes(config, ops()) == 6 * 32768 + 8 * 4 * sm90_rules.EPI_BOX_BYTES + 2048
    params = sm90_context.context(Kernel(Arch.SM90A, ops(), config))
    assert params["pingpong"] and params["consumers"] == 2 and params["setmaxnreg"]
    entry = sm90.launch(Kernel(Arch.SM90A, ops(), config), Problem.create(4096, 4096, 4096), sm_count=132)
    assert entry["block"] == [384, 1, 1] and entry["grid"] == [132, 1, 1]


@pytest.mark.parametrize("changes,rule", [
    ({"warp": Shape3(64, 128, 64)}, "warpgroup tile must equal the CTA tile"),
    ({"persistent": False}, "ping-pong needs the persistent tile loop"),
])
def test_pingpong_rejects_what_the_template_does_not_implement(changes, rule):
    config = pingpong_config(**changes)
    assert any(rule in v.rule for v in constraints.check(config, H100, Arch.SM90A, operands=ops()))


@pytest.mark.parametrize("cluster", [Cluster(2, 1), Cluster(1, 2)])
def test_pingpong_with_a_cluster_multicasts_and_releases_each_stage_to_both_ctas(cluster):
    # Verified on the H100 2026-11-23 (35/35 checks, docs/perf-notes.md "Ping-pong with clusters"); slower
    # than the cooperative winners there, so the search space does not offer it.
    config = pingpong_config(cluster=cluster)
    assert constraints.check(config, H100, Arch.SM90A, operands=ops()) == []
    kernel = Kernel(Arch.SM90A, ops(), config)
    source = render(kernel)
    assert "mbar_init(empty_bar + 8 * s, 4 * RING_CTAS);" in source
    assert f"CL_M = {cluster.m}, CL_N = {cluster.n}" in source
    compiled = compile_sm90(kernel)
    counts = sass_counts(compiled.cubin)
    assert count(counts, "UTMALDG") > 0 and count(counts, "LDL") == 0 and count(counts, "STL") == 0
    assert compiled.resources.spill_bytes == 0


def test_pingpong_rejects_split_k_and_the_sm80_family():
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    from gemmgen.families.sm90_wgmma.config import Schedule
    split = pingpong_config(decomposition=Decomposition(DecompKind.SPLIT_K, 2))
    assert any("data-parallel" in v.rule for v in constraints.check(split, H100, Arch.SM90A, operands=ops()))
    # The schedule is an sm90 knob: an sm80 configuration cannot even carry it.
    sm80 = {"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16", "stages": 3}
    with pytest.raises(InvalidInput, match="family sm80_mma has no knob schedule"):
        TileConfig.from_dict(dict(sm80, schedule="pingpong"))
    assert not constraints.check(TileConfig.from_dict(dict(sm80, schedule="cooperative")), H100)


def test_pingpong_render_orders_mainloops_with_named_barriers():
    source = render(Kernel(Arch.SM90A, ops(), pingpong_config()))
    assert "bar.sync %0, %1;" in source and "bar.arrive %0, %1;" in source
    assert "mbar_init(empty_bar + 8 * s, 4 * RING_CTAS);" in source  # one warpgroup releases each stage
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in source
    cooperative = render(Kernel(Arch.SM90A, ops(), hopper_config()))
    assert "named_bar" not in cooperative and "CONSUMERS * 4 * RING_CTAS" in cooperative


def test_pingpong_space_configs_survive_the_tuner_encoding():
    from gemmgen.rank.ranking import SearchSpace
    valid = enumerate_space("sm90_wgmma", H100, Arch.SM90A, operands=ops())
    pingpong = [c for c in valid if c.schedule.value == "pingpong"]
    assert pingpong, "the space should offer ping-pong tiles"
    space = SearchSpace(valid, lambda c: constraints.check(c, H100, Arch.SM90A, operands=ops()))
    for config in pingpong + valid[:5]:
        assert space.decode(space.params(config)) == config


@pytest.mark.parametrize("cta,stages,dtype,a,b", [
    ("128x128x64", 6, "bf16", "row", "col"), ("128x128x64", 4, "f16", "col", "row"),
    ("64x256x64", 5, "bf16", "row", "row"), ("64x256x64", 5, "f16", "col", "col")])
def test_pingpong_compiles_to_hgmma_and_tma_without_local_memory(cta, stages, dtype, a, b):
    compiled = compile_sm90(Kernel(Arch.SM90A, ops(dtype, a, b), pingpong_config(cta, stages)))
    counts = sass_counts(compiled.cubin)
    assert count(counts, "HGMMA") > 0 and count(counts, "UTMALDG") > 0
    assert count(counts, "LDL") == 0 and count(counts, "STL") == 0 and compiled.resources.spill_bytes == 0
    assert count(counts, "BAR") >= 2, "the mainloop turn barriers (bar.sync / bar.arrive) are missing"


# --- Stream-K (data-parallel waves + K-split remainder, fixed up in-kernel) ------------------------------
def streamk_config(cta="128x256x64", warp="64x256x64", stages=4, **changes) -> TileConfig:
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    return replace(hopper_config(cta, warp, stages), decomposition=Decomposition(DecompKind.STREAM_K), **changes)


def range_begin(c: int, rem: int, k_tiles: int, grid: int) -> int:
    r = rem * k_tiles
    q = r // grid
    return c * q + min(c, r - q * grid)


def walk(tiles: int, grid: int, k_tiles: int):
    """Python transcription of the template's Stream-K Walk: every CTA's units as (tile, z, kt0, kcount)."""
    rem = tiles % grid
    slices = 1 if rem == 0 else min(grid // rem, k_tiles, 16)
    if slices == 1:
        if rem > 0 and k_tiles >= 2:
            slices = -(rem * k_tiles // grid)   # range mode: -q
        else:
            rem = 0
    dp = tiles - rem
    per_cta = []
    for g in range(grid):
        units, u = [], g
        while u < dp:
            units.append((u, 0, 0, k_tiles))
            u += grid
        if slices < 0:
            # The template's next(), state for state: u = dp + cursor, + R while a tail is pending, INT_MAX when done.
            total, end = rem * k_tiles, range_begin(g + 1, rem, k_tiles, grid)
            u = dp + range_begin(g, rem, k_tiles, grid)
            for _ in range(4):
                it = u - dp
                tail = it >= total
                if tail:
                    it -= total
                if it >= end:
                    break
                tr = it // k_tiles
                boundary = (tr + 1) * k_tiles
                kt0 = it - tr * k_tiles
                if not tail and kt0 > 0 and boundary < end:
                    t, kt0, kc = dp + tr + 1, 0, end - boundary
                    u = dp + total + it
                else:
                    t, kc = dp + tr, min(boundary, end) - it
                    u = 2**31 - 1
                units.append((t, int(kt0 + kc < k_tiles), kt0, kc))
            else:
                raise AssertionError(f"CTA {g}'s range walk does not end")
        else:
            while u < dp + rem * slices:
                v = u - dp
                z = v // rem
                kt0 = z * k_tiles // slices
                units.append((dp + v - z * rem, z, kt0, (z + 1) * k_tiles // slices - kt0))
                u += grid
        per_cta.append(units)
    return per_cta, dp, rem, slices


def range_contributors(g: int, t: int, dp: int, rem: int, k_tiles: int, grid: int) -> "list[int]":
    """The template's owner loop: the CTAs before g whose ranges end inside remainder tile t."""
    tile_start = (t - dp) * k_tiles
    lo = g
    while lo > 0 and range_begin(lo, rem, k_tiles, grid) > tile_start:
        lo -= 1
    return list(range(lo, g))


@pytest.mark.parametrize("tiles,grid,k_tiles", [(288, 132, 47), (64, 132, 16), (32, 132, 1024), (132, 132, 16),
                                                (1, 132, 1), (3584, 132, 64), (8192, 132, 64), (20, 132, 3),
                                                (512, 132, 64), (2048, 132, 128), (768, 132, 64), (131, 132, 2),
                                                (100, 132, 5), (67, 132, 1), (1000, 132, 7)])
def test_streamk_walk_covers_every_k_tile_of_every_tile_once_and_each_cta_owes_at_most_one_partial(
        tiles, grid, k_tiles):
    per_cta, dp, rem, slices = walk(tiles, grid, k_tiles)
    covered = {}
    for units in per_cta:
        # At most one remainder partial handed over per CTA (its slot and flag), and in range mode it comes
        # first, before the CTA's own owner piece (so no CTA waits before it has signalled); a range's pieces
        # start at K tile 0 or end at its tile's last, so concurrent CTAs stay near one K offset.
        partials = [i for i, (t, z, _, _) in enumerate(units) if t >= dp and z > 0]
        assert len(partials) <= 1
        if slices >= 0:
            assert sum(1 for t, z, _, _ in units if t >= dp) <= 1  # one remainder unit per CTA
        else:
            pieces = [u for u in units if u[0] >= dp]
            assert len(pieces) <= 2
            if partials:
                assert partials[0] == next(i for i, (t, _, _, _) in enumerate(units) if t >= dp)
            if len(pieces) == 2:
                assert pieces[0][2] == 0 and pieces[1][2] + pieces[1][3] == k_tiles
        for t, z, kt0, kc in units:
            assert kc >= 1
            for kt in range(kt0, kt0 + kc):
                covered[(t, kt)] = covered.get((t, kt), 0) + 1
    assert covered == {(t, kt): 1 for t in range(tiles) for kt in range(k_tiles)}
    if slices < 0:
        # Every piece without its tile's last K tile is added by exactly that tile's owner (the CTA holding
        # it), found by the owner loop the template runs.
        owner = {t: g for g, units in enumerate(per_cta) for t, z, kt0, kc in units if t >= dp and kt0 + kc == k_tiles}
        added = {g: t for t in owner for g in range_contributors(owner[t], t, dp, rem, k_tiles, grid)}
        handed = {g: t for g, units in enumerate(per_cta) for t, z, _, _ in units if t >= dp and z > 0}
        assert added == handed
    # The host's grid and the model's slice count agree with the kernel's.
    assert slices <= 16 and (rem == 0 or slices < 0 or rem * slices <= grid)


def test_streamk_manifest_sizes_flags_and_partials_and_zeroes_the_flags_once():
    from gemmgen.runtime.manifest import make_manifest
    problem = Problem.create(3000, 3000, 3000, "bf16", "row", "row")
    kernel = Kernel(Arch.SM90A, problem.operands, streamk_config())
    manifest = make_manifest(kernel, problem)
    (main,) = manifest["launches"]
    assert main["grid"] == [132, 1, 1] and main["cluster"] == [1, 1, 1]
    assert manifest["workspace_bytes"] == 192 * 4 + 132 * 128 * 256 * 4   # 132 flags padded to 192, one tile each
    assert manifest["workspace_zero"] == {"bytes": 192 * 4, "when": "bind"}
    assert sm90.streamk_slices(kernel, problem, 132) == (264, 5)   # 288 tiles: 2 waves + 24 tiles x 5 slices
    # 4096^3: 512 tiles, the last wave 116 of 132: range mode over every CTA.
    big = Problem.create(4096, 4096, 4096, "bf16", "row", "row")
    assert sm90.streamk_slices(kernel, big, 132) == (396, 0)
    assert make_manifest(kernel, big)["launches"][0]["grid"] == [132, 1, 1]
    # Fewer tiles than SMs: the grid is still every SM, the tiles cut into slices.
    small = Problem.create(1024, 1024, 1024, "bf16", "row", "row")
    k128 = Kernel(Arch.SM90A, small.operands, streamk_config("128x128x64", "64x128x64"))
    assert make_manifest(k128, small)["launches"][0]["grid"] == [128, 1, 1]   # 64 tiles x 2 slices
    assert sm90.streamk_slices(k128, small, 128) == (0, 2)


def test_split_k_and_dp_manifests_say_their_workspace_needs_no_zeroing_but_sm80_split_k_does():
    from gemmgen.runtime.manifest import make_manifest, workspace_zero
    problem = Problem.create(1024, 1024, 65536, "bf16", "row", "row")
    split = make_manifest(Kernel(Arch.SM90A, problem.operands, splitk_config(4)), problem)
    assert split["workspace_zero"] == {"bytes": 0, "when": "run"}
    sm80 = TileConfig.from_dict({"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16",
                                 "stages": 3, "decomposition": {"kind": "splitk", "splits": 4}})
    m80 = make_manifest(Kernel(Arch.SM80, problem.operands, sm80), problem)
    assert m80["workspace_zero"] == {"bytes": m80["workspace_bytes"], "when": "run"}
    # A manifest from before the key existed keeps format 1's contract: all of it, before every run.
    assert workspace_zero({"workspace_bytes": 64}) == {"bytes": 64, "when": "run"}
    with pytest.raises(InvalidInput):
        workspace_zero({"workspace_bytes": 64, "workspace_zero": {"bytes": 8, "when": "sometimes"}})


@pytest.mark.parametrize("changes,rule", [
    ({"persistent": False}, "Stream-K needs the persistent tile loop"),
    ({"cluster": Cluster(2, 1)}, "Stream-K is implemented without clusters"),
])
def test_streamk_rejects_what_the_template_does_not_implement(changes, rule):
    config = streamk_config(**changes)
    assert any(rule in v.rule for v in constraints.check(config, H100, Arch.SM90A, operands=ops()))
    assert not constraints.check(streamk_config(), H100, Arch.SM90A, operands=ops())


def test_streamk_kernel_compiles_without_local_memory_and_renders_the_fixup():
    kernel = Kernel(Arch.SM90A, ops(b="row"), streamk_config())
    source = render(kernel)
    assert "struct Walk {\n    int u, rem, slices;" in source and "sk_wait(flags + v + z * walk.rem, leader)" in source
    assert "sk_wait(flags + c, leader)" in source and "sk_range_begin(blockIdx.x + 1" in source   # range mode
    assert "ld.acquire.gpu.global.u32" in source and "fence.acq_rel.gpu;" in source
    assert "sk_wait" not in render(Kernel(Arch.SM90A, ops(), hopper_config()))
    compiled = compile_sm90(kernel)
    assert compiled.spill_bytes == 0 and "C7514" not in compiled.log
    counts = sass_counts(compiled.cubin)
    assert count(counts, "HGMMA") > 0 and count(counts, "UTMALDG") > 0
    assert count(counts, "LDL") == 0 and count(counts, "STL") == 0


@pytest.mark.slow
def test_streamk_tiles_compile_without_spills_in_every_layout_and_epilogue():
    # Range mode and the short epilogue left the consumers' registers on a knife edge (docs/perf-notes.md,
    # "Stream-K range mode"): every Stream-K tile of the space, all four layouts, plain and bias+GELU epilogues,
    # D through TMA stores. (With plain stores of D, ldc not a multiple of 8, 256x128 and 64x256 spill 8-24 bytes
    # with bias: a known limitation, listed in the README.)
    from gemmgen.codegen.nvrtc import compile_many
    tiles = [("128x256x64", "64x256x64", 3), ("128x256x64", "64x256x64", 4), ("256x128x64", "128x128x64", 4),
             ("128x128x64", "64x128x64", 4), ("128x128x64", "64x128x64", 6)]
    kernels = [Kernel(Arch.SM90A, ops(dtype, a, b, bias, act), streamk_config(cta, warp, stages))
               for cta, warp, stages in tiles for a in ("row", "col") for b in ("row", "col")
               for dtype, bias, act in (("bf16", False, "none"), ("f16", True, "gelu"))]
    results = compile_many(kernels)
    failures = [r for r in results if isinstance(r, CompileError)]
    assert not failures, str(failures[0])
    assert not [r.name for r in results if r.spill_bytes or r.resources.wgmma_serialized or "C7514" in r.log]


def test_model_prices_streamk_by_its_remainder_slices():
    from gemmgen.rank.predict import predict
    odd = Problem.create(3000, 3000, 3000, "bf16", "row", "row")
    sk, dp = predict(odd, streamk_config(), H100), predict(odd, hopper_config(), H100)
    assert sk.wave_efficiency > 0.95 > dp.wave_efficiency   # 2 waves + 1/5 of one vs 3 waves for 2.18
    assert sk.time_s < dp.time_s
    # A last wave more than half full (116 of 132 tiles at 4096^3) runs in range mode: the wave takes 57 of the
    # tile's 64 K iterations, and the model charges the partials' trip through L2.
    square = Problem.create(4096, 4096, 4096, "bf16", "row", "row")
    sk, dp = predict(square, streamk_config(), H100), predict(square, hopper_config(), H100)
    assert dp.wave_efficiency == pytest.approx(512 / 528)
    assert sk.wave_efficiency == pytest.approx((512 / 132) / (3 + 57 / 64))
    assert sk.dram_bytes > dp.dram_bytes


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


# --- fused split-K (the reduction inside the GEMM launch) ---------------------------------------------
def fused_config(splits: int, cta="64x128x64", warp="64x128x64", stages=6) -> TileConfig:
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    return replace(hopper_config(cta, warp, stages), decomposition=Decomposition(DecompKind.SPLIT_K, splits, True))


def test_fused_split_k_is_named_round_trips_and_leaves_unfused_records_unchanged():
    from gemmgen.rank.ranking import axis_values, config_from_axes
    fused = fused_config(8)
    assert fused.decomposition.tag == "splitk8f" and "_splitk8f_" in fused.tag
    assert fused.to_dict()["decomposition"] == {"kind": "splitk", "splits": 8, "fused": True}
    assert TileConfig.from_dict(fused.to_dict()) == fused
    assert config_from_axes("sm90_wgmma", axis_values(fused)) == fused
    plain = splitk_config(8)
    assert plain.to_dict()["decomposition"] == {"kind": "splitk", "splits": 8}   # as before the field existed
    assert plain.decomposition.tag == "splitk8"
    with pytest.raises(InvalidInput):
        TileConfig.from_dict(dict(fused.to_dict(), decomposition={"kind": "splitk", "splits": 8, "fused": "yes"}))


def test_fused_reduction_is_a_split_k_option_of_the_sm90_family_only():
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    assert not constraints.check(fused_config(8), H100, Arch.SM90A, operands=ops())
    dp = replace(hopper_config(), decomposition=Decomposition(DecompKind.DATA_PARALLEL, 1, True))
    assert any("a fused reduction is a split-K option" in v.rule
               for v in constraints.check(dp, H100, Arch.SM90A, operands=ops()))
    sm80 = TileConfig.from_dict({"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16",
                                 "stages": 3, "decomposition": {"kind": "splitk", "splits": 4, "fused": True}})
    assert any("family sm80_mma has no fused split-K reduction" in v.rule
               for v in constraints.check(sm80, H100, Arch.SM90A, operands=ops()))


def test_fused_split_k_manifest_is_one_launch_with_counters_zeroed_once_then_partials():
    from gemmgen.runtime.manifest import make_manifest
    problem = Problem.create(16, 4096, 4096, "bf16", "row", "row")
    kernel = Kernel(Arch.SM90A, problem.operands, fused_config(8))
    manifest = make_manifest(kernel, problem)
    (main,) = manifest["launches"]
    # 1 x 32 tiles of 64x128: 32 counters padded to 64 words, then 8 slices of 16 x 4096 fp32 partials.
    assert manifest["workspace_bytes"] == 64 * 4 + 8 * 16 * 4096 * 4
    assert manifest["workspace_zero"] == {"bytes": 64 * 4, "when": "bind"}
    assert main["grid"] == [132, 1, 1]                       # 256 units on the persistent grid
    assert sm90.fused_counter_words(kernel, problem) == 64


def test_fused_split_k_renders_the_arrival_and_no_reduce_entry_and_compiles_without_local_memory():
    kernel = Kernel(Arch.SM90A, ops(b="row"), fused_config(4, "128x256x64", "64x256x64", 4))
    source = render(kernel)
    assert "atom.add.acq_rel.gpu.global.u32" in source and "fused_reduce_tile(partials" in source
    assert "_reduce(" not in source.replace("fused_reduce_tile(", "")
    assert "atom.add" not in render(Kernel(Arch.SM90A, ops(b="row"), splitk_config(4)))
    compiled = compile_sm90(kernel)
    assert compiled.spill_bytes == 0 and "C7514" not in compiled.log
    counts = sass_counts(compiled.cubin)
    assert count(counts, "HGMMA") > 0 and count(counts, "LDL") == 0 and count(counts, "STL") == 0
    assert count(counts, "ATOMG") + count(counts, "RED") > 0


def test_the_model_prices_fused_split_k_above_the_reduction_launch_where_it_measured_slower():
    from gemmgen.rank.predict import predict
    problem = Problem.create(16, 4096, 4096, "bf16", "row", "row")
    fused = predict(problem, fused_config(8), H100)
    plain = predict(problem, splitk_config(8, "64x128x64", "64x128x64", 6), H100)
    # Fitted to the H100: one SM reducing each tile cost more than the second launch saved (1.10x at 16x4096x4096).
    assert fused.time_s > plain.time_s


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,a,b,dtype,splits", [
    (16, 4096, 4096, "row", "row", "bf16", 8),
    (1000, 1096, 3000, "col", "row", "f16", 4),
    (65, 201, 1104, "row", "col", "bf16", 16),
])
def test_fused_split_k_gives_the_separate_reductions_bits_and_leaves_its_counters_zero(m, n, k, a, b, dtype, splits):
    """Same inputs through split-K with the reduction launch and with the fused reduction, three runs each
    (the counters must come back to zero between runs): bitwise the same D, finite, and close to float64."""
    import numpy as np
    from gemmgen.runtime import device
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.codegen.nvrtc import compile_kernel

    problem = Problem.create(m, n, k, dtype, a, b)
    sizes = {"A": m * k, "B": k * n, "D": m * n}
    outs = []
    with device.Device() as dev:
        bufs = {name: dev.alloc(count * 2) for name, count in sizes.items()}
        utility.fill_uniform(dev, bufs["A"], dtype, sizes["A"], seed=21)
        utility.fill_uniform(dev, bufs["B"], dtype, sizes["B"], seed=22)
        for fused in (False, True):
            from dataclasses import replace
            config = fused_config(splits)
            config = replace(config, decomposition=replace(config.decomposition, fused=fused))
            kernel = Kernel(Arch.SM90A, problem.operands, config)
            manifest = make_manifest(kernel, problem)
            module = dev.load(compile_kernel(kernel).cubin)
            workspace = dev.alloc(manifest["workspace_bytes"])
            dev.poison(workspace, "f32")                      # binding zeroes the counters, nothing else
            seq = dev.prepare(manifest, module, {name: buf.ptr for name, buf in bufs.items()}, workspace)
            runs = []
            for _ in range(3):
                dev.poison(bufs["D"], dtype)
                seq.run(0)
                dev.synchronize(kernel.name)
                runs.append(dev.copy_to_host(bufs["D"], np.uint16, sizes["D"]))
            if fused:
                words = sm90.fused_counter_words(kernel, problem)
                assert not dev.copy_to_host(workspace, np.uint32, words).any()   # every counter reset
            assert all(np.array_equal(runs[0], r) for r in runs[1:])
            outs.append(runs[0])
            dev.free(workspace)
            dev.unload(module)
        raw = {name: dev.copy_to_host(buf, np.uint16, sizes[name]) for name, buf in bufs.items()}
        for buf in bufs.values():
            dev.free(buf)
    assert np.array_equal(outs[0], outs[1])
    to64 = lambda name: device.to_float32(raw[name], dtype).astype(np.float64)
    av = to64("A").reshape(m, k) if a == "row" else to64("A").reshape(k, m).T
    bv = to64("B").reshape(k, n) if b == "row" else to64("B").reshape(n, k).T
    got = device.to_float32(outs[1], dtype).reshape(m, n)
    ref = av @ bv
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2


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
    assert "mbar_arrive_local(store_bar + 8 * (epi_g % EPI_HALVES));" in source  # consumers hand boxes over
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
    ({"cluster": True}, None, "the operand swap is implemented without clusters"),
    ({}, Problem.create(64, 4096, 4096), "the operand swap serves skinny products"),
    ({}, Problem.create(16, 4096, 4096, a="col"), "sm90 tiles narrower than 64 columns need B K-major"),
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
    wide48 = replace(narrow, cta=Shape3(128, 48, 64), warp=Shape3(64, 48, 64), mma=Shape3(64, 48, 16))
    assert any("16 or 32 wide" in v.rule for v in constraints.check(wide48, H100, Arch.SM90A, operands=ops()))


def test_data_parallel_swapped_kernel_stores_d_transposed_without_tma_store_or_workspace():
    from dataclasses import replace
    from gemmgen.model.tiles import Decomposition
    problem = Problem.create(16, 4096, 4096, "bf16", "row", "row")
    kernel = Kernel(Arch.SM90A, problem.operands, replace(swap_config("64x16x64", "64x16x64", 10), decomposition=Decomposition()))
    runs, workspace, _ = sm90.manifest_launches(kernel, problem, sm_count=132)
    assert len(runs) == 1 and workspace == 0 and runs[0]["grid"] == [64, 1, 1]
    assert not any(p["name"] == "tmD" for p in runs[0]["params"])
    source = render(kernel)
    assert "D[(size_t)(col + e) * ldd + row]" in source
    compiled = compile_sm90(kernel)
    counts = sass_counts(compiled.cubin)
    assert compiled.spill_bytes == 0 and count(counts, "LDL") == 0 and count(counts, "STL") == 0


@pytest.mark.parametrize("cta,warp,stages", [("128x16x64", "64x16x64", 10), ("64x32x64", "64x32x64", 8)])
def test_swapped_kernel_compiles_to_narrow_hgmma_without_local_memory_and_reduces_transposed(cta, warp, stages):
    problem = Problem.create(16, 4096, 4096, "bf16", "row", "row")
    kernel = Kernel(Arch.SM90A, problem.operands, swap_config(cta, warp, stages))
    source = render(kernel)
    assert "workspace + (size_t)col * N + row" in source and "constexpr int EPI_CW = WN < 32 ? WN : 32;" in source
    compiled = compile_sm90(kernel)
    assert compiled.spill_bytes == 0
    from gemmgen.codegen.sass import dump_sass
    text = dump_sass(compiled.cubin)
    counts = sass_counts(compiled.cubin)
    assert f"HGMMA.64x{Shape3.parse(warp).n}x16.F32.BF16" in text and count(counts, "UTMALDG") > 0
    assert count(counts, "LDL") == 0 and count(counts, "STL") == 0


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


def test_space_offers_swapped_tiles_to_skinny_m_only_and_the_model_ranks_one_first():
    from gemmgen.rank.predict import predict
    from gemmgen.rank.space import enumerate_space
    skinny = [c for c in enumerate_space("sm90_wgmma", H100, Arch.SM90A, Problem.create(16, 4096, 4096))
              if c.swap_ab]
    assert skinny and all(c.cta.n in (16, 32, 64) for c in skinny)
    assert not [c for c in enumerate_space("sm90_wgmma", H100, Arch.SM90A, Problem.create(4096, 4096, 4096))
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
])
def test_swapped_kernels_verify_against_the_reference(problem, cta, splits):
    """Fresh random operands, D poisoned, compared with the float64 / cuBLAS reference (GpuBenchmark.verify).
    Negative splits: split-K summed in the launch (fused), transposed by the last slice."""
    n = int(cta.split("x")[1])
    config = swap_config(cta, f"64x{n}x64", 6, abs(splits), fused=splits < 0)
    result = verify_on_gpu(problem, config, seed=5)
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
