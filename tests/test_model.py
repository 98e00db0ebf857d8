"""Property tests (hypothesis) for the tile model and the one feasibility check.

Every configuration check() accepts has consistent derived quantities (threads, shared memory,
registers, occupancy) and a finite prediction; every one it rejects names each rule it breaks;
configurations round-trip through dict, YAML and JSON; kernel names are deterministic and unique.
"""
from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemmgen.model.arch import Arch, DType, catalogue
from gemmgen.families.rules import check, ctas_per_sm, regs_allocated, regs_estimate, smem_bytes, validate
from gemmgen.model.errors import InvalidConfig, InvalidInput, Violation
from gemmgen.rank.predict import predict
from gemmgen.model.problem import Layout, Operands, Problem
from gemmgen import families
from gemmgen.model.tiles import Kernel, TileConfig
from strategies import GPUS, family_names, feasible_configs, feasible_pairs, near_configs

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

operands = st.builds(Operands, a_dtype=st.sampled_from([DType.BF16, DType.F16]),
                     a_layout=st.sampled_from(list(Layout)), b_layout=st.sampled_from(list(Layout)))


@SETTINGS
@given(pair=feasible_configs(), ops=operands)
def test_accepted_configurations_have_consistent_derived_quantities(pair, ops):
    config, gpu = pair
    ops = Operands(ops.a_dtype, ops.a_dtype, ops.a_dtype, DType.F32, ops.a_layout, ops.b_layout)
    if check(config, gpu, operands=ops):
        return
    assert config.warps_m * config.warp.m == config.cta.m and config.warps_n * config.warp.n == config.cta.n
    assert config.warp.m % config.mma.m == 0 and config.warp.n % config.mma.n == 0
    assert config.cta.k % config.mma.k == 0
    assert config.math_threads % 32 == 0 and config.threads >= config.math_threads
    assert 32 <= config.threads <= 1024 and config.threads % 32 == 0
    elt = ops.a_dtype.bytes
    operand_ring = config.stages * (config.cta.m + config.cta.n) * config.cta.k * elt
    if config.family not in ("sm80_skinny", "sm80_gemv"):   # they stream B through registers: no ring in shared memory
        assert operand_ring <= smem_bytes(config, ops)
    assert smem_bytes(config, ops) <= gpu.smem_per_block_optin
    assert regs_estimate(config) <= 255
    assert regs_allocated(config) <= gpu.regs_per_sm
    assert regs_allocated(config) >= config.math_threads * regs_estimate(config)
    resident = ctas_per_sm(config, gpu, ops)
    assert 1 <= resident <= gpu.max_ctas_per_sm
    assert resident * config.threads <= gpu.max_threads_per_sm
    assert resident * (smem_bytes(config, ops) + 1024) <= gpu.smem_per_sm
    assert validate(config, gpu, operands=ops) is config


@SETTINGS
@given(pair=feasible_configs(), m=st.integers(1, 20000), n=st.integers(1, 20000), k=st.integers(1, 20000))
def test_accepted_configurations_get_a_finite_positive_prediction(pair, m, n, k):
    config, gpu = pair
    problem = Problem.create(m, n, k, "bf16")
    if check(config, gpu, problem=problem):
        return
    pred = predict(problem, config, gpu)
    assert math.isfinite(pred.time_s) and pred.time_s > 0
    assert pred.tflops * 1e12 <= gpu.tensor_peak("bf16")
    assert pred.bound in ("compute", "memory", "power")
    assert 0 < pred.wave_efficiency <= 1
    assert problem.min_bytes <= pred.dram_bytes + 1e-6 <= pred.tiled_bytes + 1e-3
    assert pred.executed_flops >= problem.flops


@SETTINGS
@given(config=near_configs(), gpu=st.sampled_from(GPUS))
def test_rejected_configurations_name_every_rule_they_break(config, gpu):
    violations = check(config, gpu)
    if not violations:
        return
    assert all(isinstance(v, Violation) and v.rule and str(v).startswith(v.rule) for v in violations)
    try:
        validate(config, gpu)
    except InvalidConfig as exc:
        text = str(exc)
        assert "\n" not in text
        assert all(v.rule in text for v in violations)
        assert exc.violations == tuple(violations)
    else:
        raise AssertionError("validate accepted a configuration check() rejects")


@SETTINGS
@given(config=near_configs())
def test_configurations_round_trip_through_dict_yaml_and_json(config):
    assert TileConfig.from_dict(config.to_dict()) == config
    assert TileConfig.from_text(config.to_yaml()) == config
    assert TileConfig.from_text(config.to_json()) == config
    assert hash(TileConfig.from_text(config.to_yaml())) == hash(config)


