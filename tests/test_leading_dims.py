"""Operands that are views wider than themselves (a column slice of a larger array, a QKV split): the leading
dimensions come from the arrays' strides, a kernel serves every one its alignment allows, and its launches carry
them. CPU parts here; on a GPU, each family's kernel runs on such views against a float64 reference, and the
columns of D outside the view stay as they were."""
from __future__ import annotations

import pytest

import gemmgen.families as families
from gemmgen import Arch, Kernel, Problem
from gemmgen.model.arch import lookup_gpu
from gemmgen.model.errors import InvalidInput
from gemmgen.rank.predict import predict
from gemmgen.rank.ranking import rank_configs
from gemmgen.rank.space import default_config, enumerate_space, heuristic_time
from gemmgen.runtime.arrays import expected_layout
from gemmgen.runtime.manifest import make_manifest
from gemmgen.runtime.serve import check_serves, manifest_for, problem_from_shapes

H100 = lookup_gpu("h100")


def best_of(family: str, problem: Problem):
    """The model's pick among one family's configurations for `problem`."""
    ranked = rank_configs(enumerate_space(families.get(family), H100, problem=problem), problem, H100, predict,
                          heuristic_time)
    return ranked[0].config


def scalars(manifest: dict, entry_suffix: str = "") -> dict:
    launch = next(l for l in manifest["launches"] if not entry_suffix or l["entry"].endswith(entry_suffix))
    return {p["name"]: p["value"] for p in launch["params"] if p["kind"] == "scalar"}


def test_leading_dimensions_are_validated_named_and_kept_through_the_manifest():
    p = Problem.create(5, 7, 9, "bf16", "row", "col")
    assert (p.lda, p.ldb, p.ldc, p.packed) == (9, 9, 7, True)
    q = p.with_leading(16, 24, 8)
    assert (q.lda, q.ldb, q.ldc, q.packed) == (16, 24, 8, False) and q.label.endswith("_ld16x24x8")
    assert Problem.from_dict(q.to_dict()) == q and "lda" not in p.to_dict()
    assert p.with_leading(9, 9, 7) == p                      # the packed values are packed
    assert (q.swapped().lda, q.swapped().ldb) == (24, 16)    # B^T's leading dimension is B's
    assert q.with_shape(5, 7, 9) == p
    with pytest.raises(InvalidInput, match=r"lda must be at least .*\(9\).*got 3"):
        p.with_leading(3, 0, 0)
    with pytest.raises(InvalidInput, match="ldb must be"):
        Problem.create(5, 7, 9, "bf16", "row", "col", ldb="x")


def test_views_give_their_leading_dimensions_and_packed_arrays_none():
    base = Problem.create(64, 64, 64, "bf16", "row", "col")
    packed = problem_from_shapes(base, (100, 40), (40, 30), (100, 30), (40, 1), (1, 40), (30, 1))
    assert packed.packed and (packed.m, packed.n, packed.k) == (100, 30, 40)
    view = problem_from_shapes(base, (100, 40), (40, 30), (100, 30), (48, 1), (1, 56), (32, 1))
    assert (view.lda, view.ldb, view.ldc) == (48, 56, 32)
    # One row of A or one column of B: its stride along that axis is never used.
    single = problem_from_shapes(base, (1, 40), (40, 1), (1, 1), (999, 1), (1, 999), (999, 1))
    assert (single.a_ld, single.b_ld) == (0, 0)
    # ... so a one-row D (or A) whose width breaks the kernel's alignment gets a leading dimension that keeps it.
    assert single.ldc == 8
    one = problem_from_shapes(base, (1, 40), (40, 30), (1, 30), (40, 1), (1, 40), (30, 1))
    assert one.ldc == 32 and one.operands.align_c == base.operands.align_c
    # Strides that fit no leading dimension of the layouts are left for the operand check to refuse.
    odd = problem_from_shapes(base, (100, 40), (40, 30), (100, 30), (1, 100), (1, 40), (30, 1))
    assert odd.packed and expected_layout(odd)["A"] == ((100, 40), (40, 1))


