"""gemmgen.nn.Linear: torch.nn.Linear on gemmgen kernels, with an optional fused activation.

A subclass of torch.nn.Linear: the same constructor arguments, parameters (weight [out, in], bias [out]),
initialisation and state_dict, so it loads a torch.nn.Linear's checkpoint and isinstance checks still hold.
`activation` adds 'relu', 'gelu' (tanh approximation) or 'silu' after the product.

The forward is gemmgen::linear. Where autograd will need the activation's backward for GELU or SiLU, the layer
runs the bias-only kernel and applies the activation on torch, so autograd saves the pre-activation instead of
recomputing the product in the backward; without gradients (inference) the activation is fused in the kernel
epilogue. ReLU is always fused: its backward needs only the output.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.fx import _symbolic_trace
from torch.nn.utils import parametrize

from ..model.linear import ACTIVATIONS
from . import ops

# (not is_fx_tracing: that one logs a warning on its first call)
_fx_tracing = getattr(_symbolic_trace, "is_fx_symbolic_tracing", lambda: _symbolic_trace._is_fx_tracing_flag)


class Linear(torch.nn.Linear):
    """y = act(x·Wᵀ + b) on gemmgen kernels (torch where none is stored for the product)."""

    # The default for an instance that never ran __init__: a torch.nn.Linear whose __class__ was swapped to this one
    # (as module-swapping tools do), or one made by __new__ and filled in, is a plain Linear, not an AttributeError.
    activation = "none"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 activation: "str | None" = None):
        activation = "none" if activation is None else str(activation).lower()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, but got {activation!r}")
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = activation

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear, activation: "str | None" = None) -> "Linear":
        """A gemmgen Linear sharing `layer`'s parameters (no copy), its parametrizations (torch.nn.utils.parametrize,
        with their original parameters) and its training mode (hooks are the module's own: register them on the new
        layer)."""
        activation = "none" if activation is None else str(activation).lower()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, but got {activation!r}")
        out = cls.__new__(cls)
        torch.nn.Module.__init__(out)
        out.in_features, out.out_features = layer.in_features, layer.out_features
        # A parametrized tensor (weight_norm, orthogonal, ...) is not read here: its value, set as a plain tensor,
        # was left out of state_dict and parameters() (a checkpoint without the weight, an optimizer that never
        # trained it) and went stale, its graph freed after one backward. It is transferred below instead.
        parametrized = set(layer.parametrizations) if parametrize.is_parametrized(layer) else set()
        for name in ("weight", "bias"):
            if name not in parametrized:
                value = getattr(layer, name)
                if name in layer._buffers:
                    out.register_buffer(name, value, persistent=name not in layer._non_persistent_buffers_set)
                elif name in layer._parameters or value is None:
                    out.register_parameter(name, value)   # (None: a slot, as torch.nn.Linear's bias=False)
                else:
                    # A plain tensor: recomputed by the source's forward pre-hook from tensors this layer would
                    # not have, and missing from its state_dict() and parameters() (a checkpoint without it).
                    raise ValueError(
                        f"from_linear needs layer.{name} as a parameter or buffer, but it is a plain tensor set by a "
                        f"forward pre-hook (torch.nn.utils.prune, or the deprecated torch.nn.utils.weight_norm): "
                        f"make it permanent first (prune.remove(layer, {name!r}), remove_weight_norm(layer)), or use "
                        f"torch.nn.utils.parametrizations, which from_linear carries")
        if parametrized:
            parametrize.transfer_parametrizations_and_params(layer, out)   # the same modules and originals
        out.train(layer.training)   # a swap done on an eval-mode model leaves it in eval mode
        out.activation = activation
        return out

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 (torch.nn.Linear's name: callers pass input=)
        if torch.jit.is_scripting():
            # TorchScript compiles only this branch (is_scripting() is a constant to it): the custom op, whose
            # autograd recomputes Z for GELU/SiLU. (The Python below reads fx's and the ops' module state, which
            # TorchScript cannot compile.)
            return torch.ops.gemmgen.linear(input, self.weight, self.bias, self.activation)
        # Under torch.jit.trace one graph must serve both grad modes, and torch.fx's proxies have no requires_grad
        # to branch on: both record the fused op, whose backward recomputes Z.
        if self.activation in ("gelu", "silu") and torch.is_grad_enabled() and not torch.jit.is_tracing() and \
                not _fx_tracing() and (input.requires_grad or self.weight.requires_grad or
                                       (self.bias is not None and self.bias.requires_grad)):
            z = ops.linear(input, self.weight, self.bias, "none")
            if self.activation == "gelu":
                return torch.nn.functional.gelu(z, approximate="tanh")
            return torch.nn.functional.silu(z)
        return ops.linear(input, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.activation == "none" else f", activation={self.activation}")


__all__ = ["Linear"]
