"""Property tests (hypothesis) for the tile model and the one feasibility check.

Every configuration check() accepts has consistent derived quantities (threads, shared memory,
registers, occupancy) and a finite prediction; every one it rejects names each rule it breaks;
configurations round-trip through dict, YAML and JSON; kernel names are deterministic and unique.
"""
from __future__ import annotations

import math
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemmgen.model.arch import Arch, DType, catalogue
from gemmgen.families.rules import check, ctas_per_sm, regs_allocated, regs_estimate, smem_bytes, validate
from gemmgen.model.errors import InvalidConfig, Violation
from gemmgen.calc.intensity import predict
from gemmgen.model.problem import Layout, Operands, Problem
from gemmgen.model.tiles import (Cluster, DecompKind, Decomposition, Family, Kernel, Raster, RasterOrder, Shape3,
                           SmemLayout, TileConfig)

GPUS = sorted(catalogue().values(), key=lambda g: g.key)
POW2 = [8, 16, 32, 64, 128, 256]
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def configs(draw):
    """Configurations near the feasible region: tiles nest by construction most of the time."""
    family = draw(st.sampled_from(list(Family)))
    if family is Family.SM90_WGMMA:
        mma = Shape3(64, draw(st.sampled_from([64, 128, 256, 96])), 16)
        warp = Shape3(draw(st.sampled_from([64, 128])), mma.n, draw(st.sampled_from([64, 32])))
    else:
        mma = draw(st.sampled_from([Shape3(16, 8, 16), Shape3(16, 8, 8)]))
        warp = Shape3(draw(st.sampled_from([16, 32, 64, 128])), draw(st.sampled_from([16, 32, 64, 128])),
                      draw(st.sampled_from([16, 32, 64])))
    cta = Shape3(warp.m * draw(st.sampled_from([1, 2, 4])), warp.n * draw(st.sampled_from([1, 2, 4])),
                 draw(st.sampled_from([warp.k, warp.k, 2 * warp.k])))
    kind = draw(st.sampled_from(list(DecompKind)))
    splits = draw(st.sampled_from([1, 2, 4, 16, 32])) if kind is DecompKind.SPLIT_K else draw(st.sampled_from([1, 1, 2]))
    return TileConfig(
        family=family, cta=cta, warp=warp, mma=mma, stages=draw(st.integers(1, 9)),
        smem_layout=draw(st.sampled_from(list(SmemLayout))),
        raster=Raster(draw(st.sampled_from(list(RasterOrder))), draw(st.sampled_from([1, 2, 3, 4, 8, 16]))),
        decomposition=Decomposition(kind, splits),
        cluster=Cluster(draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 1, 2]))),
        warp_specialized=draw(st.booleans()) if family is Family.SM80_MMA else draw(st.sampled_from([True, True, False])),
        persistent=draw(st.booleans()))


@st.composite
def feasible_leaning(draw):
    """Configurations drawn from each family's legal values, so many pass the check."""
    family = draw(st.sampled_from(list(Family)))
    if family is Family.SM90_WGMMA:
        n = draw(st.sampled_from([64, 128, 256]))
        warp = Shape3(64, n, 64)
        cta = Shape3(64 * draw(st.sampled_from([1, 2])), n, 64)
        cluster = draw(st.sampled_from([Cluster(1, 1), Cluster(2, 1), Cluster(1, 2)]))
        return TileConfig(family, cta, warp, Shape3(64, n, 16), draw(st.integers(2, 8)),
                          raster=Raster(draw(st.sampled_from(list(RasterOrder))), draw(st.sampled_from([1, 2, 4, 8]))),
                          cluster=cluster, warp_specialized=True, persistent=draw(st.booleans()))
    warp = Shape3(draw(st.sampled_from([16, 32, 64])), draw(st.sampled_from([16, 32, 64])),
                  draw(st.sampled_from([16, 32, 64])))
    cta = Shape3(warp.m * draw(st.sampled_from([1, 2, 4])), warp.n * draw(st.sampled_from([1, 2, 4])), warp.k)
    split = draw(st.booleans())
    decomp = Decomposition(DecompKind.SPLIT_K, draw(st.integers(2, 16))) if split else Decomposition()
    return TileConfig(family, cta, warp, Shape3(16, 8, 16), draw(st.integers(2, 5)),
                      smem_layout=draw(st.sampled_from(list(SmemLayout))),
                      raster=Raster(draw(st.sampled_from(list(RasterOrder))), draw(st.sampled_from([1, 2, 4, 8, 16]))),
                      decomposition=decomp)


any_config = st.one_of(configs(), feasible_leaning())

