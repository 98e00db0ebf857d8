"""fp8 scalings beyond per-tensor (issue 22): per-row and per-column scales (rowcol), on the CPU: the problem and its
names, the CLI, the rules, rendering and NVRTC + SASS of every epilogue path, manifests and the loader's checks.
The GPU runs them in tests/test_hopper_paths_gpu.py."""
from __future__ import annotations

import json

import pytest

from gemmgen import families
from gemmgen.cli import main
from gemmgen.codegen.nvrtc import compile_kernel
from gemmgen.codegen.render import render
from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts
from gemmgen.families import rules
from gemmgen.model.arch import Arch, DType, lookup_gpu
from gemmgen.model.errors import InvalidInput
from gemmgen.model.problem import Problem, Scaling
from gemmgen.model.tiles import Kernel, TileConfig
from gemmgen.rank.space import default_config
from test_inputs import refused

H100 = lookup_gpu("h100")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))


def rowcol(m=1000, n=777, k=1104, dtype="e4m3", **kw) -> Problem:
    return Problem.create(m, n, k, dtype, "row", "col", scaling="rowcol", **kw)


def sm90(**fields) -> TileConfig:
    return TileConfig.from_dict({"family": "sm90_wgmma", "warp_specialized": True, **fields})


# One configuration per epilogue path an fp8 kernel can take, and the problem it serves.
WIDE = dict(cta="128x256x128", warp="64x256x128", mma="64x256x32", stages=4, persistent=True)
SQUARE = dict(cta="128x128x128", warp="64x128x128", mma="64x128x32", stages=4)
SWAP = dict(cta="128x32x128", warp="64x32x128", mma="64x32x32", stages=6, swap_ab=True)
PATHS = {
    "tma_store": (WIDE, dict(n=1024)),                      # D's rows 16-byte aligned: TMA stores
    "staged": (WIDE, {}),                                   # N = 777: the staged epilogue
    "pingpong": (dict(cta="128x128x128", warp="128x128x128", mma="64x128x32", stages=6, persistent=True,
                      schedule="pingpong"), dict(n=1024)),
    "splitk": (dict(SQUARE, decomposition={"kind": "splitk", "splits": 3}), {}),
    "splitk_fused": (dict(SQUARE, decomposition={"kind": "splitk", "splits": 3, "fused": True}), {}),
    "streamk": (dict(SQUARE, persistent=True, decomposition={"kind": "streamk"}), {}),
    "promote": (dict(SQUARE, persistent=True, promote=1), {}),
    "swap": (dict(SWAP, persistent=True), dict(m=24, n=3001)),
    "swap_splitk": (dict(SWAP, decomposition={"kind": "splitk", "splits": 2}), dict(m=24, n=3001)),
    "swap_fused": (dict(SWAP, decomposition={"kind": "splitk", "splits": 2, "fused": True}), dict(m=24, n=3001)),
}


# --- the problem ------------------------------------------------------------------------------------------

def test_rowcol_is_part_of_the_problem_its_names_and_its_round_trip():
    problem = rowcol(bias=True)
    assert problem.scaling is Scaling.ROWCOL and problem.scale_shapes == ((1000,), (777,))
    assert Problem.from_dict(json.loads(json.dumps(problem.to_dict()))) == problem
    assert problem.to_dict()["scaling"] == "rowcol" and problem.label.endswith("_rc_rowcol")
    assert problem.operands.tag.endswith("_bias_rowcol")
    # Per-tensor scaling keeps every name and record it had before the field.
    tensor = Problem.create(1000, 777, 1104, "e4m3", "row", "col")
    assert "scaling" not in tensor.to_dict() and tensor.scale_shapes == ((1,), (1,))
    assert tensor.label == "1000x777x1104_e4m3_rc" and not tensor.operands.tag.endswith("tensor")
    # The swapped product keeps the caller's scaling (its kernel exchanges the vectors itself).
    assert problem.swapped().scaling is Scaling.ROWCOL


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_rowcol_scaling_of_16_or_32_bit_inputs_is_refused_naming_the_rule(dtype):
    with pytest.raises(InvalidInput, match=rf"scaling 'rowcol' needs fp8 inputs \(e4m3, e5m2\), but got "
                                           rf"'{dtype}/{dtype}'"):
        Problem.create(64, 64, 64, dtype, scaling="rowcol")


