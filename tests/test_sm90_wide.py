"""The 320-wide sm90 tile (two consumer warpgroups of 64x320, each k-step an m64n256 and an m64n64 wgmma; B in two
160-row TMA boxes): its rules, its SASS, and on the GPU its results at shapes that are not tile multiples against
an fp32 reference on fresh inputs with D poisoned (NaN) first. Tolerance 1e-2 (bf16 output rounding ~2e-3)."""
from __future__ import annotations

import pytest

from gemmgen.families.sm90_wgmma import launch as sm90_launch
from gemmgen.families.rules import check
from gemmgen.model.arch import Arch
from gemmgen.model.tiles import Kernel

from sm90_helpers import H100, clean_tma_sass, hopper_config, ops

WIDE = {"family": "sm90_wgmma", "cta": "128x320x64", "warp": "64x320x64", "mma": "64x320x16", "stages": 3,
        "warp_specialized": True, "persistent": True}


def test_a_320_wide_tile_passes_the_rules_and_a_wider_one_than_384_does_not():
    assert not check(hopper_config("128x320x64", "64x320x64", 3), H100)
    bad = check(hopper_config("128x448x64", "64x448x64", 2), H100)
    assert any("wgmma N" in str(v) or "CTA tile" in str(v) for v in bad)


def test_a_row_major_b_of_five_64_column_blocks_cannot_be_multicast_by_a_pair():
    from gemmgen.model.problem import Problem
    problem = Problem.create(4096, 4096, 4096, "bf16", "row", "row")
    assert check(hopper_config("128x320x64", "64x320x64", 3, cluster=(2, 1)), H100, problem=problem)
    problem = Problem.create(4096, 4096, 4096, "bf16", "row", "col")
    assert not check(hopper_config("128x320x64", "64x320x64", 3, cluster=(2, 1)), H100, problem=problem)


@pytest.mark.parametrize("cluster,rows", [((1, 1), 160), ((2, 1), 160)])
def test_a_k_major_b_of_320_rows_loads_as_160_row_boxes(cluster, rows):
    # One TMA box spans at most 256 rows: unclustered, the tile is two boxes; a pair's slices are one box each.
    from gemmgen.model.problem import Problem
    problem = Problem.create(1000, 3000, 1000, "bf16", "row", "col")
    kernel = Kernel(Arch.SM90A, problem.operands, hopper_config("128x320x64", "64x320x64", 3, cluster=cluster))
    _, tm_b = sm90_launch.tensormap_specs(kernel, problem)
    assert tm_b["box"] == [64, rows]


@pytest.mark.parametrize("a,b,cluster", [("row", "col", (1, 1)), ("row", "col", (2, 1)), ("row", "row", (1, 1)),
                                         ("col", "col", (2, 1))])
def test_the_320_wide_tile_issues_m64n256_and_m64n64_with_no_spills(a, b, cluster):
    sass = clean_tma_sass(Kernel(Arch.SM90A, ops(a=a, b=b), hopper_config("128x320x64", "64x320x64", 3, cluster=cluster)))
    assert "HGMMA.64x256x16.F32.BF16" in sass and "HGMMA.64x64x16.F32.BF16" in sass


@pytest.mark.gpu
@pytest.mark.parametrize("a,b,cluster", [("row", "col", "1x1"), ("row", "col", "2x1"), ("row", "row", "1x1"),
                                         ("col", "col", "2x1"), ("col", "row", "1x1")])
@pytest.mark.parametrize("epilogue", ["bias_gelu", "beta", "f32_out"])
def test_the_320_wide_tile_matches_the_fp32_reference_off_tile_multiples(a, b, cluster, epilogue):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU with torch")
    from gemmgen import Problem
    from test_hopper_paths_gpu import load, operand, rel_error

    out = torch.float32 if epilogue == "f32_out" else torch.bfloat16
    kwargs = {"bias_gelu": {"bias": True, "activation": "gelu"}, "beta": {"beta": 0.5},
              "f32_out": {"c_dtype": "f32"}}[epilogue]
    m, n, k = 1000, 3000, 1000   # 8 x 9.4 tiles: the last tile column's second B box is partly past N
    gemm = load(Problem.create(m, n, k, "bf16", a, b, **kwargs), {**WIDE, "cluster": cluster})
    for mm, nn, kk in ((m, n, k), (264, 2000, 136)):   # a second shape of the same row alignment
        A, B = operand(mm, kk, a), operand(kk, nn, b)
        D = torch.full((mm, nn), float("nan"), device="cuda", dtype=out)
        ref = A.float() @ B.float()
        call = {}
        if epilogue == "bias_gelu":
            bias = torch.randn(nn, device="cuda").to(torch.bfloat16)
            call["bias"] = bias
            ref = torch.nn.functional.gelu(ref + bias.float(), approximate="tanh")
        if epilogue == "beta":
            C = torch.randn(mm, nn, device="cuda").to(torch.bfloat16)
            call["C"] = C
            ref = ref + 0.5 * C.float()
        gemm(A, B, D, **call)
        torch.cuda.synchronize()
        assert rel_error(D, ref) < 1e-2


