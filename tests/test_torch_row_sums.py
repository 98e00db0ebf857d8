"""The Linear backward's bias gradient from the weight-gradient kernel's row sums, on the CPU: a fake kernel
registered for CPU tensors under a row-sums class writes D and the row sums, and gemmgen.nn.Linear's bias gradient
is what it wrote; without such a kernel (or under tracing) the reduction runs on torch as before."""
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

IN, OUT = 48, 32


class RowSumKernel:
    """A weight-gradient kernel with row sums: D = A·B and row_sums = A's row sums, plus a marker (+1000) that
    torch's reduction cannot produce, so a test sees whose db it got."""

    def __init__(self):
        self.calls = []

    def __call__(self, A, B, D, C=None, bias=None, row_sums=None):
        self.calls.append((tuple(A.shape), tuple(B.shape), row_sums is not None))
        D.copy_(A.float() @ B.float())
        if row_sums is not None:
            row_sums.copy_(A.float().sum(1) + 1000.0)


@pytest.fixture
def kernel():
    fake = RowSumKernel()
    # The weight gradient dW = dZ^T·X: M = out, N = in, K = tokens (free); A column-major, B row-major.
    register(KernelClass(DType.BF16, Layout.COL, Layout.ROW, False, Activation.NONE, OUT, IN, None, row_sums=True),
             fake, gpu=CPU)
    stats.reset_stats(warnings_too=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.FallbackWarning)   # the forward and dgrad run on torch here
        yield fake
    REGISTRY.clear()


def _layer_grads(tokens: int):
    torch.manual_seed(0)
    layer = gemmgen.nn.Linear(IN, OUT, dtype=torch.bfloat16)
    x = torch.randn(tokens, IN).bfloat16()
    dy = torch.randn(tokens, OUT).bfloat16()
    layer(x).backward(dy)
    return layer, x, dy


@pytest.mark.parametrize("tokens", [1, 7, 33])
def test_the_bias_gradient_is_the_weight_gradient_kernels_row_sums(kernel, tokens):
    layer, x, dy = _layer_grads(tokens)
    assert kernel.calls == [((OUT, tokens), (tokens, IN), True)]
    torch.testing.assert_close(layer.bias.grad.float(), dy.float().sum(0) + 1000.0, rtol=1e-2, atol=1e-1)
    torch.testing.assert_close(layer.weight.grad.float(), dy.float().t() @ x.float(), rtol=2e-2, atol=2e-2)


def test_without_a_row_sums_kernel_torch_sums_the_bias_gradient():
    REGISTRY.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.FallbackWarning)
        layer, x, dy = _layer_grads(7)
    torch.testing.assert_close(layer.bias.grad, dy.sum(0))


def test_a_plain_weight_gradient_kernel_leaves_the_bias_gradient_to_torch(kernel):
    plain = RowSumKernel()
    REGISTRY.clear()   # only the plain one
    register(KernelClass(DType.BF16, Layout.COL, Layout.ROW, False, Activation.NONE, OUT, IN, None), plain, gpu=CPU)
    layer, x, dy = _layer_grads(7)
    assert plain.calls == [((OUT, 7), (7, IN), False)] and kernel.calls == []
    torch.testing.assert_close(layer.bias.grad, dy.sum(0))


def test_a_weight_gradient_without_bias_runs_on_the_row_sums_kernel_without_them(kernel):
    torch.manual_seed(0)
    layer = gemmgen.nn.Linear(IN, OUT, bias=False, dtype=torch.bfloat16)
    x = torch.randn(5, IN).bfloat16()
    layer(x).sum().backward()
    assert kernel.calls == [((OUT, 5), (5, IN), False)]   # called without row_sums: the kernel skips them
    torch.testing.assert_close(layer.weight.grad.float(), torch.ones(5, OUT).t() @ x.float(), rtol=2e-2, atol=2e-2)