def test_records_and_kernels_of_the_two_scalings_are_kept_apart():
    from gemmgen.runtime.manifest import check_match
    from gemmgen.tune.results import problem_key

    tensor = Problem.create(4096, 4096, 4096, "e4m3", "row", "col")
    scaled = Problem.create(4096, 4096, 4096, "e4m3", "row", "col", scaling="rowcol")
    assert problem_key(tensor) != problem_key(scaled)
    config = default_config(scaled, H100)
    kernel = Kernel(Arch.SM90A, scaled.operands, config)
    assert kernel.name != Kernel(Arch.SM90A, tensor.operands, config).name
    check_match(kernel, scaled)
    with pytest.raises(InvalidInput, match="dtypes, layouts, scaling and epilogue must match"):
        check_match(kernel, tensor)


# --- the rules ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_hopper_family_takes_rowcol_on_every_epilogue_path(path):
    fields, shape = PATHS[path]
    assert not rules.check(sm90(**fields), H100, problem=rowcol(**shape))


def test_a_family_without_rowcol_refuses_it_by_the_named_rule(monkeypatch):
    sm90_family = families.get("sm90_wgmma")
    assert Scaling.ROWCOL in sm90_family.scalings
    monkeypatch.setattr(sm90_family, "scalings", frozenset({Scaling.TENSOR}))
    broken = rules.check(sm90(**WIDE), H100, problem=rowcol())
    assert [v.rule for v in broken] == ["family sm90_wgmma supports fp8 scalings"]
    assert broken[0].value == "rowcol" and broken[0].limit == ["tensor"]


# --- rendering, NVRTC and SASS --------------------------------------------------------------------------------

def test_rowcol_renders_the_accumulator_scaling_and_no_per_tensor_alpha():
    source = render(Kernel(Arch.SM90A, rowcol().operands, sm90(**WIDE)), H100)
    assert "scale_rows_cols(acc, scale_a, scale_b," in source and "apply_scales" not in source
    tensor = Problem.create(1000, 777, 1104, "e4m3", "row", "col")
    source = render(Kernel(Arch.SM90A, tensor.operands, sm90(**WIDE)), H100)
    assert "alpha *= apply_scales(scale_a, scale_b)" in source and "scale_rows_cols" not in source


def test_a_swapped_rowcol_kernel_scales_its_rows_by_b_and_its_columns_by_a():
    # The swapped main loop computes D^T: its rows are D's columns (scale_b) and its columns D's rows (scale_a).
    fields, shape = PATHS["swap"]
    source = render(Kernel(Arch.SM90A, rowcol(**shape).operands, sm90(**fields)), H100)
    assert "scale_rows_cols(acc, scale_b, scale_a," in source


@pytest.mark.parametrize("path", ["tma_store", "pingpong", "splitk", "splitk_fused", "streamk", "swap_splitk"])
def test_rowcol_sass_runs_qgmma_with_no_local_memory(path):
    fields, shape = PATHS[path]
    problem = rowcol(bias=True, activation="gelu", **shape)
    compiled = compile_kernel(Kernel(Arch.SM90A, problem.operands, sm90(**fields)), H100)
    counts = instruction_counts(dump_sass(compiled.cubin))
    assert count_prefix(counts, "QGMMA") > 0 and count_prefix(counts, "UTMALDG") > 0
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0, compiled.resources
    assert compiled.spill_bytes == 0


# --- manifests and the loader ---------------------------------------------------------------------------------

def _manifest(problem: Problem, config: TileConfig) -> dict:
    from gemmgen.runtime.manifest import make_manifest

    return json.loads(json.dumps(make_manifest(Kernel(Arch.SM90A, problem.operands, config), problem)))


def _scale_params(manifest: dict) -> dict:
    return {p["name"]: p["shape"] for launch in manifest["launches"] for p in launch["params"]
            if p["name"] in ("scale_a", "scale_b")}


@pytest.mark.parametrize("path", ["staged", "splitk", "swap_splitk"])
def test_manifests_name_the_scale_vectors_and_their_lengths(path):
    from gemmgen.runtime.bundle import check_launches

    fields, shape = PATHS[path]
    problem = rowcol(**shape)
    manifest = _manifest(problem, sm90(**fields))
    assert manifest["operands"]["scaling"] == "rowcol"
    assert Problem.from_dict(manifest["problem"]) == problem
    # Every launch (the reduction's too) names scale_a's M and scale_b's N, in the caller's frame even swapped.
    assert _scale_params(manifest) == {"scale_a": [problem.m], "scale_b": [problem.n]}
    check_launches(manifest)
    manifest["launches"][0]["params"][[p["name"] for p in manifest["launches"][0]["params"]].index("scale_b")][
        "shape"] = [1]
    with pytest.raises(InvalidInput, match=r"params\[\d+\]\.shape must be the kernel's"):
        check_launches(manifest)


