"""128x64 tiles in 1x2 and 2x1 clusters (search space n64): where rows of A and B cross 128-byte lines a TMA box row
takes two lines, and a pair's multicast halves the shared operand's requests (docs/perf-notes.md, "Mid-size products
where cuBLAS leads": 1000^3 rc ran 10.3 us on 128x64 1x1 and 8.2 in a 1x2 pair, cuBLAS 8.4). Space, rules, SASS and
the model's picks on the CPU; on the GPU, results at shapes that are not tile or cluster multiples against an fp32
reference on fresh inputs with D poisoned (NaN) first. Tolerance 1e-2 (bf16 output rounding ~2e-3)."""
from __future__ import annotations

import pytest

from gemmgen.families.rules import check
from gemmgen.model.arch import Arch
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Kernel, TileConfig
from gemmgen.rank.space import default_config, enumerate_space

from sm90_helpers import H100, clean_tma_sass, ops

TILE = {"family": "sm90_wgmma", "cta": "128x64x64", "warp": "64x64x64", "mma": "64x64x16", "stages": 6,
        "warp_specialized": True, "persistent": True, "raster": {"order": "row", "group": 8}}
CLUSTERS = ("1x2", "2x1")
# (cluster, A layout, B layout) the rules take: a 2x1 pair multicasts B in 64-column slices per CTA, which an N-major
# (row-major) B tile of 64 columns cannot be cut into (test_a_2x1_pair_refuses_an_n_major_b below).
CASES = [(c, a, b) for c in CLUSTERS for a in ("row", "col") for b in ("row", "col") if not (c == "2x1" and b == "row")]


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_the_space_offers_128x64_tiles_in_pairs_and_the_rules_take_them(cluster):
    problem = Problem.create(1000, 1000, 1000, "bf16", "row", "col")
    config = TileConfig.from_dict({**TILE, "cluster": cluster})
    assert not check(config, H100, problem=problem)
    assert config in enumerate_space("sm90_wgmma", H100, problem=problem)


def test_a_2x1_pair_refuses_an_n_major_b():
    broken = check(TileConfig.from_dict({**TILE, "cluster": "2x1"}), H100,
                   problem=Problem.create(1000, 1000, 1000, "bf16", "row", "row"))
    assert any("64-wide slices" in str(v) for v in broken)


@pytest.mark.parametrize("cluster,a,b", [("1x2", "row", "col"), ("1x2", "col", "row"), ("2x1", "row", "col")])
def test_a_128x64_pair_multicasts_with_no_spills(cluster, a, b):
    sass = clean_tma_sass(Kernel(Arch.SM90A, ops(a=a, b=b), TileConfig.from_dict({**TILE, "cluster": cluster})))
    assert "HGMMA.64x64x16.F32.BF16" in sass and ".MULTICAST" in sass


def test_the_model_takes_the_1x2_pair_where_it_measured_faster():
    # H100, 2026-11-28 (lab-data/h100-sxm/m28-20261128-0340/n64-moved.txt): 1440x563x4696 cr, rows of A (M-major,
    # 2880 bytes) and B (N-major, 1126 bytes) across 128-byte lines: the 1x2 pair ran 33.4 us where the model's
    # previous pick, a 64x128 split-K tile, ran 39.6 (cuBLAS 79.9).
    config = default_config(Problem.create(1440, 563, 4696, "bf16", "col", "row"), H100)
    assert (config.cta.m, config.cta.n, config.cluster.m, config.cluster.n) == (128, 64, 1, 2), config.tag


@pytest.mark.gpu
@pytest.mark.parametrize("cluster,a,b", CASES)
@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (999, 1096, 1000), (240, 536, 1132)])
def test_a_128x64_pair_matches_the_fp32_reference_off_tile_and_cluster_multiples(cluster, a, b, shape):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU with torch")
    from test_hopper_paths_gpu import bias_relu_error

    m, n, k = shape   # 999 x 1096: 8 x 18 tiles (the last tile row 103 rows past M, a cluster column past N at 1x2)
    if a == "col" and m % 8:
        m += 8 - m % 8   # M-major A rows of 16-byte multiples stay on the TMA path (no pack)
    if b == "row" and n % 8:
        n += 8 - n % 8
    assert bias_relu_error(m, n, k, a, b, {**TILE, "cluster": cluster}) < 1e-2
