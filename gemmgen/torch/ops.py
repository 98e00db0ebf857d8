"""The custom ops gemmgen::mm and gemmgen::linear (torch.library), their fake impls and their autograd.

    gemmgen::mm(A, B) -> D                              D = A·B           A: M×K, B: K×N (row- or column-major)
    gemmgen::linear(X, W, bias?, activation) -> Y       Y = act(X·Wᵀ + b) X: (..., in), W: [out, in], b: [out]

On CUDA each op runs a gemmgen kernel when the registry (registry.py) holds one for its product, on the current
stream, writing an output torch allocated, with no host synchronisation (so a warmed-up call captures in a CUDA
graph). Anything else runs on torch (aten) and is counted in gemmgen.stats() with a one-time warning per
reason; CPU tensors always do. activation is 'none', 'relu', 'gelu' (tanh approximation, the kernels' GELU)
or 'silu' (x·sigmoid(x); fused in the kernels' epilogue as the others are).

Backward (register_autograd): dA = dD·Bᵀ and dB = Aᵀ·dD through gemmgen::mm, so each gradient is its own
product with its own layouts and finds its own kernel. For linear: dZ from the activation (ReLU from the saved
output; GELU/SiLU from the pre-activation, recomputed here through gemmgen::linear: gemmgen.nn.Linear avoids the
recomputation by saving it, see nn.py), dX = dZ·W, dW = dZᵀ·X, and the bias gradient, the column sums of dZ:
written by the weight-gradient kernel itself when the registry holds one built with row sums (Epilogue.row_sums:
its producer warps sum dZᵀ's rows as the tiles pass through shared memory), else a reduction on torch.

Eager fast path: `mm`, `linear` (and so gemmgen.nn.Linear) call the implementation (plans.py, shared with the
custom ops) directly when nothing traces the call: not compiling, plain tensors (no subclass, no fake or meta
tensor), no torch function or dispatch mode and no functorch transform active. Where autograd needs the call,
a torch.autograd.Function with the same backward formulas wraps it. The torch.library dispatcher costs some
25-30 us of host time per call, more than a whole small product on the GPU; torch.compile, opcheck, fake tensors
and make_fx still see the custom ops. Under a torch.func transform (grad, jvp, jacfwd, vmap) or a forward-mode AD
level, eager or compiled, `mm` and `linear` run on torch's own ops (counted as a fallback when eager): torch.library's
autograd for custom ops has no forward-mode rule (a dual's tangent is dropped silently) and fails under grad.
"""
from __future__ import annotations

import math
import sys
from typing import Optional

import torch
import torch.autograd.forward_ad as _forward_ad
from torch import Tensor

from ..model.errors import InvalidInput
from . import plans, stats
from .plans import check_linear, check_mm, check_tensors

_PLAIN = (Tensor, torch.nn.Parameter)
_C = torch._C
_is_compiling = torch.compiler.is_compiling
# Each absent accessor (an older torch) reads as "something is active": the call goes through the custom op.
_function_mode = getattr(_C, "_is_torch_function_mode_enabled", lambda: True)
_dispatch_modes = getattr(_C, "_len_torch_dispatch_stack", lambda: 1)
_functorch = getattr(_C, "_are_functorch_transforms_active", lambda: True)
# (Here an absent accessor reads as "none active": the call goes through the custom op, as before.)
_functorch_active = getattr(_C, "_are_functorch_transforms_active", lambda: False)
TRANSFORMED = ("a torch.func transform (grad, jvp, vmap, ...) or forward-mode AD, which the custom ops' autograd "
               "does not support")


def _eager(*tensors) -> bool:
    """Whether a call on `tensors` may skip the torch.library dispatcher (see the module docstring)."""
    # The modes first: under a torch function mode even reading t.is_meta goes through the mode.
    if _is_compiling() or _function_mode() or _dispatch_modes() or _functorch() or _forward_ad._current_level >= 0 \
            or _C._is_tracing():
        return False
    for t in tensors:
        if type(t) not in _PLAIN or t.is_meta:  # (None or a non-tensor too: the custom op's schema names it)
            return False
    return True


def _transformed() -> bool:
    """Whether a call runs under a torch.func transform or a forward-mode AD level. The custom ops' autograd
    (torch.library) has no forward-mode rule and not the setup_context a transform needs: torch.func.grad raises,
    and jvp/jacfwd lose the tangent without a word. Such calls run on torch's own ops. (Under torch.compile too:
    compiled jvp/jacfwd were 0.9 off, grad/jacrev raised. dynamo answers _are_functorch_transforms_active at trace
    time; AOTAutograd's own tracing is no functorch transform, so a plain compiled model keeps the custom ops.)"""
    return _functorch_active() or _forward_ad._current_level >= 0


