"""Views with gaps between their rows (a column slice of a wider tensor) through gemmgen's torch ops: on the CPU,
a kernel registered as a plain callable is promised packed operands, so such a view falls back to torch with the
reason named; on the GPU, a stored gemmgen kernel takes the view's leading dimension, or refuses one its alignment
cannot take, which becomes the fallback's reason."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
from gemmgen.model.arch import DType  # noqa: E402
from gemmgen.model.linear import KernelClass  # noqa: E402
from gemmgen.model.problem import Activation, Layout  # noqa: E402
from gemmgen.torch import stats  # noqa: E402
from gemmgen.torch.registry import CPU, REGISTRY, register  # noqa: E402


class PackedOnly:
    """A plain callable kernel: D = A·B, recording what it was given."""

    def __init__(self):
        self.calls = []

    def __call__(self, A, B, D, C=None, bias=None):
        self.calls.append((tuple(A.stride()), tuple(B.stride())))
        D.copy_(A.float() @ B.float())


@pytest.fixture
def packed_only():
    fake = PackedOnly()
    register(KernelClass(DType.BF16, Layout.ROW, Layout.ROW, False, Activation.NONE, None, 24, 40), fake, gpu=CPU)
    stats.reset_stats(warnings_too=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.FallbackWarning)
        yield fake
    REGISTRY.clear()


def test_a_packed_product_reaches_the_registered_callable_and_a_view_falls_back_naming_why(packed_only):
    A = torch.randn(7, 40).bfloat16()
    B = torch.randn(40, 24).bfloat16()
    torch.testing.assert_close(gemmgen.mm(A, B).float(), A.float() @ B.float(), rtol=2e-2, atol=2e-2)
    assert packed_only.calls == [((40, 1), (24, 1))]
    wide = torch.randn(7, 48).bfloat16()
    view = wide[:, :40]                       # rows 48 apart: a gap of 8 after each
    torch.testing.assert_close(gemmgen.mm(view, B).float(), view.float() @ B.float(), rtol=2e-2, atol=2e-2)
    assert len(packed_only.calls) == 1
    reasons = gemmgen.stats()["fallbacks_by_reason"]
    assert any("registered kernel that takes packed operands" in r for r in reasons), reasons


def test_an_operand_with_no_unit_stride_is_named_as_such(packed_only):
    A = torch.randn(7, 80).bfloat16()[:, ::2]   # stride 2 along both meanings of its rows
    B = torch.randn(40, 24).bfloat16()
    torch.testing.assert_close(gemmgen.mm(A, B).float(), A.float() @ B.float(), rtol=2e-2, atol=2e-2)
    assert any("neither row- nor column-major" in r for r in gemmgen.stats()["fallbacks_by_reason"])


@pytest.mark.gpu
def test_stored_kernels_take_views_and_refuse_a_leading_dimension_their_alignment_cannot_take(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    from gemmgen.model.linear import LinearLayer
    from gemmgen.torch.registry import gpu_key
    from gemmgen.tune.linear import tune_linear

    key = gpu_key(0)
    if key is None:
        pytest.skip(f"{torch.cuda.get_device_name(0)} is not in gemmgen's catalogue")
    tokens, in_f, out_f = 333, 520, 776
    layer = LinearLayer.create(in_f, out_f, "bf16", False, "none", tokens)
    products = tune_linear(layer, gemmgen.lookup_gpu(key), dry_run=True, top_k=1, jobs=2, root=tmp_path,
                           roles=("forward",))
    assert all(p.kernel for p in products), [p.result for p in products]
    REGISTRY.use_store(tmp_path)
    stats.reset_stats(warnings_too=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", stats.FallbackWarning)
            W = torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16)
            for extra, on_kernel in ((8, True), (24, True), (3, False)):
                wide = torch.randn(tokens, in_f + extra, device="cuda", dtype=torch.bfloat16)
                X = wide[:, :in_f]
                before = gemmgen.stats()["kernel_calls"]
                Y = gemmgen.linear(X, W)
                torch.cuda.synchronize()
                want = X.float() @ W.float().t()
                assert ((Y.float() - want).abs().max() / want.abs().max()).item() < 1e-2, extra
                assert (gemmgen.stats()["kernel_calls"] == before + 1) == on_kernel, (extra, gemmgen.stats())
        reasons = gemmgen.stats()["fallbacks_by_reason"]
        assert any("refused the call" in r for r in reasons), reasons
    finally:
        REGISTRY.use_store(None)
