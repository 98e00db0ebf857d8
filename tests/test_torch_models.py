"""gemmgen.nn.Linear dropped into real models and training code: module lifecycle, execution modes, what autograd
keeps, compilation and wrappers. Each test names the bug it covers and compares with torch.nn.Linear on the same
inputs. CPU tensors take the torch fallback, so these pin the drop-in contract."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
from gemmgen.torch.nn import Linear  # noqa: E402
from torch_helpers import quiet_fallbacks, torch_act  # noqa: E402,F401

ACTS = ["none", "relu", "gelu", "silu"]


def twin_layers(in_f=8, out_f=6, bias=True, activation="none", dtype=torch.float32):
    """A torch.nn.Linear and a gemmgen Linear with the same parameters."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(in_f, out_f, bias=bias, dtype=dtype)
    ours = Linear(in_f, out_f, bias=bias, dtype=dtype, activation=activation)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


# --- calling the layer ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ACTS)
def test_bug_calling_the_layer_with_input_keyword_raised_type_error(activation):
    # torch.nn.Linear.forward(self, input): a model calling self.proj(input=h), or a forward pre-hook with kwargs
    # that passes input=, got "forward() got an unexpected keyword argument 'input'" (the parameter was x).
    ref, ours = twin_layers(activation=activation)
    x = torch.randn(3, 8)
    torch.testing.assert_close(ours(input=x), torch_act(ref(input=x), activation))
    xg = x.clone().requires_grad_()
    ours(input=xg).sum().backward()
    assert xg.grad.shape == x.shape


# --- what autograd keeps --------------------------------------------------------------------------------------

