"""gemmgen's torch layer at the edges a model author reaches: empty widths, odd operands, transforms, double
backward, autocast and the fallback warnings. Each test names the bug it covers; every numeric result is compared
with torch.nn.Linear / torch.matmul on the same inputs. CPU tensors take the torch fallback, so these pin the
contracts; tests marked gpu check what only the kernel path shows."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
from gemmgen.torch import ops, stats  # noqa: E402
from gemmgen.torch.nn import Linear  # noqa: E402
from torch_helpers import linear_store, quiet_fallbacks, torch_act  # noqa: E402,F401

F = torch.nn.functional
ACTS = ["none", "relu", "gelu", "silu"]


def twin_layers(in_f, out_f, bias=True, activation="none", dtype=torch.float32):
    """A torch.nn.Linear and a gemmgen Linear with the same parameters."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(in_f, out_f, bias=bias, dtype=dtype)
    ours = Linear(in_f, out_f, bias=bias, dtype=dtype, activation=activation)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def assert_same_grads(ref, ours, x, activation):
    """Output and every gradient of `ours` equal torch's on the same x (fp32 aten on both sides)."""
    x1, x2 = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    want, got = torch_act(ref(x1), activation), ours(x2)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    g = torch.randn(want.shape, dtype=want.dtype)
    want_grads = torch.autograd.grad(want, [x1, *ref.parameters()], g)
    got_grads = torch.autograd.grad(got, [x2, *ours.parameters()], g)
    for name, w, o in zip(["x", "weight", "bias"], want_grads, got_grads):
        torch.testing.assert_close(o, w, msg=name)


# --- empty widths ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("in_f, out_f, shape", [(0, 7, (5, 0)), (12, 0, (5, 12)), (0, 3, (2, 0, 0)),
                                                (0, 0, (4, 0))])
def test_bug_zero_in_or_out_features_crashed_in_reshape(in_f, out_f, shape, activation):
    # reshape(-1, 0) cannot infer the token count: Linear(0, 7) and Linear(12, 0) raised "cannot reshape tensor of
    # 0 elements" in the forward and in the backward, where torch.nn.Linear gives the bias (or zeros).
    ref, ours = twin_layers(in_f, out_f, activation=activation)
    assert_same_grads(ref, ours, torch.randn(shape), activation)
    X, W = torch.randn(shape), torch.randn(out_f, in_f)
    b = torch.randn(out_f)
    torch.library.opcheck(torch.ops.gemmgen.linear.default, (X.requires_grad_(), W.requires_grad_(), b, activation))


# --- operands that are not tensors ------------------------------------------------------------------------------

@pytest.mark.parametrize("call, name", [
    (lambda: gemmgen.linear(torch.ones(2, 2), None), "linear needs W"),
    (lambda: gemmgen.linear(None, torch.ones(3, 2)), "linear needs X"),
    (lambda: torch.ops.gemmgen.linear(torch.ones(2, 2), None, None, "none"), "linear needs W"),
    (lambda: torch.ops.gemmgen.mm(None, torch.ones(2, 2)), "mm needs A"),
    (lambda: torch.ops.gemmgen.mm(torch.ones(2, 2), None), "mm needs B"),
])
def test_bug_a_none_operand_raised_attribute_error_instead_of_naming_it(call, name):
    # The custom ops' schema lets None through as a Tensor, and the eager path skipped None as if it were the
    # bias: both ended in "'NoneType' object has no attribute 'requires_grad'" (or 'data_ptr').
    with pytest.raises(TypeError, match=f"gemmgen::{name} to be a torch.Tensor, but got NoneType"):
        call()


def test_bug_a_none_operand_under_fake_tensors_is_named_too():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), pytest.raises(TypeError, match="gemmgen::mm needs A to be a torch.Tensor"):
        torch.ops.gemmgen.mm(None, torch.ones(2, 2))


@pytest.mark.parametrize("call, message", [
    (lambda: gemmgen.mm(torch.randn(3, 4).to_sparse(), torch.randn(4, 2)), "mm needs A dense"),
    (lambda: gemmgen.mm(torch.randn(3, 4), torch.randn(4, 2).to_sparse_csr()), "mm needs B dense"),
    (lambda: torch.ops.gemmgen.mm(torch.randn(3, 4).to_sparse(), torch.randn(4, 2)), "mm needs A dense"),
    (lambda: Linear(4, 2)(torch.randn(3, 4).to_sparse()), "linear needs X dense"),
    (lambda: gemmgen.linear(torch.randn(3, 4), torch.randn(2, 4), torch.randn(2).to_sparse()),
     "linear needs bias dense"),
])
def test_bug_a_sparse_operand_raised_cannot_access_data_pointer(call, message):
    # The plan's key reads data_ptr() first: "Cannot access data pointer of Tensor that doesn't have storage".
    with pytest.raises(RuntimeError, match=f"gemmgen::{message} \\(torch.strided\\), but got torch.sparse"):
        call()