def _onnx_exporting() -> bool:
    """Whether torch.onnx.export is tracing the call (its TorchScript exporter, or torch.export in the dynamo one).
    ONNX has no gemmgen::mm or gemmgen::linear (the exporters refused them: "unrecognized namespace gemmgen"), so
    such calls record torch's mm, or linear and the activation, which the exporters write as standard ops (MatMul,
    Gemm, Relu, Gelu, Sigmoid and Mul) that any ONNX runtime runs. (dynamo folds this to False: compiled graphs keep
    the custom ops.)"""
    return torch.onnx.is_in_onnx_export()


def _wrapper_subclass(*tensors) -> "str | None":
    """The reason a call with an operand of a wrapper tensor subclass (DTensor in tensor parallelism, a quantized
    weight) runs on torch's linear and mm, which its dispatch knows, where gemmgen's custom ops are unknown to it
    (DTensor: NotImplementedError, no sharding strategy); None when no operand is one. (Nested tensors are handled
    by the ops; fake and functional tensors, which are not wrapper subclasses, go through the custom ops.)"""
    for t in tensors:
        cls = type(t)
        if cls not in _PLAIN and hasattr(cls, "__tensor_flatten__") and not t.is_nested:
            return f"{cls.__name__} operands (a tensor subclass whose dispatch knows torch's ops, not gemmgen's)"
    return None


_any_autocast = getattr(_C, "_is_any_autocast_enabled", lambda: False)
# Device types with autocast (not meta), found at import: dynamo in torch 2.11 cannot trace the question itself.
_AUTOCAST_DEVICES = frozenset(d for d in ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "maia", "xla", "ipu",
                                          "privateuseone") if torch.amp.is_autocast_available(d))


def _autocast(device_type: str, *tensors):
    """`tensors` as torch's autocast gives them to linear and mm: where autocast is on for `device_type`, the
    floating ones on that device (float64 aside) cast to its dtype, so gemmgen.nn.Linear in an autocast region
    computes (on bf16/f16 kernels) and returns what torch.nn.Linear does; else as given. (torch.ops.gemmgen.* take
    the dtypes they are given.)"""
    if not (device_type in _AUTOCAST_DEVICES and torch.is_autocast_enabled(device_type)):
        return tensors   # (meta tensors: a device type with no autocast, which is_autocast_enabled refuses)
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 and
                 t.device.type == device_type else t for t in tensors)


# --- gemmgen::mm ---------------------------------------------------------------------------------------------

@torch.library.custom_op("gemmgen::mm", mutates_args=())
def mm_op(A: Tensor, B: Tensor) -> Tensor:
    """D = A·B on a gemmgen kernel when one is registered for the product, else torch.mm."""
    check_tensors("mm", A=A, B=B)
    return plans.mm(A, B)


@mm_op.register_fake
def _mm_fake(A: Tensor, B: Tensor) -> Tensor:
    check_mm(A, B)
    return A.new_empty((A.shape[0], B.shape[1]))


def _mm_setup(ctx, inputs, output) -> None:
    A, B = inputs
    # Only what a needed gradient reads (dA reads B, dB reads A), as torch.mm saves: an operand kept for nothing
    # held an activation alive for the whole backward.
    needs = ctx.needs_input_grad
    ctx.save_for_backward(A if needs[1] else None, B if needs[0] else None)


def _mm_backward(ctx, dD: Tensor):
    A, B = ctx.saved_tensors
    dD = dD.contiguous()
    dA = mm(dD, B.t()) if ctx.needs_input_grad[0] else None
    dB = mm(A.t(), dD) if ctx.needs_input_grad[1] else None
    return dA, dB


mm_op.register_autograd(_mm_backward, setup_context=_mm_setup)


class _Mm(torch.autograd.Function):
    """gemmgen::mm's autograd for the eager fast path: the same setup and backward."""

    @staticmethod
    def forward(ctx, A: Tensor, B: Tensor) -> Tensor:
        output = plans.mm(A, B)
        _mm_setup(ctx, (A, B), output)
        return output

    @staticmethod
    def backward(ctx, dD: Tensor):
        return _mm_backward(ctx, dD)


# --- gemmgen::linear -----------------------------------------------------------------------------------------

@torch.library.custom_op("gemmgen::linear", mutates_args=())
def linear_op(X: Tensor, W: Tensor, bias: Optional[Tensor], activation: str) -> Tensor:
    """Y = act(X·Wᵀ + b) on a gemmgen kernel when one is registered for the product, else torch."""
    check_tensors("linear", X=X, W=W)
    return plans.linear(X, W, bias, activation)


