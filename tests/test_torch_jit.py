"""gemmgen.torch's opt-in JIT (jit.py): a product no stored kernel serves gets the model's pick, compiled and stored.

CPU: what a build stores (a class folder the registry reads, for the exact shape), that a failed build is recorded
and not retried, and that it is off by default. GPU: gemmgen.mm and gemmgen.nn.Linear (forward, data and weight
gradients) on shapes nothing was tuned for, against torch's fp32 reference, with no fallback counted.
"""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
from gemmgen.model.arch import DType  # noqa: E402
from gemmgen.model.linear import read_class  # noqa: E402
from gemmgen.model.problem import Activation, Layout  # noqa: E402
from gemmgen.torch import jit, stats  # noqa: E402


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty kernel store and compile cache of the test's own, JIT on; everything put back after."""
    from gemmgen.torch.registry import REGISTRY

    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "cache"))
    REGISTRY.use_store(tmp_path / "kernels")
    was = jit.enabled()
    jit.enable()
    monkeypatch.setattr(jit, "_failed", {})
    stats.reset_stats(warnings_too=True)
    yield tmp_path / "kernels"
    jit.enable(was)
    REGISTRY.use_store(None)


def test_jit_is_off_unless_asked():
    import os
    assert jit.enabled() == (os.environ.get("GEMMGEN_JIT", "").strip().lower() in ("1", "true", "yes", "on"))


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("YES", True), ("on", True), (" 1 ", True),
                                       ("0", False), ("false", False), ("no", False), ("Off", False), ("", False)])
def test_gemmgen_jit_takes_the_documented_and_the_common_true_false_spellings(monkeypatch, value, on):
    monkeypatch.setenv("GEMMGEN_JIT", value)
    monkeypatch.setattr(jit, "_enabled", None)
    assert jit.enabled() is on