operands = st.builds(Operands, a_dtype=st.sampled_from([DType.BF16, DType.F16]),
                     a_layout=st.sampled_from(list(Layout)), b_layout=st.sampled_from(list(Layout)))


@SETTINGS
@given(config=any_config, gpu=st.sampled_from(GPUS), ops=operands)
def test_accepted_configurations_have_consistent_derived_quantities(config, gpu, ops):
    ops = Operands(ops.a_dtype, ops.a_dtype, ops.a_dtype, DType.F32, ops.a_layout, ops.b_layout)
    if check(config, gpu, operands=ops):
        return
    per_unit = 128 if config.family is Family.SM90_WGMMA else 32
    producer = 128 if config.family is Family.SM90_WGMMA and config.warp_specialized else 0
    assert config.warps_m * config.warp.m == config.cta.m and config.warps_n * config.warp.n == config.cta.n
    assert config.warp.m % config.mma.m == 0 and config.warp.n % config.mma.n == 0
    assert config.cta.k % config.mma.k == 0
    assert config.threads == config.warps_m * config.warps_n * per_unit + producer
    assert 32 <= config.threads <= 1024 and config.threads % 32 == 0
    elt = ops.a_dtype.bytes
    operand_ring = config.stages * (config.cta.m + config.cta.n) * config.cta.k * elt
    assert operand_ring <= smem_bytes(config, ops) <= gpu.smem_per_block_optin
    assert regs_estimate(config) <= 255
    assert regs_allocated(config) <= gpu.regs_per_sm
    assert regs_allocated(config) >= config.math_threads * regs_estimate(config)
    resident = ctas_per_sm(config, gpu, ops)
    assert 1 <= resident <= gpu.max_ctas_per_sm
    assert resident * config.threads <= gpu.max_threads_per_sm
    assert resident * (smem_bytes(config, ops) + 1024) <= gpu.smem_per_sm
    assert validate(config, gpu, operands=ops) is config


@SETTINGS
@given(config=feasible_leaning(), gpu=st.sampled_from(GPUS), m=st.integers(1, 20000), n=st.integers(1, 20000),
       k=st.integers(1, 20000))
def test_accepted_configurations_get_a_finite_positive_prediction(config, gpu, m, n, k):
    problem = Problem.create(m, n, k, "bf16")
    if check(config, gpu, problem=problem):
        return
    pred = predict(problem, config, gpu)
    assert math.isfinite(pred.time_s) and pred.time_s > 0
    assert pred.tflops * 1e12 <= gpu.tensor_peak("bf16")
    assert pred.bound in ("compute", "memory")
    assert 0 < pred.wave_efficiency <= 1
    assert problem.min_bytes <= pred.dram_bytes + 1e-6 <= pred.tiled_bytes + 1e-3
    assert pred.executed_flops >= problem.flops


@SETTINGS
@given(config=configs(), gpu=st.sampled_from(GPUS))
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
@given(config=configs())
def test_configurations_round_trip_through_dict_yaml_and_json(config):
    assert TileConfig.from_dict(config.to_dict()) == config
    assert TileConfig.from_text(config.to_yaml()) == config
    assert TileConfig.from_text(config.to_json()) == config
    assert hash(TileConfig.from_text(config.to_yaml())) == hash(config)


@SETTINGS
@given(a=any_config, b=any_config, ops=operands, arch=st.sampled_from(list(Arch)))
def test_kernel_names_are_deterministic_unique_c_identifiers(a, b, ops, arch):
    name = Kernel(arch, ops, a).name
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
    assert name == Kernel(arch, ops, TileConfig.from_dict(a.to_dict())).name
    if a != b:
        assert Kernel(arch, ops, b).name != name


@SETTINGS
@given(ops_a=operands, ops_b=operands, config=configs())
def test_kernel_names_differ_when_operands_differ(ops_a, ops_b, config):
    if ops_a != ops_b:
        assert Kernel(Arch.SM80, ops_a, config).name != Kernel(Arch.SM80, ops_b, config).name


def test_the_strategy_reaches_accepted_configurations_of_both_families():
    """Guards the property tests above against vacuity: each family has accepted draws."""
    found = set()

    # Derandomized and long enough to be deterministic: an sm90 draw passes only on the 3 Hopper GPUs of the
    # catalogue (about 1 draw in 60), so 200 random examples missed it about 3% of the time on a fresh database.
    @settings(max_examples=1500, deadline=None, derandomize=True, database=None)
    @given(config=any_config, gpu=st.sampled_from(GPUS))
    def collect(config, gpu):
        if not check(config, gpu):
            found.add(config.family)

    collect()
    assert found == set(Family)
