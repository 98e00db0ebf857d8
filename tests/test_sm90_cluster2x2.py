"""2x2 clusters on sm90: A multicast along each cluster row, B along each cluster column, each CTA's ring freed by
the three CTAs that write into it (docs/perf-notes.md, "2x2 clusters"). Rules, tensor-map slices and SASS on the
CPU; on the GPU, results at shapes that are not tile or cluster multiples against an fp32 reference on fresh
inputs with D poisoned (NaN) first. Tolerance 1e-2 (bf16 output rounding ~2e-3)."""
from __future__ import annotations

import pytest

from gemmgen.families.rules import check
from gemmgen.families.sm90_wgmma import launch as sm90_launch
from gemmgen.model.arch import Arch
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Kernel, TileConfig

from sm90_helpers import H100, clean_tma_sass, ops

TILE = {"family": "sm90_wgmma", "cta": "128x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 4,
        "warp_specialized": True, "persistent": True, "cluster": "2x2"}


def test_a_2x2_cluster_passes_the_rules_and_4_ctas_in_a_line_do_not():
    problem = Problem.create(2088, 2800, 1224, "bf16", "row", "col")
    assert not check(TileConfig.from_dict(TILE), H100, problem=problem)
    for line in ("4x1", "1x4"):
        broken = check(TileConfig.from_dict({**TILE, "cluster": line}), H100, problem=problem)
        assert any("cluster must be" in str(v) for v in broken)


def test_a_2x2_cluster_splits_each_operand_in_two_slices_not_four():
    # A is shared by a cluster row (2 CTAs) and B by a column (2 CTAs): 64-row boxes of each 128-row tile.
    problem = Problem.create(2088, 2800, 1224, "bf16", "row", "col")
    kernel = Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict(TILE))
    tm_a, tm_b = sm90_launch.tensormap_specs(kernel, problem)
    assert tm_a["box"] == [64, 64] and tm_b["box"] == [64, 64]


def test_a_persistent_2x2_grid_built_without_a_gpu_holds_no_more_clusters_than_the_gpcs_can():
    # Regression: the fallback (no cuOccupancyMaxActiveClusters) was SMs / cluster size, 33 clusters of 4 on an H100
    # SXM's 132 SMs; its 8 GPCs of at most 18 SMs hold at most 4 clusters of 4 each, so the 33rd cluster of a
    # multi-wave product waited for another's whole tile loop in any launch of the exported grid as is.
    problem = Problem.create(4096, 4096, 4096, "bf16", "row", "col")   # 256 cluster tiles: many waves
    kernel = Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict(TILE))
    assert sm90_launch.launch(kernel, problem, sm_count=132)["grid"] == [128, 1, 1]   # 32 clusters
    assert sm90_launch.launch(kernel, problem, sm_count=114)["grid"] == [112, 1, 1]   # H100 PCIe: 28
    assert sm90_launch.launch(kernel, problem, sm_count=132, max_clusters=30)["grid"] == [120, 1, 1]   # the driver's
    pair = Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict({**TILE, "cluster": "2x1"}))
    assert sm90_launch.launch(pair, problem, sm_count=132)["grid"] == [132, 1, 1]   # a pair fits a TPC: 66


def test_the_rule_for_64_row_tiles_over_m_names_the_2x2_cluster_it_refuses():
    # Regression: the refusal read "a 2x1 cluster of 64-row tiles serves M up to 128" for a 2x2 cluster.
    narrow = {**TILE, "cta": "64x128x64", "warp": "64x128x64"}
    broken = check(TileConfig.from_dict(narrow), H100, problem=Problem.create(300, 3000, 2000, "bf16", "row", "col"))
    rules = [v.rule for v in broken if "64-row tiles" in v.rule]
    assert rules and all(r.startswith("a 2x2 cluster of 64-row tiles serves M up to 128") for r in rules), broken
    assert not check(TileConfig.from_dict(narrow), H100, problem=Problem.create(100, 3000, 2000, "bf16", "row", "col"))


def test_a_row_major_b_needs_whole_64_column_blocks_per_cluster_column_slice():
    problem = Problem.create(2088, 2800, 1224, "bf16", "row", "row")
    assert not check(TileConfig.from_dict(TILE), H100, problem=problem)   # 128 columns: two 64-wide slices
    narrow = {**TILE, "cta": "128x64x64", "warp": "64x64x64", "mma": "64x64x16"}
    broken = check(TileConfig.from_dict(narrow), H100, problem=problem)
    assert any("64-wide slices" in str(v) for v in broken)


@pytest.mark.parametrize("a,b", [("row", "col"), ("row", "row"), ("col", "col")])
def test_a_2x2_cluster_multicasts_both_operands_with_no_spills(a, b):
    sass = clean_tma_sass(Kernel(Arch.SM90A, ops(a=a, b=b), TileConfig.from_dict(TILE)))
    assert "HGMMA.64x128x16.F32.BF16" in sass and ".MULTICAST" in sass


@pytest.mark.gpu
@pytest.mark.parametrize("a,b", [("row", "col"), ("row", "row"), ("col", "col"), ("col", "row")])
@pytest.mark.parametrize("shape", [(2088, 2800, 1224), (1000, 333, 2000), (4096, 4096, 4096)])
def test_a_2x2_cluster_matches_the_fp32_reference_off_cluster_multiples(a, b, shape):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU with torch")
    from test_hopper_paths_gpu import bias_relu_error

    m, n, k = shape   # 1000 x 333: 8 x 3 tiles, so the last cluster column holds one tile column past N
    if b == "row" and n % 8:
        n += 8 - n % 8   # row-major B rows of 16-byte multiples keep it on the TMA path (no pack)
    assert bias_relu_error(m, n, k, a, b, dict(TILE)) < 1e-2


# The knobs a 2x2 cluster can be combined with through --config (the space lists it plain): each must stay correct.
KNOBS = {"splitk2": {"decomposition": {"kind": "splitk", "splits": 2}},
         "store_warp": {"store_warp": True},
         "pingpong": {"warp": "128x128x64", "schedule": "pingpong"},
         "swap": {"swap_ab": True}}


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_the_rules_take_a_2x2_cluster_with_each_knob(knob):
    m = 200 if knob == "swap" else 1000
    problem = Problem.create(m, 3000, 2000, "bf16", "row", "col")
    assert not check(TileConfig.from_dict({**TILE, **KNOBS[knob]}), H100, problem=problem)


@pytest.mark.gpu
@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_a_2x2_cluster_with_each_knob_matches_the_fp32_reference(knob):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU with torch")
    from test_hopper_paths_gpu import load, operand, rel_error

    m, n, k = (200 if knob == "swap" else 1000), 3000, 2000
    gemm = load(Problem.create(m, n, k, "bf16", "row", "col", beta=0.5), {**TILE, **KNOBS[knob]})
    for mm, nn, kk in ((m, n, k), (m - 37, n - 8, k + 64)):   # a second shape the kernel serves
        A, B = operand(mm, kk, "row"), operand(kk, nn, "col")
        C = torch.randn(mm, nn, device="cuda").to(torch.bfloat16)
        D = torch.full((mm, nn), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(A, B, D, C=C)
        torch.cuda.synchronize()
        assert rel_error(D, A.float() @ B.float() + 0.5 * C.float()) < 1e-2
