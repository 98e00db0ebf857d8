"""fp8 (e4m3, e5m2, mixed) and tf32 on every layout, on the GPU (issue 22): operands stored MN-major (A
column-major, B row-major) are transposed by the pack launch into K-major copies, misaligned rows are copied, and
the K-major main loop reads the copies. Shapes are not tile multiples (1000x777x1100, 333x4099x257: odd rows, so
every fp8 operand is packed), a second shape runs through the same bundle, the operand swap and 3xTF32 too.
Each against the fp64 product of the same (fp8- or fp32-valued) inputs, with D poisoned (NaN) first.
Tolerances, ||D - ref|| / ||ref||: fp8 with bf16 D 1e-2 (bf16 output rounding ~2e-3, fp8 wgmma's reduced-precision
accumulation); tf32 with fp32 D 5e-3 (each input rounded to a 10-bit mantissa, ~1e-3); 3xTF32 1e-5 (fp32 class).
NaN never passes. The CPU side: tests/test_fp8_tf32_layouts.py and tests/test_pack_emulated.py.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gemmgen import Problem  # noqa: E402

pytestmark = pytest.mark.gpu
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
DTYPES = [("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("f32", "f32")]
TORCH = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "f32": "float32"}
FP8 = {"family": "sm90_wgmma", "cta": "128x128x128", "warp": "64x128x128", "mma": "64x128x32", "stages": 4,
       "warp_specialized": True, "persistent": True}
TF32 = {"family": "sm90_wgmma", "cta": "128x128x32", "warp": "64x128x32", "mma": "64x128x8", "stages": 4,
        "warp_specialized": True, "persistent": True}
FP8_SWAP = {"family": "sm90_wgmma", "cta": "128x32x128", "warp": "64x32x128", "mma": "64x32x32", "stages": 6,
            "warp_specialized": True, "persistent": True, "swap_ab": True}
TOLERANCE = {1: 1e-2, 4: 5e-3}


# The sm_90 check (autouse) and the export-and-load helper are test_hopper_paths_gpu's.
from test_hopper_paths_gpu import hopper, load  # noqa: E402,F401


def operand(rows: int, cols: int, layout: str, dtype: str):
    """rows x cols of `dtype`, stored row- or column-major (a transposed view of a contiguous tensor)."""
    dt = getattr(torch, TORCH[dtype])
    if layout == "row":
        return torch.randn(rows, cols, device="cuda").to(dt)
    return torch.randn(cols, rows, device="cuda").to(dt).t()


def rel_error(out, ref) -> float:
    if not bool(torch.isfinite(out).all()):
        return float("nan")
    return float((out.double() - ref).norm() / ref.norm())


def check(gemm, a_dtype, b_dtype, a, b, m, n, k, bias=False):
    A, B = operand(m, k, a, a_dtype), operand(k, n, b, b_dtype)
    assert A.stride(1 if a == "row" else 0) == 1 and B.stride(1 if b == "row" else 0) == 1   # stored as asked
    out = torch.float32 if a_dtype == "f32" else torch.bfloat16
    D = torch.full((m, n), float("nan"), device="cuda", dtype=out)
    bias_t = torch.randn(n, device="cuda").to(out) if bias else None
    gemm(A, B, D, **({"bias": bias_t} if bias else {}))
    torch.cuda.synchronize()
    ref = A.float().double() @ B.float().double() + (bias_t.float().double() if bias else 0)
    return rel_error(D, ref)


@pytest.mark.parametrize("a_dtype,b_dtype", DTYPES)
@pytest.mark.parametrize("a,b", LAYOUTS)
def test_every_layout_is_packed_k_major_and_matches_the_fp64_reference(a_dtype, b_dtype, a, b):
    config = TF32 if a_dtype == "f32" else FP8
    tolerance = TOLERANCE[4 if a_dtype == "f32" else 1]
    for (m, n, k), second in (((1000, 777, 1100), (264, 1001, 516)), ((333, 4099, 257), None)):
        problem = Problem.create(m, n, k, a_dtype, a, b, b_dtype=b_dtype, bias=True)
        gemm = load(problem, config)
        # The second shape has the alignments of the first: the same bundle serves it, its copies re-planned.
        for shape in (m, n, k), second:
            if shape is None:
                continue
            err = check(gemm, a_dtype, b_dtype, a, b, *shape, bias=True)
            print(f"{a_dtype}x{b_dtype} {a[0]}{b[0]} {'x'.join(map(str, shape))}: {err:.2e}")
            assert err < tolerance, (shape, err)


@pytest.mark.parametrize("a_dtype,b_dtype", [("e4m3", "e4m3"), ("e5m2", "e4m3")])
@pytest.mark.parametrize("a,b", LAYOUTS)
def test_the_swapped_kernel_transposes_the_operands_its_main_loop_reads_mn_major(a_dtype, b_dtype, a, b):
    # Swapped, the main loop's A is B^T and its B is A^T: row-major B and column-major A are the transposed ones.
    m, n, k = 24, 3001, 1040
    gemm = load(Problem.create(m, n, k, a_dtype, a, b, b_dtype=b_dtype), FP8_SWAP)
    for shape in ((m, n, k), (16, 1000, 784)):
        err = check(gemm, a_dtype, b_dtype, a, b, *shape)
        assert err < TOLERANCE[1], (shape, err)


@pytest.mark.parametrize("a,b", LAYOUTS)
def test_3xtf32_on_every_layout_reaches_fp32_accuracy(a, b):
    config = dict(TF32, split3=True, promote=1)
    for m, n, k in ((1000, 777, 1001), (333, 4099, 257)):   # K not a multiple of 4: split parts stored by element
        gemm = load(Problem.create(m, n, k, "f32", a, b, fp32_math="3xtf32"), config)
        err = check(gemm, "f32", "f32", a, b, m, n, k)
        print(f"3xTF32 {a[0]}{b[0]} {m}x{n}x{k}: {err:.2e}")
        assert err < 1e-5, ((m, n, k), err)
