"""Staggered promotion (sm90_wgmma's promote_stagger), on the CPU: the rules, names and records, what the model
predicts, the rendered phases and the SASS. The GPU checks its results against a float64 reference and against
plain promotion's error (tests/test_hopper_paths_gpu.py)."""
from __future__ import annotations

import json

import pytest

from gemmgen.codegen.nvrtc import compile_kernel
from gemmgen.codegen.render import render
from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts
from gemmgen.families import rules
from gemmgen.model.arch import Arch, lookup_gpu
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Kernel, TileConfig
from gemmgen.rank.predict import predict

H100 = lookup_gpu("h100")
SQUARE = dict(cta="128x128x128", warp="64x128x128", mma="64x128x32", stages=4, persistent=True)


def sm90(**fields) -> TileConfig:
    return TileConfig.from_dict({"family": "sm90_wgmma", "warp_specialized": True, **fields})


def fp8(scaling="tensor") -> Problem:
    return Problem.create(4096, 4096, 4096, "e4m3", "row", "col", scaling=scaling)


def rule_names(config, problem=None):
    return [v.rule for v in rules.check(config, H100, problem=problem or fp8())]


def test_the_knob_is_named_recorded_and_round_trips():
    config = sm90(**SQUARE, promote=2, promote_stagger=True)
    assert config.tag.endswith("_pr2_ps") and not rule_names(config)
    assert TileConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    # Off, it leaves names and records as they were.
    plain = sm90(**SQUARE, promote=2)
    assert "promote_stagger" not in plain.to_dict() and plain.tag.endswith("_pr2")


@pytest.mark.parametrize("fields,rule", [
    (dict(SQUARE, promote=1), "staggered promotion (promote_stagger) needs an interval of 2 or more k-tiles"),
    (dict(SQUARE), "staggered promotion (promote_stagger) needs an interval of 2 or more k-tiles"),
    # Ping-pong's warpgroups take turns on whole tiles: nothing to stagger against.
    (dict(cta="64x128x128", warp="64x128x128", mma="64x128x32", stages=6, persistent=True, schedule="pingpong",
          promote=2), "staggered promotion (promote_stagger) staggers the consumer warpgroups"),
    # One consumer warpgroup.
    (dict(cta="64x128x128", warp="64x128x128", mma="64x128x32", stages=6, persistent=True, promote=2),
     "staggered promotion (promote_stagger) staggers the consumer warpgroups"),
])
def test_stagger_without_an_interval_or_a_second_warpgroup_is_refused_by_name(fields, rule):
    names = rule_names(sm90(**fields, promote_stagger=True))
    assert any(name.startswith(rule) for name in names), names


def test_the_model_prices_the_staggered_drain_below_the_plain_one():
    problem = fp8()
    plain, staggered, none = (predict(problem, sm90(**SQUARE, **knobs), H100).time_s
                              for knobs in ({"promote": 2}, {"promote": 2, "promote_stagger": True}, {}))
    assert none < staggered < plain


def test_the_warpgroups_promotion_phases_are_rendered():
    source = render(Kernel(Arch.SM90A, fp8().operands, sm90(**SQUARE, promote=4, promote_stagger=True)), H100)
    assert "const int kph = cw * 4 / CONSUMERS;" in source
    assert "if ((kt + kph + 1) % 4 == 0 || kt + 1 == kcount)" in source
    plain = render(Kernel(Arch.SM90A, fp8().operands, sm90(**SQUARE, promote=4)), H100)
    assert "kph" not in plain


def test_the_sass_keeps_the_wgmma_pipeline_and_no_spills():
    config = sm90(**SQUARE, promote=2, promote_stagger=True)
    compiled = compile_kernel(Kernel(Arch.SM90A, fp8().operands, config), H100)
    counts = instruction_counts(dump_sass(compiled.cubin))
    assert count_prefix(counts, "QGMMA") == 4 and count_prefix(counts, "HGMMA") == 0, counts
    # ptxas serializes every wgmma (C7514) when other instructions read accumulators it considers in flight.
    assert "C7514" not in compiled.log
    assert compiled.spill_bytes == 0 and count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0