# --- double backward --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", [ops.linear, torch.ops.gemmgen.linear])
def test_bug_double_backward_of_the_silu_op_raised_not_implemented(op):
    # The op's backward used aten.silu_backward, which has no derivative: create_graph=True through
    # gemmgen.linear(..., "silu") raised "derivative for aten::silu_backward is not implemented" where torch's
    # F.silu(F.linear(...)) differentiates twice.
    X = (torch.rand(3, 4, dtype=torch.float64) + 0.1).requires_grad_()
    W = (torch.rand(2, 4, dtype=torch.float64) + 0.1).requires_grad_()
    b = torch.rand(2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, w, bb: op(x, w, bb, "silu"), (X, W, b))


@pytest.mark.parametrize("activation", ACTS)
def test_double_backward_of_the_layer_equals_torch_linear(activation):
    ref, ours = twin_layers(4, 3, activation=activation, dtype=torch.float64)
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    got = []
    for layer, forward in ((ref, lambda v: torch_act(ref(v), activation)), (ours, ours)):
        gx, = torch.autograd.grad((forward(x) ** 2).sum(), x, create_graph=True)
        got.append(torch.autograd.grad(gx.pow(2).sum(), [x, *layer.parameters()]))
    for want, mine in zip(*got):
        torch.testing.assert_close(mine, want)


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_bug_training_only_the_bias_recomputed_the_product_in_the_backward(activation):
    # A frozen weight and a trained bias (BitFit) took the fused forward, whose backward runs the product again
    # for the pre-activation: two linear products per step instead of one. The layer now keeps the
    # pre-activation whenever any of x, weight, bias needs a gradient.
    ref, ours = twin_layers(6, 4, activation=activation)
    for layer in (ref, ours):
        layer.weight.requires_grad_(False)
    x = torch.randn(3, 6)
    g = torch.randn(3, 4)
    torch_act(ref(x), activation).backward(g)
    stats.reset_stats()
    ours(x).backward(g)
    assert gemmgen.stats()["fallbacks"] == 1, gemmgen.stats()   # the forward only (CPU: counted as a fallback)
    torch.testing.assert_close(ours.bias.grad, ref.bias.grad)
    assert ours.weight.grad is None


# --- torch.func transforms and forward-mode AD ------------------------------------------------------------------

def _gelu_pair():
    ref, ours = twin_layers(6, 4, activation="gelu")
    return (lambda v: torch_act(ref(v), "gelu")), ours


def test_bug_jacfwd_of_the_layer_was_silently_wrong():
    # torch.library's custom-op autograd has no forward-mode rule: under jvp/jacfwd the op ran without the
    # tangent and the Jacobian came back wrong (0.43 off) with no error. Such calls now run on torch's ops.
    want, ours = _gelu_pair()
    x = torch.randn(3, 6)
    torch.testing.assert_close(torch.func.jacfwd(ours)(x), torch.func.jacfwd(want)(x))
    B, tA = torch.randn(6, 2), torch.randn(3, 6)
    _, tangent = torch.func.jvp(lambda a: gemmgen.mm(a, B), (x,), (tA,))
    torch.testing.assert_close(tangent, tA @ B)
    assert any("torch.func transform" in r for r in gemmgen.stats()["fallbacks_by_reason"])


@pytest.mark.parametrize("transform", ["grad", "jacrev"])
def test_bug_torch_func_grad_and_jacrev_raised_about_setup_context(transform):
    # "In order to use an autograd.Function with functorch transforms ... it must override setup_context":
    # torch.func.grad over gemmgen.nn.Linear (or gemmgen.mm) failed.
    want, ours = _gelu_pair()
    x = torch.randn(3, 6)
    if transform == "grad":
        params = {k: v.detach() for k, v in ours.named_parameters()}
        got = torch.func.grad(lambda p: torch.func.functional_call(ours, p, (x,)).sum())(params)
        ref = torch.nn.Linear(6, 4)
        ref.load_state_dict(params)
        exp = torch.func.grad(lambda p: torch_act(torch.func.functional_call(ref, p, (x,)), "gelu").sum())(params)
        for name in exp:
            torch.testing.assert_close(got[name], exp[name], msg=name)
    else:
        torch.testing.assert_close(torch.func.jacrev(ours)(x), torch.func.jacrev(want)(x))
    B = torch.randn(6, 2)
    torch.testing.assert_close(torch.func.grad(lambda a: gemmgen.mm(a, B).sum())(x), torch.ones(3, 2) @ B.t())


