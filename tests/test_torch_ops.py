"""gemmgen's torch layer on the CPU: the custom ops (opcheck, torch.compile, autograd), gemmgen.nn.Linear against
torch.nn.Linear, the fallback counters, DLPack, the kernel registry and `gemmgen tune-linear --dry-run`.

CPU tensors always take the torch (aten) fallback, so these tests pin the ops' contracts (schemas, fake impls,
gradient formulas, state_dict) and the store's format; tests/test_torch_gpu.py checks the kernel path.
"""
from __future__ import annotations

import json
import re
import warnings

import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
from gemmgen.model.arch import DType  # noqa: E402
from gemmgen.model.errors import InvalidInput  # noqa: E402
from gemmgen.model.linear import KernelClass, LinearLayer, read_class  # noqa: E402
from gemmgen.model.problem import Activation, Layout  # noqa: E402
from gemmgen.torch import ops, stats  # noqa: E402
from gemmgen.torch.nn import Linear  # noqa: E402
from gemmgen.torch.registry import KernelRegistry  # noqa: E402
from torch_helpers import quiet_fallbacks, torch_act  # noqa: E402,F401

ACTS = ["none", "relu", "gelu", "silu"]




# --- the ops' contracts -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b_col", [False, True])
def test_opcheck_mm(dtype, b_col):
    A = torch.randn(37, 24, dtype=dtype, requires_grad=True)
    B = (torch.randn(19, 24, dtype=dtype).t() if b_col else torch.randn(24, 19, dtype=dtype)).requires_grad_()
    torch.library.opcheck(torch.ops.gemmgen.mm.default, (A, B))


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_opcheck_linear(activation, with_bias):
    X = torch.randn(3, 7, 24, requires_grad=True)
    W = torch.randn(19, 24, requires_grad=True)
    b = torch.randn(19, requires_grad=True) if with_bias else None
    torch.library.opcheck(torch.ops.gemmgen.linear.default, (X, W, b, activation))


@pytest.mark.parametrize("activation", ACTS)
def test_linear_op_gradients_pass_gradcheck_in_double(activation):
    # Double precision runs the fallback, so this checks the registered backward formulas themselves
    # (the recomputed pre-activation of GELU and SiLU included). Inputs away from ReLU's kink.
    X = (torch.rand(5, 6, dtype=torch.float64) + 0.1).requires_grad_()
    W = (torch.rand(4, 6, dtype=torch.float64) + 0.1).requires_grad_()
    b = torch.rand(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, bb: ops.linear(x, w, bb, activation), (X, W, b))


def test_mm_gradients_pass_gradcheck_with_a_transposed_operand():
    A = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    B = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: gemmgen.mm(a, b.t()), (A, B))


