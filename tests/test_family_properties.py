"""Properties of every feasible configuration of every family's space, on problems of several shapes: what the
launch description promises a launcher (coverage, resources, workspace), whatever the decomposition, schedule,
store warp or operand swap. Exhaustive over the spaces (a few hundred configurations), no GPU needed."""
from __future__ import annotations

import math

import pytest

from gemmgen import Arch, Kernel, Problem, TileConfig, families
from gemmgen.families.rules import ctas_per_sm, smem_bytes
from gemmgen.model.arch import lookup_gpu
from gemmgen.model.tiles import DecompKind
from gemmgen.rank.space import enumerate_space, families_for
from gemmgen.runtime.manifest import make_manifest

H100 = lookup_gpu("h100")
PROBLEMS = {
    "square": Problem.create(4096, 4096, 4096),
    "odd": Problem.create(3000, 1000, 777, "f16", "col", "col", beta=0.5, bias=True, activation="gelu"),
    "skinny": Problem.create(16, 4096, 4096, "bf16", "row", "col"),
    "deep": Problem.create(1024, 1024, 65536, "bf16", "row", "row"),
    # Leading dimensions 4093 and 3001 bf16 are not 16-byte multiples: TMA kernels pack them first.
    "misaligned": Problem.create(4095, 3001, 4093, "bf16", "row", "col", bias=True),
    # fp32 inputs (tf32) and fp8, K-major, fp32 D.
    "fp32": Problem.create(1000, 1004, 2052, "f32", "row", "col", bias=True),
    "fp8": Problem.create(2000, 1040, 784, "e4m3", "row", "col", c_dtype="f32"),
    # fp8 and tf32 stored MN-major: the pack launch transposes them into K-major copies (odd rows as well).
    "fp8-mn": Problem.create(1000, 777, 1100, "e4m3", "col", "row", b_dtype="e5m2"),
    "tf32-mn": Problem.create(333, 4099, 257, "f32", "col", "col", bias=True),
    # 3xTF32 (--math 3xtf32): the split3 kernels, in place (aligned K-major) and through the tile pack.
    "3xtf32": Problem.create(1000, 1004, 2052, "f32", "row", "col", bias=True, fp32_math="3xtf32"),
    "3xtf32-mn": Problem.create(333, 4099, 257, "f32", "col", "row", fp32_math="3xtf32"),
}


def cases():
    for label, problem in PROBLEMS.items():
        for family in families_for(H100.arch):
            for config in enumerate_space(family, H100, problem=problem):
                yield label, problem, config


CASES = list(cases())


def test_every_family_has_feasible_configurations_for_every_kind_of_problem():
    by_problem = {label: {c.family for l, _, c in CASES if l == label} for label in PROBLEMS}
    assert all(by_problem.values()), by_problem
    kinds = {c.decomposition.kind for _, _, c in CASES}
    assert kinds == {DecompKind.DATA_PARALLEL, DecompKind.SPLIT_K, DecompKind.STREAM_K}


