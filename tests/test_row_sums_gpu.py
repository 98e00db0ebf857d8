"""Row sums of A beside D (Epilogue.row_sums) on the GPU: the weight gradient's product dW = dZ^T·X (A column-major,
B row-major) and A row-major too, at shapes that are not tile multiples (1000 x 777 x 333: B's rows odd, so B is
packed), then a second token count through the same bundle (K 2049: the ring wraps many times). Every schedule the
rules allow: cooperative with a 2x1 cluster, a 1x2 cluster multicasting A with the store warp (D through TMA
stores), ping-pong, 256-row tiles (two blocks per row-sum warp), three consumer warpgroups (an odd block count),
one consumer warpgroup, f16. D and the row sums are poisoned (NaN) first, and the row sums' buffer runs 8 elements
past M: those must stay NaN. Against float64 references of the same inputs:
  D: ||D - ref|| / ||ref|| < 1e-2 (bf16 output rounding ~2e-3);
  row sums: |s - ref| <= 2^-8 |ref| + 1e-3 per row (fp32 sums rounded once to bf16/f16). NaN never passes.
Last, gemmgen.nn.Linear's bias gradient from such a bundle registered as the weight-gradient kernel.
CPU side: tests/test_row_sums.py, tests/test_torch_row_sums.py.
"""
from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")

from gemmgen import Problem  # noqa: E402

pytestmark = pytest.mark.gpu
TOLERANCE = 1e-2
BASE = {"family": "sm90_wgmma", "warp_specialized": True, "persistent": True, "raster": {"order": "row", "group": 8}}
COOP = {**BASE, "cta": "128x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 3, "cluster": "2x1"}
A_MCAST = {**COOP, "cluster": "1x2", "store_warp": True}
PINGPONG = {**BASE, "cta": "128x128x64", "warp": "128x128x64", "mma": "64x128x16", "stages": 6,
            "schedule": "pingpong"}
SHORT = {**BASE, "cta": "64x256x64", "warp": "64x256x64", "mma": "64x256x16", "stages": 4}   # one row-sum warp
SQUARE = {**BASE, "cta": "128x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 5}
SINGLE = {"family": "sm90_wgmma", "cta": "64x128x64", "warp": "64x128x64", "mma": "64x128x16", "stages": 6,
          "warp_specialized": True}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}

# The sm_90 check (autouse) and the export-and-load helper are test_hopper_paths_gpu's.
from test_hopper_paths_gpu import hopper, operand, rel_error  # noqa: E402,F401
from test_hopper_paths_gpu import load as export_and_load  # noqa: E402

_loaded = {}


def load(problem: Problem, config: dict):
    """The bundle for (problem, config), compiled once per session (three tests share the cooperative one)."""
    key = (problem, json.dumps(config, sort_keys=True))
    if key not in _loaded:
        _loaded[key] = export_and_load(problem, config)
    return _loaded[key]


def run(gemm, m, n, k, a, b, dtype):
    """One call on fresh inputs: (A, B, D, row sums, the buffer's 8 elements past M)."""
    dt = DTYPES[dtype]
    A, B = operand(m, k, a, dt), operand(k, n, b, dt)
    D = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
    buffer = torch.full((m + 8,), float("nan"), device="cuda", dtype=dt)
    gemm(A, B, D, row_sums=buffer[:m])
    torch.cuda.synchronize()
    return A, B, D, buffer[:m], buffer[m:]


def check(A, B, D, sums, tail):
    assert rel_error(D, A.double() @ B.double()) < TOLERANCE
    ref = A.double().sum(1)
    assert bool(torch.isfinite(sums).all()), "a row sum was not written"
    error = (sums.double() - ref).abs()
    assert bool((error <= 2 ** -8 * ref.abs() + 1e-3).all()), float(error.max())
    assert bool(torch.isnan(tail).all()), "a row past M was written"


@pytest.mark.parametrize("a,b,dtype,config,n", [
    ("col", "row", "bf16", COOP, 777), ("row", "row", "bf16", COOP, 777), ("col", "row", "bf16", A_MCAST, 776),
    ("col", "row", "bf16", PINGPONG, 777), ("col", "row", "bf16", SHORT, 777), ("row", "col", "bf16", SQUARE, 777),
    ("col", "row", "f16", SINGLE, 777)],
    ids=["wgrad-coop2x1", "rowA-coop", "wgrad-1x2-storewarp", "wgrad-pingpong", "wgrad-64rows", "rowA-128x128",
         "wgrad-f16-single"])
def test_row_sums_and_d_match_float64_at_odd_shapes_and_another_token_count(a, b, dtype, config, n):
    m, k = 1000, 333
    gemm = load(Problem.create(m, n, k, dtype, a, b, row_sums=True), config)
    for kk in (k, 2049):   # the second token count through the same bundle
        check(*run(gemm, m, n, kk, a, b, dtype))


def test_a_row_sums_kernel_called_without_them_writes_d_only():
    gemm = load(Problem.create(1000, 777, 333, "bf16", "col", "row", row_sums=True), COOP)
    A, B = operand(1000, 333, "col", torch.bfloat16), operand(333, 777, "row", torch.bfloat16)
    D = torch.full((1000, 777), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(A, B, D)
    torch.cuda.synchronize()
    assert rel_error(D, A.double() @ B.double()) < TOLERANCE


def test_linear_bias_gradient_comes_from_the_registered_row_sums_kernel():
    from gemmgen.model.arch import DType
    from gemmgen.model.linear import KernelClass
    from gemmgen.model.problem import Activation, Layout
    from gemmgen.torch import stats
    from gemmgen.torch.nn import Linear
    from gemmgen.torch.registry import REGISTRY, register

    tokens, in_features, out_features = 333, 777, 1000
    bundle = load(Problem.create(out_features, in_features, tokens, "bf16", "col", "row", row_sums=True), COOP)
    register(KernelClass(DType.BF16, Layout.COL, Layout.ROW, False, Activation.NONE, out_features, in_features, None,
                         row_sums=True), bundle)
    try:
        stats.reset_stats(warnings_too=True)
        torch.manual_seed(0)
        layer = Linear(in_features, out_features, device="cuda", dtype=torch.bfloat16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", stats.FallbackWarning)   # forward and dgrad: no kernel registered
            for _ in range(2):   # the second backward reuses the plan with new outputs
                layer.zero_grad(set_to_none=True)
                x = torch.randn(tokens, in_features, device="cuda").bfloat16()
                dy = torch.randn(tokens, out_features, device="cuda").bfloat16()
                layer(x).backward(dy)
                torch.cuda.synchronize()
                ref = dy.double().sum(0)
                error = (layer.bias.grad.double() - ref).abs()
                assert bool((error <= 2 ** -8 * ref.abs() + 1e-3).all()), float(error.max())
                assert rel_error(layer.weight.grad, dy.double().t() @ x.double()) < TOLERANCE
        assert stats.stats()["kernel_calls"] >= 2
    finally:
        REGISTRY.clear()
