"""fp8 accumulation as part of the problem (`--accumulate fast|fp32`, Problem.fp8_accum), on the CPU: the problem, its
label and record, the rule admitting only promoting kernels for fp32 accumulation, the CLI's one-line refusals and
a dry run's pick. The cuBLAS baseline it selects is timed on the GPU (gemmgen/tune/bench/gpu.py)."""
from __future__ import annotations

import json

import pytest

from gemmgen.families import rules
from gemmgen.model.arch import lookup_gpu
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import TileConfig

H100 = lookup_gpu("h100")
SQUARE = dict(cta="128x128x128", warp="64x128x128", mma="64x128x32", stages=4, persistent=True)


def sm90(**fields) -> TileConfig:
    return TileConfig.from_dict({"family": "sm90_wgmma", "warp_specialized": True, **fields})


def fp8() -> Problem:
    return Problem.create(4096, 4096, 4096, "e4m3", "row", "col")


def rule_names(config, problem=None):
    return [v.rule for v in rules.check(config, H100, problem=problem or fp8())]


def test_fp32_accumulation_is_part_of_the_problem_its_label_and_record():
    from gemmgen.model.problem import Fp8Accum

    problem = Problem.create(4096, 4096, 4096, "e4m3", "row", "col", fp8_accum="fp32")
    assert problem.fp8_accum is Fp8Accum.FP32 and problem.label.endswith("_rc_acc32")
    assert Problem.from_dict(json.loads(json.dumps(problem.to_dict()))) == problem
    # The default (fast) leaves labels and records as they were.
    fast = Problem.create(4096, 4096, 4096, "e4m3", "row", "col")
    assert fast.fp8_accum is Fp8Accum.FAST and "fp8_accum" not in fast.to_dict()
    assert fast.label == "4096x4096x4096_e4m3_rc"


def test_fp32_accumulation_admits_only_kernels_that_promote_every_1_to_4_k_tiles():
    problem = Problem.create(4096, 4096, 4096, "e4m3", "row", "col", fp8_accum="fp32")
    assert rule_names(sm90(**SQUARE), problem) == [
        "--accumulate fp32 promotes the fp8 partial sums into fp32 every 1-4 k-tiles (promote 1, 2 or 4)"]
    for promote in (1, 2, 4):
        assert not rule_names(sm90(**SQUARE, promote=promote), problem)
    # A fast problem takes either.
    assert not rule_names(sm90(**SQUARE)) and not rule_names(sm90(**SQUARE, promote=2))


@pytest.mark.parametrize("argv,message", [
    (["64", "64", "64", "--accumulate", "fp32"],
     "--accumulate fp32 is for fp8 inputs (e4m3, e5m2); other dtypes accumulate in fp32, but got 'bf16'"),
    (["64", "64", "64", "--dtype", "e4m3", "--b", "col", "--accumulate", "slow"],
     "--accumulate must be one of fast, fp32, but got 'slow'"),
])
def test_the_cli_refuses_a_bad_accumulation_in_one_line(argv, message, capsys):
    from gemmgen.cli import main

    assert main(["tune", *argv, "--dry-run", "--gpu", "h100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gemmgen tune: error: {message}"]


def test_a_dry_run_of_an_fp32_accumulation_problem_picks_a_promoting_kernel(tmp_path, monkeypatch, capsys):
    from gemmgen.cli import main

    for var in ("GEMMGEN_RESULTS", "GEMMGEN_CACHE", "GEMMGEN_DATA"):
        monkeypatch.setenv(var, str(tmp_path / var))
    assert main(["tune", "4096", "4096", "4096", "--dtype", "e4m3", "--b", "col", "--accumulate", "fp32",
                 "--dry-run", "--gpu", "h100", "--top-k", "1", "--no-progress"]) == 0
    pick = [line for line in capsys.readouterr().out.splitlines() if line.startswith("model's pick")]
    assert pick and "_pr" in pick[0] and "_acc32" not in pick[0]