@pytest.mark.parametrize("call, message", [
    (lambda: gemmgen.mm(torch.randn(3, 4), torch.randn(5, 6)), "A: M×K and B: K×N"),
    (lambda: gemmgen.mm(torch.randn(3, 4), torch.randn(4, 6, dtype=torch.float64)), "one dtype"),
    (lambda: ops.linear(torch.randn(3, 4), torch.randn(5, 6)), "X (..., in) and W [out, in]"),
    (lambda: ops.linear(torch.randn(3, 4), torch.randn(5, 4), torch.randn(4)), "bias [out]"),
    (lambda: ops.linear(torch.randn(3, 4), torch.randn(5, 4), None, "tanh"), "activation must be one of"),
])
def test_bad_operands_are_refused_naming_the_rule(call, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        call()


# --- gemmgen.nn.Linear against torch.nn.Linear -------------------------------------------------------------------

def twin_layers(in_f, out_f, bias, activation, dtype):
    """A torch.nn.Linear and a gemmgen Linear with the same parameters."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(in_f, out_f, bias=bias, dtype=dtype)
    ours = Linear(in_f, out_f, bias=bias, dtype=dtype, activation=activation)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def grads(layer, x, activation=None, reference=False):
    x = x.clone().requires_grad_()
    y = torch_act(layer(x), activation) if reference else layer(x)
    g = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)  # a fixed, uneven upstream gradient
    y.backward(g)
    out = {"y": y.detach(), "x": x.grad, "w": layer.weight.grad}
    if layer.bias is not None:
        out["b"] = layer.bias.grad
    return out


@pytest.mark.parametrize("tokens", [1, 13, 77])
@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_fp32_gradients_match_torch_linear(tokens, activation, bias):
    # fp32: both run aten on the CPU; only the order of the bias-gradient sum may differ: 1e-5 relative.
    ref, ours = twin_layers(40, 24, bias, activation, torch.float32)
    x = torch.randn(tokens, 40)
    want, got = grads(ref, x, activation, reference=True), grads(ours, x)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("activation", ["none", "gelu", "relu"])
def test_linear_bf16_gradients_are_within_torch_bf16_error_of_the_fp64_reference(activation):
    # The numerics rule: against an fp64 reference, gemmgen's bf16 error is at most torch's own bf16
    # Linear's (x 1.5, + 1e-3 for the rounding of a differently ordered sum).
    ref64, _ = twin_layers(96, 40, True, activation, torch.float64)
    ref16, ours = twin_layers(96, 40, True, activation, torch.bfloat16)
    x = torch.randn(2, 51, 96, dtype=torch.float64)
    exact = grads(ref64, x, activation, reference=True)
    theirs = grads(ref16, x.bfloat16(), activation, reference=True)
    mine = grads(ours, x.bfloat16())
    for name in exact:
        scale = exact[name].abs().max()
        err_torch = (theirs[name].double() - exact[name]).abs().max() / scale
        err_mine = (mine[name].double() - exact[name]).abs().max() / scale
        assert err_mine <= 1.5 * err_torch + 1e-3, (name, float(err_mine), float(err_torch))


def test_state_dict_round_trips_with_torch_linear():
    ref = torch.nn.Linear(12, 7)
    ours = Linear(12, 7, activation="relu")
    assert list(ours.state_dict()) == ["weight", "bias"]
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    ours.load_state_dict(ref.state_dict())
    back = torch.nn.Linear(12, 7)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back.weight, ref.weight) and torch.equal(back.bias, ref.bias)
    assert isinstance(ours, torch.nn.Linear) and "activation=relu" in repr(ours)
    assert Linear(12, 7, bias=False).bias is None


def test_from_linear_shares_parameters():
    ref = torch.nn.Linear(8, 3)
    ours = Linear.from_linear(ref, activation="silu")
    assert ours.weight is ref.weight and ours.bias is ref.bias
    x = torch.randn(4, 8)
    torch.testing.assert_close(ours(x), torch.nn.functional.silu(ref(x)))


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="activation must be one of"):
        Linear(4, 4, activation="tanh")


# --- torch.compile ---------------------------------------------------------------------------------------------

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = Linear(32, 64, activation="gelu")
        self.down = Linear(64, 32, bias=False)
        self.mix = torch.nn.Parameter(torch.randn(32, 32) * 0.1)

    def forward(self, x):
        return self.down(self.up(x)) + gemmgen.mm(x.reshape(-1, 32), self.mix).reshape(x.shape)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_traces_the_block_in_one_graph_forward_and_backward(backend):
    torch._dynamo.reset()
    model = Block()
    x = torch.randn(2, 9, 32, requires_grad=True)
    compiled = torch.compile(model, backend=backend, fullgraph=True)  # fullgraph: a graph break is an error
    got = compiled(x)
    want = model(x)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    # no-grad (inference) takes the fused-activation path: also one graph
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), want.detach())


def test_compiled_graph_calls_the_custom_ops():
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    with torch.no_grad():
        torch.compile(Block(), backend=backend, fullgraph=True)(torch.randn(5, 32))
    assert {"gemmgen.linear", "gemmgen.mm"} <= {target.removesuffix(".default") for target in seen}, seen


# --- stats, DLPack ---------------------------------------------------------------------------------------------

def test_stats_count_fallbacks_by_reason_and_warn_once():
    stats.reset_stats(warnings_too=True)
    layer = Linear(8, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            layer(torch.randn(2, 8))
        gemmgen.mm(torch.randn(2, 8), torch.randn(8, 3))
    counts = gemmgen.stats()
    assert counts["kernel_calls"] == 0 and counts["fallbacks"] == 4
    assert counts["fallbacks_by_reason"] == {"tensors on cpu": 4}
    assert len([w for w in caught if issubclass(w.category, stats.FallbackWarning)]) == 1
    gemmgen.reset_stats()
    assert gemmgen.stats()["fallbacks"] == 0


def test_mm_takes_numpy_through_dlpack_and_returns_numpy():
    np = pytest.importorskip("numpy")
    A = np.arange(12, dtype=np.float32).reshape(3, 4)
    B = np.ones((4, 2), dtype=np.float32)
    D = gemmgen.mm(A, B)
    assert isinstance(D, np.ndarray) and np.allclose(D, A @ B)
    with pytest.raises(gemmgen.InvalidInput, match="__dlpack__"):
        gemmgen.mm([[1.0]], [[2.0]])


def test_importing_gemmgen_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, gemmgen; gemmgen.stats(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


# --- the registry and the store --------------------------------------------------------------------------------

def forward_class(n=24, k=40, activation=Activation.NONE):
    return KernelClass(DType.BF16, Layout.ROW, Layout.COL, True, activation, None, n, k)


def test_registry_finds_a_registered_kernel_by_class_and_fixed_dimensions():
    registry = KernelRegistry(root="/nonexistent")
    kernel = lambda A, B, D, C=None, bias=None: D  # noqa: E731
    registry.register(forward_class(), kernel)
    find = lambda m, n, k, act=Activation.NONE, gpu="h100-sxm": registry.find(  # noqa: E731
        DType.BF16, Layout.ROW, Layout.COL, True, act, m, n, k, gpu)
    assert find(7, 24, 40).kernel is kernel and find(8192, 24, 40).kernel is kernel  # any token count
    assert find(7, 25, 40) is None and find(7, 24, 40, Activation.GELU) is None
    assert registry.find(DType.BF16, Layout.ROW, Layout.ROW, True, Activation.NONE, 7, 24, 40, "h100-sxm") is None
    registry.register(forward_class(), kernel, gpu="a100-sxm")
    assert find(7, 24, 40, gpu=None).kernel is kernel  # a registration for any GPU serves an unknown one
    with pytest.raises(TypeError, match="callable"):
        registry.register(forward_class(), "not a kernel")


def test_a_store_folder_whose_class_json_nests_thousands_deep_is_skipped_not_a_recursion_error(tmp_path):
    # Regression: read_class parsed class.json with json.loads, whose RecursionError escaped KernelRegistry.find (so
    # a model's forward on the GPU) where every other damaged store folder is skipped.
    folder = tmp_path / "h100-sxm" / forward_class().key
    folder.mkdir(parents=True)
    (folder / "class.json").write_text("[" * 100000 + "]" * 100000)
    assert read_class(folder) is None
    registry = KernelRegistry(root=tmp_path)
    assert registry.find(DType.BF16, Layout.ROW, Layout.COL, True, Activation.NONE, 7, 24, 40, "h100-sxm") is None


def test_linear_layer_products_have_the_layouts_and_dimensions_of_the_three_gemms():
    layer = LinearLayer.create(4096, 14336, "bf16", True, "silu", "1..4096")
    p = layer.problems()
    assert (p["forward"].m, p["forward"].n, p["forward"].k) == (4096, 14336, 4096)
    assert (p["dgrad"].m, p["dgrad"].n, p["dgrad"].k) == (4096, 4096, 14336)
    assert (p["wgrad"].m, p["wgrad"].n, p["wgrad"].k) == (14336, 4096, 4096)
    assert [(p[r].a_layout.value, p[r].b_layout.value) for r in ("forward", "dgrad", "wgrad")] == [
        ("row", "col"), ("row", "row"), ("col", "row")]
    assert p["forward"].epilogue.bias and p["forward"].epilogue.activation is Activation.SILU  # fused
    # Training keeps the pre-activation for SiLU's backward: the bias-only forward, a class of its own.
    assert p["preact"].epilogue.bias and p["preact"].epilogue.activation is Activation.NONE
    assert (p["preact"].m, p["preact"].n, p["preact"].k) == (4096, 14336, 4096)
    assert layer.classes()["preact"].key == "bf16_rc_bias_mT_n14336_k4096" != layer.classes()["forward"].key
    assert "preact" not in LinearLayer.create(4096, 14336, "bf16", True, "relu", "1..4096").problems()
    assert not p["dgrad"].epilogue.bias and not p["wgrad"].epilogue.bias
    # The bias gradient comes from the weight-gradient kernel (the row sums of dZᵀ), unless asked otherwise.
    assert p["wgrad"].epilogue.row_sums and layer.classes()["wgrad"].key == "bf16_cr_rowsum_m14336_n4096_kT"
    for other in (LinearLayer.create(4096, 14336, "bf16", True, "silu", "1..4096", bias_grad="separate"),
                  LinearLayer.create(4096, 14336, "bf16", False, "silu", "1..4096")):
        assert other.classes()["wgrad"].key == "bf16_cr_linear_m14336_n4096_kT"
    with pytest.raises(InvalidInput, match="--bias-grad must be one of fused, separate"):
        LinearLayer.create(64, 64, bias=True, bias_grad="sometimes")


def test_tune_linear_dry_run_stores_the_three_products_where_the_registry_finds_them(tmp_path, monkeypatch, capsys):
    from gemmgen.cli import main

    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path))
    try:
        from gemmgen.codegen import nvrtc  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {exc}")
    common = ["--bias", "--activation", "gelu", "--dry-run", "--gpu", "h100", "--top-k", "1", "--jobs", "1"]
    code = main(["tune-linear", "256", "200", "--tokens", "64..128"] + common)
    out = capsys.readouterr().out
    assert code == 0, out
    store = tmp_path / "kernels" / "h100-sxm"
    folders = sorted(p.name for p in store.iterdir())
    # A layer with a bias, on Hopper: the weight gradient writes the bias gradient too (the row sums of dZᵀ); a
    # GELU layer's training forward (bias only, the pre-activation kept for GELU's backward) is a product of its own.
    assert folders == ["bf16_cr_rowsum_m200_n256_kT", "bf16_rc_bias_gelu_mT_n200_k256", "bf16_rc_bias_mT_n200_k256",
                       "bf16_rr_linear_mT_n256_k200"]
    for folder in store.iterdir():
        kernel_class, raw = read_class(folder)
        assert raw["measured"] is False and raw["layer"]["tokens"] == [64, 128]
        if kernel_class.m is None:  # tokens are M: a dispatch table over the token buckets 64 and 65..128
            table = json.loads((folder / "dispatch.json").read_text())["tables"][0]
            assert [(b["m_min"], b["m_max"]) for b in table["buckets"]] == [(64, 64), (65, 128)]
        else:  # tokens are K: one kernel, tuned at the top of the range
            manifests = list(folder.glob("gemmgen_*.json"))
            assert len(manifests) == 1 and json.loads(manifests[0].read_text())["problem"]["K"] == 128
            assert not (folder / "dispatch.json").exists()
    registry = KernelRegistry()
    found = registry.find(DType.BF16, Layout.COL, Layout.ROW, False, Activation.NONE, 200, 256, 77, "h100-sxm", True)
    assert found is not None and found.kernel.name.startswith("gemmgen_sm_90a_bf16bf16_bf16_f32_cr")
    assert found.kernel.problem.epilogue.row_sums
    assert registry.find(DType.BF16, Layout.COL, Layout.ROW, False, Activation.NONE, 200, 256, 77, "a100-sxm",
                         True) is None
    forward = registry.find(DType.BF16, Layout.ROW, Layout.COL, True, Activation.GELU, 100, 200, 256, "h100-sxm")
    assert forward is not None and hasattr(forward.kernel, "kernel_for")  # the dispatch callable
    # Re-running replaces each folder whole: one count, no buckets -> one manifest per class, no dispatch table.
    assert main(["tune-linear", "256", "200", "--tokens", "64", "--buckets", "none"] + common) == 0
    assert all(len(list(f.glob("gemmgen_*.json"))) == 1 for f in store.iterdir())
    assert not list(store.glob("*/dispatch.json"))
    assert not [p for p in store.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("argv, message", [
    (["tune-linear", "0", "64", "--gpu", "h100", "--dry-run"], "IN must be a positive integer"),
    (["tune-linear", "64", "x", "--gpu", "h100", "--dry-run"], "OUT must be a positive integer"),
    (["tune-linear", "64", "64", "--tokens", "9..3", "--gpu", "h100", "--dry-run"], "LO <= HI"),
    (["tune-linear", "64", "64", "--tokens", "1..", "--gpu", "h100", "--dry-run"], "--tokens must be"),
    (["tune-linear", "64", "64", "--dtype", "f32", "--gpu", "h100", "--dry-run"], "bf16 or f16"),
    (["tune-linear", "64", "64", "--bias-grad", "separate", "--gpu", "h100", "--dry-run"], "--bias-grad needs --bias"),
    (["tune-linear", "64", "64", "--bias", "--bias-grad", "later", "--gpu", "h100", "--dry-run"],
     "--bias-grad must be one of fused, separate"),
    (["tune-linear", "64", "64", "--activation", "tanh", "--gpu", "h100", "--dry-run"], "activation must be"),
    (["tune-linear", "64", "64", "--dry-run"], "--dry-run needs --gpu"),
    (["tune-linear", "64", "64", "--gpu", "h900", "--dry-run"], "GPU must be one of"),
    (["tune-linear", "64", "64", "--trials", "0", "--gpu", "h100", "--dry-run"], "--trials must be"),
    (["tune-linear", "64", "64", "--buckets", "log", "--gpu", "h100", "--dry-run"], "--buckets must be one of"),
])
def test_tune_linear_refuses_bad_input_with_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    from gemmgen.cli import main

    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_tune_linear_reduces_the_bias_gradient_separately_where_no_family_writes_row_sums(tmp_path):
    """On an A100 (sm80 families only: none writes row sums) a layer with a bias stores the plain weight
    gradient, and says so in class.json; gemmgen.nn.Linear then reduces dZ on torch."""
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.tune.linear import tune_linear

    try:
        from gemmgen.codegen import nvrtc  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {exc}")
    layer = LinearLayer.create(256, 200, "bf16", True, "none", "64")
    assert layer.problems()["wgrad"].epilogue.row_sums
    (product,) = tune_linear(layer, lookup_gpu("a100"), dry_run=True, top_k=1, roles=("wgrad",), root=tmp_path)
    assert product.folder.name == "bf16_cr_linear_m200_n256_kT" and not product.problem.epilogue.row_sums
    kernel_class, raw = read_class(product.folder)
    assert not kernel_class.row_sums and raw["layer"]["bias_grad"] == "separate"