@linear_op.register_fake
def _linear_fake(X: Tensor, W: Tensor, bias: Optional[Tensor], activation: str) -> Tensor:
    check_linear(X, W, bias, activation)
    return X.new_empty((*X.shape[:-1], W.shape[0]))


def _linear_setup(ctx, inputs, output) -> None:
    X, W, bias, activation = inputs
    ctx.activation = activation
    ctx.x_shape = X.shape
    # Only what the backward reads, as torch.nn.Linear's addmm saves: dX reads W, dW reads X, and a GELU/SiLU
    # backward recomputes the pre-activation from all three. Saving X for a frozen layer kept its input activation
    # alive until the backward (memory torch does not hold), and saving W made a layer whose parameters were made
    # under torch.inference_mode fail ("Inference tensors cannot be saved for backward") where torch runs.
    needs, recompute = ctx.needs_input_grad, activation in ("gelu", "silu")
    ctx.save_for_backward(X if recompute or needs[1] else None, W if recompute or needs[0] else None,
                          bias if recompute else None, output if activation == "relu" else None)


def _linear_backward(ctx, dY: Tensor):
    X, W, bias, Y = ctx.saved_tensors
    activation = ctx.activation
    if activation == "relu":
        # torch's own ReLU backward: the gradient passes where Y > 0 is not false (a NaN output passes it on)
        dZ = torch.ops.aten.threshold_backward(dY, Y, 0)
    elif activation in ("gelu", "silu"):
        Z = linear(X, W, bias, "none")  # the pre-activation, recomputed
        if activation == "gelu":
            dZ = torch.ops.aten.gelu_backward(dY, Z, approximate="tanh")
        elif torch.is_grad_enabled():
            # create_graph: aten's silu_backward has no derivative; torch's own SiLU composes it likewise
            sigmoid = torch.sigmoid(Z)
            dZ = dY * sigmoid * (1 + Z * (1 - sigmoid))
        else:
            dZ = torch.ops.aten.silu_backward(dY, Z)
    else:
        dZ = dY
    return linear_grads(ctx.needs_input_grad, dZ, X, W, ctx.x_shape)


def linear_grads(needs, dZ: Tensor, X: "Tensor | None", W: "Tensor | None", x_shape):
    """(dX, dW, db, None) from the pre-activation gradient dZ: dX = dZ·W and dW = dZᵀ·X through gemmgen::mm
    (or its fast path), db the column sums of dZ: the row sums of dZᵀ written by the weight-gradient kernel
    when one has them (eager calls), else a reduction on torch. X (W) may be None where dW (dX) is not needed;
    x_shape is X's shape."""
    out_features, in_features = dZ.shape[-1], x_shape[-1]
    dZ2 = plans.rows(dZ, out_features).contiguous()
    dX = mm(dZ2, W).view(x_shape) if needs[0] else None
    dW = db = None
    if needs[1]:
        dZt, X2 = dZ2.t(), plans.rows(X, in_features).contiguous()
        if needs[2] and _eager(dZt, X2) and not (torch.is_grad_enabled() and (dZt.requires_grad or
                                                                              X2.requires_grad)):
            dW, db = plans.mm_row_sums(dZt, X2)
        else:
            dW = mm(dZt, X2)
    if needs[2] and db is None:
        db = dZ2.sum(0)
    return dX, dW, db, None


linear_op.register_autograd(_linear_backward, setup_context=_linear_setup)


class _Linear(torch.autograd.Function):
    """gemmgen::linear's autograd for the eager fast path: the same setup and backward."""

    @staticmethod
    def forward(ctx, X: Tensor, W: Tensor, bias: "Tensor | None", activation: str) -> Tensor:
        output = plans.linear(X, W, bias, activation)
        _linear_setup(ctx, (X, W, bias, activation), output)
        return output

    @staticmethod
    def backward(ctx, dY: Tensor):
        return _linear_backward(ctx, dY)


# --- Python entry points -------------------------------------------------------------------------------------

