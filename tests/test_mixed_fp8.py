"""Mixed fp8 products (A e4m3 x B e5m2 and the reverse, issue 22): the model, the family registry, code generation
and the CLI, on the CPU. The GPU runs them in tests/test_hopper_paths_gpu.py, the SASS is in tests/test_sass.py."""
from __future__ import annotations

import json

import pytest

from gemmgen import families
from gemmgen.calc.intensity import roofline
from gemmgen.cli import main
from gemmgen.codegen.render import render
from gemmgen.families import rules
from gemmgen.model.arch import Arch, DType, lookup_gpu
from gemmgen.model.errors import InvalidInput
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Kernel, TileConfig
from gemmgen.rank.predict import predict
from gemmgen.rank.space import check_target, default_config, enumerate_space
from test_inputs import refused  # the one CLI-refusal check (exit 2, one line, no traceback)

H100 = lookup_gpu("h100")
PAIRS = [("e4m3", "e5m2"), ("e5m2", "e4m3")]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))


def mixed(m=4096, n=4096, k=4096, a="e4m3", b="e5m2", **kw) -> Problem:
    return Problem.create(m, n, k, a, "row", "col", b_dtype=b, **kw)


# --- the model ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("a,b", PAIRS)
def test_a_mixed_fp8_problem_round_trips_and_names_both_dtypes(a, b):
    problem = mixed(1000, 2000, 512, a, b, bias=True)
    assert (problem.a_dtype.value, problem.b_dtype.value) == (a, b) and problem.mixed
    assert Problem.from_dict(json.loads(json.dumps(problem.to_dict()))) == problem
    assert problem.to_dict()["b_dtype"] == b
    assert problem.operands.tag.startswith(f"{a}{b}_bf16_f32_rc_")   # fp8 writes bf16 unless told otherwise
    assert f"_{a}{b}_rc" in problem.label
    # Swapped, the main loop's A is B^T: the dtypes trade places with the layouts.
    assert (problem.swapped().a_dtype.value, problem.swapped().b_dtype.value) == (b, a)


def test_b_dtype_defaults_to_a_s_and_old_records_without_it_still_load():
    assert Problem.create(64, 64, 64, "e4m3", "row", "col").b_dtype is DType.E4M3
    record = mixed(64, 64, 64).to_dict()
    del record["b_dtype"]
    assert Problem.from_dict(record).b_dtype is DType.E4M3
    # A matched pair keeps its name: records and labels of one-dtype problems are unchanged.
    assert Problem.create(64, 64, 64, "e4m3", "row", "col").label == "64x64x64_e4m3_rc"


@pytest.mark.parametrize("a,b", [("bf16", "f16"), ("f16", "bf16"), ("e4m3", "bf16"), ("f32", "e5m2")])
def test_a_mixed_pair_that_is_not_fp8_is_refused_naming_the_rule(a, b):
    with pytest.raises(InvalidInput, match=r"A and B must have the same dtype unless both are fp8 .*"
                                           rf"'{a}/{b}'"):
        Problem.create(64, 64, 64, a, b_dtype=b)


def test_the_roofline_and_the_model_take_the_fp8_rate_and_one_byte_per_element():
    problem = mixed()
    roof = roofline(problem, H100)
    assert roof.peak_flops == H100.tensor_peak("e4m3") == H100.tensor_peak("e5m2")
    same = Problem.create(4096, 4096, 4096, "e4m3", "row", "col")
    assert problem.min_bytes == same.min_bytes == 2 * 4096 * 4096 + 4096 * 4096 * 2
    config = default_config(problem, H100)
    assert predict(problem, config, H100).time_s == pytest.approx(predict(same, config, H100).time_s)


# --- the family registry and the rules ------------------------------------------------------------------