@pytest.mark.parametrize("activation", ACTS)
def test_bug_forward_mode_ad_of_the_layer_raised_or_needed_a_jvp(activation):
    # With a dual tensor (torch.autograd.forward_ad) the layer raised "You must implement the jvp function" and
    # gemmgen.linear "mm_out ... does not support [forward AD] because it is an out= function"; on the GPU a
    # kernel would have dropped the tangent.
    import torch.autograd.forward_ad as fwAD

    ref, ours = twin_layers(6, 4, activation=activation)
    x, t = torch.randn(3, 6), torch.randn(3, 6)
    with fwAD.dual_level():
        got = fwAD.unpack_dual(ours(fwAD.make_dual(x, t)))
        want = fwAD.unpack_dual(torch_act(ref(fwAD.make_dual(x, t)), activation))
        torch.testing.assert_close(got.primal, want.primal)
        torch.testing.assert_close(got.tangent, want.tangent)


def test_vmap_over_the_layer_equals_torch_linear():
    want, ours = _gelu_pair()
    x = torch.randn(5, 3, 6)
    torch.testing.assert_close(torch.func.vmap(ours)(x), torch.func.vmap(want)(x))


# --- autocast ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("grad", [False, True])
def test_bug_the_layer_ignored_autocast_and_returned_fp32(activation, grad):
    # In torch.autocast("cpu", bfloat16) torch.nn.Linear computes in bf16 and returns bf16; gemmgen.nn.Linear
    # ran fp32 (on the GPU: on torch, never on a bf16 kernel) and returned fp32. It now casts as autocast does.
    ref, ours = twin_layers(12, 7, activation=activation)
    x = torch.randn(2, 5, 12)
    x1, x2 = x.clone().requires_grad_(grad), x.clone().requires_grad_(grad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = torch_act(ref(x1), activation), ours(x2)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)
    if grad:
        g = torch.randn(want.shape, dtype=want.dtype)
        for w, o in zip(torch.autograd.grad(want, [x1, *ref.parameters()], g),
                        torch.autograd.grad(got, [x2, *ours.parameters()], g)):
            assert o.dtype == w.dtype == torch.float32
            torch.testing.assert_close(o, w)


@pytest.mark.parametrize("backend", [None, "eager", "aot_eager"])
def test_bug_mm_under_autocast_returned_a_dtype_that_depended_on_the_compile_backend(backend):
    # gemmgen.mm in an autocast region gave bf16 eagerly and with backend="eager" (torch.mm inside the fallback
    # autocast) but fp32 with aot_eager (the fake impl's dtype): now bf16 everywhere, as torch.matmul, and the
    # bare op keeps its inputs' dtype in every mode, as its fake impl says.
    torch._dynamo.reset()
    A, B = torch.randn(4, 3), torch.randn(3, 5)

    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return gemmgen.mm(a, b), torch.ops.gemmgen.mm(a, b), torch.matmul(a, b)

    run = f if backend is None else torch.compile(f, backend=backend, fullgraph=True)
    ours, bare, want = run(A, B)
    assert ours.dtype == want.dtype == torch.bfloat16 and bare.dtype == torch.float32
    torch.testing.assert_close(ours, want)
    torch.testing.assert_close(bare, A @ B)


def test_bug_meta_tensors_in_an_autocast_region_raised_unknown_device_type():
    # The autocast cast (2f51123) asked torch.is_autocast_enabled("meta"), which raises "unknown device type for
    # autocast": a model materialised on the meta device could not run in an autocast region. As torch.nn.Linear,
    # meta tensors are not cast.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = Linear(4, 3, device="meta", activation="gelu")(torch.randn(2, 4, device="meta"))
        want = torch.nn.Linear(4, 3, device="meta")(torch.randn(2, 4, device="meta"))
        assert got.shape == want.shape and got.dtype == want.dtype and got.is_meta
        assert gemmgen.mm(torch.randn(2, 4, device="meta"), torch.randn(4, 3, device="meta")).shape == (2, 3)


