"""Stream-K in thread-block clusters (search spaces streamk and streamk_n128_clusters): the walk deals cluster tiles
and K ranges to resident clusters, whose CTAs walk the same units (so they keep serving each other's multicasts), and
each CTA hands over or adds the partial of its own CTA tile through a slot and flag of its own (cluster i's CTA of rank
r uses i * CL_SIZE + r). docs/perf-notes.md, "Stream-K in clusters". CPU: space, rules, manifest, the fix-up's
rendering, SASS without spills. GPU: results in both remainder modes (K slices; K ranges over every cluster) at shapes
that are not tile or cluster multiples, with bias + ReLU, against an fp32 reference on fresh inputs with D poisoned
first. Tolerance 1e-2 (bf16 output rounding ~2e-3)."""
from __future__ import annotations

import pytest

from gemmgen.families.sm90_wgmma import launch as sm90
from gemmgen.families.rules import check
from gemmgen.model.arch import Arch
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Kernel, TileConfig
from gemmgen.rank.space import enumerate_space
from gemmgen.runtime.manifest import make_manifest

from sm90_helpers import H100, clean_tma_sass, ops

BASE = {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, "raster": {"order": "row", "group": 8},
        "decomposition": {"kind": "streamk"}}
WIDE = {**BASE, "cta": "128x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 4}
SQUARE = {**BASE, "cta": "128x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 6}
# (tile, cluster) pairs the space offers; 128x256 in 1x2 / 2x2 and 256x128 in pairs spill 8-12 bytes and are not.
OFFERED = [(WIDE, "2x1"), (SQUARE, "2x1"), (SQUARE, "1x2"), (SQUARE, "2x2")]


def config(tile: dict, cluster: str) -> TileConfig:
    return TileConfig.from_dict({**tile, "cluster": cluster})


@pytest.mark.parametrize("tile,cluster", OFFERED)
def test_the_space_offers_streamk_in_clusters_and_the_rules_take_it(tile, cluster):
    problem = Problem.create(3000, 2000, 1500, "bf16", "row", "col")
    assert not check(config(tile, cluster), H100, problem=problem)
    assert config(tile, cluster) in enumerate_space("sm90_wgmma", H100, problem=problem)


def test_the_fixup_indexes_slots_and_flags_per_cta_of_the_cluster():
    from gemmgen.codegen.render import render
    source = render(Kernel(Arch.SM90A, ops(), config(WIDE, "2x1")))
    assert "const int me = CL_SIZE > 1 ? (int)cluster_ctarank() : 0;" in source
    assert "sk_wait(flags + c * CL_SIZE + me, leader)" in source and "sk_store(acc, sk_slot(workspace, (int)blockIdx.x)" in source
    assert "sk_range_begin(blockIdx.x / CL_SIZE + 1" in source and 'static_assert(CL_SIZE == 1' not in source


def test_the_manifest_launches_resident_clusters_with_a_slot_per_cta():
    # 2900 x 1000 on 128x256 in 2x1: 23 tile rows (12 cluster rows) x 4 columns = 48 cluster tiles on 66 resident
    # pairs: range mode over every pair, 132 CTAs, one partial slot each.
    problem = Problem.create(2900, 1000, 1000, "bf16", "row", "col")
    kernel = Kernel(Arch.SM90A, problem.operands, config(WIDE, "2x1"))
    manifest = make_manifest(kernel, problem)
    (main,) = manifest["launches"]
    assert main["grid"] == [132, 1, 1] and main["cluster"] == [2, 1, 1]
    assert sm90.streamk_slices(kernel, problem, 66) == (0, 0)
    assert manifest["workspace_bytes"] == 192 * 4 + 132 * 128 * 256 * 4
    # 1000 x 1000 x 4104: 16 cluster tiles, each cut into 4 K slices: 64 pairs.
    small = Problem.create(1000, 1000, 4104, "bf16", "row", "col")
    assert sm90.streamk_slices(kernel, small, 66) == (0, 4)
    assert make_manifest(kernel, small)["launches"][0]["grid"] == [128, 1, 1]


def test_the_model_splits_the_remainder_in_cluster_units():
    from gemmgen.rank.predict import predict
    problem = Problem.create(2900, 1000, 1000, "bf16", "row", "col")
    pair, single = predict(problem, config(WIDE, "2x1"), H100), predict(problem, config(WIDE, "1x1"), H100)
    # 48 cluster tiles (96 CTA tiles, one row past M) in range mode on 66 pairs: the wave takes 48 / 66 of a tile's
    # K iterations, rounded up to whole iterations (16 K tiles); 1x1: 92 of 132 tiles, likewise.
    assert pair.wave_efficiency == pytest.approx((96 / 132) / (12 / 16))
    assert single.wave_efficiency == pytest.approx((92 / 132) / (12 / 16))


@pytest.mark.slow
@pytest.mark.parametrize("tile,cluster", OFFERED)
@pytest.mark.parametrize("a,b", [("row", "col"), ("col", "row")])
def test_streamk_in_clusters_multicasts_with_no_spills(tile, cluster, a, b):
    sass = clean_tma_sass(Kernel(Arch.SM90A, ops(a=a, b=b, bias=True, activation="gelu"), config(tile, cluster)))
    assert ".MULTICAST" in sass and "HGMMA" in sass


# Shapes per offered pair: K-slice mode (the remainder at most half the resident clusters) and range mode (more
# than half), one with full waves before it; none a multiple of the tile or the cluster.
GPU_CASES = {
    (0, "2x1"): [(1000, 1000, 4104), (2900, 1000, 1000), (4801, 1000, 776)],
    (1, "2x1"): [(1000, 500, 3000), (2500, 1000, 1000)],
    (1, "1x2"): [(1000, 500, 3000), (1000, 1280, 1000)],
    (1, "2x2"): [(1000, 500, 3000), (2500, 500, 1000), (3300, 2200, 520)],
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
@pytest.mark.parametrize("a,b", [("row", "col"), ("row", "row"), ("col", "row"), ("col", "col")])
def test_streamk_in_clusters_matches_the_fp32_reference_in_both_modes(case, a, b):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU with torch")
    from test_hopper_paths_gpu import bias_relu_error

    (tile_index, cluster), shapes = case, GPU_CASES[case]
    tile = (WIDE, SQUARE)[tile_index]
    for m, n, k in shapes:
        if a == "col" and m % 8:
            m += 8 - m % 8   # M-major A rows of 16-byte multiples stay on the TMA path (no pack)
        if b == "row" and n % 8:
            n += 8 - n % 8
        err = bias_relu_error(m, n, k, a, b, {**tile, "cluster": cluster})
        assert err < 1e-2, (m, n, k, err)