def test_an_aligned_kernel_refuses_an_unaligned_view_and_an_unaligned_one_serves_it():
    base = Problem.create(256, 256, 256, "bf16", "row", "col")
    kernel = Kernel(Arch.SM90A, base.operands, default_config(base, H100))
    assert make_manifest(kernel, base)["serves"]["leading_multiple_of"] == {"lda": 8, "ldb": 8, "ldc": 8}
    check_serves(kernel, base.with_leading(264, 264, 264))
    with pytest.raises(InvalidInput, match="align"):
        check_serves(kernel, base.with_leading(257, 0, 0))
    loose = Problem.create(255, 255, 255, "bf16", "row", "col")   # odd sizes: a kernel for unaligned rows
    served = loose.with_leading(0, 0, 0).with_shape(256, 256, 256).with_leading(259, 261, 263)
    check_serves(Kernel(Arch.SM90A, loose.operands, default_config(loose, H100)), served)


@pytest.mark.parametrize("family,shape,layouts", [
    ("sm90_wgmma", (300, 200, 136), ("row", "col")),
    ("sm80_mma", (300, 200, 136), ("col", "row")),
    ("sm80_skinny", (8, 200, 136), ("row", "col")),
    ("sm80_gemv", (3, 200, 136), ("row", "row")),
])
def test_each_family_passes_the_views_leading_dimensions_to_its_launches(family, shape, layouts):
    base = Problem.create(*shape, "bf16", *layouts)
    kernel = Kernel(Arch.SM90A, base.operands, best_of(family, base))
    view = base.with_leading(base.lda + 8, base.ldb + 16, base.ldc + 24)
    served = manifest_for(make_manifest(kernel, base), kernel, view)
    got = scalars(served, kernel.name)
    assert (got["lda"], got["ldb"], got["ldc"], got["ldd"]) == (view.lda, view.ldb, view.ldc, view.ldc)


def test_tma_descriptors_of_a_hopper_kernel_stride_by_the_leading_dimensions():
    base = Problem.create(512, 512, 512, "bf16", "row", "col")
    kernel = Kernel(Arch.SM90A, base.operands, best_of("sm90_wgmma", base))
    view = base.with_leading(520, 528, 536)
    served = manifest_for(make_manifest(kernel, base), kernel, view)
    strides = [p["strides_bytes"][0] for l in served["launches"] for p in l["params"] if "strides_bytes" in p]
    assert 520 * 2 in strides and 528 * 2 in strides


# --- on the GPU ---------------------------------------------------------------------------------

GPU_CASES = [  # family, (M, N, K), layouts, extra elements per leading dimension (A, B, D)
    ("sm90_wgmma", (1000, 520, 264), ("row", "col"), (8, 16, 24)),
    ("sm90_wgmma", (999, 517, 263), ("row", "row"), (3, 5, 7)),        # unaligned: the pack pass reads the views
    ("sm90_wgmma", (16, 1000, 512), ("row", "col"), (8, 8, 8)),        # the model's swapped tile for few rows
    ("sm80_mma", (333, 250, 200), ("col", "row"), (1, 2, 3)),
    ("sm80_skinny", (8, 300, 264), ("row", "col"), (8, 16, 8)),
    ("sm80_gemv", (3, 700, 300), ("row", "row"), (5, 7, 9)),
    ("sm80_gemv", (3, 700, 300), ("row", "row"), (4, 4, 4)),          # 16-byte rows, N's end inside a vector
]


def view(torch, rows, cols, layout, extra, fill=None):
    """A rows x cols operand in `layout` cut from a larger array whose leading dimension is `extra` wider; the
    array is returned too."""
    if layout == "row":
        full = torch.randn(rows, cols + extra, device="cuda").to(torch.bfloat16)
        return full[:, :cols], full
    full = torch.randn(cols, rows + extra, device="cuda").to(torch.bfloat16)
    return full[:, :rows].t(), full


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"{c[0]}-{c[1][0]}x{c[1][1]}x{c[1][2]}-{'-'.join(map(str, c[3]))}"
                                                  for c in GPU_CASES])
