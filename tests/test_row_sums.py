"""Row sums of A beside D (Epilogue.row_sums, a Linear layer's bias gradient from its weight-gradient kernel) on the
CPU: the option's identity and round trips, the rules that refuse it, the rendered kernel, NVRTC and its SASS, the
manifest's row_sums tensor and the loader's checks. tests/test_row_sums_gpu.py runs the kernels."""
from __future__ import annotations

import pytest

from gemmgen import Arch, Kernel, Problem, TileConfig
from gemmgen.codegen.nvrtc import compile_kernel
from gemmgen.codegen.render import render
from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts
from gemmgen.families import rules
from gemmgen.model.arch import lookup_gpu
from gemmgen.model.errors import InvalidInput
from gemmgen.model.linear import KernelClass
from gemmgen.runtime.arrays import ArrayInfo, check_operand, expected_layout
from gemmgen.runtime.loader import LoadedKernel
from gemmgen.runtime.bundle import check_schema
from gemmgen.runtime.manifest import make_manifest
from test_inputs import refused  # the one CLI-refusal check (exit 2, one line, no traceback)
from space_helpers import compile_cache  # noqa: F401 (an autouse fixture: this module's compiles get their own cache)

H100 = lookup_gpu("h100")
BASE = {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, "raster": {"order": "row", "group": 8}}
COOP = {**BASE, "cta": "128x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 3, "cluster": "2x1"}
TALL = {**BASE, "cta": "256x128x64", "warp": "128x128x64", "mma": "64x128x16", "stages": 4}
THREE = {**BASE, "cta": "192x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 4}
PINGPONG = {**BASE, "cta": "128x128x64", "warp": "128x128x64", "mma": "64x128x16", "stages": 6,
            "schedule": "pingpong"}
A_MCAST = {**COOP, "cluster": "1x2", "store_warp": True}


def wgrad(m=1000, n=777, k=333, a="col", b="row", dtype="bf16", **kw) -> Problem:
    """The weight gradient's product: A = dZ^T (out x tokens, column-major), B = X (tokens x in, row-major)."""
    return Problem.create(m, n, k, dtype, a, b, row_sums=True, **kw)


def kernel(problem: Problem, config: dict) -> Kernel:
    return Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict(config))


def broken(problem: Problem, config: dict) -> "list[str]":
    return [v.rule for v in rules.check(TileConfig.from_dict(config), H100, Arch.SM90A, problem)]


def test_row_sums_name_the_kernel_and_round_trip_through_problem_and_kernel_class_dicts():
    problem = wgrad()
    assert "_rowsum_" in kernel(problem, COOP).name
    assert "rowsum" not in kernel(Problem.create(1000, 777, 333, "bf16", "col", "row"), COOP).name
    assert Problem.from_dict(problem.to_dict()) == problem and problem.to_dict()["row_sums"] is True
    assert "row_sums" not in Problem.create(8, 8, 8).to_dict()  # older problems' dicts stay identical
    cls = KernelClass.of(problem, "k")
    assert cls.row_sums and KernelClass.from_dict(cls.to_dict()) == cls and "rowsum" in cls.key
    assert cls.operands_key != KernelClass.of(Problem.create(1000, 777, 333, "bf16", "col", "row"), "k").operands_key
    # D's dtype holds the sums: the compulsory traffic counts them
    assert problem.min_bytes - Problem.create(1000, 777, 333, "bf16", "col", "row").min_bytes == 1000 * 2


@pytest.mark.parametrize("config", [COOP, PINGPONG, A_MCAST], ids=["coop2x1", "pp", "1x2sw"])
def test_data_parallel_sm90_configurations_take_row_sums(config):
    assert broken(wgrad(4096, 4096, 4096), config) == []


@pytest.mark.parametrize("config", [TALL, THREE], ids=["tall", "three"])
def test_tiles_over_128_rows_are_refused_for_row_sums_by_a_named_rule(config):
    """Two 64-row blocks per row-sum warp fell behind the consumers (35-37% slower at 8192 tokens, measured):
    the template builds one block per warp, and a taller tile is refused naming the rule (plain products keep it)."""
    assert broken(wgrad(4096, 4096, 4096), config) == [
        "row sums of A need a CTA tile of at most 128 rows (two 64-row blocks, one per row-sum warp)"]
    assert broken(Problem.create(4096, 4096, 4096, "bf16", "col", "row"), config) == []


@pytest.mark.parametrize("change,rule", [
    ({"decomposition": {"kind": "splitk", "splits": 2}}, "row sums of A are written by data-parallel kernels only"),
    ({"decomposition": {"kind": "streamk", "splits": 1}}, "row sums of A are written by data-parallel kernels only"),
    ({"cta": "128x32x64", "warp": "64x32x64", "mma": "64x32x16", "cluster": "1x1", "swap_ab": True,
      "persistent": True}, "row sums of A are not written by a swapped kernel"),
])
def test_split_k_stream_k_and_the_swap_are_refused_by_a_named_rule(change, rule):
    problem = wgrad(16, 4096, 4096, a="row", b="col") if change.get("swap_ab") else wgrad(4096, 4096, 4096)
    assert any(r.startswith(rule) for r in broken(problem, {**COOP, **change})), broken(problem, {**COOP, **change})


def test_fp8_a_and_other_families_are_refused_by_a_named_rule():
    fp8 = {**COOP, "cta": "128x256x128", "warp": "64x256x128", "mma": "64x256x32"}
    assert "row sums of A are written for 16-bit A (bf16, f16)" in broken(
        Problem.create(4096, 4096, 4096, "e4m3", "row", "col", row_sums=True), fp8)
    sm80 = {"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16", "stages": 3}
    violations = rules.check(TileConfig.from_dict(sm80), lookup_gpu("a100"), Arch.SM80, wgrad())
    assert "family sm80_mma cannot write the row sums of A" in [v.rule for v in violations]


def test_cli_refuses_row_sums_where_no_family_writes_them(capsys):
    line = refused(capsys, "compile", "1000", "777", "333", "--a", "col", "--row-sums", "--gpu", "a100",
                   "--out", "/nonexistent")
    assert "cannot write the row sums of A" in line


@pytest.mark.parametrize("a", ["col", "row"])
def test_render_adds_two_row_sum_warps_to_every_stage_release_and_the_abi(a):
    source = render(kernel(wgrad(a=a), COOP))
    assert "out_t* row_sums, float* workspace" in source
    assert "constexpr int ROW_SUM_WARPS = 2;" in source
    assert "(CONSUMERS * 4 + ROW_SUM_WARPS) * RING_CTAS" in source
    assert "else if (threadIdx.x / 32 >= ROWSUM_WARP0)" in source
    assert f"A_KMAJOR = {'true' if a == 'row' else 'false'}" in source
    plain = render(kernel(Problem.create(1000, 777, 333, "bf16", a, "row"), COOP))
    # A plain kernel renders as before the option (its identity, and so the stored trials, stay valid).
    assert "row_sums" not in plain and "ROW_SUM_WARPS" not in plain and "ROWSUM" not in plain


def _gemm_sass(k: Kernel) -> "tuple[dict, object]":
    compiled = compile_kernel(k, H100)
    text = dump_sass(compiled.cubin)
    part = next(p for p in text.split("Function : ")[1:] if p.split()[0] == k.name)
    return instruction_counts(part), compiled


# The producer warpgroup runs at 40 registers: the row-sum loops, 8 shared-memory loads in flight, must fit them (no
# local memory) with either A layout, on 64- and 128-row tiles, and beside the ping-pong's two consumers.
SHORT = {**BASE, "cta": "64x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 4}


@pytest.mark.parametrize("a,dtype,config", [("col", "bf16", COOP), ("row", "bf16", COOP), ("col", "f16", COOP),
                                            ("row", "f16", SHORT), ("col", "bf16", PINGPONG), ("col", "bf16", SHORT)],
                         ids=["col-coop", "row-coop", "col-f16", "row-short", "col-pp", "col-short"])
def test_row_sum_kernels_compile_to_wgmma_and_tma_with_shared_loads_and_no_local_memory(a, dtype, config):
    counts, compiled = _gemm_sass(kernel(wgrad(4096, 4096, 4096, a=a, dtype=dtype), config))
    assert count_prefix(counts, "HGMMA") > 0 and count_prefix(counts, "UTMALDG") > 0
    assert count_prefix(counts, "LDS") > 0   # the row-sum warps' reads of the ring (the GEMM itself has none)
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0, compiled.resources
    assert compiled.spill_bytes == 0


def test_the_plain_kernel_reads_no_shared_memory_through_lds():
    counts, _ = _gemm_sass(kernel(Problem.create(4096, 4096, 4096, "bf16", "col", "row"), TALL))
    assert count_prefix(counts, "LDS") == 0   # so the count above is the row sums'


def _loaded(problem: Problem, config: dict) -> LoadedKernel:
    return LoadedKernel(make_manifest(kernel(problem, config), problem), b"", "<test>")


def test_manifest_lists_row_sums_as_an_m_long_tensor_and_the_loader_checks_it():
    problem = wgrad()
    manifest = make_manifest(kernel(problem, COOP), problem)
    check_schema({**manifest, "cubin_sha256": "0" * 64})  # what gemmgen.load checks first (export adds the digest)
    assert manifest["operands"]["row_sums"] is True
    main = next(l for l in manifest["launches"] if l["entry"] == manifest["name"])
    names = [p["name"] for p in main["params"]]
    assert names.index("bias") < names.index("row_sums") == names.index("workspace") - 1
    spec = main["params"][names.index("row_sums")]
    assert spec == {"name": "row_sums", "ctype": "__nv_bfloat16*", "kind": "tensor", "tensor": "row_sums",
                    "shape": [1000]}
    loaded = _loaded(problem, COOP)
    assert loaded.problem == problem and expected_layout(problem)["row_sums"] == ((1000,), (1,))
    given = loaded._given("A", "B", "D", None, None, None, None, "rs")
    assert given["row_sums"] == "rs"
    assert "row_sums" not in loaded._given("A", "B", "D", None, None, None, None)   # None: the kernel skips them
    check_operand("row_sums", ArrayInfo(0x1002, (1000,), (1,), "bfloat16", 0, 0), problem)  # 2-byte aligned is enough
    for info, rule in ((ArrayInfo(0x1000, (999,), (1,), "bfloat16", 0, 0), "row_sums must have shape"),
                       (ArrayInfo(0x1000, (1000,), (1,), "float32", 0, 0), "row_sums must have dtype"),
                       (ArrayInfo(0x1001, (1000,), (1,), "bfloat16", 0, 0), "row_sums must be 2-byte aligned")):
        with pytest.raises(InvalidInput, match=rule):
            check_operand("row_sums", info, problem)


def test_a_kernel_without_row_sums_refuses_a_row_sums_array():
    plain = Problem.create(1000, 777, 333, "bf16", "col", "row")
    with pytest.raises(InvalidInput, match="row_sums must be None"):
        _loaded(plain, COOP)._given("A", "B", "D", None, None, None, None, "rs")


def test_a_row_sums_bundle_serves_other_token_counts_but_not_a_plain_problem():
    from gemmgen.runtime.serve import check_serves

    k = kernel(wgrad(), COOP)
    check_serves(k, wgrad(1000, 777, 4097))
    with pytest.raises(InvalidInput, match="must match the kernel's"):
        check_serves(k, Problem.create(1000, 777, 4097, "bf16", "col", "row"))


def test_the_tuner_allocates_verifies_and_times_the_row_sums_as_an_output():
    """A row-sums problem's operand set has an M-long row_sums buffer in D's dtype, passed to the kernel (so the
    timing includes them); the verdict is the worse of D's and the sums' errors, and a NaN sum never passes."""
    import numpy as np

    from gemmgen.tune.reference import Comparison, GemmPointers, _with_row_sums, operand_bytes, storage_shapes

    problem = wgrad()
    assert storage_shapes(problem)["row_sums"] == (problem.m,)
    assert operand_bytes(problem)["row_sums"] == problem.m * 2
    assert "row_sums" not in storage_shapes(Problem.create(1000, 777, 333, "bf16", "col", "row"))
    assert GemmPointers(1, 2, 3, row_sums=9).as_dict() == {"A": 1, "B": 2, "D": 3, "row_sums": 9}
    d_ok = Comparison(1e-3, 0, "torch", None, "")
    want = np.arange(1.0, 5.0)
    assert _with_row_sums(d_ok, None) is d_ok
    assert _with_row_sums(d_ok, (want, want)).rel_error == 1e-3
    worse = _with_row_sums(d_ok, (want * 1.1, want))
    assert abs(worse.rel_error - 0.1) < 1e-9 and "row sums of A: error 1.000e-01" in worse.detail
    unwritten = _with_row_sums(d_ok, (np.array([1.0, np.nan, 3.0, 4.0]), want))
    assert unwritten.rel_error == float("inf") and unwritten.nonfinite == 1