def saved_numel(forward, *inputs) -> int:
    """Elements autograd keeps for the backward of forward(*inputs)."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t.numel()), t)[1], lambda t: t):
        forward(*inputs)
    return sum(saved)


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("trained", ["weight", "input"])
def test_bug_the_layer_kept_tensors_its_backward_never_reads(activation, trained):
    # The backward's setup saved X, W and bias whatever needed a gradient: a frozen layer (requires_grad_(False))
    # with a trained layer below it kept its input activation alive until the backward, memory torch.nn.Linear
    # does not hold. It now saves what the needed gradients read, as torch's addmm does.
    ref, ours = twin_layers(64, 4, activation=activation)
    x = torch.randn(32, 64, requires_grad=trained == "input")
    if trained == "input":
        ref.requires_grad_(False)
        ours.requires_grad_(False)
    want = saved_numel(lambda v: torch_act(ref(v), activation), x)
    assert saved_numel(ours, x) == want
    X, W = x.detach().requires_grad_(trained == "input"), ours.weight.detach().requires_grad_(trained == "weight")
    assert saved_numel(torch.ops.gemmgen.linear, X, W, None, "none") == saved_numel(torch.nn.functional.linear, X, W)
    assert saved_numel(gemmgen.mm, X, W.t()) == saved_numel(torch.mm, X, W.t())
    assert saved_numel(torch.ops.gemmgen.mm, X, W.t()) == saved_numel(torch.mm, X, W.t())


@pytest.mark.parametrize("activation", ["none", "relu"])
def test_bug_an_input_changed_in_place_after_a_frozen_layer_failed_the_backward(activation):
    # The same cause (15a1eb7): a frozen layer saved its input, so a residual stream updated in place after it
    # raised "one of the variables needed for gradient computation has been modified by an inplace operation"
    # in the backward, where torch.nn.Linear (which keeps no input for a frozen weight) runs.
    ref, ours = twin_layers(activation=activation)
    grads = []
    for layer, forward in ((ref, lambda v: torch_act(ref(v), activation)), (ours, ours)):
        layer.requires_grad_(False)
        leaf = torch.randn(3, 8, generator=torch.Generator().manual_seed(2), requires_grad=True)
        h = leaf * 1
        y = forward(h)
        h.mul_(2)
        y.sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("activation", ["none", "relu"])
def test_bug_a_layer_made_under_inference_mode_failed_on_plain_input_outside_it(activation):
    # A layer built in a torch.inference_mode() block has inference-tensor parameters that still require grad.
    # Called outside on an input that needs no gradient, torch.nn.Linear runs (it saves only X); gemmgen saved W
    # too and raised "Inference tensors cannot be saved for backward".
    with torch.inference_mode():
        ref, ours = twin_layers(activation=activation)
    x = torch.randn(3, 8)
    torch.testing.assert_close(ours(x), torch_act(ref(x), activation))


@pytest.mark.parametrize("activation", ACTS)
def test_gradients_with_only_the_input_or_only_the_weight_trained_equal_torch(activation):
    # (The setup now saves less: each gradient must still come out right, double backward included.)
    for trained in ("input", "weight"):
        ref, ours = twin_layers(activation=activation, dtype=torch.float64)
        x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=trained == "input")
        got = []
        for layer, forward in ((ref, lambda v: torch_act(ref(v), activation)), (ours, ours)):
            layer.weight.requires_grad_(trained == "weight")
            wrt = [x] if trained == "input" else [layer.weight, layer.bias]
            first = torch.autograd.grad((forward(x) ** 2).sum(), wrt, create_graph=True)
            got.append(first + torch.autograd.grad(sum(g.pow(2).sum() for g in first), wrt))
        for want, mine in zip(*got):
            torch.testing.assert_close(mine, want)


# --- module lifecycle -----------------------------------------------------------------------------------------

def test_bug_a_torch_linear_whose_class_was_swapped_raised_attribute_error():
    # Module-swapping code sets `module.__class__ = gemmgen.nn.Linear` on a torch.nn.Linear (no __init__ runs):
    # its forward and repr raised "'Linear' object has no attribute 'activation'". It is now a plain Linear.
    ref = torch.nn.Linear(8, 6)
    swapped = torch.nn.Linear(8, 6)
    swapped.load_state_dict(ref.state_dict())
    swapped.__class__ = Linear
    x = torch.randn(3, 8)
    torch.testing.assert_close(swapped(x), ref(x))
    assert repr(swapped) == "Linear(in_features=8, out_features=6, bias=True)"


@pytest.mark.parametrize("parametrization", ["weight_norm", "orthogonal"])
def test_bug_from_linear_of_a_parametrized_layer_dropped_its_weight_from_state_dict(parametrization):
    # from_linear read a parametrized weight once, as a plain tensor: the new layer's state_dict and parameters()
    # had no weight (a checkpoint saved without it, an optimizer that never trained it), and the second backward
    # raised "Trying to backward through the graph a second time". It now carries the parametrizations, sharing
    # their original parameters with the source layer.
    torch.manual_seed(0)
    ref = getattr(torch.nn.utils.parametrizations, parametrization)(torch.nn.Linear(6, 6))
    ours = Linear.from_linear(ref, activation="relu")
    assert isinstance(ours, Linear)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    assert {id(p) for p in ours.parameters()} == {id(p) for p in ref.parameters()}
    optimizer = torch.optim.SGD(ours.parameters(), lr=0.1)
    for _ in range(2):
        x = torch.randn(4, 6)
        torch.testing.assert_close(ours(x), torch.relu(ref(x)))
        ours(x).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_from_linear_without_bias_keeps_a_bias_slot_as_torch_linear():
    ours = Linear.from_linear(torch.nn.Linear(8, 6, bias=False))
    assert ours._parameters.keys() == torch.nn.Linear(8, 6, bias=False)._parameters.keys()
    assert ours.bias is None and ours(torch.randn(2, 8)).shape == (2, 6)


def test_bug_from_linear_of_a_pruned_layer_dropped_its_weight_from_state_dict():
    # torch.nn.utils.prune (and the deprecated weight_norm) replace the weight by a plain tensor that a forward
    # pre-hook recomputes: from_linear took that tensor as a plain attribute, missing from the new layer's
    # state_dict() (a checkpoint saved without its weight) and never recomputed. It now refuses, naming the remedy.
    import torch.nn.utils.prune as prune

    pruned = torch.nn.Linear(8, 6)
    prune.l1_unstructured(pruned, "weight", amount=0.5)
    with pytest.raises(ValueError, match=r"layer\.weight as a parameter or buffer.*prune\.remove"):
        Linear.from_linear(pruned)
    prune.remove(pruned, "weight")
    ours = Linear.from_linear(pruned)
    assert ours.state_dict().keys() == pruned.state_dict().keys()
    x = torch.randn(3, 8)
    torch.testing.assert_close(ours(x), pruned(x))


def test_from_linear_keeps_a_weight_registered_as_a_buffer_in_state_dict():
    frozen = torch.nn.Linear(8, 6)
    weight = frozen.weight.detach().clone()
    del frozen.weight
    frozen.register_buffer("weight", weight)
    ours = Linear.from_linear(frozen)
    assert ours.state_dict().keys() == frozen.state_dict().keys() and "weight" in dict(ours.named_buffers())


# --- inputs -----------------------------------------------------------------------------------------------------

def _strided_nested(*shapes, requires_grad=False):
    torch.manual_seed(1)
    return torch.nested.nested_tensor([torch.randn(*s) for s in shapes], requires_grad=requires_grad)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("activation", ACTS)
def test_bug_a_strided_nested_input_raised_internal_error(activation):
    # torch.nested.nested_tensor's default layout is torch.strided, a plain Tensor, so it took the eager path and
    # the plan's key read its shape: "Internal error: NestedTensorImpl doesn't support sizes. Please file an
    # issue." where torch.nn.Linear runs it. Its sequences now run as one product, gradients included.
    ref, ours = twin_layers(activation=activation)
    x1 = _strided_nested((3, 8), (5, 8), requires_grad=True)
    x2 = _strided_nested((3, 8), (5, 8), requires_grad=True)
    want, got = torch_act(ref(x1), activation), ours(x2)
    assert got.is_nested and got.layout == torch.strided
    g = _strided_nested((3, 6), (5, 6))
    want_grads = torch.autograd.grad(want, [x1, ref.weight, ref.bias], g)
    got_grads = torch.autograd.grad(got, [x2, ours.weight, ours.bias], g)
    for w, o in zip((want, *want_grads), (got, *got_grads)):
        for a, b in zip(o.unbind(), w.unbind()) if w.is_nested else [(o, w)]:
            torch.testing.assert_close(a, b)
    with torch.no_grad():
        for a, b in zip(ours(x2).unbind(), want.unbind()):
            torch.testing.assert_close(a, b)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_strided_nested_operand_of_mm_or_a_wrong_width_is_named():
    with pytest.raises(RuntimeError, match="needs A dense, but got a nested tensor"):
        gemmgen.mm(_strided_nested((3, 8)), torch.randn(8, 2))
    with pytest.raises(RuntimeError, match=r"needs X \(\.\.\., in\) and W \[out, in\]"):
        Linear(8, 6)(_strided_nested((3, 7), (2, 7)))


# --- higher-order autograd ------------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ACTS)
def test_bug_vectorized_jacobian_and_hessian_raised_cannot_access_data_pointer(activation):
    # torch.autograd.functional.jacobian/hessian(vectorize=True) run the backward under legacy vmap, whose
    # BatchedTensor is a plain Tensor without storage: the plan's key raised "Cannot access data pointer of Tensor
    # that doesn't have storage". Such operands now run on torch's ops (counted as a fallback).
    ref, ours = twin_layers(4, 3, activation=activation, dtype=torch.float64)
    x = torch.randn(2, 4, dtype=torch.float64)
    want_f = lambda v: torch_act(ref(v), activation)   # noqa: E731
    for fn in (torch.autograd.functional.jacobian, torch.autograd.functional.hessian):
        wrap = (lambda f: f) if fn is torch.autograd.functional.jacobian else \
            (lambda f: lambda v: f(v).pow(2).sum())
        torch.testing.assert_close(fn(wrap(ours), x, vectorize=True), fn(wrap(want_f), x, vectorize=True))
    assert any("without storage" in r for r in gemmgen.stats()["fallbacks_by_reason"])


@pytest.mark.parametrize("activation", ACTS)
def test_bug_gradcheck_with_batched_gradients_failed_on_the_ops(activation):
    # gradcheck(check_batched_grad=True), as an op author checks a composite: same data pointer error.
    torch.manual_seed(0)
    X = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    W = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, dtype=torch.float64, requires_grad=True)
    op = lambda x, w, bb: gemmgen.linear(x, w, bb, activation)   # noqa: E731
    assert torch.autograd.gradcheck(op, (X, W, b), check_batched_grad=True)
    assert torch.autograd.gradgradcheck(op, (X, W, b), check_batched_grad=True)
    assert torch.autograd.gradcheck(gemmgen.mm, (X, W.t()), check_batched_grad=True)


# --- tensor subclasses: DTensor (tensor parallelism), quantized weights ------------------------------------

@pytest.fixture
def one_process_group():
    """A gloo process group of this process alone, and its CPU device mesh."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_bug_tensor_parallel_layers_raised_no_sharding_strategy(one_process_group, activation, compiled):
    # parallelize_module's ColwiseParallel/RowwiseParallel make the weights DTensors: the layer raised
    # "Operator gemmgen.linear.default does not have a sharding strategy registered" (NotImplementedError) where
    # torch.nn.Linear runs. DTensor operands now run on torch's linear, counted as a fallback.
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    results = []
    for ours in (False, True):
        torch.manual_seed(0)
        first = Linear(8, 16, activation=activation) if ours else torch.nn.Linear(8, 16)
        act = torch.nn.Identity() if ours else torch.nn.GELU("tanh") if activation == "gelu" else torch.nn.Identity()
        model = torch.nn.Sequential(first, act, Linear(16, 4) if ours else torch.nn.Linear(16, 4))
        model = parallelize_module(model, one_process_group, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        run = torch.compile(model, backend="aot_eager", fullgraph=True) if compiled else model
        y = run(torch.randn(3, 8, generator=torch.Generator().manual_seed(1)))
        y.sum().backward()
        results.append((y.detach(), model[0].weight.grad.full_tensor(), model[2].bias.grad.full_tensor()))
    for want, got in zip(*results):
        torch.testing.assert_close(got, want)
    if not compiled:
        assert any("DTensor" in r for r in gemmgen.stats()["fallbacks_by_reason"])


class Int8Weight(torch.Tensor):
    """A weight-only int8 tensor as quantization libraries make them (torchao's quantize_ swaps the weight of every
    isinstance(m, torch.nn.Linear)): a wrapper subclass whose dispatch dequantizes for aten ops, refuses others."""

    @staticmethod
    def __new__(cls, qdata, scale):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=scale.dtype, device=qdata.device)

    def __init__(self, qdata, scale):
        self.qdata, self.scale = qdata, scale

    def __tensor_flatten__(self):
        return ["qdata", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return Int8Weight(inner["qdata"], inner["scale"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        if func is torch.ops.aten.detach.default:
            return Int8Weight(args[0].qdata, args[0].scale)
        if func.namespace != "aten":
            raise NotImplementedError(f"Int8Weight has no rule for {func}")
        unwrap = lambda t: t.qdata.to(t.scale.dtype) * t.scale[:, None] if isinstance(t, Int8Weight) else t  # noqa
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


@pytest.mark.parametrize("activation", ACTS)
def test_bug_a_quantized_weight_subclass_raised_in_the_custom_op(activation):
    # A weight swapped for a wrapper tensor subclass (weight-only quantization) went through gemmgen::linear,
    # which the subclass's dispatch does not know: NotImplementedError where torch.nn.Linear runs (its aten ops
    # dequantize). Such operands now run on torch's linear, counted as a fallback naming the subclass.
    ref, ours = twin_layers(activation=activation)
    scale = ref.weight.detach().abs().amax(1) / 127
    qdata = (ref.weight.detach() / scale[:, None]).round().to(torch.int8)
    for layer in (ref, ours):
        layer.weight = torch.nn.Parameter(Int8Weight(qdata, scale), requires_grad=False)
    x = torch.randn(3, 8, requires_grad=True)
    torch.testing.assert_close(ours(x), torch_act(ref(x), activation))
    torch.testing.assert_close(torch.autograd.grad(ours(x).sum(), x)[0],
                               torch.autograd.grad(torch_act(ref(x), activation).sum(), x)[0])
    assert any(r.startswith("Int8Weight operands") for r in gemmgen.stats()["fallbacks_by_reason"])


# --- torch.func transforms inside torch.compile -----------------------------------------------------------------

def _gelu_twins():
    ref, ours = twin_layers(activation="gelu")
    return (lambda v: torch_act(ref(v), "gelu")), ours


@pytest.mark.parametrize("transform", ["jvp", "jacfwd"])
def test_bug_compiled_forward_mode_transforms_were_silently_wrong(transform):
    # The layer ran torch's ops under a torch.func transform only outside torch.compile; compiled, it recorded
    # gemmgen::linear, whose autograd has no forward-mode rule: the tangent was dropped and the compiled jvp was
    # 0.92 off (jacfwd 0.37), with no error.
    want, ours = _gelu_twins()
    x, t = torch.randn(3, 8), torch.randn(3, 8)
    if transform == "jvp":
        run = lambda f: lambda v, tv: torch.func.jvp(f, (v,), (tv,))[1]   # noqa: E731
        args = (x, t)
    else:
        run = lambda f: torch.func.jacfwd(f)   # noqa: E731
        args = (x[0],)
    torch.testing.assert_close(torch.compile(run(ours), backend="aot_eager")(*args), run(want)(*args))


@pytest.mark.parametrize("transform", ["grad", "jacrev", "vmap"])
def test_bug_compiled_grad_and_jacrev_raised(transform):
    # Compiled torch.func.grad/jacrev raised ("RuntimeError when making fake tensor call": the custom op's autograd
    # under a functorch transform). They now run torch's ops, as eager calls do. (vmap worked, through torch's
    # per-element batching fallback for gemmgen::linear; it now runs torch's batched linear.)
    want, ours = _gelu_twins()
    x = torch.randn(4, 3, 8)
    run = {"grad": lambda f: torch.func.grad(lambda v: f(v).sum()), "jacrev": torch.func.jacrev,
           "vmap": torch.vmap}[transform]
    arg = x[0, 0] if transform == "jacrev" else x
    torch.testing.assert_close(torch.compile(run(ours), backend="aot_eager", fullgraph=True)(arg), run(want)(arg))


def test_a_compiled_model_without_transforms_still_records_the_custom_ops():
    # (The transform check now runs under torch.compile too: a plain model must keep gemmgen's ops, forward and
    # backward.)
    from torch._dynamo.backends.common import aot_autograd

    seen = []

    def record(gm, example_inputs):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    _, ours = _gelu_twins()
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend=aot_autograd(fw_compiler=record, bw_compiler=record), fullgraph=True)
    compiled(torch.randn(3, 8, requires_grad=True)).sum().backward()
    forward, backward = seen
    assert "gemmgen.linear.default" in forward and "gemmgen.mm.default" in backward, seen


# --- TorchScript --------------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", ACTS)
def test_bug_torch_jit_script_of_the_layer_raised_a_compile_error(activation, bias):
    # torch.jit.script(model) failed to compile the layer's forward ("python value of type 'bool' cannot be used as
    # a value", in torch.fx's tracing flag): TorchScript deployments could not take it where torch.nn.Linear
    # scripts. The scripted forward is now the custom op gemmgen::linear (a kernel where one is stored).
    import io

    ref, ours = twin_layers(4, 3, bias=bias, activation=activation)
    scripted = torch.jit.script(torch.nn.Sequential(ours))
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x1, x2 = (torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(3), requires_grad=True) for _ in "12")
    want, got = torch_act(ref(x1), activation), scripted(x2)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(loaded(x2), want)
    g = torch.randn(want.shape)
    for w, o in zip(torch.autograd.grad(want, [x1, *ref.parameters()], g),
                    torch.autograd.grad(got, [x2, *ours.parameters()], g)):
        torch.testing.assert_close(o, w)
    assert gemmgen.stats()["fallbacks"] > 0   # (CPU: the op ran on torch, counted)
