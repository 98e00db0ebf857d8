"""What the torch-layer tests share: torch's own activations, quiet fallback counters, and a kernel store of a Linear
layer's products (the model's picks, compiled for this GPU)."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from gemmgen.torch import stats  # noqa: E402


def torch_act(z, activation: str):
    """The layer's activation as torch computes it (GELU: the tanh approximation, as the kernels do)."""
    return {"none": lambda t: t, "relu": torch.relu, "silu": torch.nn.functional.silu,
            "gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[activation](z)


@pytest.fixture(autouse=True)
def quiet_fallbacks():
    """Counters and one-time warnings reset for each test, the FallbackWarning silenced (imported: autouse there)."""
    stats.reset_stats(warnings_too=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.FallbackWarning)
        yield


def linear_store(tmp_path_factory, in_features: int, out_features: int, tokens: int, activations=("none",)):
    """A kernel store holding Linear(in, out, bias)'s products at `tokens`: all three for "none", the forward for
    each other activation; registered for the test module, then unregistered (a generator for a fixture)."""
    import gemmgen
    from gemmgen.model.linear import LinearLayer
    from gemmgen.torch.registry import REGISTRY, gpu_key
    from gemmgen.tune.linear import tune_linear

    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    key = gpu_key(0)
    if key is None:
        pytest.skip(f"{torch.cuda.get_device_name(0)} is not in gemmgen's catalogue")
    root = tmp_path_factory.mktemp("kernels")
    for activation in activations:
        layer = LinearLayer.create(in_features, out_features, "bf16", True, activation, tokens)
        products = tune_linear(layer, gemmgen.lookup_gpu(key), dry_run=True, top_k=1, jobs=2, root=root,
                               roles=("forward",) if activation != "none" else ("forward", "dgrad", "wgrad"))
        assert all(p.kernel for p in products), [p.result for p in products]
    REGISTRY.use_store(root)
    yield root
    REGISTRY.use_store(None)
