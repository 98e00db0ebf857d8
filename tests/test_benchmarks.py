"""benchmarks/: every experiment starts (its --help), uses gemmgen's public names only, and the GPU-free part of
the space check selects a feasible case for every configuration of every family."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name != "harness.py")


def test_no_benchmark_imports_a_private_gemmgen_name():
    private = []
    for path in BENCH.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gemmgen":
                parts = node.module.split(".") + [a.name for a in node.names]
                if any(p.startswith("_") for p in parts):
                    private.append(f"{path.name}:{node.lineno} {node.module}")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.value, ast.Name) and node.value.id in ("gemm", "gemmgen", "kernel"):
                    private.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not private, private


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_benchmark_explains_itself(script):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60,
                          cwd=BENCH.parent)
    if done.returncode and "No module named 'torch'" in done.stderr:
        pytest.skip("needs torch")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_space_check_picks_a_feasible_case_for_every_configuration_of_every_family():
    sys.path.insert(0, str(BENCH))
    try:
        from space_check import cases
    finally:
        sys.path.remove(str(BENCH))
    from gemmgen import lookup_gpu
    from gemmgen.families.rules import check
    from gemmgen.rank.space import all_configs, families_for

    gpu = lookup_gpu("h100")
    todo = cases()
    for name in families_for(gpu.arch):
        feasible = {c.tag for c in all_configs(name) if not check(c, gpu, gpu.arch)}
        covered = {kernel.config.tag for _, _, kernel in todo if kernel.config.family == name}
        assert covered == feasible, sorted(feasible - covered)[:3]
    assert all(not check(k.config, gpu, gpu.arch, problem) for _, problem, k in todo)


def test_the_random_suite_is_reproducible_and_a_valid_suite_file(tmp_path):
    """benchmarks/random_suite.py: the same seed gives the same file (the checked-in random-seed11.yaml is that
    file), and what it writes loads as a suite of problems every dimension and layout of which is accepted."""
    from gemmgen.tune.suite_file import load_shapes

    def draw(seed: int, count: int) -> str:
        done = subprocess.run([sys.executable, str(BENCH / "random_suite.py"), "--seed", str(seed), "--count",
                               str(count)], capture_output=True, text=True, timeout=60, cwd=BENCH.parent)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert draw(11, 20) == (BENCH / "suites" / "random-seed11.yaml").read_text()
    path = tmp_path / "drawn.yaml"
    path.write_text(draw(3, 200))
    shapes = load_shapes(path)
    assert len(shapes) == 200 and len({s.name for s in shapes}) == 200
    assert all(2 * s.m * s.n * s.k <= 2.2e12 and 1 <= s.m <= 8192 for s in shapes)
    assert {s.a for s in shapes} == {s.b for s in shapes} == {"row", "col"}
    assert any(s.n % 8 for s in shapes) and any(s.m <= 16 for s in shapes)


def test_small_latency_changes_a_matched_configuration_where_the_rules_allow_and_says_why_not(capsys):
    """benchmarks/small_latency.py --change: a matched configuration with fields changed (numbers and booleans
    parsed), kept where the rules accept it for the shape, reported with the broken rule where they do not."""
    sys.path.insert(0, str(BENCH.parent))
    from benchmarks.small_latency import changed
    from gemmgen import Problem
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.model.tiles import TileConfig
    from gemmgen.rank.ranking import Ranked

    gpu = lookup_gpu("h100")
    problem = Problem.create(96, 4096, 4096, "bf16", "row", "col")
    base = Ranked(TileConfig.from_dict({"family": "sm90_wgmma", "cta": "64x128x64", "warp": "64x128x64",
                                        "mma": "64x128x16", "stages": 6, "cluster": "2x1",
                                        "warp_specialized": True, "persistent": True}), None, None, "", 0)
    out = changed(base, ["stages=8", "swap_ab=true,cta=64x48x64,warp=64x48x64,mma=64x48x16,cluster=1x2,stages=12",
                         "stages=12", "cluster=3x1"], problem, gpu)
    assert [r.config.stages for r in out] == [8, 12]
    assert out[1].config.swap_ab and (out[1].config.cluster.m, out[1].config.cluster.n) == (1, 2)
    printed = capsys.readouterr().out
    assert "shared memory per block must fit" in printed   # 12 stages of 64x128 tiles
    assert "cluster must be" in printed


@pytest.mark.parametrize("bad", ["abc", "0..4", "9..3", "1..8:0"])
def test_dispatch_sweep_names_a_bad_m_range_in_one_line_before_looking_for_a_gpu(bad):
    result = subprocess.run([sys.executable, str(BENCH / "dispatch_sweep.py"), "--m", bad], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "--m must be LO..HI[:STEP]" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
