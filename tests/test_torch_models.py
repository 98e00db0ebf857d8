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