def test_a_loaded_kernel_computes_on_views_and_writes_only_inside_d(tmp_path, case):
    torch = pytest.importorskip("torch")
    import gemmgen
    from gemmgen.codegen.nvrtc import compile_kernel
    from gemmgen.tune.export import export_bundle

    family, (m, n, k), (la, lb), (ea, eb, ed) = case
    # The kernel is built for the views' own problem, so its alignment is theirs.
    packed = Problem.create(m, n, k, "bf16", la, lb)
    built_for = packed.with_leading(packed.lda + ea, packed.ldb + eb, packed.ldc + ed)
    kernel = Kernel(Arch.SM90A, built_for.operands, best_of(family, built_for))
    export_bundle(tmp_path, kernel, built_for, compile_kernel(kernel), measured=None, verification=None,
                  environment={})
    gemm = gemmgen.load(tmp_path)
    try:
        for _ in range(2):   # fresh inputs each time; the second call reuses the binding of the first's shapes
            A, _ = view(torch, m, k, la, ea)
            B, _ = view(torch, k, n, lb, eb)
            D_full = torch.full((m, n + ed), float("nan"), device="cuda", dtype=torch.bfloat16)
            D_full[:, n:] = 7.0
            D = D_full[:, :n]
            gemm(A, B, D)
            torch.cuda.synchronize()
            ref = A.double() @ B.double()
            err = float((D.double() - ref).norm() / ref.norm())
            assert err < 1e-2, (kernel.name, err)
            assert bool((D_full[:, n:] == 7.0).all()), "the kernel wrote outside D's view"
    finally:
        gemm.close()


def test_the_tuners_benchmark_allocates_views_with_gaps_and_compares_inside_them():
    import numpy as np

    from gemmgen.tune.reference import in_view, operand_bytes, storage_shapes, view_widths

    p = Problem.create(64, 48, 40, "bf16", "col", "row", beta=1.0)
    assert storage_shapes(p)["A"] == (40, 64) and view_widths(p) == {}
    v = p.with_leading(72, 50, 56)
    shapes = storage_shapes(v)
    assert (shapes["A"], shapes["B"], shapes["C"], shapes["D"]) == ((40, 72), (40, 50), (64, 56), (64, 56))
    assert view_widths(v) == {"A": 64, "B": 48, "C": 48, "D": 48}
    assert operand_bytes(v)["A"] == 40 * 72 * 2
    storage = np.arange(64 * 56).reshape(64, 56)
    assert in_view(storage, v, "D").shape == (64, 48) and in_view(storage, p.with_leading(0, 0, 0), "D") is storage


def test_tune_takes_leading_dimensions_for_one_shape_and_refuses_them_for_a_shape_set(capsys, tmp_path):
    from gemmgen.cli import main
    from gemmgen.tune.suite_file import SuiteFileError, load_shapes

    out = tmp_path / "bundle"
    assert main(["tune", "256", "192", "128", "--lda", "131", "--ldc", "200", "--gpu", "h100", "--dry-run",
                 "--jobs", "0", "--top-k", "1", "--out", str(out)]) == 0
    import json

    manifest = json.loads(next(out.glob("*.json")).read_text())
    assert (manifest["problem"]["lda"], manifest["problem"]["ldc"]) == (131, 200)
    assert "_a1x" in manifest["name"]  # 131 elements apart: rows off 16-byte boundaries
    for argv in (["tune", "--m", "1..16", "--n", "64", "--k", "64", "--ldb", "72", "--gpu", "h100", "--dry-run"],
                 ["tune", "64", "64", "64", "--lda", "63", "--gpu", "h100", "--dry-run"]):
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "not a shape set" in err and "lda must be at least" in err

    suite = tmp_path / "views.yaml"
    suite.write_text("shapes:\n  - {name: qkv_slice, M: 512, N: 512, K: 256, lda: 264, ldc: 1536}\n")
    (shape,) = load_shapes(suite)
    assert shape.problem("bf16").label.endswith("_ld264x512x1536")
    suite.write_text("shapes:\n  - {M: 512, N: 512, K: 256, ldb: 500}\n")
    with pytest.raises(SuiteFileError, match="ldb must be at least"):
        load_shapes(suite)


@pytest.mark.gpu
def test_tune_measures_a_view_and_exports_a_kernel_for_its_leading_dimensions(tmp_path):
    """`gemmgen tune --lda/--ldc` on the GPU: the benchmark allocates the gaps (NaN in them), every trial is
    verified there, and the winner's manifest records the view's leading dimensions."""
    import json

    pytest.importorskip("optuna")
    from gemmgen.cli import main

    out = tmp_path / "bundle"
    argv = ["tune", "300", "200", "100", "--lda", "104", "--ldc", "205", "--trials", "4", "--top-k", "3",
            "--storage", f"sqlite:///{tmp_path / 'studies.db'}", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    manifest = json.loads(next(out.glob("*.json")).read_text())
    assert (manifest["problem"]["lda"], manifest["problem"]["ldc"]) == (104, 205)
    assert manifest["measured"] and manifest["verification"]
