"""A single row of A (column of B) is the same K contiguous elements in either layout: a request (the CLI, suite rows,
shape sets) reads it as K-major (row-major A, column-major B; Problem.k_major_rows), which the tensor-core families
read in place, where a 1 x K column-major A has a 2-byte leading dimension that TMA cannot take and was packed first
(1x5168x576 cr: 6.2 us against cuBLAS's 4.1; docs/perf-notes.md, "One row of A"). Arrays of either layout are accepted
by the kernel built for it; stored problems (manifests, dispatch tables) are read as written."""
from __future__ import annotations

import pytest

from gemmgen.model.arch import lookup_gpu
from gemmgen.model.problem import Layout, Problem
from gemmgen.runtime.arrays import ArrayInfo, check_operand

H100 = lookup_gpu("h100")


@pytest.mark.parametrize("lda", [0, 1])
def test_a_one_row_column_major_a_is_read_as_row_major(lda):
    problem = Problem.create(1, 5168, 576, "bf16", "col", "row", lda=lda).k_major_rows()
    assert problem.a_layout is Layout.ROW and problem.lda == 576 and problem.operands.align_a == 8
    assert problem.label == "1x5168x576_bf16_rr"


def test_a_one_column_row_major_b_is_read_as_column_major():
    problem = Problem.create(77, 1, 576, "bf16", "row", "row").k_major_rows()
    assert problem.b_layout is Layout.COL and problem.ldb == 576


def test_a_strided_view_and_a_stored_problem_keep_their_layout():
    # lda 8: the row's elements 8 apart, not contiguous: still the column-major view it is.
    problem = Problem.create(1, 5168, 576, "bf16", "col", "row", lda=8).k_major_rows()
    assert problem.a_layout is Layout.COL and problem.lda == 8
    assert Problem.create(2, 5168, 576, "bf16", "col", "row").k_major_rows().a_layout is Layout.COL
    # A manifest's problem is read as written: a bundle built for a one-row column-major A stays that bundle.
    stored = Problem.create(1, 5168, 576, "bf16", "col", "row")
    assert Problem.from_dict(stored.to_dict()).a_layout is Layout.COL


def test_the_kernel_for_the_row_major_view_takes_a_column_major_array():
    problem = Problem.create(1, 5168, 576, "bf16", "col", "row").k_major_rows()
    # torch.randn(576, 1).t(): shape (1, 576), strides (1, 1); and a contiguous row: strides (576, 1).
    for strides in ((1, 1), (576, 1)):
        check_operand("A", ArrayInfo(4096, (1, 576), strides, "bfloat16", 0, 0), problem)


def test_the_dry_run_packs_nothing_for_a_one_row_column_major_a(tmp_path):
    from gemmgen.cli import main

    assert main(["tune", "1", "5168", "576", "--a", "col", "--b", "row", "--gpu", "h100", "--dry-run",
                 "--out", str(tmp_path)]) in (0, None)
    import json
    manifest = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert not any(launch["entry"].endswith("_pack") for launch in manifest["launches"])
    assert manifest["problem"]["a_layout"] == "row"


def test_a_shape_set_from_one_row_keeps_the_callers_layout_for_every_bucket(tmp_path):
    # Every bucket's problem is the set's base problem at the bucket's shape: a base built at M = 1 would have read
    # a column-major A as row-major for all of them, and the M = 2..8 buckets' kernels would refuse the caller's A.
    import json

    from gemmgen.cli import main

    assert main(["tune", "--m", "1..8", "--n", "512", "--k", "512", "--a", "col", "--b", "col", "--gpu", "h100",
                 "--dry-run", "--jobs", "0", "--out", str(tmp_path)]) == 0
    dispatch = json.loads((tmp_path / "dispatch.json").read_text())
    assert dispatch["problem"]["a_layout"] == "col"
    layouts = {json.loads(path.read_text())["problem"]["a_layout"] for path in tmp_path.rglob("*.json")
               if path.name != "dispatch.json" and "problem" in json.loads(path.read_text())}
    assert layouts == {"col"}, layouts