def linear(X: Tensor, W: Tensor, bias: "Tensor | None" = None, activation: str = "none") -> Tensor:
    """Y = act(X·Wᵀ + b): gemmgen::linear, or its implementation directly when nothing traces the call."""
    if _any_autocast() and isinstance(X, Tensor):
        X, W, bias = _autocast(X.device.type, X, W, bias)
    if _eager(X, W) if bias is None else _eager(X, W, bias):
        if X.is_nested:   # torch.strided layout: a plain Tensor (a torch.jagged one is a subclass: not eager)
            return _nested_linear(X, W, bias, activation)
        if torch.is_grad_enabled() and (X.requires_grad or W.requires_grad or
                                        (bias is not None and bias.requires_grad)):
            return _Linear.apply(X, W, bias, activation)
        return plans.linear(X, W, bias, activation)
    if isinstance(X, Tensor) and X.is_nested:
        return _nested_linear(X, W, bias, activation)
    if _onnx_exporting():   # (no check_linear: the exporter's traced shapes are tensors; torch's linear checks them)
        torch._check(activation in plans.TORCH_ACTIVATIONS, lambda: f"gemmgen::linear activation must be one of "
                                                                    f"{', '.join(plans.TORCH_ACTIVATIONS)}, but got "
                                                                    f"{activation!r}")
        return plans.TORCH_ACTIVATIONS[activation](torch.nn.functional.linear(X, W, bias))
    if _transformed():
        if not _is_compiling():   # (dynamo cannot trace check_linear's message closures; torch's linear checks)
            check_linear(X, W, bias, activation)
            stats.fallback("linear", TRANSFORMED)
        return plans.TORCH_ACTIVATIONS[activation](torch.nn.functional.linear(X, W, bias))
    subclassed = _wrapper_subclass(X, W, bias)
    if subclassed:
        if not _is_compiling():
            stats.fallback("linear", subclassed)
        return plans.TORCH_ACTIVATIONS[activation](torch.nn.functional.linear(X, W, bias))
    return torch.ops.gemmgen.linear(X, W, bias, activation)


def _nested_linear(X: Tensor, W: Tensor, bias: "Tensor | None", activation: str) -> Tensor:
    """linear() of a nested tensor (variable-length sequences, as torch.nn.Linear takes them), the tokens of all
    its sequences in one product: torch.jagged, its packed values, rebuilt on X's offsets; torch.strided (the
    default of torch.nested.nested_tensor), its components concatenated, then split back (autograd follows)."""
    if X.layout == torch.jagged:
        Y = linear(X.values(), W, bias, activation)
        return torch.nested.nested_tensor_from_jagged(Y, offsets=X.offsets(), lengths=X.lengths(),
                                                      jagged_dim=X._ragged_idx)
    # (A strided nested tensor has no sizes to read: X.shape raised "Internal error: NestedTensorImpl doesn't
    # support sizes" from the plan's key.)
    torch._check(X.dim() >= 2, lambda: f"gemmgen::linear needs a nested X whose components are (..., in), but got "
                                       f"a nested tensor of {X.dim()} dimensions")
    components = X.unbind()
    for part in components:
        check_linear(part, W, bias, activation)
    out_features, in_features = W.shape
    Y = linear(torch.cat([plans.rows(part, in_features) for part in components]), W, bias, activation)
    counts = [math.prod(part.shape[:-1]) for part in components]
    return torch.nested.as_nested_tensor([y.view(*part.shape[:-1], out_features)
                                          for y, part in zip(Y.split(counts), components)], layout=torch.strided)


def mm(A, B):
    """D = A·B: gemmgen::mm (or its implementation directly when nothing traces the call) for torch tensors, or
    for any array with __dlpack__ (numpy, cupy, jax): taken without a copy, computed, and handed back in the
    first operand's library when it has from_dlpack (on the GPU under the DLPack stream handshake; on the CPU,
    the fallback)."""
    if isinstance(A, Tensor) and isinstance(B, Tensor):
        if _any_autocast():
            A, B = _autocast(A.device.type, A, B)
        if _eager(A, B):
            if torch.is_grad_enabled() and (A.requires_grad or B.requires_grad):
                return _Mm.apply(A, B)
            return plans.mm(A, B)
        if _onnx_exporting():
            return torch.mm(A, B)
        if _transformed():
            if not _is_compiling():
                check_mm(A, B)
                stats.fallback("mm", TRANSFORMED)
            return torch.mm(A, B)
        subclassed = _wrapper_subclass(A, B)
        if subclassed:
            if not _is_compiling():
                stats.fallback("mm", subclassed)
            return torch.mm(A, B)
        return torch.ops.gemmgen.mm(A, B)
    for name, x in (("A", A), ("B", B)):
        if not isinstance(x, Tensor) and not hasattr(x, "__dlpack__"):
            raise InvalidInput(f"{name} must be a torch tensor or an array with __dlpack__", type(x).__name__)
    tA = A if isinstance(A, Tensor) else torch.from_dlpack(A)
    tB = B if isinstance(B, Tensor) else torch.from_dlpack(B)
    D = mm(tA, tB)
    if isinstance(A, Tensor):
        return D
    library = sys.modules.get(type(A).__module__.split(".")[0])
    from_dlpack = getattr(library, "from_dlpack", None)
    return from_dlpack(D) if from_dlpack is not None else D


__all__ = ["linear", "linear_grads", "linear_op", "mm", "mm_op"]