def test_a_per_tensor_manifest_names_one_value_per_scale():
    problem = Problem.create(1000, 777, 1104, "e4m3", "row", "col")
    assert _scale_params(_manifest(problem, sm90(**WIDE))) == {"scale_a": [1], "scale_b": [1]}


def test_a_served_shape_gets_scale_vectors_of_its_own_lengths():
    from gemmgen.runtime.serve import kernel_of, manifest_for

    manifest = _manifest(rowcol(), sm90(**WIDE))
    other = rowcol(2000, 512, 4096)
    served = manifest_for(manifest, kernel_of(manifest), other)
    assert _scale_params(served) == {"scale_a": [2000], "scale_b": [512]}


def _info(shape, strides=None, dtype="float32"):
    from gemmgen.runtime.arrays import ArrayInfo

    return ArrayInfo(0x1000, tuple(shape), tuple(strides or (1,) * len(shape)), dtype, 0, 0)


def test_the_loader_takes_scale_vectors_flat_or_in_scaled_mm_s_rowwise_shapes():
    from gemmgen.runtime.arrays import check_operand

    problem = rowcol()
    for shape, strides in (((1000,), (1,)), ((1000, 1), (1, 1))):
        check_operand("scale_a", _info(shape, strides), problem)
    for shape, strides in (((777,), (1,)), ((1, 777), (777, 1))):
        check_operand("scale_b", _info(shape, strides), problem)


@pytest.mark.parametrize("name,shape,why", [
    ("scale_a", (999,), r"scale_a must hold 1000 float32 values, one per row of A \(M\), for rowcol scaling"),
    ("scale_a", (777,), r"scale_a must hold 1000 float32 values"),
    ("scale_a", (1,), r"scale_a must hold 1000 float32 values"),
    ("scale_a", (1, 1000), r"scale_a must hold 1000 float32 values"),
    ("scale_b", (1000,), r"scale_b must hold 777 float32 values, one per column of B \(N\), for rowcol scaling"),
    ("scale_b", (777, 1), r"scale_b must hold 777 float32 values"),
])
def test_the_loader_refuses_scale_vectors_of_the_wrong_length(name, shape, why):
    from gemmgen.runtime.arrays import check_operand

    with pytest.raises(InvalidInput, match=why):
        check_operand(name, _info(shape), rowcol())


def test_the_loader_refuses_a_strided_or_non_float32_scale_vector():
    from gemmgen.runtime.arrays import check_operand

    with pytest.raises(InvalidInput, match="scale_a must be row-major with element strides"):
        check_operand("scale_a", _info((1000,), (2,)), rowcol())
    with pytest.raises(InvalidInput, match="scale_b must have dtype f32"):
        check_operand("scale_b", _info((777,), dtype="bfloat16"), rowcol())


def test_a_per_tensor_kernel_refuses_a_scale_vector():
    from gemmgen.runtime.arrays import check_operand

    problem = Problem.create(1000, 777, 1104, "e4m3", "row", "col")
    check_operand("scale_a", _info(()), problem)
    with pytest.raises(InvalidInput, match="scale_a must be one float32 value for per-tensor scaling"):
        check_operand("scale_a", _info((1000,)), problem)


# --- the tuner's measuring side -----------------------------------------------------------------------------

def test_the_worker_allocates_fills_and_passes_scale_vectors_for_rowcol():
    from gemmgen.tune.bench.policy import manifest_mismatch
    from gemmgen.tune.reference import GemmPointers, operand_bytes, operand_dtypes, storage_shapes

    problem = rowcol()
    shapes = storage_shapes(problem)
    assert shapes["scale_a"] == (1000,) and shapes["scale_b"] == (777,)
    assert operand_bytes(problem)["scale_a"] == 4000 and operand_dtypes(problem)["scale_b"] is DType.F32
    assert "scale_a" not in storage_shapes(Problem.create(1000, 777, 1104, "e4m3", "row", "col"))
    assert GemmPointers(1, 2, 3, scale_a=4, scale_b=5).as_dict() == {"A": 1, "B": 2, "D": 3, "scale_a": 4,
                                                                     "scale_b": 5}
    # A manifest for the other scaling is another problem: the worker refuses to time it.
    manifest = _manifest(rowcol(), sm90(**WIDE))
    assert manifest_mismatch(manifest, rowcol()) == ""
    tensor = Problem.create(1000, 777, 1104, "e4m3", "row", "col")
    assert "scaling='rowcol' (want 'tensor')" in manifest_mismatch(manifest, tensor)


