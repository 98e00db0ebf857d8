"""The Hopper paths added on 2026-11-25, run on the GPU at shapes that are not tile multiples, each against an fp32
reference on fresh random inputs with D poisoned (NaN) first:
  - operands whose leading dimension is not a 16-byte multiple (the pack pass), all four layouts, the operand swap;
  - fp8 (e4m3, e5m2) with per-tensor scales as device scalars, with and without fp32 promotion;
  - mixed fp8 (e4m3 x e5m2 and e5m2 x e4m3, the gradient GEMMs), also through the operand swap;
  - fp8 with per-row and per-column scales (rowcol) through every epilogue path, against a float64 reference;
  - fp8 with DeepGEMM's block scales (A per row and 128 of K, B per 128 x 128), against a float64 reference.
Tolerance: ||D - ref|| / ||ref|| < 1e-2 (bf16 output rounding is ~2e-3); NaN never passes.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
from gemmgen import Arch, Kernel, Problem, TileConfig  # noqa: E402

pytestmark = pytest.mark.gpu
TOLERANCE = 1e-2


@pytest.fixture(scope="module", autouse=True)
def hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU with torch")


def load(problem: Problem, config: dict):
    from gemmgen.codegen.nvrtc import compile_kernel
    from gemmgen.tune.export import export_bundle

    kernel = Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict(config))
    folder = Path(tempfile.mkdtemp(prefix="gemmgen-test-"))
    export_bundle(folder, kernel, problem, compile_kernel(kernel), measured=None, verification=None, environment={})
    return gemmgen.load(folder)


def operand(rows, cols, layout, dtype=torch.bfloat16):
    x = torch.randn(rows, cols, device="cuda") if layout == "row" else torch.randn(cols, rows, device="cuda").t()
    return x.to(dtype)


def rel_error(out, ref) -> float:
    if not bool(torch.isfinite(out).all()):
        return float("nan")
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def bias_relu_error(m: int, n: int, k: int, a: str, b: str, config: dict) -> float:
    """The relative error of `config` exported and loaded for D = relu(A @ B + bias) at m x n x k in layouts a, b, run
    once on fresh random inputs with D poisoned (NaN) first, against the fp32 reference (NaN where D is not finite)."""
    gemm = load(Problem.create(m, n, k, "bf16", a, b, bias=True, activation="relu"), config)
    A, B = operand(m, k, a), operand(k, n, b)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(A, B, D, bias=bias)
    torch.cuda.synchronize()
    return rel_error(D, torch.relu(A.float() @ B.float() + bias.float()))


SM90 = {"family": "sm90_wgmma", "cta": "128x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 4,
        "warp_specialized": True, "persistent": True}


@pytest.mark.parametrize("a,b", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")])
def test_misaligned_operands_are_packed_and_correct_on_every_layout(a, b):
    m, n, k = 333, 517, 259   # every leading dimension odd: A and B packed, D stored element by element
    gemm = load(Problem.create(m, n, k, "bf16", a, b, bias=True, activation="relu"), SM90)
    for mm, nn, kk in ((m, n, k), (129, 1001, 77)):   # a second shape the bundle serves
        A, B = operand(mm, kk, a), operand(kk, nn, b)
        bias = torch.randn(nn, device="cuda").to(torch.bfloat16)
        D = torch.full((mm, nn), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(A, B, D, bias=bias)
        torch.cuda.synchronize()
        ref = torch.relu(A.float() @ B.float() + bias.float())
        assert rel_error(D, ref) < TOLERANCE


def test_misaligned_skinny_product_packs_the_swapped_operands():
    swap = {"family": "sm90_wgmma", "cta": "128x32x64", "warp": "64x32x64", "mma": "64x32x16", "stages": 6,
            "warp_specialized": True, "persistent": True, "swap_ab": True}
    gemm = load(Problem.create(19, 4095, 1001, "bf16", "row", "col"), swap)
    A, B = operand(19, 1001, "row"), operand(1001, 4095, "col")
    D = torch.full((19, 4095), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(A, B, D)
    torch.cuda.synchronize()
    assert rel_error(D, A.float() @ B.float()) < TOLERANCE


@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
@pytest.mark.parametrize("promote", [0, 1])
def test_fp8_with_device_scales_matches_the_fp32_reference(dtype, promote):
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[dtype]
    config = {"family": "sm90_wgmma", "cta": "128x128x128", "warp": "64x128x128", "mma": "64x128x32", "stages": 4,
              "warp_specialized": True, "persistent": True, "promote": promote}
    gemm = load(Problem.create(1000, 1048, 784, dtype, "row", "col", bias=True), config)
    for m, n, k in ((1000, 1048, 784), (77, 3000, 1040)):   # rows of 16-byte multiples, not tile multiples
        a, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
        sa, sb = (a.abs().max() / 200).reshape(()), (b.abs().max() / 200).reshape(())
        A, B = (a / sa).to(fp8), (b / sb).to(fp8).t()
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(A, B, D, bias=bias, scale_a=sa, scale_b=sb)
        torch.cuda.synchronize()
        ref = (A.float() @ B.float()) * (sa * sb) + bias.float()
        assert rel_error(D, ref) < TOLERANCE


FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
MIXED_SWAP = {"family": "sm90_wgmma", "cta": "128x32x128", "warp": "64x32x128", "mma": "64x32x32", "stages": 6,
              "warp_specialized": True, "persistent": True, "swap_ab": True}


# Mixed fp8 (wgmma .e4m3.e5m2 / .e5m2.e4m3): each operand quantized to its own type with its own device scale;
# the reference is the fp32 product of the same fp8 values. The swapped kernel runs B^T (B's type) as its A.
@pytest.mark.parametrize("a_dtype,b_dtype", [("e4m3", "e5m2"), ("e5m2", "e4m3")])
@pytest.mark.parametrize("case", ["promote0", "promote1", "swap"])
def test_mixed_fp8_with_device_scales_matches_the_fp32_reference(a_dtype, b_dtype, case):
    config = MIXED_SWAP if case == "swap" else {
        "family": "sm90_wgmma", "cta": "128x128x128", "warp": "64x128x128", "mma": "64x128x32", "stages": 4,
        "warp_specialized": True, "persistent": True, "promote": int(case[-1])}
    shapes = ((24, 3001, 1040), (7, 1000, 784)) if case == "swap" else ((1000, 1048, 784), (77, 3000, 1040))
    m0, n0, k0 = shapes[0]
    gemm = load(Problem.create(m0, n0, k0, a_dtype, "row", "col", bias=True, b_dtype=b_dtype), config)
    for m, n, k in shapes:   # rows of 16-byte multiples, not tile multiples
        a, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
        sa, sb = (a.abs().max() / 200).reshape(()), (b.abs().max() / 200).reshape(())
        A, B = (a / sa).to(FP8[a_dtype]), (b / sb).to(FP8[b_dtype]).t()
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(A, B, D, bias=bias, scale_a=sa, scale_b=sb)
        torch.cuda.synchronize()
        ref = (A.float() @ B.float()) * (sa * sb) + bias.float()
        assert rel_error(D, ref) < TOLERANCE


def test_mixed_fp8_kernel_refuses_b_of_a_s_type():
    config = {"family": "sm90_wgmma", "cta": "128x128x128", "warp": "64x128x128", "mma": "64x128x32", "stages": 4,
              "warp_specialized": True, "persistent": True}
    gemm = load(Problem.create(256, 256, 256, "e4m3", "row", "col", b_dtype="e5m2"), config)
    A = torch.randn(256, 256, device="cuda").to(torch.float8_e4m3fn)
    B = torch.randn(256, 256, device="cuda").to(torch.float8_e4m3fn).t()
    D = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(gemmgen.InvalidInput, match="B must have dtype e5m2"):
        gemm(A, B, D)


# fp32 D from 16-bit (and fp8) inputs: the staged epilogue stores fp32 (TMA stores stay 16-bit), through every
# decomposition and the operand swap; C and bias are fp32 too.
F32_CASES = {
    "dp": ({"cta": "128x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 4}, (1000, 1003, 517)),
    "splitk": ({"cta": "128x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 4,
                "decomposition": {"kind": "splitk", "splits": 4}}, (300, 500, 4100)),
    "streamk": ({"cta": "128x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 4,
                 "decomposition": {"kind": "streamk"}}, (1000, 1000, 4100)),
    "swap": ({"cta": "128x32x64", "warp": "64x32x64", "mma": "64x32x16", "stages": 6, "swap_ab": True},
             (24, 3001, 1024)),
}


@pytest.mark.parametrize("case", sorted(F32_CASES))
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_fp32_output_from_16_bit_inputs(case, dtype):
    knobs, (m, n, k) = F32_CASES[case]
    config = {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, **knobs}
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    gemm = load(Problem.create(m, n, k, dtype, "row", "col", c_dtype="f32", beta=0.5, bias=True), config)
    A, B = operand(m, k, "row", tdt), operand(k, n, "col", tdt)
    C, bias = torch.randn(m, n, device="cuda"), torch.randn(n, device="cuda")
    D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    gemm(A, B, D, C=C, bias=bias)
    torch.cuda.synchronize()
    ref = A.double() @ B.double() + 0.5 * C.double() + bias.double()
    # fp32 D: no output rounding to 16 bits, so the error is the fp32 accumulation's, far under bf16's.
    assert rel_error(D, ref) < 1e-5


def test_fp32_output_from_fp8_inputs():
    config = {"family": "sm90_wgmma", "cta": "128x128x128", "warp": "64x128x128", "mma": "64x128x32", "stages": 4,
              "warp_specialized": True, "persistent": True}
    m, n, k = 777, 1040, 528
    gemm = load(Problem.create(m, n, k, "e4m3", "row", "col", c_dtype="f32"), config)
    a, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    A, B = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
    D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    gemm(A, B, D)
    torch.cuda.synchronize()
    assert rel_error(D, A.double() @ B.double()) < 1e-3   # fp8 wgmma accumulates with reduced precision


@pytest.mark.parametrize("cta,warp,mma,extra", [
    ("128x256x32", "64x256x32", "64x256x8", {}),
    ("128x128x32", "128x128x32", "64x128x8", {"schedule": "pingpong", "stages": 6}),
    ("64x128x32", "64x128x32", "64x128x8", {"decomposition": {"kind": "splitk", "splits": 4}}),
])
def test_tf32_from_fp32_inputs_matches_the_fp64_reference(cta, warp, mma, extra):
    config = {"family": "sm90_wgmma", "cta": cta, "warp": warp, "mma": mma, "stages": 4,
              "warp_specialized": True, "persistent": True, **extra}
    gemm = load(Problem.create(1000, 1004, 2052, "f32", "row", "col", beta=0.5, bias=True), config)
    for m, n, k in ((1000, 1004, 2052), (77, 3000, 516)):   # 16-byte rows, not tile multiples
        A, B = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda").t()
        C, bias = torch.randn(m, n, device="cuda"), torch.randn(n, device="cuda")
        D = torch.full((m, n), float("nan"), device="cuda")
        gemm(A, B, D, C=C, bias=bias)
        torch.cuda.synchronize()
        ref = A.double() @ B.double() + 0.5 * C.double() + bias.double()
        assert rel_error(D, ref) < 5e-3   # tf32: a 10-bit mantissa on each input, ~1e-3 on the product


@pytest.mark.parametrize("decomposition", [{"kind": "dp"}, {"kind": "splitk", "splits": 2}])
def test_3xtf32_reaches_fp32_accuracy(decomposition):
    # Promotion every k-tile is part of 3xTF32 (rules): without it wgmma's accumulation left 2e-5 on the H100.
    promote = 1
    config = {"family": "sm90_wgmma", "cta": "128x128x32", "warp": "64x128x32", "mma": "64x128x8", "stages": 4,
              "warp_specialized": True, "persistent": True, "split3": True, "decomposition": decomposition,
              "promote": promote}
    gemm = load(Problem.create(1000, 1004, 2052, "f32", "row", "col", bias=True, fp32_math="3xtf32"), config)
    for m, n, k in ((1000, 1004, 2052), (77, 3000, 516)):
        A, B = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda").t()
        bias = torch.randn(n, device="cuda")
        D = torch.full((m, n), float("nan"), device="cuda")
        gemm(A, B, D, bias=bias)
        torch.cuda.synchronize()
        ref = A.double() @ B.double() + bias.double()
        err = rel_error(D, ref)
        print(f"3xTF32 promote={promote} {decomposition['kind']} {m}x{n}x{k}: {err:.2e}")
        assert err < 1e-5   # fp32 GEMM class (plain tf32 reads ~8e-4 here)


@pytest.mark.parametrize("m,config", [
    (16, {"family": "sm90_wgmma", "cta": "64x16x64", "warp": "64x16x64", "mma": "64x16x16", "stages": 12,
          "warp_specialized": True, "persistent": True, "swap_ab": True}),
    (1000, SM90),
    (1000, dict(SM90, decomposition={"kind": "splitk", "splits": 2, "fused": True})),
])
def test_programmatic_launches_read_what_the_previous_kernel_wrote(m, config):
    """PDL: each launch may start while the previous one finishes, and must wait for it before reading. A chain
    of 16 products, each reading as A the D the previous one wrote (as successive layers do), launched back to
    back with no host sync, gives bit for bit what the same chain gives with a sync after every product (the
    kernels are deterministic), and stays near the chain through torch (both round to bf16 each step)."""
    k, steps = 1024, 16
    gemm = load(Problem.create(m, k, k, "bf16", "row", "col"), config)
    main = [l for l in gemm.manifest["launches"] if l["entry"] == gemm.manifest["name"]][0]
    assert main.get("programmatic") is True
    B = (torch.randn(k, k, device="cuda") / k ** 0.5).to(torch.bfloat16).t()   # column-major, norm-preserving
    x0 = operand(m, k, "row")

    def chain(sync: bool):
        xs = [x0] + [torch.full((m, k), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(steps)]
        for i in range(steps):
            gemm(xs[i], B, xs[i + 1])
            if sync:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        return xs[-1]

    back_to_back, synced = chain(False), chain(True)
    ref = x0
    for _ in range(steps):
        ref = (ref.float() @ B.float()).to(torch.bfloat16)
    assert torch.equal(back_to_back, synced)
    assert rel_error(back_to_back, ref) < 5e-2, rel_error(back_to_back, ref)


# fp8 with per-row and per-column scales (rowcol): each row of A and each column of B quantized with its own scale
# (amax / 200, as a rowwise-quantizing user would), D = sa[m] * sb[n] * (A @ B) + bias. One configuration per
# epilogue path, at shapes that are not tile multiples (rows stay 16-byte multiples, fp8's TMA rule); the reference
# is float64 over the same fp8 values and scales. Tolerance 1e-2 (bf16 D, fp8 wgmma accumulation).
_SQUARE = {"cta": "128x128x128", "warp": "64x128x128", "mma": "64x128x32", "stages": 4}
_SWAP = {"cta": "128x32x128", "warp": "64x32x128", "mma": "64x32x32", "stages": 6, "swap_ab": True}
ROWCOL_CASES = {
    # D's rows 16-byte aligned (N = 1048): the TMA-store epilogue; N = 777: the staged one.
    "tma_store": ({"cta": "128x256x128", "warp": "64x256x128", "mma": "64x256x32", "stages": 4},
                  ((1000, 1048, 1104), (77, 3000, 1040))),
    "staged": ({"cta": "128x256x128", "warp": "64x256x128", "mma": "64x256x32", "stages": 4},
               ((1000, 777, 1104), (333, 1001, 528))),
    "pingpong": ({"cta": "128x128x128", "warp": "128x128x128", "mma": "64x128x32", "stages": 6,
                  "schedule": "pingpong"}, ((1000, 1048, 1104), (77, 3000, 1040))),
    "promote": (dict(_SQUARE, promote=1), ((1000, 777, 1104), (77, 3000, 1040))),
    "splitk": (dict(_SQUARE, decomposition={"kind": "splitk", "splits": 3}), ((1000, 777, 1104), (300, 500, 4112))),
    "splitk_fused": (dict(_SQUARE, decomposition={"kind": "splitk", "splits": 3, "fused": True}),
                     ((1000, 777, 1104), (300, 500, 4112))),
    "streamk": (dict(_SQUARE, decomposition={"kind": "streamk"}), ((1000, 777, 1104), (1000, 1000, 4112))),
    # The operand swap: a skinny M; its rows are D's columns, so scale_b scales them.
    "swap": (_SWAP, ((24, 3001, 1040), (7, 1000, 784))),
    "swap_splitk": (dict(_SWAP, decomposition={"kind": "splitk", "splits": 2}), ((24, 3001, 1040), (9, 777, 4112))),
    "swap_fused": (dict(_SWAP, decomposition={"kind": "splitk", "splits": 2, "fused": True}),
                   ((24, 3001, 1040), (9, 777, 4112))),
}


def rowwise_fp8(rows, k, fp8=torch.float8_e4m3fn):
    """A rows x k fp8 matrix quantized row by row (K contiguous), and its float32 scale per row."""
    x = torch.randn(rows, k, device="cuda") * torch.rand(rows, 1, device="cuda").mul(8).exp2()   # rows of unlike size
    scale = x.abs().amax(dim=1) / 200
    return (x / scale[:, None]).to(fp8), scale.float().contiguous()


def scaled_fp8_bundle(knobs: dict, shapes, scaling: str):
    """The bundle of an e4m3 rc product with bias and `scaling`, built for the first of `shapes` (the case's
    tile knobs on the persistent warp-specialized kernel)."""
    config = {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, **knobs}
    m0, n0, k0 = shapes[0]
    return load(Problem.create(m0, n0, k0, "e4m3", "row", "col", bias=True, scaling=scaling), config)


@pytest.mark.parametrize("case", sorted(ROWCOL_CASES))
def test_fp8_rowcol_scales_match_the_fp64_reference_on_every_epilogue_path(case):
    knobs, shapes = ROWCOL_CASES[case]
    gemm = scaled_fp8_bundle(knobs, shapes, "rowcol")
    for i, (m, n, k) in enumerate(shapes):   # the second a shape the bundle serves
        A, sa = rowwise_fp8(m, k)
        Bt, sb = rowwise_fp8(n, k)
        B = Bt.t()   # column-major K x N: B's columns are Bt's rows, each with its scale
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        # Flat vectors, or torch._scaled_mm's rowwise shapes (M, 1) and (1, N).
        gemm(A, B, D, bias=bias, scale_a=sa if i == 0 else sa[:, None], scale_b=sb if i == 0 else sb[None, :])
        torch.cuda.synchronize()
        ref = (A.double() @ B.double()) * sa.double()[:, None] * sb.double()[None, :] + bias.double()
        err = rel_error(D, ref)
        print(f"rowcol {case} {m}x{n}x{k}: {err:.2e}")
        assert err < TOLERANCE


def test_fp8_rowcol_follows_cublas_rowwise_convention():
    """The kernel's D = sa[m] * sb[n] * (A @ B) is torch._scaled_mm's rowwise scaling: both land within the
    tolerance of the float64 reference, and of each other."""
    config = {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, **_SQUARE}
    m, n, k = 1000, 1048, 1104
    gemm = load(Problem.create(m, n, k, "e4m3", "row", "col", scaling="rowcol"), config)
    A, sa = rowwise_fp8(m, k)
    Bt, sb = rowwise_fp8(n, k)
    D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(A, Bt.t(), D, scale_a=sa, scale_b=sb)
    torch.cuda.synchronize()
    ref = (A.double() @ Bt.t().double()) * sa.double()[:, None] * sb.double()[None, :]
    assert rel_error(D, ref) < TOLERANCE
    try:
        cublas = torch._scaled_mm(A, Bt.t(), sa[:, None], sb[None, :], out_dtype=torch.bfloat16)
    except RuntimeError as exc:   # a torch/cuBLAS without rowwise scaling
        pytest.skip(f"torch._scaled_mm has no rowwise scaling here: {exc}")
    print(f"rowcol vs fp64: gemmgen {rel_error(D, ref):.2e}, cuBLAS {rel_error(cublas, ref):.2e}")
    assert rel_error(cublas, ref) < TOLERANCE and rel_error(D, cublas.double()) < TOLERANCE


# fp8 with block scales (DeepGEMM's): A quantized per row and 128-wide K block, B per 128 x 128 block of N x K, over
# values whose magnitude changes across rows and K blocks (so a scale applied to the wrong block shows). The
# reference dequantizes the same fp8 values by the same scales in float64. Tolerance 1e-2 (bf16 D).
_BLOCK_SQUARE = dict(_SQUARE, promote=1)
BLOCK_CASES = {
    "tma_store": (_BLOCK_SQUARE, ((1000, 1048, 1104), (77, 3000, 1040))),
    "staged": (_BLOCK_SQUARE, ((1000, 777, 1104), (333, 1001, 528))),
    "n64": ({"cta": "128x64x128", "warp": "64x64x128", "mma": "64x64x32", "stages": 6, "promote": 1},
            ((1000, 777, 1104), (77, 3000, 1040))),
    "pingpong": ({"cta": "64x128x128", "warp": "64x128x128", "mma": "64x128x32", "stages": 6, "promote": 1,
                  "schedule": "pingpong"}, ((1000, 1048, 1104), (77, 3000, 1040))),
    "cluster": (dict(_BLOCK_SQUARE, cluster="2x1"), ((1000, 1048, 1104), (77, 3000, 1040))),
    "splitk": (dict(_BLOCK_SQUARE, decomposition={"kind": "splitk", "splits": 3}),
               ((1000, 777, 1104), (300, 500, 4112))),
    "splitk_fused": (dict(_BLOCK_SQUARE, decomposition={"kind": "splitk", "splits": 3, "fused": True}),
                     ((1000, 777, 1104), (300, 500, 4112))),
}


def blockwise_fp8(rows, k, rows_per_block, fp8=torch.float8_e4m3fn):
    """A rows x k fp8 matrix (K contiguous) quantized per block of rows_per_block rows x 128 of K, and its
    float32 scales [ceil(rows / rows_per_block), ceil(k / 128)]."""
    kb, rb = -(-k // 128), -(-rows // rows_per_block)
    x = torch.randn(rows, k, device="cuda") * torch.rand(rows, 1, device="cuda").mul(6).exp2()
    x = x * torch.rand(1, kb, device="cuda").mul(6).exp2().repeat_interleave(128, dim=1)[:, :k]
    padded = torch.nn.functional.pad(x, (0, kb * 128 - k, 0, rb * rows_per_block - rows))
    amax = padded.reshape(rb, rows_per_block, kb, 128).abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = (amax / 200).float().contiguous()
    expand = scale.repeat_interleave(rows_per_block, dim=0).repeat_interleave(128, dim=1)[:rows, :k]
    return (x / expand).to(fp8).contiguous(), scale


def dequantized(q, scale, rows_per_block):
    expand = scale.double().repeat_interleave(rows_per_block, dim=0).repeat_interleave(128, dim=1)
    return q.double() * expand[:q.shape[0], :q.shape[1]]


@pytest.mark.parametrize("case", sorted(BLOCK_CASES))
def test_fp8_block_scales_match_the_fp64_reference(case):
    knobs, shapes = BLOCK_CASES[case]
    gemm = scaled_fp8_bundle(knobs, shapes, "block")
    for m, n, k in shapes:   # the second a shape the bundle serves
        A, sa = blockwise_fp8(m, k, 1)       # [M, ceil(K/128)]
        Bt, sb = blockwise_fp8(n, k, 128)    # [ceil(N/128), ceil(K/128)]
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(A, Bt.t(), D, bias=bias, scale_a=sa, scale_b=sb)
        torch.cuda.synchronize()
        ref = dequantized(A, sa, 1) @ dequantized(Bt, sb, 128).t() + bias.double()
        err = rel_error(D, ref)
        print(f"block {case} {m}x{n}x{k}: {err:.2e}")
        assert err < TOLERANCE


@pytest.mark.parametrize("scaling,knobs", [("rowcol", _SQUARE), ("block", _BLOCK_SQUARE)])
def test_the_tuner_s_worker_fills_verifies_and_times_scaled_fp8(scaling, knobs):
    """The measuring worker (tune/bench) allocates and fills the scale vectors or blocks, verifies against its
    scaled torch reference and times the kernel; cuBLAS is timed with rowwise _scaled_mm where torch has it."""
    from gemmgen.codegen.nvrtc import compile_kernel
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.tune.bench import GpuBenchmark

    problem = Problem.create(1000, 777, 1104, "e4m3", "row", "col", bias=True, scaling=scaling)
    kernel = Kernel(Arch.SM90A, problem.operands, TileConfig.from_dict(
        {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, **knobs}))
    compiled = compile_kernel(kernel)
    bench = GpuBenchmark()
    try:
        m = bench.measure(make_manifest(kernel, problem, compiled), compiled.cubin, problem)
        assert m.ok and m.backend == "torch" and m.rel_error < m.threshold, m.reason
        cublas = bench.cublas_time(problem)
        print(f"worker {scaling}: error {m.rel_error:.2e}, {m.time_s * 1e6:.1f} us; cuBLAS {cublas}")
        assert cublas is None or cublas > 0
    finally:
        bench.close()


# Staggered promotion (promote_stagger): the second warpgroup's intervals end promote/2 k-tiles earlier, so its
# first interval is shorter and its partial sums are promoted at other k-tiles: not the same bits as plain
# promotion, but the same accuracy. Checked against float64 and against plain promotion's error on the same
# inputs (within 5%). K values: fewer k-tiles than the stagger (K = 208), an odd count of intervals, a K that is not
# a multiple of 128, split-K's shorter per-split k-ranges, a 2x1 cluster, 3xTF32's split3 kernel.
STAGGER_CASES = {
    "pr2": ({**_SQUARE, "promote": 2}, ((1000, 1048, 1104), (77, 3000, 208), (300, 520, 656))),
    "pr4": ({**_SQUARE, "promote": 4}, ((1000, 1048, 2960), (77, 3000, 208), (300, 520, 1424))),
    "pr4_n192": ({"cta": "128x192x128", "warp": "64x192x128", "mma": "64x192x32", "stages": 4, "promote": 4},
                 ((1000, 1048, 2960), (300, 520, 1424))),
    "pr2_cluster": ({**_SQUARE, "promote": 2, "cluster": "2x1"}, ((1000, 1048, 1104), (300, 520, 656))),
    "pr2_splitk": ({**_SQUARE, "promote": 2, "decomposition": {"kind": "splitk", "splits": 3}},
                   ((1000, 777, 1104), (300, 500, 4112))),
}


@pytest.mark.parametrize("case", sorted(STAGGER_CASES))
def test_staggered_promotion_is_as_accurate_as_plain_promotion(case):
    knobs, shapes = STAGGER_CASES[case]
    plain = scaled_fp8_bundle(knobs, shapes, "tensor")
    staggered = scaled_fp8_bundle({**knobs, "promote_stagger": True}, shapes, "tensor")
    for m, n, k in shapes:
        a, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
        sa, sb = (a.abs().max() / 200).reshape(()), (b.abs().max() / 200).reshape(())
        A, Bt = (a / sa).to(torch.float8_e4m3fn), (b / sb).to(torch.float8_e4m3fn)
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        ref = (A.double() @ Bt.double().t()) * float(sa * sb) + bias.double()
        errors = []
        for gemm in (plain, staggered):
            D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            gemm(A, Bt.t(), D, bias=bias, scale_a=sa, scale_b=sb)
            torch.cuda.synchronize()
            errors.append(rel_error(D, ref))
        print(f"stagger {case} {m}x{n}x{k}: plain {errors[0]:.3e}, staggered {errors[1]:.3e}")
        assert errors[1] < TOLERANCE and errors[1] <= 1.05 * errors[0]


def test_staggered_3xtf32_keeps_fp32_accuracy():
    config = {"family": "sm90_wgmma", "cta": "128x128x32", "warp": "64x128x32", "mma": "64x128x8", "stages": 4,
              "warp_specialized": True, "persistent": True, "split3": True, "promote": 8, "promote_stagger": True}
    m, n, k = 1000, 1048, 2052
    gemm = load(Problem.create(m, n, k, "f32", "row", "col", fp32_math="3xtf32"), config)
    A, B = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda").t()
    D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    gemm(A, B, D)
    torch.cuda.synchronize()
    err = rel_error(D, A.double() @ B.double())
    print(f"3xTF32 staggered {m}x{n}x{k}: {err:.2e}")
    assert err < 2e-6   # cuBLAS fp32: ~1e-6 at this K


# Composed stores (launch.uses_composed_stores): a 16-bit D whose rows are not 16-byte aligned, so no TMA store;
# the consumers stage D in the store boxes and write each row as aligned 16-byte stores composed from two staged
# 8-element groups, the row's ends as 2-byte stores. D (odd N: its rows start on every 2-byte offset) lies inside a
# larger NaN-filled buffer with guard elements on both sides: a store outside D shows as a changed guard.
# Tiles whose warp shares fit their store boxes (128x256 s3, a narrow tile) take the composed stores; those whose
# share does not (128x256 s4, 64x256 ping-pong) keep the staged element stores, checked the same way. Odd M and N,
# bias + GELU + beta.
COMPOSED = {
    "128x256_s3": {"cta": "128x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 3},
    "128x256_s4_cl2x1": {"cta": "128x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 4, "cluster": "2x1"},
    "64x256_pp": {"cta": "64x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 5, "schedule": "pingpong"},
    "128x64": {"cta": "128x64x64", "warp": "64x64x64", "mma": "64x64x16", "stages": 6},
}


def bias_gelu_beta_error(gemm, m: int, n: int, k: int, a: str, b: str, D) -> float:
    """gemm on fresh A, B, C and bias (the bundles below: beta 0.5, bias, GELU) into D, which the caller poisoned:
    the relative error against the fp32 epilogue of A @ B."""
    A, B = operand(m, k, a), operand(k, n, b)
    C = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    gemm(A, B, D, C=C, bias=bias)
    torch.cuda.synchronize()
    ref = torch.nn.functional.gelu(A.float() @ B.float() + 0.5 * C.float() + bias.float(), approximate="tanh")
    return rel_error(D, ref)


@pytest.mark.parametrize("case", sorted(COMPOSED))
@pytest.mark.parametrize("a,b", [("row", "row"), ("col", "col")])
def test_an_unaligned_d_leaves_as_composed_16_byte_stores_and_nothing_outside_it(case, a, b):
    config = {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, **COMPOSED[case]}
    m, n, k = 1001, 1999, 515
    gemm = load(Problem.create(m, n, k, "bf16", a, b, bias=True, activation="gelu", beta=0.5), config)
    for mm, nn, kk in ((m, n, k), (333, 517, 259), (70, 9, 77)):
        # D contiguous (the bundle's ldd is N; the loader wants its start 16-byte aligned) inside a NaN-filled
        # buffer, 8 guard elements before it and 10 after.
        full = torch.full((mm * nn + 18,), float("nan"), device="cuda", dtype=torch.bfloat16)
        err = bias_gelu_beta_error(gemm, mm, nn, kk, a, b, full[8:8 + mm * nn].view(mm, nn))
        print(f"composed {case} {a}{b} {mm}x{nn}x{kk}: {err:.2e}")
        assert err < TOLERANCE
        guard = torch.cat([full[:8], full[8 + mm * nn:]])
        assert bool(torch.isnan(guard).all()), f"{case}: a store landed outside D"


# Two 64-row tiles in a 2x1 cluster (search space `skinny_clusters`): for M <= 128 the pair covers every row and
# multicasts B's tile. Every layout, M below, inside and at the pair's 128 rows (one CTA of the pair without rows
# when M <= 64), odd N, K down to one k-tile, bias + GELU + beta; D poisoned first.
SKINNY_CLUSTERS = {
    "64x128_s6": {"cta": "64x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 6, "cluster": "2x1"},
    "64x256_s4": {"cta": "64x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 4, "cluster": "2x1"},
}


@pytest.mark.parametrize("case", sorted(SKINNY_CLUSTERS))
@pytest.mark.parametrize("a,b", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")])
def test_two_64_row_tiles_in_a_cluster_share_b_and_compute_every_row(case, a, b):
    config = {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, **SKINNY_CLUSTERS[case]}
    gemm = load(Problem.create(100, 1999, 520, "bf16", a, b, bias=True, activation="gelu", beta=0.5), config)
    # (M keeps column-major A's leading dimension on the bundle's alignment: 100 elements, 8-byte rows.)
    for mm, nn, kk in ((100, 1999, 520), (128, 4104, 1032), (68, 520, 8), (4, 1000, 264)):
        D = torch.full((mm, nn), float("nan"), device="cuda", dtype=torch.bfloat16)
        err = bias_gelu_beta_error(gemm, mm, nn, kk, a, b, D)
        print(f"skinny cluster {case} {a}{b} {mm}x{nn}x{kk}: {err:.2e}")
        assert err < TOLERANCE


# Tiles as wide as a batch's M (search spaces `batch_swap`, `batch_narrow`): swapped tiles whose N (the problem's
# M) is 48-112 columns, alone or in 1x2 pairs sharing the weights' tile and 2x1 pairs sharing the activations';
# and 64x96 tiles unswapped in 2x1 pairs. Their N is not a multiple of 64: a K-major box of the tile's height and
# the staged epilogue's 16-column chunks. M at the most the kernel serves, just past one tile, about half a tile
# and 3; odd N, K down to one k-tile; bias + GELU + beta; D poisoned first.
BATCH_TILES = {
    "swap_64x48_1x2": ({"cta": "64x48x64", "warp": "64x48x64", "mma": "64x48x16", "stages": 12, "cluster": "1x2",
                        "swap_ab": True}, [("row", "col")]),
    "swap_128x48_1x2": ({"cta": "128x48x64", "warp": "64x48x64", "mma": "64x48x16", "stages": 8, "cluster": "1x2",
                         "swap_ab": True}, [("row", "col"), ("row", "row")]),
    "swap_64x80": ({"cta": "64x80x64", "warp": "64x80x64", "mma": "64x80x16", "stages": 10, "cluster": "1x1",
                    "swap_ab": True}, [("row", "col"), ("row", "row")]),
    "swap_64x112_2x1": ({"cta": "64x112x64", "warp": "64x112x64", "mma": "64x112x16", "stages": 8, "cluster": "2x1",
                         "swap_ab": True}, [("row", "col"), ("row", "row")]),
    "narrow_64x96_2x1": ({"cta": "64x96x64", "warp": "64x96x64", "mma": "64x96x16", "stages": 10, "cluster": "2x1"},
                         [("row", "col"), ("col", "col")]),
}


@pytest.mark.parametrize("case,a,b", [(c, a, b) for c, (_, layouts) in sorted(BATCH_TILES.items()) for a, b in layouts])
def test_tiles_as_wide_as_the_batch_compute_every_row(case, a, b):
    fields, _ = BATCH_TILES[case]
    config = {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, **fields}
    cta_m, cta_n = (int(x) for x in fields["cta"].split("x")[:2])
    cl_m, cl_n = (int(x) for x in fields["cluster"].split("x"))
    m_max = cta_n * cl_n if fields.get("swap_ab") else cta_m * cl_m
    tile = cta_n if fields.get("swap_ab") else cta_m
    gemm = load(Problem.create(m_max, 1999, 520, "bf16", a, b, bias=True, activation="gelu", beta=0.5), config)
    # (M keeps column-major A's leading dimension on the bundle's alignment: multiples of 8 elements.)
    for mm, nn, kk in ((m_max, 1999, 520), (tile + 8, 4104, 1032), (tile // 2 + 8 if a == "col" else tile // 2 + 1,
                                                                      520, 64), (8 if a == "col" else 3, 1000, 264)):
        mm = min(mm, m_max)
        D = torch.full((mm, nn), float("nan"), device="cuda", dtype=torch.bfloat16)
        err = bias_gelu_beta_error(gemm, mm, nn, kk, a, b, D)
        print(f"batch tile {case} {a}{b} {mm}x{nn}x{kk}: {err:.2e}")
        assert err < TOLERANCE


# The batch tiles for fp8 and fp32 (tf32) inputs, whose B reaches shared memory K-major in any layout (packed where
# it is not): the swapped 64x48 pair (1x2) and the unswapped 64x96 pair (2x1), with BK one 128-byte row.
@pytest.mark.parametrize("dtype", ["e4m3", "f32"])
@pytest.mark.parametrize("swapped", [True, False])
def test_batch_tiles_for_fp8_and_tf32_match_the_fp32_reference(dtype, swapped):
    bk, mk = (128, 32) if dtype == "e4m3" else (32, 8)
    tile, cluster = ("64x48", "1x2") if swapped else ("64x96", "2x1")
    config = {"family": "sm90_wgmma", "cta": f"{tile}x{bk}", "warp": f"{tile}x{bk}",
              "mma": f"64x{tile.split('x')[1]}x{mk}", "stages": 6, "cluster": cluster, "swap_ab": swapped,
              "warp_specialized": True, "persistent": True}
    m_max = 96 if swapped else 128
    gemm = load(Problem.create(m_max, 1000, 784, dtype, "row", "col", bias=True), config)
    for m, n, k in ((m_max, 1000, 784), (50, 3000, 1040), (3, 520, 128)):
        a, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
        bias = torch.randn(n, device="cuda")
        if dtype == "e4m3":
            sa, sb = (a.abs().max() / 200).reshape(()), (b.abs().max() / 200).reshape(())
            A, B = (a / sa).to(torch.float8_e4m3fn), (b / sb).to(torch.float8_e4m3fn).t()
            bias = bias.to(torch.bfloat16)
            D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            gemm(A, B, D, bias=bias, scale_a=sa, scale_b=sb)
            ref = (A.float() @ B.float()) * (sa * sb) + bias.float()
        else:
            A, B = a, b.t()
            D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
            gemm(A, B, D, bias=bias)
            ref = A.double() @ B.double() + bias.double()
        torch.cuda.synchronize()
        err = rel_error(D, ref)
        print(f"batch tile {dtype} {tile} {cluster} {m}x{n}x{k}: {err:.2e}")
        assert err < TOLERANCE


# Tile widths that fit the waves (search spaces `widths`, `widths_256`): 128-, 192- and 256-row tiles whose N is a
# multiple of 16 but not of 64, for K-major B (column-major B), with the staged epilogue; alone and in clusters.
# Shapes that are not tile multiples (odd M, N past a partial tile, K past a partial k-tile), a second and third shape
# through the same bundle, row- and column-major A, bias + GELU + beta; D poisoned first.
WIDTHS = {
    "128x144_s6": {"cta": "128x144x64", "warp": "64x144x64", "mma": "64x144x16", "stages": 6},
    "128x208_s4_cl2x1": {"cta": "128x208x64", "warp": "64x208x64", "mma": "64x208x16", "stages": 4, "cluster": "2x1"},
    "192x112_s4_cl2x1": {"cta": "192x112x64", "warp": "64x112x64", "mma": "64x112x16", "stages": 4, "cluster": "2x1"},
    "256x160_s3": {"cta": "256x160x64", "warp": "128x160x64", "mma": "64x160x16", "stages": 3},
}


@pytest.mark.parametrize("case", sorted(WIDTHS))
@pytest.mark.parametrize("a", ["row", "col"])
def test_width_tiles_match_the_fp32_reference_at_shapes_that_are_not_tile_multiples(case, a):
    config = {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, **WIDTHS[case]}
    gemm = load(Problem.create(513, 4104, 1032, "bf16", a, "col", bias=True, activation="gelu", beta=0.5), config)
    for mm, nn, kk in ((513, 4104, 1032), (777, 1000, 520), (8, 136, 72)):
        D = torch.full((mm, nn), float("nan"), device="cuda", dtype=torch.bfloat16)
        err = bias_gelu_beta_error(gemm, mm, nn, kk, a, "col", D)
        print(f"width tile {case} {a[0]}c {mm}x{nn}x{kk}: {err:.2e}")
        assert err < TOLERANCE