@SETTINGS
@given(a=near_configs(), b=near_configs(), ops=operands, arch=st.sampled_from(list(Arch)))
def test_kernel_names_are_deterministic_unique_c_identifiers(a, b, ops, arch):
    name = Kernel(arch, ops, a).name
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
    assert name == Kernel(arch, ops, TileConfig.from_dict(a.to_dict())).name
    if a != b:
        assert Kernel(arch, ops, b).name != name


@SETTINGS
@given(ops_a=operands, ops_b=operands, config=near_configs())
def test_kernel_names_differ_when_operands_differ(ops_a, ops_b, config):
    if ops_a != ops_b:
        assert Kernel(Arch.SM80, ops_a, config).name != Kernel(Arch.SM80, ops_b, config).name


def test_the_strategies_reach_accepted_configurations_of_every_family():
    """Guards the property tests above against vacuity: every family has feasible draws, and the near-boundary
    strategy lands on both sides of the check for each family."""
    accepted, rejected = set(), set()

    @settings(max_examples=400, deadline=None, derandomize=True, database=None)
    @given(config=near_configs(), gpu=st.sampled_from(GPUS))
    def collect(config, gpu):
        (rejected if check(config, gpu) else accepted).add(config.family)

    collect()
    names = set(family_names())
    assert names == {f.name for f in families.all_families()} and names
    assert all(feasible_pairs(name) for name in names)
    assert accepted == names and rejected == names


def test_sm80_mma_on_unaligned_rows_is_priced_at_its_measured_fifth_and_the_packed_hopper_kernel_ranks_first():
    """2-byte rows are copied element by element through registers: on the H100 sm80_mma ran 72-99 TFLOP/s on
    4095³ against 430-441 aligned (docs/lab-data/h100-sxm/misaligned-20261125-0406.json). Priced at the aligned
    rate, it was the model's pick for mid-size misaligned products over the packed sm90 kernel."""
    from gemmgen.families.sm80_mma import FAMILY, UNALIGNED_COMPUTE_EFFICIENCY
    from gemmgen.model.arch import lookup_gpu as gpu_of
    from gemmgen.rank.predict import predict as model
    from gemmgen.rank.ranking import rank_configs
    from gemmgen.rank.space import enumerate_space, families_for, heuristic_time

    h100 = gpu_of("h100")
    aligned = Problem.create(4096, 4096, 4096, "bf16", "row", "col")
    odd = Problem.create(4095, 4095, 4095, "bf16", "row", "col")
    # (64x32 warp tiles: 64x64 ones copying both operands in pieces under 8 bytes spill, and the rules refuse them.)
    config = TileConfig.from_dict({"family": "sm80_mma", "cta": "128x64x32", "warp": "64x32x32", "mma": "16x8x16",
                                   "stages": 4})
    ratio = model(odd, config, h100).tflops / model(aligned, config, h100).tflops
    # (aligned rows on Hopper also pay for filling each tile, HOPPER_TILE_FILL_K: the fifth is against the rest)
    ratio *= FAMILY.compute_efficiency(config, aligned, h100)
    assert UNALIGNED_COMPUTE_EFFICIENCY * 0.8 < ratio < UNALIGNED_COMPUTE_EFFICIENCY * 1.25
    mid = Problem.create(2794, 1400, 1392, "bf16", "col", "col")   # A's rows 5588 bytes apart
    best = min((r for family in families_for(h100.arch)
                for r in rank_configs(enumerate_space(family, h100, problem=mid), mid, h100, model, heuristic_time)),
               key=lambda r: r.time_s)
    assert best.config.family == "sm90_wgmma"


