"""fp8 and tf32 on every layout (issue 22): wgmma reads these types K-major only, so an operand stored MN-major
(A column-major, B row-major) is transposed by the pack launch into a K-major copy in the workspace, and the
unchanged main loop reads the copy. On the CPU: the rules, the manifests, the model's charge, the rendered
CUDA, NVRTC and the SASS. The GPU runs them in tests/test_layouts_gpu.py."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from gemmgen import Arch, Kernel, Problem, TileConfig, families
from gemmgen.cli import main
from gemmgen.codegen.nvrtc import compile_kernel
from gemmgen.codegen.render import render
from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts
from gemmgen.families import rules
from gemmgen.families.sm90_wgmma.launch import TRANSPOSE_TILE_BYTES, transposed
from gemmgen.model.arch import lookup_gpu
from gemmgen.rank.predict import predict
from gemmgen.rank.space import default_config, enumerate_space
from gemmgen.runtime.manifest import make_manifest
from test_inputs import refused  # the one CLI-refusal check (exit 2, one line, no traceback)

H100 = lookup_gpu("h100")
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
DTYPES = [("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e5m2"), ("f32", "f32")]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))


def problem_of(a_dtype, b_dtype, a, b, m=1000, n=777, k=1100, **kw) -> Problem:
    return Problem.create(m, n, k, a_dtype, a, b, b_dtype=b_dtype, **kw)


def kernel_of(problem: Problem, config=None) -> Kernel:
    return Kernel(Arch.SM90A, problem.operands, config or default_config(problem, H100, Arch.SM90A))


@pytest.mark.parametrize("a_dtype,b_dtype", DTYPES)
@pytest.mark.parametrize("a,b", LAYOUTS)
def test_every_layout_of_fp8_and_tf32_has_feasible_hopper_configurations(a_dtype, b_dtype, a, b):
    problem = problem_of(a_dtype, b_dtype, a, b)
    assert enumerate_space("sm90_wgmma", H100, Arch.SM90A, problem=problem)
    config = default_config(problem, H100, Arch.SM90A)
    assert config.family == "sm90_wgmma" and not rules.check(config, H100, problem=problem)
    assert transposed(kernel_of(problem, config)) == (a == "col", b == "row")


@pytest.mark.parametrize("a_dtype,b_dtype", DTYPES)
@pytest.mark.parametrize("a,b", LAYOUTS)
def test_mn_major_operands_are_transposed_into_k_major_workspace_copies(a_dtype, b_dtype, a, b):
    # 1000 x 777 x 1100: fp8 rows of 1100 (K-major) or 1000/777 bytes (MN-major) are not 16-byte multiples, so
    # every fp8 operand is packed, the MN-major ones transposed; f32 rows of 1100 are, of 777 are not.
    problem = problem_of(a_dtype, b_dtype, a, b)
    kernel = kernel_of(problem)
    manifest = make_manifest(kernel, problem)
    elt = problem.a_dtype.bytes
    pack = manifest["launches"][0]
    gemm = next(l for l in manifest["launches"] if l["entry"] == kernel.name)
    maps = {p["name"]: p for p in gemm["params"] if p["kind"] == "tensormap"}
    aligned = {"A": problem.lda * elt % 16 == 0, "B": problem.ldb * elt % 16 == 0}
    expect = {"A": (a == "col", a == "col" or not aligned["A"]), "B": (b == "row", b == "row" or not aligned["B"])}
    packed = [name for name, (_, p) in expect.items() if p]
    if not packed:
        assert pack["entry"] == kernel.name and manifest["workspace_bytes"] == 0
        return
    assert pack["entry"] == f"{kernel.name}_pack" and pack["grid"][2] == len(packed)
    params = {p["name"]: p for p in pack["params"]}
    ends = []
    for z, name in enumerate(packed):
        mode, rows, cols = (params[f"{key}{z}"]["value"] for key in ("mode", "rows", "cols"))
        assert params[f"src{z}"]["tensor"] == name and mode == int(expect[name][0])
        m_or_n = problem.m if name == "A" else problem.n
        # The copy is K-major: a row per M (N) of K elements, rows 128-byte aligned; a transposed source's
        # storage is K rows of M (N).
        assert (rows, cols) == ((problem.k, m_or_n) if mode else (m_or_n, problem.k))
        ld_dst, offset = params[f"ld_dst{z}"]["value"], params[f"dst{z}"]["offset_bytes"]
        assert ld_dst * elt % 128 == 0 and problem.k <= ld_dst < problem.k + 128 // elt
        assert offset % 1024 == 0
        ends.append((offset, offset + m_or_n * ld_dst * elt))
        tm = maps["tmA" if name == "A" else "tmB"]
        assert tm["tensor"] == "workspace" and tm["offset_bytes"] == offset
        assert tm["dims"] == [problem.k, m_or_n] and tm["strides_bytes"] == [ld_dst * elt]
        assert pack["grid"][0] * TRANSPOSE_TILE_BYTES // elt >= cols
    ends.sort()
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(ends, ends[1:])) and ends[-1][1] <= manifest["workspace_bytes"]
    for name in ("A", "B"):   # an operand TMA reads in place keeps its own tensor map
        if name not in packed:
            assert maps["tmA" if name == "A" else "tmB"]["tensor"] == name


@pytest.mark.parametrize("a_dtype", ["e4m3", "f32"])
def test_the_model_charges_the_transpose_at_the_copy_rate_and_nothing_for_k_major(a_dtype):
    # 4096^3: every row 16-byte aligned, so only a transpose makes a copy.
    kmajor = Problem.create(4096, 4096, 4096, a_dtype, "row", "col")
    config = default_config(kmajor, H100, Arch.SM90A)
    base = predict(kmajor, config, H100)
    assert base.prepass_bytes == 0 and base.prepass_s == 0
    elt = kmajor.a_dtype.bytes
    for a, b, copies in (("col", "col", 1), ("row", "row", 1), ("col", "row", 2)):
        problem = Problem.create(4096, 4096, 4096, a_dtype, a, b)
        pr = predict(problem, config, H100)
        # Each transposed operand read once and written once.
        assert pr.prepass_bytes == copies * 2 * 4096 * 4096 * elt
        assert pr.prepass_s > pr.prepass_bytes / H100.dram_bandwidth
        assert pr.time_s == pytest.approx(base.time_s + pr.prepass_s, rel=1e-6)


def test_a_transpose_longer_than_the_main_loop_makes_the_prediction_pack_bound():
    # A skinny fp8 product whose B (4096 x 4096) is row-major: moving B twice costs more than the GEMM.
    problem = Problem.create(64, 4096, 4096, "e4m3", "row", "row")
    pr = predict(problem, default_config(problem, H100, Arch.SM90A), H100)
    assert pr.bound == "memory" and pr.limiter == "pack"


def test_roofline_shows_the_pack_for_mn_major_fp8_only(capsys):
    assert main(["roofline", "4096", "4096", "4096", "--dtype", "e4m3", "--a", "col", "--b", "col",
                 "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert "pack MB" in out and re.search(r"^pack: 33\.6 MB read and written", out, re.M), out
    assert main(["roofline", "4096", "4096", "4096", "--dtype", "e4m3", "--b", "col", "--gpu", "h100"]) == 0
    assert "pack" not in capsys.readouterr().out


def test_3xtf32_swapped_stays_refused_on_a_transposed_layout_naming_the_rule(capsys, tmp_path):
    # 3xTF32 splits both operands in its pre-pass; the swapped main loop is not built for it, in any layout.
    split3 = {"family": "sm90_wgmma", "cta": "64x32x32", "warp": "64x32x32", "mma": "64x32x8", "stages": 8,
              "warp_specialized": True, "persistent": True, "split3": True, "promote": 1, "swap_ab": True}
    path = tmp_path / "split3.json"
    path.write_text(__import__("json").dumps(split3))
    line = refused(capsys, "roofline", "16", "4096", "4096", "--dtype", "f32", "--math", "3xtf32", "--a", "col",
                   "--gpu", "h100", "--config", str(path))
    assert "3xTF32 (split3) runs data-parallel or split-K tiles, unswapped" in line


SPLIT3 = {"family": "sm90_wgmma", "cta": "128x128x32", "warp": "64x128x32", "mma": "64x128x8", "stages": 4,
          "warp_specialized": True, "persistent": True, "split3": True, "promote": 1}


@pytest.mark.parametrize("a,b", LAYOUTS)
def test_3xtf32_splits_transposed_and_misaligned_operands_in_the_tile_copy(a, b):
    config = TileConfig.from_dict(SPLIT3)
    for k in (1024, 1001):   # K-major rows of 1001 fp32 are not 16-byte multiples
        problem = Problem.create(1000, 777, k, "f32", a, b, fp32_math="3xtf32")
        assert not rules.check(config, H100, problem=problem)
        kernel = kernel_of(problem, config)
        launches = families.of(config).launches(kernel, problem).launches
        pack, gemm = launches[0], launches[-1]
        params = {p["name"]: p for p in pack["params"]}
        old_pass = (a, b) == ("row", "col") and k == 1024   # aligned K-major rows keep the split3 entry
        assert pack["entry"] == kernel.name + ("_split3" if old_pass else "_pack")
        maps = {p["name"]: p for p in gemm["params"] if p["kind"] == "tensormap"}
        if not old_pass:
            # mode: bit 0 transposes, bit 1 splits (the copy, then its small parts one plane further).
            assert params["mode0"]["value"] == int(a == "col") | 1 << 1
            assert params["mode1"]["value"] == int(b == "row") | 1 << 1
            plane = 1000 * params["ld_dst0"]["value"] * 4   # A's copy: M rows of K
            assert maps["tmA"]["offset_bytes"] == params["dst0"]["offset_bytes"]
            assert maps["tmA2"]["offset_bytes"] == params["dst0"]["offset_bytes"] + plane
        else:   # the operands themselves are the big parts; the split pass writes the small ones
            assert maps["tmA"]["tensor"] == "A" and maps["tmB"]["tensor"] == "B"
            assert maps["tmA2"]["offset_bytes"] == params["dst0"]["offset_bytes"]
            assert maps["tmB2"]["offset_bytes"] == params["dst1"]["offset_bytes"]
        assert maps["tmA2"]["tensor"] == maps["tmB2"]["tensor"] == "workspace"
        assert maps["tmA2"]["dims"] == [k, 1000] and maps["tmB2"]["dims"] == [k, 777]
        assert params["ld_dst0"]["value"] >= k and params["ld_dst0"]["value"] % 32 == 0
        # three K segments, each rounded up to whole 32-wide k-tiles (each map zero-fills its tail)
        assert {p["name"]: p.get("value") for p in gemm["params"]}["K"] == 3 * -(-k // 32) * 32


@pytest.mark.parametrize("a,b,k", [("row", "col", 2052), ("col", "row", 1001)], ids=["in-place", "tile-copy"])
def test_every_3xtf32_launch_takes_the_manifest_s_parameters_in_order(a, b, k):
    """The split-K reduction is launched with the GEMM's parameter list (the manifest gives both one list), so
    both entry points declare exactly those parameters, tmA2 and tmB2 (the small parts' maps) included."""
    config = TileConfig.from_dict({**SPLIT3, "decomposition": {"kind": "splitk", "splits": 2}})
    problem = Problem.create(1000, 1004, k, "f32", a, b, bias=True, fp32_math="3xtf32")
    kernel = kernel_of(problem, config)
    source = render(kernel, H100)
    launches = make_manifest(kernel, problem)["launches"]
    assert [l["entry"] for l in launches][-2:] == [kernel.name, kernel.name + "_reduce"]
    for launch in launches[-2:]:
        signature = re.search(rf"{launch['entry']}\((.*?)\)\s*{{", source, re.S).group(1)
        declared = [re.sub(r"\[.*\]", "", part).split()[-1].lstrip("*") for part in signature.split(",")]
        assert declared == [p["name"] for p in launch["params"]], launch["entry"]
        assert "tmA2" in declared and "tmB2" in declared


def _functions(cubin: bytes) -> "dict[str, dict]":
    text = dump_sass(cubin)
    return {part.split()[0]: (instruction_counts(part), part) for part in text.split("Function : ")[1:]}


@pytest.mark.parametrize("a_dtype,b_dtype", DTYPES)
@pytest.mark.parametrize("a,b", LAYOUTS)
def test_sass_transposes_through_shared_memory_then_runs_the_k_major_wgmma(a_dtype, b_dtype, a, b):
    problem = problem_of(a_dtype, b_dtype, a, b)
    kernel = kernel_of(problem)
    source = render(kernel, H100)
    assert "constexpr bool A_KMAJOR = true, B_KMAJOR = true;" in source
    compiled = compile_kernel(kernel, H100)
    funcs = _functions(compiled.cubin)
    gemm, text = funcs[kernel.name]
    if a_dtype == "f32":
        assert set(re.findall(r"HGMMA\.64x\d+x8\.F32\.(\w+)", text)) == {"TF32"}
    else:
        assert set(re.findall(r"QGMMA\.64x\d+x32\.F32\.(\w+)\.(\w+)", text)) == {(a_dtype.upper(), b_dtype.upper())}
    assert count_prefix(gemm, "UTMALDG") > 0
    # Every fp8 operand of this shape is packed (rows of 1100, 1000 or 777 bytes); f32 rows of 1100 are 16-byte
    # multiples, so row-major A and column-major B f32 are read in place, with no pack entry.
    if (a_dtype, a, b) == ("f32", "row", "col"):
        assert kernel.name + "_pack" not in funcs
        return
    pack, _ = funcs[kernel.name + "_pack"]
    # 16-byte global loads and stores, 16-byte shared stores of the loaded chunks, 32-bit column reads.
    assert count_prefix(pack, "LDG.E.128") > 0 and count_prefix(pack, "STG.E.128") > 0
    if transposed(kernel) != (False, False):
        assert count_prefix(pack, "STS.128") > 0 and count_prefix(pack, "LDS") > 0
        if a_dtype != "f32":
            assert count_prefix(pack, "PRMT") > 0   # the 4x4 byte transposes
    for counts, _ in funcs.values():
        assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
    assert compiled.spill_bytes == 0


def test_tune_dry_run_ranks_and_exports_a_transposing_kernel_with_the_pack_in_its_bound(capsys, tmp_path):
    # A skinny fp8 product with B row-major: the transpose of B outlasts the main loop, so the ranking says
    # memory-bound, and the exported bundle packs B before the GEMM.
    import json

    assert main(["tune", "64", "4096", "4096", "--dtype", "e4m3", "--b", "row", "--gpu", "h100", "--dry-run",
                 "--top-k", "1", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^1 .* memory +ok", out, re.M), out
    [manifest] = [json.loads(p.read_text()) for p in (tmp_path / "b").glob("*.json")]
    pack = manifest["launches"][0]
    assert pack["entry"] == manifest["name"] + "_pack"
    params = {p["name"]: p for p in pack["params"]}
    # Swapped or not, the one transposed copy is of the caller's B.
    copies = [z for z in range(pack["grid"][2]) if params[f"mode{z}"]["value"] & 1]
    assert [params[f"src{z}"]["tensor"] for z in copies] == ["B"]


def test_math_chooses_3xtf32_or_tf32_kernels_for_fp32_inputs_and_is_refused_for_others(capsys):
    """--math 3xtf32 asks for fp32-class accuracy: only the split3 kernels serve it (verified against fp32's
    tolerance, timed against cuBLAS fp32); plain f32 runs the tf32 kernels; other dtypes have no choice."""
    h100 = lookup_gpu("h100")
    x3 = Problem.create(4096, 4096, 4096, "f32", "row", "col", fp32_math="3xtf32")
    tf32 = Problem.create(4096, 4096, 4096, "f32", "row", "col")
    assert x3.label.endswith("_3xtf32") and Problem.from_dict(x3.to_dict()) == x3
    assert "fp32_math" not in tf32.to_dict()   # older records stay identical
    assert all(c.split3 for c in enumerate_space("sm90_wgmma", h100, problem=x3))
    assert not any(c.split3 for c in enumerate_space("sm90_wgmma", h100, problem=tf32))
    assert "3xTF32 (split3) kernels serve --math 3xtf32 problems" in rules.check(
        TileConfig.from_dict(SPLIT3), h100, problem=tf32)[0].rule
    line = refused(capsys, "tune", "64", "64", "64", "--math", "3xtf32", "--dry-run", "--gpu", "h100")
    assert "--math 3xtf32 is for fp32 inputs (--dtype f32)" in line
    line = refused(capsys, "tune", "64", "64", "64", "--dtype", "f32", "--math", "fp64", "--dry-run", "--gpu", "h100")
    assert "--math must be one of tf32, 3xtf32" in line