@pytest.mark.parametrize("value", ["2", "enable", "ture", "-1"])
def test_a_gemmgen_jit_value_it_does_not_take_is_refused_naming_the_variable_value_and_spellings(monkeypatch, value):
    # It was read as off without a word: a user who set GEMMGEN_JIT=2 or a typo never learnt the JIT stayed off.
    # It is read on first use, so `import gemmgen` with a bad value still works.
    import subprocess
    import sys

    from gemmgen.model.errors import InvalidInput

    monkeypatch.setenv("GEMMGEN_JIT", value)
    monkeypatch.setattr(jit, "_enabled", None)
    with pytest.raises(InvalidInput) as caught:
        jit.enabled()
    message = str(caught.value)
    assert "GEMMGEN_JIT" in message and repr(value) in message and "\n" not in message
    assert all(word in message for word in ("1", "true", "yes", "on", "0", "false", "no", "off"))
    jit.enable()   # enable() decides without the environment
    assert jit.enabled()
    done = subprocess.run([sys.executable, "-c", "import gemmgen"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_token_counts_are_built_at_the_top_of_their_quarter_octave_bucket():
    assert [jit.bucket(m) for m in (1, 16, 17, 33, 49, 77, 100, 128, 129, 513, 2088, 16384, 16385)] == \
        [16, 16, 32, 48, 64, 80, 112, 128, 160, 640, 2560, 16384, 16385]
    tops = [jit.bucket(m) for m in range(1, 16385)]
    # every top a multiple of 16 at or above its counts, no count below ~0.8 of its top past the smallest buckets
    assert all(t % 16 == 0 and t >= m for m, t in enumerate(tops, 1))
    assert all(m / t > 0.78 for m, t in enumerate(tops, 1) if m > 64) and len(set(tops)) == 36


def test_a_build_stores_the_bucket_s_class_where_the_registry_reads_and_serves_the_bucket_from_it(store):
    from gemmgen.torch.registry import REGISTRY
    assert jit.build(DType.BF16, Layout.ROW, Layout.COL, True, Activation.GELU, 77, 776, 520, "h100-sxm")
    folders = [f for f in (store / "h100-sxm").iterdir() if not f.name.startswith(".")]
    assert len(folders) == 1
    kernel_class, raw = read_class(folders[0])
    assert (kernel_class.m, kernel_class.n, kernel_class.k) == (80, 776, 520)   # 77 tokens: the 65..80 bucket
    assert kernel_class.bias and kernel_class.activation is Activation.GELU and raw["role"] == "jit"
    assert raw["measured"] is False and list(folders[0].glob("*.cubin"))
    # Another count of the bucket is served by the same kernel: nothing compiled, nothing stored.
    assert jit.build(DType.BF16, Layout.ROW, Layout.COL, True, Activation.GELU, 66, 776, 520, "h100-sxm")
    assert len([f for f in (store / "h100-sxm").iterdir() if not f.name.startswith(".")]) == 1
    served = [REGISTRY.find(DType.BF16, Layout.ROW, Layout.COL, True, Activation.GELU, m, 776, 520, "h100-sxm")
              for m in (77, 66, 80)]
    assert all(served) and len({id(f.kernel) for f in served}) == 1


def test_a_weight_gradient_with_its_bias_gradient_is_bucketed_in_k_too(store):
    """A product writing A's row sums is a Linear layer's weight gradient (M the output width, K the tokens): K goes
    to its bucket, M stays."""
    assert jit.build(DType.BF16, Layout.COL, Layout.ROW, False, Activation.NONE, 392, 264, 77, "h100-sxm",
                     row_sums=True)
    folders = [f for f in (store / "h100-sxm").iterdir() if not f.name.startswith(".")]
    kernel_class, _ = read_class(folders[0])
    assert len(folders) == 1 and (kernel_class.m, kernel_class.n, kernel_class.k) == (392, 264, 80)
    assert kernel_class.row_sums


def test_a_failed_build_is_recorded_and_not_tried_again(store, monkeypatch):
    calls = []

    def no_pick(*args, **kwargs):
        calls.append(args)
        return None
    monkeypatch.setattr(jit, "_builder", no_pick)
    for _ in range(3):
        assert not jit.build(DType.F16, Layout.ROW, Layout.ROW, False, Activation.NONE, 64, 64, 64, "h100-sxm")
    assert len(calls) == 1 and list(jit.failures().values()) == ["no configuration compiled"]
    # A dimension no family indexes: refused by a rule, recorded with it.
    assert not jit.build(DType.BF16, Layout.ROW, Layout.ROW, False, Activation.NONE, 2 ** 31, 64, 64, "h100-sxm")
    assert any("2147483648" in key for key in jit.failures())


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    from gemmgen.torch.registry import gpu_key
    if gpu_key(0) is None:
        pytest.skip(f"{torch.cuda.get_device_name(0)} is not in gemmgen's catalogue")


@pytest.mark.gpu
def test_mm_on_a_shape_nothing_was_tuned_for_runs_on_a_jit_kernel(store, cuda):
    torch.manual_seed(3)
    A = torch.randn(301, 520, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(520, 1000, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):   # the second call is served from the plan
        got = gemmgen.mm(A, B).float()
    want = A.float() @ B.float()
    assert ((got - want).norm() / want.norm()).item() < 1e-2
    counts = gemmgen.stats()
    assert counts["fallbacks"] == 0 and counts["kernel_calls"] == 2, counts


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_linear_trains_on_jit_kernels_within_torch_bf16_error(store, cuda, activation):
    """Forward, data and weight gradients (the bias gradient from the weight gradient's row sums) all compiled on
    first use at odd sizes, against torch's fp32 Linear; no fallback."""
    torch.manual_seed(4)
    tokens, fan_in, fan_out = 77, 264, 392
    ref32 = torch.nn.Linear(fan_in, fan_out, device="cuda")
    ref16 = torch.nn.Linear(fan_in, fan_out, device="cuda", dtype=torch.bfloat16)
    ref16.load_state_dict(ref32.state_dict())
    ours = gemmgen.nn.Linear(fan_in, fan_out, device="cuda", dtype=torch.bfloat16, activation=activation)
    ours.load_state_dict(ref32.state_dict())
    act = (lambda t: t) if activation == "none" else (lambda t: torch.nn.functional.gelu(t, approximate="tanh"))

    def run(layer, x, g, post):
        x = x.clone().requires_grad_()
        y = post(layer(x))
        y.backward(g)
        return {"y": y.detach().float(), "x": x.grad.float(), "w": layer.weight.grad.float(),
                "b": layer.bias.grad.float()}
    x = torch.randn(tokens, fan_in, device="cuda")
    g = torch.randn(tokens, fan_out, device="cuda")
    exact = run(ref32, x, g, act)
    theirs = run(ref16, x.bfloat16(), g.bfloat16(), act)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.FallbackWarning)
        mine = run(ours, x.bfloat16(), g.bfloat16(), lambda t: t)
    counts = gemmgen.stats()
    assert counts["fallbacks"] == 0, counts
    for name in exact:
        scale = exact[name].abs().max()
        err_torch = ((theirs[name] - exact[name]).abs().max() / scale).item()
        err_mine = ((mine[name] - exact[name]).abs().max() / scale).item()
        assert err_mine <= 2 * err_torch + 2e-3, (name, err_mine, err_torch)
