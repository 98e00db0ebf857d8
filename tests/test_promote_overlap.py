"""Overlapped promotion (sm90_wgmma's promote_overlap), on the CPU: the rules, names and records, what the model
predicts, and the SASS. The GPU checks it equals plain promotion bit for bit (tests/test_hopper_paths_gpu.py)."""
from __future__ import annotations

import json

import pytest

from gemmgen.codegen.nvrtc import compile_kernel
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


def test_the_knob_is_named_recorded_and_round_trips():
    config = sm90(**SQUARE, promote=2, promote_overlap=True)
    assert config.tag.endswith("_pr2_po")
    assert TileConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    # Off, it leaves names and records as they were.
    plain = sm90(**SQUARE, promote=2)
    assert "promote_overlap" not in plain.to_dict() and plain.tag.endswith("_pr2")


def test_overlap_without_a_promotion_interval_is_refused_by_name():
    broken = rules.check(sm90(**SQUARE, promote_overlap=True), H100, problem=fp8())
    assert any(v.rule.startswith("overlapped promotion (promote_overlap) needs a promotion interval")
               for v in broken), broken


def test_overlap_needs_room_for_a_third_accumulator_set():
    wide = sm90(cta="128x192x128", warp="64x192x128", mma="64x192x32", stages=4, persistent=True, promote=1)
    assert not rules.check(wide, H100, problem=fp8())
    broken = rules.check(sm90(**{**wide.to_dict(), "promote_overlap": True}), H100, problem=fp8())
    assert ("accumulators per consumer thread must leave room for addressing", 288) in [(v.rule, v.value)
                                                                                        for v in broken]
    assert not rules.check(sm90(**SQUARE, promote=1, promote_overlap=True), H100, problem=fp8())


def test_the_model_prices_the_overlapped_drain_below_the_plain_one():
    problem = fp8()
    plain, overlapped, none = (predict(problem, sm90(**SQUARE, **knobs), H100).time_s
                               for knobs in ({"promote": 1}, {"promote": 1, "promote_overlap": True}, {}))
    assert none < overlapped < plain


@pytest.mark.parametrize("scaling", ["tensor", "block"])
def test_the_sass_alternates_two_sets_without_an_inserted_wgmma_or_spills(scaling):
    config = sm90(**SQUARE, promote=1, promote_overlap=True)
    problem = fp8(scaling)
    compiled = compile_kernel(Kernel(Arch.SM90A, problem.operands, config), H100)
    sass = dump_sass(compiled.cubin)
    counts = instruction_counts(sass)
    # Two copies of the k-tile (one per set), 4 k-steps each; wgmma issued under a branch that joins before its
    # commit made ptxas close the group with an empty HGMMA.64x8x16 of its own (and wait<1> then waited on the
    # k-tile just issued): the template commits inside each branch, so none may appear.
    assert count_prefix(counts, "QGMMA") == 8 and count_prefix(counts, "HGMMA") == 0, counts
    assert compiled.spill_bytes == 0 and count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