# --- the one-time fallback warning ------------------------------------------------------------------------------

def test_bug_a_kernel_refusing_token_counts_warned_once_per_count():
    # A kernel's refusal names the call's shape ("does not serve 7x24x40: ..."), and the one-time warning was
    # keyed on that text: a model whose token count changes got a FallbackWarning for every new count. Now one
    # per kernel; gemmgen.stats() still counts each reason.
    from gemmgen.model.arch import DType
    from gemmgen.model.errors import InvalidInput
    from gemmgen.model.linear import KernelClass
    from gemmgen.model.problem import Activation, Layout
    from gemmgen.torch.registry import CPU, REGISTRY, register

    def multiple_of_8_rows(A, B, D, C=None, bias=None):
        m, k = A.shape
        if m % 8:
            raise InvalidInput(f"this kernel does not serve {m}x{B.shape[1]}x{k}: M % 8 == 0: got {m}", "kernel")
        D.copy_(A.float() @ B.float())

    register(KernelClass(DType.BF16, Layout.ROW, Layout.ROW, False, Activation.NONE, None, 24, 40),
             multiple_of_8_rows, gpu=CPU)
    try:
        B = torch.randn(40, 24).bfloat16()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for m in range(1, 20):
                A = torch.randn(m, 40).bfloat16()
                torch.testing.assert_close(gemmgen.mm(A, B).float(), A.float() @ B.float(), rtol=2e-2, atol=2e-2)
        counts = gemmgen.stats()
        assert counts["kernel_calls"] == 2 and counts["fallbacks"] == 17
        assert len(counts["fallbacks_by_reason"]) == 17
        refusals = [w for w in caught if issubclass(w.category, stats.FallbackWarning)]
        assert len(refusals) == 1 and "does not serve 1x24x40" in str(refusals[0].message)
    finally:
        REGISTRY.clear()


def test_bug_the_fallback_warning_pointed_into_plans_py_not_the_calling_line():
    # stacklevel=3 named a line of gemmgen/torch/plans.py (the depth to the caller varies: layer, mm, custom op,
    # autograd). The warning now names the first frame outside gemmgen's torch layer and torch: the model's line.
    import inspect

    layer = Linear(8, 4)
    calls = [lambda: layer(torch.randn(2, 8)), lambda: gemmgen.mm(torch.randn(2, 8), torch.randn(8, 3)),
             lambda: torch.ops.gemmgen.mm(torch.randn(2, 8), torch.randn(8, 3)),
             lambda: layer(torch.randn(2, 8, requires_grad=True)).sum().backward()]
    for call in calls:
        stats.reset_stats(warnings_too=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        (warning,) = [w for w in caught if issubclass(w.category, stats.FallbackWarning)]
        assert (warning.filename, warning.lineno) == (__file__, inspect.getsourcelines(call)[1]), \
            (warning.filename, warning.lineno)


# --- torch.jit.trace and torch.fx -------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ACTS)
def test_bug_jit_trace_of_the_layer_failed_its_checks_or_recorded_the_eager_path(activation):
    # torch.jit.trace recorded the eager fast path (the autograd.Function, or the plan's aten calls), and for GELU/
    # SiLU the grad-mode branch: "Graphs differed across invocations". Tracing now records gemmgen::linear, once.
    import io

    ref, ours = twin_layers(6, 4, activation=activation)
    traced = torch.jit.trace(ours, (torch.randn(3, 6),))
    assert "gemmgen::linear" in str(traced.graph)
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x = torch.randn(5, 6)
    torch.testing.assert_close(loaded(x), torch_act(ref(x), activation))
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch_act(ref(x1), activation).sum().backward()
    traced(x2).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad)


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_bug_fx_symbolic_trace_of_a_gelu_layer_raised_trace_error(activation):
    # The layer branched on x.requires_grad, a Proxy under torch.fx.symbolic_trace: "symbolically traced
    # variables cannot be used as inputs to control flow". It now records the fused op.
    ref, ours = twin_layers(6, 4, activation=activation)
    graph = torch.fx.symbolic_trace(torch.nn.Sequential(ours, torch.nn.ReLU()))
    assert "gemmgen.linear" in graph.code
    x = torch.randn(2, 6)
    torch.testing.assert_close(graph(x), torch.relu(torch_act(ref(x), activation)))


