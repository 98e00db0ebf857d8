"""Pairs of 64-row tiles in 2x1 clusters (search space `skinny_clusters`): the M they serve and how the model prices
them where their second CTA has no rows (docs/perf-notes.md, "Shapes nobody chose", "Pairs of 64-row tiles over
M <= 64")."""
from __future__ import annotations

import pytest

from gemmgen.families import rules as constraints
from gemmgen.families.sm90_wgmma.config import Sm90Config
from gemmgen.model.arch import Arch
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Cluster, Kernel, Shape3
from gemmgen.rank.space import enumerate_space

from sm90_helpers import H100, hopper_config


def test_a_pair_of_64_row_tiles_sharing_b_serves_m_up_to_128_and_says_so():
    """2x1 clusters of 64-row tiles (skinny_clusters) cover every row of M <= 128; at larger M they measured slower
    than 1x1 tiles, so the rules refuse them there and the manifest states m_max."""
    from gemmgen.runtime.manifest import make_manifest

    pair = Sm90Config(Shape3(64, 128, 64), Shape3(64, 128, 64), Shape3(64, 128, 16), 6, cluster=Cluster(2, 1),
                      warp_specialized=True, persistent=True)
    for m in (1, 100, 128):
        assert constraints.check(pair, H100, Arch.SM90A, Problem.create(m, 4096, 4096, "bf16", "row", "col")) == []
    refused = constraints.check(pair, H100, Arch.SM90A, Problem.create(129, 4096, 4096, "bf16", "row", "col"))
    assert [v.rule for v in refused if "serves M up to 128" in v.rule], refused
    problem = Problem.create(100, 4096, 4096, "bf16", "row", "col")
    assert make_manifest(Kernel(Arch.SM90A, problem.operands, pair), problem)["serves"]["m_max"] == 128
    # 128-row tiles in 2x1 clusters (the large-product kernels) keep every M.
    wide = hopper_config("128x256x64", "64x256x64", cluster=(2, 1))
    assert constraints.check(wide, H100, Arch.SM90A, Problem.create(4096, 4096, 4096)) == []
    space = [c for c in enumerate_space("sm90_wgmma", H100, Arch.SM90A, Problem.create(96, 4096, 4096, "bf16",
                                                                                     "row", "col"))
             if c.cta.m == 64 and c.cluster.m == 2 and not c.swap_ab]
    assert {c.cta.n for c in space} == {96, 128, 256}


def test_a_pair_of_64_row_tiles_over_m_up_to_64_is_priced_down_but_still_serves():
    """A 2x1 pair of 64-row tiles over M <= 64 has a CTA without rows: measured 1.2-1.7x slower than the tile the
    model ranked next (docs/perf-notes.md, "Pairs of 64-row tiles over M <= 64"), so the model prices its main loop
    and loads at EMPTY_PAIR_EFFICIENCY there; the rules still accept it, so a pair tuned at M 65-128 serves any
    smaller M of its dispatch bucket."""
    from gemmgen.families import sm90_wgmma
    from gemmgen.rank.calibration import params_for
    from gemmgen.rank.ranking import rank_configs
    from gemmgen.rank.predict import predict

    pair = Sm90Config(Shape3(64, 128, 64), Shape3(64, 128, 64), Shape3(64, 128, 16), 6, cluster=Cluster(2, 1),
                      warp_specialized=True, persistent=True)
    from gemmgen.families import of
    for m, factor in ((56, sm90_wgmma.EMPTY_PAIR_EFFICIENCY), (64, sm90_wgmma.EMPTY_PAIR_EFFICIENCY), (65, 1.0)):
        problem = Problem.create(m, 544, 1096, "bf16", "col", "row")
        assert constraints.check(pair, H100, Arch.SM90A, problem) == []
        assert of(pair).compute_efficiency(pair, problem, H100) == pytest.approx(factor)
        assert of(pair).load_efficiency(pair, problem) == pytest.approx(factor)
    # The model's pick at 56x544x1096 cr (the pair before, 7.5 us on the H100) is no longer the pair.
    problem = Problem.create(56, 544, 1096, "bf16", "col", "row")
    params, _ = params_for(H100)
    space = enumerate_space("sm90_wgmma", H100, Arch.SM90A, problem)
    best = rank_configs(space, problem, H100, lambda p, c, g: predict(p, c, g, params))[0].config
    assert not (best.cta.m == 64 and best.cluster.m == 2 and not best.swap_ab)