@pytest.mark.parametrize("a,b", PAIRS)
def test_the_hopper_family_takes_mixed_fp8_pairs_and_renders_wgmma_with_both_types(a, b):
    problem = mixed(1000, 1048, 784, a, b)
    assert (DType(a), DType(b)) in families.get("sm90_wgmma").dtype_pairs()
    check_target(H100, Arch.SM90A, problem.a_dtype, problem.b_dtype)
    assert enumerate_space("sm90_wgmma", H100, Arch.SM90A, None, problem.operands)
    config = default_config(problem, H100, Arch.SM90A)
    assert config.family == "sm90_wgmma" and not rules.check(config, H100, problem=problem)
    source = render(Kernel(Arch.SM90A, problem.operands, config), H100)
    assert f"k32.f32.{a}.{b}" in source and f".{b}.{a}" not in source


def test_a_swapped_mixed_kernel_runs_b_s_type_as_its_a():
    swap = TileConfig.from_dict({"family": "sm90_wgmma", "cta": "128x32x128", "warp": "64x32x128",
                                 "mma": "64x32x32", "stages": 6, "warp_specialized": True, "persistent": True,
                                 "swap_ab": True})
    problem = mixed(24, 3001, 1040)
    assert not rules.check(swap, H100, problem=problem)
    assert "m64n32k32.f32.e5m2.e4m3" in render(Kernel(Arch.SM90A, problem.operands, swap), H100)


@pytest.mark.parametrize("a,b", [("row", "row"), ("col", "row"), ("col", "col")])
def test_mixed_fp8_takes_every_layout_through_the_transposing_pack(a, b):
    from gemmgen.families.sm90_wgmma.launch import transposed

    problem = Problem.create(4096, 4096, 4096, "e4m3", a, b, b_dtype="e5m2")
    config = default_config(mixed(), H100, Arch.SM90A)
    assert not rules.check(config, H100, problem=problem)
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    assert transposed(kernel) == (a == "col", b == "row")
    source = render(kernel, H100)
    assert "k32.f32.e4m3.e5m2" in source and f"{kernel.name}_pack(" in source


def test_the_sm80_family_refuses_mixed_pairs_even_of_dtypes_it_takes(monkeypatch):
    sm80 = families.get("sm80_mma")
    assert sm80.mixed_dtypes == frozenset()
    # Were it to take both fp8 types one by one, the pair would still be refused: by the registry up front ...
    monkeypatch.setattr(sm80, "dtypes", sm80.dtypes | {DType.E4M3, DType.E5M2})
    check_target(H100, Arch.SM80, DType.E4M3)
    with pytest.raises(InvalidInput, match=r"A/B dtype pair must be one the kernel families take on h100-sxm "
                                           r"\(sm_80\): matching A and B dtypes only, but got 'e4m3 x e5m2'"):
        check_target(H100, Arch.SM80, DType.E4M3, DType.E5M2)
    # ... and by the shared feasibility rules for any configuration of the family.
    config = default_config(Problem.create(4096, 4096, 4096, "bf16"), H100, Arch.SM80)
    broken = [v.rule for v in rules.check(config, H100, Arch.SM80, problem=mixed())]
    assert "family sm80_mma supports A/B dtype pairs" in broken


def test_the_loader_checks_a_s_and_b_s_dtypes_apart():
    from gemmgen.runtime.arrays import ArrayInfo, check_operand

    problem = mixed(256, 256, 256)
    a = ArrayInfo(0x1000, (256, 256), (256, 1), "float8_e4m3fn", 0, 0)
    b = ArrayInfo(0x2000, (256, 256), (1, 256), "float8_e5m2", 0, 0)
    check_operand("A", a, problem)
    check_operand("B", b, problem)
    with pytest.raises(InvalidInput, match="B must have dtype e5m2"):
        check_operand("B", ArrayInfo(0x2000, (256, 256), (1, 256), "float8_e4m3fn", 0, 0), problem)
    with pytest.raises(InvalidInput, match="A must have dtype e4m3"):
        check_operand("A", ArrayInfo(0x1000, (256, 256), (256, 1), "float8_e5m2", 0, 0), problem)