def test_sm80_mma_unaligned_copies_go_at_the_rate_of_the_ring_ahead_and_a_long_product_leaves_sm80_mma():
    """Element-wise copies of 2-byte rows are latency-bound: on the H100 64x64x32 tiles with 4 stages (24 KB ahead)
    ran 1.35-3.5x their price on unaligned products where 48 KB ahead ran 0.4-1.4x; at 11x3256x8063 cc the model's
    sm80_mma pick (64x64x32 split-K 8) ran 192 us against 63-67 for the swapped sm90 tiles beside it."""
    from gemmgen.families.sm80_mma import FAMILY, KMAJOR_UNALIGNED_SLOWDOWN, UNALIGNED_LOAD_EFFICIENCY
    from gemmgen.model.arch import lookup_gpu as gpu_of
    from gemmgen.rank.space import default_config

    odd = Problem.create(11, 3256, 8063, "bf16", "col", "col")   # B K-major with odd K: see the test below
    shallow = TileConfig.from_dict({"family": "sm80_mma", "cta": "64x64x32", "warp": "32x32x32", "mma": "16x8x16",
                                    "stages": 4, "decomposition": {"kind": "splitk", "splits": 8}})
    deep = TileConfig.from_dict({"family": "sm80_mma", "cta": "64x64x64", "warp": "32x32x64", "mma": "16x8x16",
                                 "stages": 4, "decomposition": {"kind": "splitk", "splits": 8}})
    assert math.isclose(FAMILY.load_efficiency(deep, odd), UNALIGNED_LOAD_EFFICIENCY / KMAJOR_UNALIGNED_SLOWDOWN)
    assert math.isclose(FAMILY.load_efficiency(shallow, odd), UNALIGNED_LOAD_EFFICIENCY / KMAJOR_UNALIGNED_SLOWDOWN / 2)
    assert FAMILY.load_efficiency(shallow, Problem.create(16, 3256, 8064, "bf16", "row", "col")) == 1.0
    # 4-byte rows (B's 6300-byte rows at 40x3150x12032 rr) are copied 4 bytes at a time: that tile ran 49.9 us there,
    # the packed sm90 pick 93.5, so only 2-byte rows pay for a shallow ring
    wide_copies = Problem.create(40, 3150, 12032, "bf16", "row", "row")
    assert FAMILY.load_efficiency(shallow, wide_copies) == UNALIGNED_LOAD_EFFICIENCY
    assert default_config(wide_copies, gpu_of("h100")).family == "sm80_mma"
    assert default_config(odd, gpu_of("h100")).family == "sm90_wgmma"


def test_sm80_mma_on_hopper_pays_for_filling_each_tile_on_short_k_loops():
    """At 6096x7808x288 rc (9 k-tiles of 32) sm80_mma's 128x128 tiles ran 1.7x their price on the H100, the sm90
    kernels beside them 0.9-1.3x; the charge is Hopper's (the family's Ampere rate was fitted there) and on aligned
    rows only."""
    from gemmgen.families.sm80_mma import (FAMILY, HOPPER_TILE_FILL_K, KMAJOR_UNALIGNED_SLOWDOWN,
                                          UNALIGNED_COMPUTE_EFFICIENCY)
    from gemmgen.model.arch import lookup_gpu as gpu_of
    from gemmgen.rank.space import default_config

    config = TileConfig.from_dict({"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16",
                                   "stages": 4})
    short = Problem.create(6096, 7808, 288, "bf16", "row", "col")
    h100, a100 = gpu_of("h100"), gpu_of("a100")
    assert math.isclose(FAMILY.compute_efficiency(config, short, h100), 1 / (1 + HOPPER_TILE_FILL_K / 288))
    assert FAMILY.compute_efficiency(config, short, a100) == 1.0
    assert FAMILY.compute_efficiency(config, short) == 1.0
    assert math.isclose(FAMILY.compute_efficiency(config, Problem.create(6096, 7808, 287, "bf16", "row", "col"), h100),
                        UNALIGNED_COMPUTE_EFFICIENCY / KMAJOR_UNALIGNED_SLOWDOWN)
    assert (FAMILY.compute_efficiency(config, Problem.create(6096, 7808, 8192, "bf16", "row", "col"), h100)
            > FAMILY.compute_efficiency(config, short, h100))
    assert default_config(short, h100).family == "sm90_wgmma"


def test_sm80_mma_on_k_major_rows_off_16_bytes_costs_more_and_long_k_products_leave_it():
    """Long k-loops over K-major rows that are not 16-byte aligned (odd K): on the H100 (2026-11-28,
    docs/lab-data/h100-sxm/m28-20261128-0340/) the model's sm80_mma picks ran 1.22-1.37x slower than the sm90 kernels
    it now picks (20x2392x6651 rc 47.5 -> 39.0 us, 48x11639x1021 cc 46.8 -> 34.1, 32x4824x11851 rc 155.6 -> 131.4);
    an N-major B with odd N is not charged, and sm80_mma stays the pick at 20x4499x6536 rr (68 against 75+ us)."""
    from gemmgen.families.sm80_mma import FAMILY, KMAJOR_UNALIGNED_SLOWDOWN, UNALIGNED_COMPUTE_EFFICIENCY
    from gemmgen.model.arch import lookup_gpu as gpu_of
    from gemmgen.rank.space import default_config

    h100 = gpu_of("h100")
    config = TileConfig.from_dict({"family": "sm80_mma", "cta": "64x64x64", "warp": "32x32x64", "mma": "16x8x16",
                                   "stages": 4})
    n_major = Problem.create(20, 4499, 6536, "bf16", "row", "row")
    assert KMAJOR_UNALIGNED_SLOWDOWN > 1
    assert FAMILY.compute_efficiency(config, n_major, h100) == UNALIGNED_COMPUTE_EFFICIENCY
    assert math.isclose(FAMILY.compute_efficiency(config, Problem.create(20, 2392, 6651, "bf16", "row", "col"), h100),
                        UNALIGNED_COMPUTE_EFFICIENCY / KMAJOR_UNALIGNED_SLOWDOWN)
    for m, n, k, a, b in ((20, 2392, 6651, "row", "col"), (48, 11639, 1021, "col", "col"),
                          (32, 4824, 11851, "row", "col")):
        assert default_config(Problem.create(m, n, k, "bf16", a, b), h100).family == "sm90_wgmma"
    assert default_config(n_major, h100).family == "sm80_mma"