# --- the CLI -----------------------------------------------------------------------------------------------------

def test_the_cli_takes_rowcol_and_exports_a_manifest_naming_the_scales(tmp_path):
    out = tmp_path / "bundle"
    assert main(["tune", "4096", "4096", "4096", "--dtype", "e4m3", "--a", "row", "--b", "col", "--scaling",
                 "rowcol", "--gpu", "h100", "--dry-run", "--top-k", "1", "--jobs", "1", "--out", str(out)]) == 0
    [path] = out.glob("*.json")
    manifest = json.loads(path.read_text())
    assert manifest["problem"]["scaling"] == "rowcol" and "_rowcol_" in manifest["name"]
    assert _scale_params(manifest) == {"scale_a": [4096], "scale_b": [4096]}
    assert "scale_rows_cols(acc," in (out / manifest["source"]).read_text()


def test_roofline_answers_for_rowcol(capsys):
    assert main(["roofline", "4096", "4096", "4096", "--dtype", "e4m3", "--a", "row", "--b", "col",
                 "--scaling", "rowcol", "--gpu", "h100"]) == 0


def test_the_cli_refuses_rowcol_for_bf16_and_an_unknown_scaling(capsys):
    line = refused(capsys, "roofline", "64", "64", "64", "--gpu", "h100", "--scaling", "rowcol")
    assert "scaling 'rowcol' needs fp8 inputs" in line and "'bf16/bf16'" in line
    line = refused(capsys, "roofline", "64", "64", "64", "--gpu", "h100", "--dtype", "e4m3", "--scaling", "rows")
    assert "scaling must be one of tensor, rowcol" in line and "'rows'" in line


# --- block scaling (DeepGEMM's 1x128 for A, 128x128 for B) ---------------------------------------------------------

def block(m=1000, n=1048, k=1104, **kw) -> Problem:
    return Problem.create(m, n, k, "e4m3", "row", "col", scaling="block", **kw)


BLOCK_SQUARE = dict(SQUARE, persistent=True, promote=1)
BLOCK_PATHS = {
    "tma_store": BLOCK_SQUARE,                                                # N = 1048: TMA stores
    "n64": dict(cta="128x64x128", warp="64x64x128", mma="64x64x32", stages=6, persistent=True, promote=1),
    "n16": dict(cta="128x16x128", warp="64x16x128", mma="64x16x32", stages=6, persistent=True, promote=1),
    "pingpong": dict(cta="64x128x128", warp="64x128x128", mma="64x128x32", stages=6, persistent=True,
                     schedule="pingpong", promote=1),
    "cluster": dict(BLOCK_SQUARE, cluster="2x1"),
    "splitk": dict(BLOCK_SQUARE, decomposition={"kind": "splitk", "splits": 3}),
    "splitk_fused": dict(BLOCK_SQUARE, decomposition={"kind": "splitk", "splits": 3, "fused": True}),
}


def test_block_scales_have_deepgemm_s_shapes_and_name_the_kernel():
    problem = block(1000, 1048, 1104)
    assert problem.scale_shapes == ((1000, 9), (9, 9))   # ceil(1104 / 128) = 9 K blocks, ceil(1048 / 128) = 9
    assert block(256, 128, 128).scale_shapes == ((256, 1), (1, 1))
    assert Problem.from_dict(json.loads(json.dumps(problem.to_dict()))) == problem
    assert problem.label.endswith("_rc_block") and problem.operands.tag.endswith("_linear_block")


@pytest.mark.parametrize("path", sorted(BLOCK_PATHS))
def test_the_hopper_family_takes_block_scaling_on_promoting_tiles(path):
    assert not rules.check(sm90(**BLOCK_PATHS[path]), H100, problem=block())