def test_a_mixed_kernel_does_not_serve_a_matched_pair():
    from gemmgen.runtime.manifest import check_match

    problem = mixed()
    kernel = Kernel(Arch.SM90A, problem.operands, default_config(problem, H100))
    check_match(kernel, problem)
    with pytest.raises(InvalidInput, match="dtypes, layouts, scaling and epilogue must match"):
        check_match(kernel, Problem.create(4096, 4096, 4096, "e4m3", "row", "col"))


def test_records_of_mixed_and_matched_pairs_are_kept_apart():
    from gemmgen.tune.results import problem_key

    keys = {problem_key(mixed(a=a, b=b)) for a, b in PAIRS + [("e4m3", "e4m3"), ("e5m2", "e5m2")]}
    assert len(keys) == 4


# --- the CLI ---------------------------------------------------------------------------------------------

def test_the_cli_takes_a_mixed_pair_and_exports_its_dry_run_pick(capsys, tmp_path):
    out = tmp_path / "bundle"
    assert main(["tune", "4096", "4096", "4096", "--dtype", "e4m3", "--b-dtype", "e5m2", "--a", "row", "--b", "col",
                 "--gpu", "h100", "--dry-run", "--top-k", "1", "--jobs", "1", "--out", str(out)]) == 0
    [manifest_path] = out.glob("*.json")
    manifest = json.loads(manifest_path.read_text())
    assert (manifest["problem"]["a_dtype"], manifest["problem"]["b_dtype"]) == ("e4m3", "e5m2")
    assert "_e4m3e5m2_" in manifest["name"]
    assert ".f32.e4m3.e5m2" in (out / manifest["source"]).read_text()


def test_roofline_and_space_answer_for_a_mixed_pair(capsys):
    assert main(["roofline", "4096", "4096", "4096", "--dtype", "e4m3", "--b-dtype", "e5m2", "--a", "row",
                 "--b", "col", "--gpu", "h100"]) == 0
    printed = capsys.readouterr().out
    assert "e4m3 x e5m2" in printed and f"{H100.tensor_peak('e4m3') / 1e12:.1f} TFLOP/s" in printed
    assert main(["space", "--dtype", "e5m2", "--b-dtype", "e4m3", "--a", "row", "--b", "col", "--gpu", "h100"]) == 0
    assert "(e5m2e4m3_bf16_f32_rc_" in capsys.readouterr().out


@pytest.mark.parametrize("command", [
    ["tune", "64", "64", "64", "--gpu", "h100", "--dry-run"],
    ["bench", "64", "64", "64"],
    ["compile", "64", "64", "64", "--gpu", "h100", "--out", "o"],
    ["render", "64", "64", "64", "--gpu", "h100"],
    ["roofline", "64", "64", "64", "--gpu", "h100"],
    ["lookup", "64", "64", "64", "--gpu", "h100"],
    ["space", "--gpu", "h100"],
])
def test_a_16_bit_mixed_pair_is_refused_by_every_command(capsys, command):
    line = refused(capsys, *command, "--dtype", "bf16", "--b-dtype", "f16")
    assert "A and B must have the same dtype unless both are fp8" in line and "'bf16/f16'" in line


@pytest.mark.parametrize("command", [
    ["compile", "64", "64", "64", "--gpu", "h100", "--arch", "sm_80", "--out", "o"],
    ["render", "64", "64", "64", "--gpu", "h100", "--arch", "sm_80"],
    ["space", "--gpu", "h100", "--arch", "sm_80"],
    ["tune", "64", "64", "64", "--gpu", "a100", "--dry-run"],
])
def test_a_mixed_fp8_pair_is_refused_up_front_where_no_family_takes_it(capsys, command):
    line = refused(capsys, *command, "--dtype", "e4m3", "--b-dtype", "e5m2", "--a", "row", "--b", "col")
    assert "must be one the kernel families take on" in line and "(sm_80)" in line


def test_an_unknown_b_dtype_is_refused_naming_the_choices(capsys):
    line = refused(capsys, "roofline", "64", "64", "64", "--gpu", "h100", "--dtype", "e4m3", "--b-dtype", "e3m4")
    assert "dtype must be one of" in line and "'e3m4'" in line