def test_a_grid_of_few_hopper_ctas_streams_at_its_ctas_rate_and_a_decode_product_takes_the_swapped_tile():
    """A TMA-fed CTA streams about 48 GB/s from DRAM (H100: 16x14336x4096 with 64x256 tiles, 56 CTAs, moved 118 MB
    at 47 GB/s per CTA), so 56 CTAs cannot pull HBM's rate and 132 can; before this cap the model ranked the 64x256
    tile first there and it ran 48.9 us against the swapped 64x16 tile's 46.3 (docs/perf-notes.md)."""
    from gemmgen.families.sm90_wgmma import SM_STREAM_RATE
    from gemmgen.model.arch import lookup_gpu as gpu_of
    from gemmgen.rank.calibration import params_for
    from gemmgen.rank.ranking import rank_configs
    from gemmgen.rank.space import enumerate_space, families_for, heuristic_time

    h100 = gpu_of("h100")
    params, _ = params_for(h100)
    decode = Problem.create(16, 14336, 4096, "bf16", "row", "col")
    wide = TileConfig.from_dict({"family": "sm90_wgmma", "cta": "64x256x64", "warp": "64x256x64", "mma": "64x256x16",
                                 "stages": 4, "warp_specialized": True, "persistent": True})
    few = predict(decode, wide, h100, params)
    assert few.units == 56 and few.dram_rate <= 56 * SM_STREAM_RATE * 1.0001
    large = predict(Problem.create(8192, 8192, 8192, "bf16", "row", "col"), wide, h100, params)
    assert large.dram_rate > 56 * SM_STREAM_RATE     # a full grid is not held to it
    ranked = [r for family in families_for(h100.arch)
              for r in rank_configs(enumerate_space(family, h100, problem=decode), decode, h100,
                                    lambda p, c, g: predict(p, c, g, params), heuristic_time)]
    assert min(ranked, key=lambda r: r.time_s).config.swap_ab


@pytest.mark.parametrize("field,value", [("alpha", 1e39), ("beta", -3.5e38), ("alpha", "1e300")])
def test_alpha_and_beta_past_float32_are_refused_up_front(field, value):
    # Regression: `gemmgen compile 64 64 64 --gpu h100 --alpha 1e39` was accepted ("finite") and the kernel, which
    # takes alpha and beta as float, received inf.
    with pytest.raises(InvalidInput, match=f"{field} must be a finite number from .* float32"):
        Problem.create(64, 64, 64, **{field: value})
    assert Problem.create(64, 64, 64, **{field: 3.4e38}).to_dict()[field] == 3.4e38


@pytest.mark.parametrize("field,value", [("a_dtype", "bf16"), ("a_layout", "row"), ("scaling", "tensor")])
def test_the_problem_constructor_refuses_a_name_where_it_takes_a_model_type(field, value):
    # Regression: Problem(4096, 4096, 4096, "bf16") was accepted and failed at its first use as an AttributeError
    # ('str' object has no attribute 'bytes'); names are Problem.create's.
    with pytest.raises(InvalidInput, match=rf"Problem's {field} must be a \w+ \(Problem.create takes names"):
        Problem(64, 64, 64, **{field: value})


def test_predict_takes_a_catalogue_name_as_roofline_does():
    # Found 2026-11-28: predict(p, config, "h100") was an AttributeError ('str' object has no attribute 'arch'),
    # though roofline() and peak_per_sm() in the same README example take names.
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.rank.predict import predict
    from gemmgen.rank.space import default_config

    p = Problem.create(4096, 4096, 4096, "bf16")
    h100 = lookup_gpu("h100")
    config = default_config(p, h100)
    assert predict(p, config, "h100").time_s == predict(p, config, h100).time_s > 0
    with pytest.raises(InvalidInput, match="GPU must be one of"):
        predict(p, config, "h1000")