@pytest.mark.parametrize("label,problem,config", CASES, ids=[f"{l}-{c.tag}" for l, _, c in CASES])
def test_launch_description_covers_the_work_within_the_gpu_limits(label, problem, config):
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    manifest = make_manifest(kernel, problem)
    assert TileConfig.from_dict(manifest["config"]) == config
    # Operand packs (copies TMA can read) come first; then the GEMM and its reduction, if any.
    packs = [l for l in manifest["launches"] if l["entry"] in (f"{kernel.name}_pack", f"{kernel.name}_split3")]
    launches = manifest["launches"][len(packs):]
    main = launches[0]
    assert main["entry"] == kernel.name and main["block"] == [config.threads, 1, 1]
    assert main["dynamic_smem"] <= H100.smem_per_block_optin
    assert main["dynamic_smem"] in (0, smem_bytes(config, problem.operands))
    cluster = main["cluster"][0]
    assert cluster == config.cluster.size and main["grid"][0] % cluster == 0
    ctas = math.prod(main["grid"])
    gemm = families.of(config).gemm_problem(config, problem)
    tiles = math.ceil(gemm.m / config.cta.m) * math.ceil(gemm.n / config.cta.n)
    splits = config.decomposition.splits if config.decomposition.kind is DecompKind.SPLIT_K else 1
    resident = ctas_per_sm(config, H100, problem.operands) * H100.sm_count
    if getattr(config, "persistent", False):
        # A persistent grid never exceeds what can be resident at once (Stream-K's owners spin on the others).
        assert 1 <= ctas <= resident
    else:
        assert ctas >= tiles * splits  # one CTA per tile and K slice (clusters round the tile count up)
    workspace = manifest["workspace_bytes"]
    zero = manifest["workspace_zero"]
    copies = []
    assert len(packs) <= 1   # one launch copies every misaligned operand
    for pack in packs:
        p = {q["name"]: q for q in pack["params"]}
        for z in range(pack["grid"][2]):
            elt = problem.a_dtype.bytes
            rows, cols = p[f"rows{z}"]["value"], p[f"cols{z}"]["value"]
            # fp8 and tf32 copies (the tile copy, a mode per copy): a transposed copy has a row per source column.
            transposed = bool(p[f"mode{z}"]["value"] & 1) if f"mode{z}" in p else False
            out_rows, out_cols = (cols, rows) if transposed else (rows, cols)
            # 3xTF32: the tile copy writes the copy and its small parts (two planes); the split pass of aligned
            # rows only the small parts (the operand itself is the big part).
            planes = 2 if getattr(config, "split3", False) and f"mode{z}" in p else 1
            copies.append((p[f"dst{z}"]["offset_bytes"], planes * out_rows * p[f"ld_dst{z}"]["value"] * elt))
            assert p[f"ld_dst{z}"]["value"] >= out_cols
            # The tile copy runs a CTA per 128 bytes of source columns, the row copy a thread per 16 bytes.
            per_cta = 128 // elt if f"mode{z}" in p else 256 * (16 // elt)
            assert pack["grid"][0] * per_cta >= cols
    copies.sort()
    # Copies lie after the workspace's zeroed prefix, one after another, inside the workspace.
    assert all(off >= zero["bytes"] for off, _ in copies)
    assert all(a + n <= b for (a, n), (b, _) in zip(copies, copies[1:])) and all(a + n <= workspace for a, n in copies)
    own = copies[0][0] if copies else workspace   # the GEMM's own workspace ends where the first copy begins
    assert 0 <= zero["bytes"] <= workspace and zero["when"] in ("run", "bind")
    if splits > 1:
        assert own >= splits * problem.m * problem.n * 4  # every slice's fp32 partial of D
        fused = config.decomposition.fused
        assert len(launches) == (1 if fused else 2)
        if not fused:
            assert launches[1]["entry"] == f"{kernel.name}_reduce" and launches[1]["params"] == main["params"]
    elif config.decomposition.kind is DecompKind.STREAM_K:
        assert len(launches) == 1 and own > 0 and zero["when"] == "bind"
    else:
        assert len(launches) == 1 and own == 0
    # Tensor maps are bound by the tensor they read: a swapped kernel's tmA reads the caller's B.
    # A packed operand's map reads its copy in the workspace instead.
    maps = {p["name"]: p["tensor"] for p in main["params"] if p["kind"] == "tensormap"}
    if maps:
        swapped = getattr(config, "swap_ab", False)
        sources = {p["tensor"] for l in packs for p in l["params"]
                   if p["name"].startswith("src") and int(p["name"][3:]) < l["grid"][2]}
        split3 = getattr(config, "split3", False)
        tile_copy = any(q["name"] == "mode0" for l in packs for q in l["params"])
        in_place = split3 and not tile_copy   # 3xTF32 on aligned K-major rows reads them as the big part
        for tm, tensor in (("tmA", "B" if swapped else "A"), ("tmB", "A" if swapped else "B")):
            assert maps[tm] == ("workspace" if tensor in sources and not in_place else tensor)
            if split3:   # the small parts' maps
                assert maps[tm + "2"] == "workspace"
            if tm + "e" in maps:   # the edge map reads what the main map reads, its box cut to the rows left in
                edge = next(p for p in main["params"] if p["name"] == tm + "e")   # the last box (a tile's, or a
                full = next(p for p in main["params"] if p["name"] == tm)         # multicast slice's)
                extent, tile = (gemm.m, config.cta.m) if tm == "tmA" else (gemm.n, config.cta.n)
                rows = full["box"][1]
                assert edge["tensor"] == full["tensor"] and edge["dims"] == full["dims"]
                # One box per tile or multicast slice, or two where a slice is past TMA's 256 rows (320-wide B).
                assert tile % rows == 0 and tile // rows in (1, 2, config.cluster.size)
                assert rows <= 256
                assert edge["box"] == [full["box"][0], extent - (math.ceil(extent / rows) - 1) * rows]
        packed_maps = 0 if in_place else sum(1 + (tm + "e" in maps) for tm, tensor in
                                             (("tmA", "B" if swapped else "A"), ("tmB", "A" if swapped else "B"))
                                             if tensor in sources)
        assert sum(m == "workspace" for m in maps.values()) == packed_maps + 2 * split3
    scalars = {p["name"]: p["value"] for p in main["params"] if p["kind"] == "scalar"}
    if getattr(config, "split3", False):   # three segments of K rounded up to whole k-tiles
        assert scalars["K"] == 3 * math.ceil(gemm.k / config.cta.k) * config.cta.k
    else:
        assert scalars["K"] == gemm.k
    assert (scalars["M"], scalars["N"]) == (gemm.m, gemm.n)
    assert scalars["ldc"] == problem.ldc


def test_kernel_names_are_unique_across_the_spaces():
    names = {}
    for label, problem, config in CASES:
        name = Kernel(Arch.SM90A, problem.operands, config).name
        assert names.setdefault((label, name), config) == config