# --- torch.compile: recompiles ----------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ["none", "silu"])
def test_bug_dynamic_compile_specialised_the_token_count_in_the_traced_backward(activation):
    # plans.rows (d923d37) took the token count as Size.numel(), which specialises a dynamic size: with
    # dynamic=True the layer recompiled for every new token count (torch.nn.Linear compiles once past 0 and 1).
    import torch._dynamo.utils as dynamo_utils

    def graphs(model) -> int:
        torch._dynamo.reset()
        dynamo_utils.counters.clear()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
        for shape in [(0,), (1,), (2,), (5,), (9,), (3, 0), (4, 7)]:
            compiled(torch.randn(*shape, 16, requires_grad=True)).sum().backward()
        return dynamo_utils.counters["stats"]["unique_graphs"]

    ref, ours = twin_layers(16, 8, activation=activation)
    want = graphs(torch.nn.Sequential(ref, torch.nn.SiLU() if activation == "silu" else torch.nn.Identity()))
    assert graphs(ours) == want


# --- nested (jagged) tensors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("compiled", [False, True])
def test_bug_a_jagged_nested_input_raised_not_implemented(activation, compiled):
    # torch.nn.Linear takes variable-length sequences as a torch.jagged nested tensor; gemmgen's raised
    # NotImplementedError("gemmgen.linear.default") from the nested tensor's dispatch. Its values are the tokens:
    # one product, rebuilt on the same offsets.
    ref, ours = twin_layers(4, 3, activation=activation)
    parts = [torch.randn(3, 4), torch.randn(2, 4), torch.randn(1, 4)]
    x1, x2 = (torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=True) for _ in range(2))
    torch._dynamo.reset()
    layer = torch.compile(ours, backend="aot_eager", fullgraph=True) if compiled else ours
    got, want = layer(x1), torch_act(ref(x2), activation)
    assert got.is_nested and got.shape[0] == 3 and got.layout == torch.jagged
    torch.testing.assert_close(got.values(), want.values())
    got.values().sum().backward()
    want.values().sum().backward()
    torch.testing.assert_close(x1.grad.values(), x2.grad.values())
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad)


def test_from_linear_keeps_the_layers_training_mode():
    # Found 2026-11-27: from_linear built a module in training mode whatever the layer's, so swapping the layers of
    # an eval-mode model into gemmgen ones left them in training mode.
    ref = torch.nn.Linear(8, 4).eval()
    assert not Linear.from_linear(ref).training
    assert Linear.from_linear(ref.train()).training


def test_relu_backward_passes_the_gradient_where_the_output_is_nan_as_torch_does():
    # Found 2026-11-27: the ReLU backward was where(Y > 0, dY, 0), which zeroes the gradient at a NaN output where
    # torch's threshold_backward passes it on.
    W = torch.randn(3, 4)
    x = torch.randn(5, 4)
    x[0, 0] = float("nan")
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ops.linear(xs[0], W, None, "relu").sum().backward()
    torch.relu(F.linear(xs[1], W)).sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad, equal_nan=True)


# --- on the GPU: what only the kernel path shows ----------------------------------------------------------------

