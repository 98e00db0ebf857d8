"""gemmgen's torch ops on the GPU: the kernel path against torch's fp32 reference at shapes that are not tile
multiples, its gradients, a side stream, CUDA graph capture and DLPack.

The kernels are the model's picks for each product (tune-linear's dry run, compiled for this GPU, not measured),
stored in a temporary kernel store: this checks correctness and dispatch, not speed (benchmarks/linear_bench.py).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
from torch_helpers import linear_store, torch_act  # noqa: E402
from torch_helpers import quiet_fallbacks  # noqa: E402,F401

pytestmark = pytest.mark.gpu

IN, OUT, TOKENS = 520, 776, 333  # 8-aligned (the kernels' vector width), not multiples of any tile


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A kernel store holding the three products of Linear(IN, OUT, bias) for each activation, tuned at TOKENS
    (the weight gradient writing the bias gradient too)."""
    yield from linear_store(tmp_path_factory, IN, OUT, TOKENS, ("none", "relu", "gelu", "silu"))


act = torch_act


def run(layer, x, g, reference=None):
    x = x.clone().requires_grad_()
    y = act(layer(x), reference) if reference else layer(x)
    y.backward(g)
    return {"y": y.detach().float(), "x": x.grad.float(), "w": layer.weight.grad.float(),
            "b": layer.bias.grad.float()}


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "silu"])
def test_linear_kernels_match_torch_fp32_within_torch_bf16_error(store, activation):
    torch.manual_seed(0)
    ref32 = torch.nn.Linear(IN, OUT, device="cuda")
    ref16 = torch.nn.Linear(IN, OUT, device="cuda", dtype=torch.bfloat16)
    ref16.load_state_dict(ref32.state_dict())
    ours = gemmgen.nn.Linear(IN, OUT, device="cuda", dtype=torch.bfloat16, activation=activation)
    ours.load_state_dict(ref32.state_dict())
    x = torch.randn(TOKENS, IN, device="cuda")
    g = torch.randn(TOKENS, OUT, device="cuda")
    exact = run(ref32, x, g, activation)
    theirs = run(ref16, x.bfloat16(), g.bfloat16(), activation)
    mine = run(ours, x.bfloat16(), g.bfloat16())
    counts = gemmgen.stats()
    assert counts["fallbacks"] == 0, counts
    assert counts["kernel_calls_by_op"] == {"linear": 1, "mm": 2}  # forward, dX, dW all on kernels
    for name in exact:
        scale = exact[name].abs().max()
        err_torch = ((theirs[name] - exact[name]).abs().max() / scale).item()
        err_mine = ((mine[name] - exact[name]).abs().max() / scale).item()
        assert err_mine <= 2 * err_torch + 2e-3, (name, err_mine, err_torch)


@pytest.mark.parametrize("tokens", [1, 77, 1000])
def test_other_token_counts_are_right_on_a_kernel_or_the_counted_fallback(store, tokens):
    torch.manual_seed(1)
    layer = gemmgen.nn.Linear(IN, OUT, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(tokens, IN, device="cuda", dtype=torch.bfloat16)
    want = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
    got = layer(x).float()
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-2
    counts = gemmgen.stats()
    assert counts["kernel_calls"] + counts["fallbacks"] == 1, counts


def test_mm_runs_the_stored_dgrad_kernel_on_a_side_stream(store):
    A = torch.randn(TOKENS, OUT, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(OUT, IN, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        D = gemmgen.mm(A, B)
    torch.cuda.current_stream().wait_stream(side)
    want = A.float() @ B.float()
    assert ((D.float() - want).abs().max() / want.abs().max()).item() < 1e-2
    assert gemmgen.stats()["kernel_calls_by_op"] == {"mm": 1}


def test_forward_captures_in_a_cuda_graph(store):
    layer = gemmgen.nn.Linear(IN, OUT, device="cuda", dtype=torch.bfloat16, activation="relu")
    x = torch.randn(TOKENS, IN, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        layer(x)  # warm-up: the kernel loads and binds before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        y = layer(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    want = torch.relu(torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float()))
    assert ((y.float() - want).abs().max() / want.abs().max()).item() < 1e-2
    assert gemmgen.stats()["fallbacks"] == 0


def test_mm_takes_cupy_arrays_through_dlpack(store):
    cupy = pytest.importorskip("cupy")
    A = cupy.random.standard_normal((TOKENS, OUT), dtype=cupy.float32).astype(cupy.float16)
    B = cupy.random.standard_normal((OUT, IN), dtype=cupy.float32).astype(cupy.float16)
    D = gemmgen.mm(A, B)
    assert isinstance(D, cupy.ndarray) and D.shape == (TOKENS, IN)
    want = A.astype(cupy.float32) @ B.astype(cupy.float32)
    assert float(abs(D.astype(cupy.float32) - want).max() / abs(want).max()) < 1e-2
