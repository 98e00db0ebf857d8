"""Search spaces: the YAML's products, filtered by the feasibility check; default pick; bad files."""
from __future__ import annotations

import json

import pytest

from gemmgen.families import rules as constraints

from gemmgen.model import paths

from gemmgen.rank import space
from gemmgen import families
from gemmgen.model.arch import Arch, lookup_gpu
from gemmgen.model.errors import InvalidInput
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import DecompKind, SmemLayout

H100 = lookup_gpu("h100")
A100 = lookup_gpu("a100")


def test_space_keeps_exactly_the_configs_check_accepts():
    every = space.all_configs("sm80_mma")
    kept = space.enumerate_space("sm80_mma", A100, Arch.SM80)
    assert kept and len(kept) < len(every)  # A100's 163 KB limit rejects the deepest 256-wide pipelines
    for config in every:
        accepted = not constraints.check(config, A100, Arch.SM80)
        assert (config in kept) is accepted


def test_space_covers_the_axes_the_family_supports():
    configs = space.all_configs("sm80_mma")
    assert {c.stages for c in configs} == {2, 3, 4, 5}
    assert {c.smem_layout for c in configs} == set(SmemLayout)
    assert {c.decomposition.kind for c in configs} == {DecompKind.DATA_PARALLEL, DecompKind.SPLIT_K}
    assert {c.cta.k for c in configs} == {32, 64}
    assert {c.raster.order.value for c in configs} == {"row", "col"}
    assert len({c.tag for c in configs}) == len(configs)


def test_problem_rules_apply():
    short_k = Problem.create(4096, 4096, 64)
    kept = space.enumerate_space("sm80_mma", H100, Arch.SM90A, short_k)
    assert all(c.decomposition.splits <= 2 for c in kept)  # K = 64 has one or two K tiles


def test_families_for_arch():
    assert "sm80_mma" in space.families_for("sm_80")
    assert "sm90_wgmma" not in space.families_for("sm_80")


def test_default_config_is_valid_and_deterministic():
    problem = Problem.create(4096, 4096, 4096)
    pick = space.default_config(problem, H100, Arch.SM80)
    assert not constraints.check(pick, H100, Arch.SM80, problem)
    assert pick == space.default_config(problem, H100, Arch.SM80)
    assert pick.family == "sm80_mma"


def test_heuristic_prefers_big_tiles_for_big_problems_and_split_k_for_long_k():
    big = Problem.create(8192, 8192, 8192)
    configs = space.enumerate_space("sm80_mma", H100, Arch.SM80, big)
    best = min(configs, key=lambda c: space.heuristic_time(big, c, H100))
    assert best.cta.m * best.cta.n >= 128 * 128 and best.decomposition.kind is DecompKind.DATA_PARALLEL
    skinny = Problem.create(128, 128, 16384)
    configs = space.enumerate_space("sm80_mma", H100, Arch.SM80, skinny)
    best = min(configs, key=lambda c: space.heuristic_time(skinny, c, H100))
    assert best.decomposition.kind is DecompKind.SPLIT_K


@pytest.mark.parametrize("text,rule", [
    ("family: sm80_mma\n", "exactly one of 'axes' or 'spaces'"),
    ("family: sm90_wgmma\naxes: {}\n", "'family' must be sm80_mma"),
    ("family: sm80_mma\naxes: {tiles: [{cta: 128x128, warp: 64x64}], bk: [32], mma: [16x8x16]}\n", "axis 'stages'"),
    ("family: sm80_mma\naxes: {tiles: [{cta: 128x128, warp: 64x64}], bk: [32], mma: [16x8x16], stages: [3], "
     "colour: [red]}\n", "axes must be among"),
    ("family: sm80_mma\naxes: {tiles: [128x128], bk: [32], mma: [16x8x16], stages: [3]}\n", "tiles entry"),
    ("family: sm80_mma\naxes: {tiles: [{cta: 128x128, warp: 64x64}], bk: [32], mma: [16x8x16], stages: 3}\n",
     "non-empty list"),
    ("family: [unclosed\n", "valid YAML"),
])
def test_malformed_space_file_names_file_and_rule(tmp_path, monkeypatch, text, rule):
    (tmp_path / "sm80_mma.yaml").write_text(text)
    monkeypatch.setattr(families.get("sm80_mma"), "space_file", tmp_path / "sm80_mma.yaml")
    with pytest.raises(InvalidInput) as info:
        space.enumerate_space("sm80_mma", H100, Arch.SM80)
    message = str(info.value)
    assert "sm80_mma.yaml" in message and rule in message
    assert "\n" not in message


def test_a_leading_dimension_tma_cannot_load_no_longer_rules_out_the_tma_family():
    # Before the pack pass (2026-11-25) lda = 4097 bf16 ruled sm90_wgmma out and the tuner fell back to sm80.
    from gemmgen.rank.space import excluded_families

    gpu = lookup_gpu("h100")
    odd = Problem.create(4096, 4096, 4097, "bf16")  # A row-major: lda = 4097 elements, not 16-byte rows
    general = lambda excluded: [family for family, _ in excluded if not families.get(family).specialist]  # noqa: E731
    assert general(excluded_families(odd, gpu)) == []
    assert general(excluded_families(Problem.create(4096, 4096, 4096, "bf16"), gpu)) == []


def test_a_family_ruled_out_by_its_dtypes_is_named_for_them_not_for_a_rule_that_ties():
    # Regression: of rules every configuration breaks, the one whose message sorted last was named, so an fp8
    # tune on the H100 noted 'sm80_mma writes D in the inputs' dtype: got bf16, limit e4m3' (and row sums on the
    # A100 the skinny family's M rule) where the family takes no fp8 at all.
    from gemmgen.rank.space import excluded_families

    fp8 = dict(excluded_families(Problem.create(64, 64, 64, "e4m3"), lookup_gpu("h100")))
    assert {family: rule.split(":")[0] for family, rule in fp8.items()} == {
        f"sm80_{name}": f"family sm80_{name} supports dtypes" for name in ("mma", "skinny", "gemv")}
    row_sums = dict(excluded_families(Problem.create(4096, 4096, 4096, "bf16", row_sums=True), lookup_gpu("a100")))
    assert all("cannot write the row sums of A" in rule for rule in row_sums.values()), row_sums


def test_tune_dry_run_picks_a_packing_tma_kernel_for_misaligned_rows(capsys, tmp_path, monkeypatch):
    from gemmgen.cli import main

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    assert main(["tune", "4095", "4095", "4095", "--gpu", "h100", "--dry-run", "--top-k", "1",
                 "--out", str(tmp_path / "b")]) == 0
    [manifest] = [json.loads(p.read_text()) for p in (tmp_path / "b").glob("*.json")]
    assert manifest["config"]["family"] == "sm90_wgmma"
    # lda = ldb = 4095: both operands are copied before the GEMM, by one launch.
    assert [l["entry"] for l in manifest["launches"]] == [manifest["name"] + "_pack", manifest["name"]]
    assert manifest["launches"][0]["grid"][2] == 2
