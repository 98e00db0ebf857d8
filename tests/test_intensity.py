"""The calculator: per-level intensities (the seed note's table), the roofline and the model's predictions."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_config
from gemmgen.model.errors import InvalidConfig
from gemmgen.calc.intensity import (SEED_MMA, SEED_PEAK_PER_SM, SEED_WARP_SHAPES, cta_level, mma_level, roofline,
                                    seed_table, smem_level, warp_level)
from gemmgen.rank.predict import footprint, predict
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import RasterOrder, Shape3

# The seed note's table (../shared/seeds/003_182f5c76a6b8b523.txt), as printed there.
SEED_TABLE = [
    ("16x8x16", "4.000", "1695.000"), ("64x64x32", "10.667", "635.625"), ("32x128x32", "9.846", "688.594"),
    ("16x64x32", "7.111", "953.438"), ("16x128x32", "7.529", "900.469"), ("32x32x32", "8.000", "847.500"),
    ("64x64x64", "10.667", "635.625"), ("32x32x64", "8.000", "847.500"), ("64x32x32", "9.143", "741.562"),
]


def test_seed_table_is_reproduced_to_three_decimals_from_the_notes_inputs():
    rows = seed_table(SEED_PEAK_PER_SM, SEED_MMA, SEED_WARP_SHAPES, "f16")
    got = [(str(r.shape), f"{r.intensity:.3f}", f"{r.bytes_per_clock:.3f}") for r in rows]
    assert got == SEED_TABLE


def test_catalogue_peak_for_the_rtx3090_is_512_not_the_notes_6780(rtx3090):
    assert rtx3090.tensor_flop_per_clock_per_sm("f16") == pytest.approx(512.0)
    row = warp_level(Shape3(64, 64, 32), SEED_MMA, rtx3090.tensor_flop_per_clock_per_sm("f16"), "f16")
    assert f"{row.intensity:.3f}" == "10.667" and row.bytes_per_clock == pytest.approx(48.0)


def test_cta_level_bf16_128x256x64_needs_85_33_flop_per_byte(h100):
    level = cta_level(Shape3(128, 256, 64), "bf16", h100.tensor_flop_per_clock_per_sm("bf16"))
    assert f"{level.intensity:.2f}" == "85.33"
    assert level.bytes_per_clock == pytest.approx(4096 / 85.333, rel=1e-3)


def test_cluster_multicast_divides_each_operands_share_of_cta_traffic():
    alone = cta_level(Shape3(128, 256, 64), "bf16", 1.0)
    paired = cta_level(Shape3(128, 256, 64), "bf16", 1.0, multicast_m=2)  # B shared by the 2 CTAs along M
    assert paired.bytes == pytest.approx(alone.bytes - 256 * 64 * 2 / 2)


def test_smem_level_counts_a_and_b_fragments_and_wgmma_rereads_b_per_m64():
    assert smem_level(Shape3(64, 64, 32), "f16").intensity == pytest.approx(32.0)
    assert smem_level(Shape3(64, 256, 64), "bf16", reads="wgmma").intensity == pytest.approx(51.2)
    assert smem_level(Shape3(128, 256, 64), "bf16", reads="wgmma").intensity == pytest.approx(51.2)


def test_mma_level_counts_fragments_and_fp32_accumulators():
    assert mma_level(Shape3(16, 8, 16), "bf16").intensity == pytest.approx(4096 / 1792)


def test_wider_element_types_halve_intensity():
    assert cta_level(Shape3(128, 128, 32), "f32").intensity == pytest.approx(cta_level(Shape3(128, 128, 32), "f16").intensity / 2)


def test_8192_cubed_bf16_on_h100_is_compute_bound_and_its_kernel_power_bound(h100, hopper_big):
    problem = Problem.create(8192, 8192, 8192, "bf16")
    roof = roofline(problem, h100, predict(problem, hopper_big, h100))
    assert roof.bound == "compute"
    # Held at 700 W the clock falls below what the tensor cores could do at the datasheet clock.
    pred = roof.prediction
    assert pred.bound == "power" and pred.limiter == "power" and pred.power_s > pred.compute_s > pred.memory_s
    # A sane magnitude: between cuBLAS-like efficiency and the datasheet peak.
    assert 500 < roof.prediction.tflops < 989.4


def test_16x4096x4096_on_h100_is_memory_bound(h100):
    problem = Problem.create(16, 4096, 4096, "bf16")
    roof = roofline(problem, h100)
    assert roof.bound == "memory"
    assert roof.min_intensity == pytest.approx(problem.flops / problem.min_bytes)
    skinny = make_config("sm80_mma", "32x64x64", "16x32x64", "16x8x16", 4, decomposition={"kind": "splitk", "splits": 4})
    assert predict(problem, skinny, h100).bound == "memory"


def test_power_ceiling_is_energy_over_the_power_left_after_the_static_draw(h100, hopper_big):
    import dataclasses

    from gemmgen.rank.predict import DEFAULT_PARAMS, power_time

    p = DEFAULT_PARAMS
    joules = 1e-12 * (1e12 * p.energy_pj_per_flop + 1e9 * p.energy_pj_per_dram_byte + 2e9 * p.energy_pj_per_l2_byte)
    assert power_time(1e12, 1e9, 2e9, "bf16", h100) == pytest.approx(joules / (700.0 - p.static_power_w))
    # A FLOP's energy scales with the inputs' width: fp8 at half a 16-bit FLOP's.
    assert power_time(1e12, 0, 0, "e4m3", h100) == pytest.approx(power_time(1e12, 0, 0, "bf16", h100) / 2)
    # No ceiling where the catalogue has no power limit, or the model no energy figures.
    assert power_time(1e12, 1e9, 2e9, "bf16", dataclasses.replace(h100, power_limit_w=0.0)) == 0.0
    assert power_time(1e12, 1e9, 2e9, "bf16", h100, dataclasses.replace(p, energy_pj_per_flop=0.0)) == 0.0


def test_at_the_power_limit_a_tile_moving_more_bytes_per_flop_loses_more(h100, hopper_big):
    problem = Problem.create(8192, 8192, 8192, "bf16")
    small = make_config("sm90_wgmma", "128x128x64", "64x128x64", "64x128x16", 5,
                        warp_specialized=True, persistent=True, raster={"order": "row", "group": 8})
    big, little = predict(problem, hopper_big, h100), predict(problem, small, h100)
    assert little.tiled_bytes > big.tiled_bytes and little.power_s > big.power_s
    # A GPU without a catalogue power limit has no ceiling at all.
    import dataclasses

    unlimited = dataclasses.replace(h100, power_limit_w=0.0)
    assert predict(problem, small, unlimited).power_s == 0.0 and predict(problem, small, unlimited).bound == "compute"
    # The ceiling never binds on a product that is over in microseconds.
    tiny = Problem.create(16, 4096, 4096, "bf16")
    assert predict(tiny, small, h100).power_s < predict(tiny, small, h100).memory_s


def test_ridge_is_peak_over_bandwidth(h100):
    roof = roofline(Problem.create(4096, 4096, 4096), h100)
    assert roof.ridge == pytest.approx(989.4e12 / 3.35e12)
    assert roof.time_lower_bound_s == pytest.approx(roof.flops / roof.peak_flops)


def test_bigger_tiles_rank_better_on_large_problems(h100, hopper_big):
    problem = Problem.create(8192, 8192, 8192)
    mid = make_config("sm90_wgmma", "128x128x64", "64x128x64", "64x128x16", 4, warp_specialized=True, persistent=True)
    small = make_config("sm80_mma", "64x64x64", "32x32x64", "16x8x16", 4)
    times = [predict(problem, c, h100).time_s for c in (hopper_big, mid, small)]
    assert times == sorted(times)


def test_split_k_and_small_tiles_rank_better_on_skinny_problems(h100, hopper_big, sm80_default):
    problem = Problem.create(16, 4096, 4096)
    splitk = make_config("sm80_mma", "32x64x64", "16x32x64", "16x8x16", 4, decomposition={"kind": "splitk", "splits": 4})
    t_splitk = predict(problem, splitk, h100).time_s
    assert t_splitk < predict(problem, hopper_big, h100).time_s
    assert t_splitk < predict(problem, sm80_default, h100).time_s


def test_split_k_writes_and_reads_fp32_partials(h100):
    problem = Problem.create(256, 256, 8192)
    dp = make_config("sm80_mma", "64x64x64", "32x32x64", "16x8x16", 4)
    sk = make_config("sm80_mma", "64x64x64", "32x32x64", "16x8x16", 4, decomposition={"kind": "splitk", "splits": 4})
    a, b = predict(problem, dp, h100), predict(problem, sk, h100)
    assert b.units == 4 * a.units
    assert b.tiled_bytes - a.tiled_bytes == pytest.approx(2 * 4 * 256 * 256 * 4)


def test_tiled_traffic_rereads_a_per_column_tile_and_b_per_row_tile(h100, sm80_default):
    problem = Problem.create(1000, 3000, 512)
    pred = predict(problem, sm80_default, h100)
    a = 1000 * 512 * 2 * -(-3000 // 128)
    b = 512 * 3000 * 2 * -(-1000 // 128)
    assert pred.tiled_bytes == pytest.approx(a + b + 1000 * 3000 * 2)
    assert pred.tiles == 8 * 24
    assert pred.dram_bytes <= pred.tiled_bytes and pred.l2_saved_bytes >= 0


def test_problem_that_fits_in_l2_reads_each_operand_once(h100, sm80_default):
    problem = Problem.create(2048, 2048, 2048)  # A + B = 16 MB, within half of 50 MB
    pred = predict(problem, sm80_default, h100)
    assert pred.dram_bytes == pytest.approx(problem.min_bytes)


def test_rasterization_group_shrinks_dram_traffic_when_operands_exceed_l2(h100):
    problem = Problem.create(16384, 16384, 4096)
    plain = make_config("sm80_mma", "128x128x32", "64x64x32", "16x8x16", 4)
    grouped = make_config("sm80_mma", "128x128x32", "64x64x32", "16x8x16", 4, raster={"order": "row", "group": 8})
    assert predict(problem, grouped, h100).dram_bytes < predict(problem, plain, h100).dram_bytes


def test_wave_quantization_counts_the_partial_last_wave(h100, hopper_big):
    # 133 tiles of 128x256 on 132 SMs at one CTA per SM: two waves, the second nearly empty.
    import dataclasses

    from gemmgen.model.tiles import Cluster

    problem = Problem.create(128 * 7, 256 * 19, 4096)
    pred = predict(problem, dataclasses.replace(hopper_big, cluster=Cluster(1, 1)), h100)
    assert pred.tiles == 133 and pred.ctas_per_sm == 1
    assert pred.wave_efficiency == pytest.approx(133 / 264)
    assert pred.waves == pytest.approx(133 / 132)


def test_a_cluster_runs_whole_past_the_edge(h100, hopper_big):
    """7 tile rows in 2x1 clusters launch 4 cluster rows: the eighth tile row's CTAs run their main loops (they
    take part in the multicasts), so the work is 8 x 19 tiles, and that many FLOPs are executed. Measured on the
    H100: 192x112 tiles at 513x4096x4096 (3 tile rows) 33 us in 1x1 clusters, 61 in 2x1."""
    problem = Problem.create(128 * 7, 256 * 19, 4096)
    pred = predict(problem, hopper_big, h100)
    assert hopper_big.cluster.m == 2
    assert pred.tiles == 8 * 19
    assert pred.executed_flops == pytest.approx(2.0 * 128 * 8 * 256 * 19 * 4096)


def test_persistent_kernels_avoid_per_wave_overhead(h100, hopper_big):
    import dataclasses

    problem = Problem.create(8192, 8192, 8192)
    plain = dataclasses.replace(hopper_big, persistent=False)
    assert predict(problem, hopper_big, h100).overhead_s < predict(problem, plain, h100).overhead_s


def test_launch_overhead_is_in_every_prediction(h100, sm80_default):
    pred = predict(Problem.create(16, 16, 16), sm80_default, h100)
    assert pred.time_s >= 3e-6


def test_prediction_exposes_per_level_numbers_and_serialises(h100, hopper_big):
    pred = predict(Problem.create(4096, 4096, 4096), hopper_big, h100)
    d = pred.to_dict()
    assert [lv["level"] for lv in d["levels"]] == ["global->shared", "shared->registers", "warp (seed note)",
                                                  "registers->MMA"]
    for key in ("time_s", "tflops", "bound", "flops", "dram_bytes", "intensity", "waves", "wave_efficiency",
                "ctas_per_sm", "tiles"):
        assert key in d


def test_infeasible_config_raises_invalid_config_naming_the_rule(h100):
    problem = Problem.create(4096, 4096, 4096)
    bad = make_config("sm80_mma", "128x128x32", "64x64x32", "16x8x8", 4)
    with pytest.raises(InvalidConfig) as info:
        predict(problem, bad, h100)
    assert "mma.sync shape" in str(info.value)


@pytest.mark.parametrize("wave,order,group,expected", [
    (132, RasterOrder.ROW, 1, (3, 64)),  # 64 tiles per row: 132 tiles span 3 rows
    (132, RasterOrder.ROW, 8, (8, 17)),
    (132, RasterOrder.COL, 8, (17, 8)),
    (5, RasterOrder.ROW, 8, (5, 1)),
    (10000, RasterOrder.ROW, 1, (64, 64)),
])
def test_footprint_of_a_wave_under_rasterization(wave, order, group, expected):
    assert footprint(wave, 64, 64, order, group) == expected


def test_calculator_imports_neither_cuda_python_nor_optuna():
    code = ("import sys, gemmgen.calc.intensity, gemmgen.runtime.detect, gemmgen.cli.roofline; "
            "bad = [m for m in sys.modules if m.startswith(('cuda', 'optuna', 'matplotlib'))]; print(bad); "
            "sys.exit(1 if bad else 0)")
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_part_empty_last_wave_is_not_held_to_the_power_limit(h100):
    # Measured on the H100 (2026-11-27): at 8192x4096x4096 rc, 832 tiles of 128x320 (6.3 waves) ran 6% slower than
    # 1024 of 128x256 (7.8 waves) where the energy of the whole grid had them level; the last wave's few busy SMs
    # run at their clock, and only full waves stretch to their share of the energy.
    problem = Problem.create(8192, 4096, 4096, "bf16", "row", "col")
    wide = make_config("sm90_wgmma", "128x320x64", "64x320x64", "64x320x16", 3, warp_specialized=True,
                       persistent=True, raster={"order": "col", "group": 8})
    pair = make_config("sm90_wgmma", "128x256x64", "64x256x64", "64x256x16", 4, warp_specialized=True,
                       persistent=True, raster={"order": "row", "group": 1}, cluster="2x1")
    w, p = predict(problem, wide, h100), predict(problem, pair, h100)
    assert w.bound == "power" and w.wave_efficiency < 0.95
    assert w.power_bound_s > max(w.compute_s, w.power_s)      # the tail adds to the stretched full waves
    assert w.time_s > p.time_s                               # as measured
    # One part-empty wave never draws past the limit: the ceiling then leaves the compute time as it is.
    tiny = predict(Problem.create(16, 4096, 4096, "bf16"), wide, h100)
    assert tiny.power_bound_s == pytest.approx(tiny.compute_s)
