"""The benchmarks' shape arguments (benchmarks/harness.py): a bad one is an InvalidInput (which the benchmarks'
run_main prints as one line with exit status 2), never a ValueError from int() or an unpacking."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gemmgen.model.errors import InvalidInput

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402


def test_good_shapes_parse():
    assert harness.product_shape("4096x1x13") == (4096, 1, 13)
    problem = harness.shape_problem("16,4096,4095,cr")
    assert (problem.m, problem.n, problem.k) == (16, 4096, 4095)
    assert (problem.a_layout.value, problem.b_layout.value) == ("col", "row")


@pytest.mark.parametrize("text", ["12x", "4096x4096", "0x1x1", "ax2x3", "1x2x3x4", "-1x2x3"])
def test_a_bad_product_shape_names_the_rule_and_the_text(text):
    with pytest.raises(InvalidInput, match="three positive integers") as info:
        harness.product_shape(text)
    assert text in str(info.value)


@pytest.mark.parametrize("text", ["16,4096,rc", "16,4096,4096,rx", "16,4096,4096", "a,b,c,rc"])
def test_a_bad_layout_shape_is_refused(text):
    with pytest.raises(InvalidInput):
        harness.shape_problem(text)