# A 64x320 warpgroup tile stages D in 5 pairs of boxes per tile (3 stages leave room for 4 boxes a warp): an odd
# number of groups. With a store warp, the half of the staging region a group fills must follow the running count
# of groups, not the group's index in its tile, or from a CTA's second tile on the store warp stores the other
# half (wrong D at 4096^3 on the H100; one tile per CTA at 1000x3000 hid it).
def test_the_320_wide_tile_with_a_store_warp_stages_an_odd_number_of_box_groups():
    from gemmgen.families.sm90_wgmma.rules import epi_boxes
    from gemmgen.model.tiles import TileConfig
    config = TileConfig.from_dict({**WIDE, "store_warp": True})
    share, boxes = config.warp.n // 32, epi_boxes(config, ops(a="row", b="col"))
    assert (share, boxes) == (10, 4) and share // (boxes // 2) == 5


@pytest.mark.gpu
@pytest.mark.parametrize("store_warp", [False, True])
@pytest.mark.parametrize("raster", ["row", "col"])
@pytest.mark.parametrize("shape", [(1000, 3000, 1000), (4096, 4096, 4096)])
def test_the_320_wide_tile_with_a_store_warp_and_either_raster_matches_the_fp32_reference(store_warp, raster, shape):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU with torch")
    from gemmgen import Problem
    from test_hopper_paths_gpu import load, operand, rel_error

    m, n, k = shape
    config = {**WIDE, "raster": {"order": raster, "group": 8}, "store_warp": store_warp}
    gemm = load(Problem.create(m, n, k, "bf16", "row", "col"), config)
    A, B = operand(m, k, "row"), operand(k, n, "col")
    D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(A, B, D)
    torch.cuda.synchronize()
    assert rel_error(D, A.float() @ B.float()) < 1e-2


@pytest.mark.parametrize("dtype,k,mma", [("e4m3", 128, ["QGMMA.64x256x32.F32.E4M3.E4M3", "QGMMA.64x64x32.F32.E4M3.E4M3"]),
                                         ("f32", 32, ["HGMMA.64x256x8.F32.TF32", "HGMMA.64x64x8.F32.TF32"])])
def test_the_fp8_and_tf32_320_wide_tiles_issue_both_wgmma_widths_with_no_spills(dtype, k, mma):
    from gemmgen import Problem
    from gemmgen.model.tiles import TileConfig
    step = 32 // (1 if dtype == "e4m3" else 4)
    config = TileConfig.from_dict({**WIDE, "cta": f"128x320x{k}", "warp": f"64x320x{k}", "mma": f"64x320x{step}"})
    sass = clean_tma_sass(Kernel(Arch.SM90A, Problem.create(4096, 14336, 4096, dtype, "row", "col").operands, config))
    assert all(instruction in sass for instruction in mma)   # fp8 wgmma shows as QGMMA, tf32 as HGMMA


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["e4m3", "f32"])
@pytest.mark.parametrize("a,b,cluster", [("row", "col", "1x1"), ("row", "col", "2x1"), ("row", "row", "1x1")])
@pytest.mark.parametrize("shape", [(1000, 3000, 1000), (4096, 4096, 4096)])
def test_the_fp8_and_tf32_320_wide_tiles_match_the_fp32_reference(dtype, a, b, cluster, shape):
    # fp8 (per-tensor scales of 1) writes bf16 D, tf32 fp32 D; a row-major B goes through the transposing pack.
    # Tolerances: bf16 rounding of D (~2e-3) for fp8; tf32 truncation (~8e-4) for f32.
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU with torch")
    from gemmgen import Problem
    from test_hopper_paths_gpu import load, operand, rel_error

    k_tile, step = (128, 32) if dtype == "e4m3" else (32, 8)
    config = {**WIDE, "cta": f"128x320x{k_tile}", "warp": f"64x320x{k_tile}", "mma": f"64x320x{step}",
              "cluster": cluster}
    m, n, k = shape
    gemm = load(Problem.create(m, n, k, dtype, a, b), config)
    torch_dtype = torch.float8_e4m3fn if dtype == "e4m3" else torch.float32
    A, B = operand(m, k, a, torch_dtype), operand(k, n, b, torch_dtype)
    D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16 if dtype == "e4m3" else torch.float32)
    gemm(A, B, D)
    torch.cuda.synchronize()
    assert rel_error(D, A.double() @ B.double()) < (1e-2 if dtype == "e4m3" else 5e-3)