@pytest.mark.parametrize("fields,rule", [
    (dict(SQUARE, persistent=True), "block scaling applies each 128-K block's scales as its partial sums are "
                                    "promoted: promote must be 1"),
    (dict(SQUARE, persistent=True, promote=2), "block scaling applies each 128-K block's scales as its partial "
                                               "sums are promoted: promote must be 1"),
    (dict(cta="128x192x128", warp="64x192x128", mma="64x192x32", stages=4, persistent=True, promote=1),
     "block scaling needs warpgroup tile N a multiple or a divisor of 128 (whole 128-column scale blocks)"),
    (dict(BLOCK_SQUARE, decomposition={"kind": "streamk"}),
     "block scaling is implemented for data-parallel and split-K tiles (not Stream-K)"),
    (dict(SWAP, persistent=True, promote=1), "block scaling is implemented without the operand swap"),
])
def test_block_scaling_refuses_the_tiles_it_is_not_built_for_by_named_rules(fields, rule):
    problem = block(24, 3001, 1040) if fields.get("swap_ab") else block()
    assert rule in [v.rule for v in rules.check(sm90(**fields), H100, problem=problem)]


def test_the_model_s_pick_for_a_block_scaled_problem_promotes_every_k_tile():
    config = default_config(block(4096, 4096, 4096), H100)
    assert config.promote == 1 and not rules.check(config, H100, problem=block(4096, 4096, 4096))


def test_block_scaling_renders_the_scales_into_the_promotion_and_nothing_else():
    source = render(Kernel(Arch.SM90A, block().operands, sm90(**BLOCK_SQUARE)), H100)
    assert "load_block_scales(blk_a, blk_b, scale_a, scale_b, w.kt0 + kt, k_tiles_all," in source
    assert "fmaf(part[mi][i], scale, acc[mi][i])" in source
    assert "apply_scales" not in source and "scale_rows_cols" not in source


@pytest.mark.parametrize("path", ["tma_store", "n16", "pingpong", "splitk_fused"])
def test_block_scaled_sass_runs_qgmma_with_no_local_memory(path):
    problem = block(bias=True, activation="gelu")
    compiled = compile_kernel(Kernel(Arch.SM90A, problem.operands, sm90(**BLOCK_PATHS[path])), H100)
    counts = instruction_counts(dump_sass(compiled.cubin))
    assert count_prefix(counts, "QGMMA") > 0 and count_prefix(counts, "UTMALDG") > 0
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0, compiled.resources
    assert compiled.spill_bytes == 0


def test_block_manifests_name_both_scale_matrices_and_the_loader_checks_them():
    from gemmgen.runtime.arrays import check_operand

    problem = block()
    manifest = _manifest(problem, sm90(**dict(BLOCK_SQUARE, decomposition={"kind": "splitk", "splits": 3})))
    assert manifest["operands"]["scaling"] == "block"
    assert _scale_params(manifest) == {"scale_a": [1000, 9], "scale_b": [9, 9]}
    check_operand("scale_a", _info((1000, 9), (9, 1)), problem)
    check_operand("scale_b", _info((9, 9), (9, 1)), problem)
    with pytest.raises(InvalidInput, match=r"scale_a must have shape \(M, ceil\(K/128\)\): one per row of A and "
                                           r"128 of K for block scaling, but got \(1000, 8\) \(\(1000, 9\) for "):
        check_operand("scale_a", _info((1000, 8), (8, 1)), problem)
    with pytest.raises(InvalidInput, match=r"scale_b must have shape \(ceil\(N/128\), ceil\(K/128\)\)"):
        check_operand("scale_b", _info((1048, 9), (9, 1)), problem)
    with pytest.raises(InvalidInput, match="scale_b must be row-major"):
        check_operand("scale_b", _info((9, 9), (1, 9)), problem)


def test_the_reference_dequantizes_by_blocks_as_the_definition_says():
    torch = pytest.importorskip("torch")
    from gemmgen.tune.reference import dequantize_blocks

    m, n, k = 300, 200, 260
    a, b = torch.randn(m, k, dtype=torch.float64), torch.randn(k, n, dtype=torch.float64)
    sa, sb = torch.rand(m, 3, dtype=torch.float64) + 0.5, torch.rand(2, 3, dtype=torch.float64) + 0.5
    got = torch.matmul(*dequantize_blocks(torch, a, b, sa, sb)).double()
    want = torch.zeros(m, n, dtype=torch.float64)
    for kb in range(3):
        ks = slice(kb * 128, min(k, kb * 128 + 128))
        want += (a[:, ks] @ b[ks, :]) * sa[:, kb, None] * sb[torch.arange(n) // 128, kb][None, :]
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_compulsory_traffic_counts_the_scales():
    tensor = Problem.create(4096, 4096, 4096, "e4m3", "row", "col")
    assert rowcol(4096, 4096, 4096).min_bytes == tensor.min_bytes + 4 * (4096 + 4096)
    assert block(4096, 4096, 4096).min_bytes == tensor.min_bytes + 4 * (4096 * 32 + 32 * 32)
