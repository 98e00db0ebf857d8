"""Rendering against the configuration model: constants follow the config, the banner names the kernel,
the environment is strict."""
from __future__ import annotations

import re
from dataclasses import replace

import jinja2
import pytest

from gemmgen.families import rules as constraints
from gemmgen.model.arch import Arch, DType
from gemmgen.model.errors import InvalidConfig
from gemmgen.model.problem import Activation, Layout, Operands
from gemmgen.codegen.render import environment, render, render_unchecked, template_context
from gemmgen.families.sm80_mma.config import Sm80Config
from gemmgen.model.tiles import (DecompKind, Decomposition, Kernel, Raster, RasterOrder, Shape3, SmemLayout,
                           TileConfig)

BASE = Sm80Config(Shape3(128, 256, 32), Shape3(64, 64, 32), Shape3(16, 8, 16), 3)


def kernel(config=BASE, **ops) -> Kernel:
    return Kernel(Arch.SM80, Operands(**ops), config)


def constant(source: str, name: str) -> int:
    match = re.search(rf"\b{name} = (\d+)", source)
    assert match, f"{name} not found"
    return int(match.group(1))


def test_banner_opens_with_kernel_name_and_config_yaml():
    k = kernel()
    lines = render(k).splitlines()
    assert lines[1] == f"// {k.name}"
    banner = "\n".join(lines[:40])
    for line in BASE.to_yaml().splitlines():
        assert f"//   {line}" in banner


def test_tile_and_pipeline_constants_follow_the_config():
    source = render(kernel())
    assert (constant(source, "BM"), constant(source, "BN"), constant(source, "BK")) == (128, 256, 32)
    assert (constant(source, "WM"), constant(source, "WN")) == (64, 64)
    assert constant(source, "STAGES") == 3
    assert constant(source, "THREADS") == 256
    assert "__launch_bounds__(cfg::THREADS)" in source


def test_changing_stages_and_tile_changes_only_the_right_constants():
    a = render(kernel())
    b = render(kernel(replace(BASE, stages=5, cta=Shape3(128, 128, 32))))
    assert constant(b, "STAGES") == 5 and constant(b, "BN") == 128 and constant(b, "THREADS") == 128
    assert constant(a, "BM") == constant(b, "BM") and constant(a, "BK") == constant(b, "BK")


def test_smem_size_in_source_matches_constraints():
    for layout in SmemLayout:
        cfg = replace(BASE, smem_layout=layout)
        ops = Operands(a_layout=Layout.COL)
        source = render(Kernel(Arch.SM80, ops, cfg))
        assert f"SMEM_BYTES == {constraints.smem_bytes(cfg, ops)}" in source


@pytest.mark.parametrize("a,b,trans_a,trans_b", [("row", "row", False, True), ("row", "col", False, False),
                                                 ("col", "row", True, True), ("col", "col", True, False)])
def test_ldmatrix_trans_only_where_k_is_not_contiguous(a, b, trans_a, trans_b):
    source = render(kernel(a_layout=Layout(a), b_layout=Layout(b)))
    a_call = re.search(r"ldmatrix_x4(_trans)?\(a\[mi\]", source)
    b_call = re.search(r"ldmatrix_x4(_trans)?\(r4", source)
    assert bool(a_call.group(1)) is trans_a
    assert bool(b_call.group(1)) is trans_b


def test_dtype_selects_mma_and_conversions():
    bf = render(kernel())
    f16 = render(kernel(a_dtype=DType.F16, b_dtype=DType.F16, c_dtype=DType.F16))
    assert "m16n8k16.row.col.f32.bf16.bf16.f32" in bf and "cvt.rn.bf16x2.f32" in bf
    assert "m16n8k16.row.col.f32.f16.f16.f32" in f16 and "cvt.rn.f16x2.f32" in f16 and "bf16" not in \
        f16.split("// ---- Types")[1].split("typedef")[0].replace("__nv_bfloat16", "")


def test_splitk_adds_the_reduce_entry_point_and_dp_does_not():
    split = kernel(replace(BASE, decomposition=Decomposition(DecompKind.SPLIT_K, 4)))
    source = render(split)
    assert f"{split.name}_reduce(" in source and constant(source, "SPLITS") == 4
    assert "_reduce(" not in render(kernel())


def test_epilogue_options_reach_the_source():
    plain = render(kernel())
    gelu = render(kernel(bias=True, activation=Activation.GELU))
    relu = render(kernel(activation=Activation.RELU))
    assert "tanhf(inner)" in gelu and "to_f32(bias[col])" in gelu
    assert "tanhf(inner)" not in plain and "to_f32(bias[col])" not in plain
    assert "x > 0.0f ? x : 0.0f" in relu


def test_alignment_selects_copy_width_and_store_width():
    # (64x32 warp tiles: 64x64 ones copying both operands in pieces under 8 bytes spill, and the rules refuse them.)
    narrow = render(kernel(replace(BASE, cta=Shape3(128, 128, 32), warp=Shape3(64, 32, 32)), align_a=2, align_b=1, align_c=1))
    assert "ALIGN_A = 2, ALIGN_B = 1" in narrow
    assert "*reinterpret_cast<u32*>(d) = pack2" not in narrow
    assert "*reinterpret_cast<u32*>(d) = pack2" in render(kernel())


def test_raster_order_and_group_reach_the_source():
    col = render(kernel(replace(BASE, raster=Raster(RasterOrder.COL, 4))))
    assert constant(col, "RASTER_GROUP") == 4 and "Column order" in col
    assert "Row order" in render(kernel())


def test_render_validates_the_config_first():
    bad = replace(BASE, stages=7)
    with pytest.raises(InvalidConfig, match="stages"):
        render(kernel(bad))


def test_strict_undefined_rejects_a_missing_value():
    k = kernel()
    context = template_context(k)
    del context["stages"]
    with pytest.raises(jinja2.UndefinedError, match="stages"):
        render_unchecked(k, context)


def test_one_strict_environment():
    env = environment()
    assert env is environment()
    assert env.undefined is jinja2.StrictUndefined
    assert env.trim_blocks and env.lstrip_blocks and env.keep_trailing_newline


def test_context_holds_only_plain_values_from_the_kernel():
    context = template_context(kernel())
    for key, value in context.items():
        assert isinstance(value, (int, bool, str, list)), key
