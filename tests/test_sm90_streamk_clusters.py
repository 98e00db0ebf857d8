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


# The other inputs and outputs the rules take through cluster Stream-K: fp8 (tensor and per-row/column scales),
# tf32, an fp32 D with beta and C, and operands whose rows are off 16-byte boundaries (packed first). Each at a
# K-slice shape and a range-mode shape (2x1 on 66 resident pairs: 16 and 48 cluster tiles).
FP8_WIDE = {**BASE, "cta": "128x256x128", "warp": "64x256x128", "mma": "64x256x32", "stages": 4, "cluster": "2x1"}
TF32_WIDE = {**BASE, "cta": "128x256x32", "warp": "64x256x32", "mma": "64x256x8", "stages": 4, "cluster": "2x1"}
TWO_MODES = [(1000, 1000, 4096), (2900, 1000, 1024)]


@pytest.mark.slow
@pytest.mark.parametrize("knobs,dtype,scaling", [(FP8_WIDE, "e4m3", "rowcol"), (TF32_WIDE, "f32", "tensor")])
def test_fp8_and_tf32_streamk_in_a_pair_compile_without_spills(knobs, dtype, scaling):
    # No search space offers Stream-K for fp8 or tf32 (they run as --config); with per-tensor scales the fp8 128x256
    # tile in a pair spills 16-56 bytes (NVRTC 13, 2026-11-28: correct, slower), with per-row/column scales it does not.
    operands = Problem.create(1000, 1000, 4096, dtype, "row", "col", bias=True, scaling=scaling).operands
    sass = clean_tma_sass(Kernel(Arch.SM90A, operands, TileConfig.from_dict(knobs)))
    assert ".MULTICAST" in sass and ("E4M3" in sass if dtype == "e4m3" else "TF32" in sass)


def _gpu_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU with torch")
    return torch


@pytest.mark.gpu
@pytest.mark.parametrize("scaling", ["tensor", "rowcol"])
def test_fp8_streamk_in_a_pair_matches_the_fp64_reference(scaling):
    torch = _gpu_torch()
    from test_hopper_paths_gpu import TOLERANCE, load, rel_error, rowwise_fp8

    m0, n0, k0 = TWO_MODES[0]
    gemm = load(Problem.create(m0, n0, k0, "e4m3", "row", "col", bias=True, scaling=scaling), FP8_WIDE)
    for m, n, k in TWO_MODES:
        if scaling == "tensor":   # one scale a tensor, as device scalars
            a, bt = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
            sa, sb = (a.abs().max() / 200).reshape(()), (bt.abs().max() / 200).reshape(())
            A, Bt = (a / sa).to(torch.float8_e4m3fn), (bt / sb).to(torch.float8_e4m3fn)
        else:                     # a scale per row of A and per column of B
            A, sa = rowwise_fp8(m, k)
            Bt, sb = rowwise_fp8(n, k)
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(A, Bt.t(), D, bias=bias, scale_a=sa, scale_b=sb)
        torch.cuda.synchronize()
        if scaling == "tensor":
            ref = (A.double() @ Bt.t().double()) * float(sa * sb) + bias.double()
        else:
            ref = (A.double() @ Bt.t().double()) * sa.double()[:, None] * sb.double()[None, :] + bias.double()
        assert rel_error(D, ref) < TOLERANCE, (scaling, m, n, k)


@pytest.mark.gpu
def test_tf32_and_fp32_output_streamk_in_a_pair_match_the_fp64_reference():
    torch = _gpu_torch()
    from test_hopper_paths_gpu import load, rel_error

    m0, n0, k0 = TWO_MODES[0]
    tf32 = load(Problem.create(m0, n0, k0, "f32", "row", "col", beta=0.5, bias=True), TF32_WIDE)
    f32_out = load(Problem.create(m0, n0, k0, "bf16", "row", "col", c_dtype="f32", beta=0.5, bias=True),
                   {**WIDE, "cluster": "2x1"})
    for m, n, k in TWO_MODES:
        for gemm, dtype, tolerance in ((tf32, torch.float32, 5e-3), (f32_out, torch.bfloat16, 1e-5)):
            A, B = torch.randn(m, k, device="cuda").to(dtype), torch.randn(n, k, device="cuda").to(dtype).t()
            C, bias = torch.randn(m, n, device="cuda"), torch.randn(n, device="cuda")
            D = torch.full((m, n), float("nan"), device="cuda")
            gemm(A, B, D, C=C, bias=bias)
            torch.cuda.synchronize()
            ref = A.double() @ B.double() + 0.5 * C.double() + bias.double()
            assert rel_error(D, ref) < tolerance, (dtype, m, n, k)


@pytest.mark.gpu
@pytest.mark.parametrize("a,b", [("row", "row"), ("col", "col")])
def test_streamk_in_2x2_clusters_on_packed_operands_matches_the_fp32_reference(a, b):
    _gpu_torch()
    from test_hopper_paths_gpu import bias_relu_error

    # Every leading dimension odd: A and B packed into the workspace behind the partial slots, D stored element by
    # element. On 32 resident 2x2 clusters: 2501 x 1499, 20 x 12 tiles, 60 cluster tiles (a wave, then 28 in range
    # mode); 2501 x 999, 40 (a wave, then 8 cut into K slices); 1001 x 999, 16 (K slices only).
    for m, n, k in ((2501, 1499, 1001), (2501, 999, 1001), (1001, 999, 3001)):
        assert bias_relu_error(m, n, k, a, b, {**SQUARE, "cluster": "2x2"}) < 1e-2, (m, n, k)