IN, OUT, TOKENS = 520, 776, 333   # as tests/test_torch_gpu.py: 8-aligned, not tile multiples


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A kernel store holding Linear(IN, OUT, bias)'s three products (no activation), tuned at TOKENS: the model's
    picks, compiled for this GPU."""
    yield from linear_store(tmp_path_factory, IN, OUT, TOKENS)


def _rel_err(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


@pytest.mark.gpu
def test_gpu_an_fp32_layer_in_a_bf16_autocast_region_trains_on_the_bf16_kernels(store):
    # Before the autocast fix an fp32 layer in torch.autocast("cuda", bfloat16) ran its three products on torch in
    # fp32 (fallbacks: dtype float32) and returned fp32; it now casts as torch.nn.Linear does and runs on kernels.
    torch.manual_seed(0)
    ref = torch.nn.Linear(IN, OUT, device="cuda")
    ours = Linear(IN, OUT, device="cuda")
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(TOKENS, IN, device="cuda")
    g = torch.randn(TOKENS, OUT, device="cuda", dtype=torch.bfloat16)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want, got = ref(x1), ours(x2)
    assert got.dtype == want.dtype == torch.bfloat16
    want.backward(g)
    got.backward(g)
    counts = gemmgen.stats()
    assert counts["fallbacks"] == 0 and counts["kernel_calls_by_op"] == {"linear": 1, "mm": 2}, counts
    exact = torch.nn.functional.linear(x, ref.weight, ref.bias)
    assert _rel_err(got, exact) <= 2 * _rel_err(want, exact) + 2e-3
    for mine, theirs in ((x2.grad, x1.grad), (ours.weight.grad, ref.weight.grad), (ours.bias.grad, ref.bias.grad)):
        assert mine.dtype == torch.float32 and _rel_err(mine, theirs) < 2e-2


@pytest.mark.gpu
def test_gpu_jvp_through_a_layer_with_a_stored_kernel_keeps_the_tangent(store):
    # A kernel writes no tangent: under jvp the custom op lost it silently (the Jacobian-vector product came back
    # as zeros). Such calls now run on torch's ops, counted as a fallback.
    torch.manual_seed(0)
    ours = Linear(IN, OUT, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(TOKENS, IN, device="cuda", dtype=torch.bfloat16)
    t = torch.randn_like(x)
    _, tangent = torch.func.jvp(ours, (x,), (t,))
    assert _rel_err(tangent, t.float() @ ours.weight.float().t()) < 1e-2
    assert any("torch.func transform" in r for r in gemmgen.stats()["fallbacks_by_reason"])


@pytest.mark.gpu
@pytest.mark.parametrize("in_f, out_f", [(0, OUT), (IN, 0)])
def test_gpu_a_layer_with_an_empty_width_equals_torch_linear(store, in_f, out_f):
    ref, ours = (m.to("cuda", torch.bfloat16) for m in twin_layers(in_f, out_f))
    x = torch.randn(TOKENS, in_f, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(ours(x), ref(x))


@pytest.mark.gpu
def test_gpu_refused_views_at_many_token_counts_warn_once(store):
    # Views whose rows a kernel's alignment cannot take (3 elements of gap) at several token counts: each is
    # refused and counted, with at most one FallbackWarning for the stored kernel's refusals.
    W = torch.randn(OUT, IN, device="cuda", dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for tokens in (TOKENS, TOKENS - 16, TOKENS - 32, TOKENS - 48):
            X = torch.randn(tokens, IN + 3, device="cuda", dtype=torch.bfloat16)[:, :IN]
            assert _rel_err(gemmgen.linear(X, W), X.float() @ W.float().t()) < 1e-2
    assert gemmgen.stats()["fallbacks"] == 4
    refusals = [w for w in caught if issubclass(w.category, stats.FallbackWarning) and "refused" in str(w.message)]
    assert len(refusals) <= 1, [str(w.message) for w in refusals]


@pytest.mark.gpu
def test_gpu_a_jit_traced_layer_runs_the_stored_kernel(store):
    torch.manual_seed(0)
    ours = Linear(IN, OUT, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(TOKENS, IN, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        traced = torch.jit.trace(ours, (x,))
        stats.reset_stats()
        y = traced(x)
    assert gemmgen.stats()["kernel_calls_by_op"] == {"linear": 1}, gemmgen.stats()
    assert _rel_err(y, torch.nn.functional.linear(x.float(), ours.weight.float(), ours.bias.float())) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpu_inductor_compiled_layer_runs_the_stored_kernels(store, mode):
    # torch.compile's default backend (inductor), and its CUDA graphs (reduce-overhead), around the custom ops:
    # the same numbers as torch.nn.Linear within bf16 error, no fallback, forward and backward.
    torch.manual_seed(0)
    torch._dynamo.reset()
    ref = torch.nn.Linear(IN, OUT, device="cuda", dtype=torch.bfloat16)
    ours = Linear(IN, OUT, device="cuda", dtype=torch.bfloat16)
    ours.load_state_dict(ref.state_dict())
    compiled = torch.compile(ours, mode=mode, fullgraph=True)
    for step in range(3):
        x = torch.randn(TOKENS, IN, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            y = compiled(x).clone()
        exact = torch.nn.functional.linear(x.float(), ref.weight.float(), ref.bias.float())
        assert _rel_err(y, exact) <= 2 * _rel_err(ref(x), exact) + 2e-3, step
    x = torch.randn(TOKENS, IN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    compiled(x).float().pow(2).sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    ref(x_ref).float().pow(2).sum().backward()
    assert _rel_err(x.grad, x_ref.grad) < 2e-2 and _rel_err(ours.weight.grad, ref.weight.grad) < 2e-2
    assert gemmgen.stats()["fallbacks"] == 0, gemmgen.stats()
