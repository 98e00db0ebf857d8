"""The custom ops gemmgen::mm and gemmgen::linear (torch.library), their fake impls and their autograd.

    gemmgen::mm(A, B) -> D                              D = A·B           A: M×K, B: K×N (row- or column-major)
    gemmgen::linear(X, W, bias?, activation) -> Y       Y = act(X·Wᵀ + b) X: (..., in), W: [out, in], b: [out]

On CUDA each op runs a gemmgen kernel when the registry (registry.py) holds one for its product, on the current
stream, writing an output torch allocated, with no host synchronisation (so a warmed-up call captures in a CUDA
graph). Anything else runs on torch (aten) and is counted in gemmgen.stats() with a one-time warning per
reason; CPU tensors always do. activation is 'none', 'relu', 'gelu' (tanh approximation, the kernels' GELU)
or 'silu' (no kernel fuses it: the bias kernel runs, then SiLU).

Backward (register_autograd): dA = dD·Bᵀ and dB = Aᵀ·dD through gemmgen::mm, so each gradient is its own
product with its own layouts and finds its own kernel. For linear: dZ from the activation (ReLU from the saved
output; GELU/SiLU from the pre-activation, recomputed here through gemmgen::linear: gemmgen.nn.Linear avoids the
recomputation by saving it, see nn.py), dX = dZ·W, dW = dZᵀ·X, and the bias gradient as a column-sum
reduction of dZ (no kernel epilogue fuses it yet).
"""
from __future__ import annotations

import sys
from typing import Optional

import torch
from torch import Tensor

from ..model.arch import DType
from ..model.errors import InvalidInput
from ..model.linear import ACTIVATIONS, kernel_activation
from ..model.problem import Activation, Epilogue, Layout
from . import stats
from .registry import REGISTRY, gpu_key

_DTYPES = {torch.bfloat16: DType.BF16, torch.float16: DType.F16}
_KERNEL_ACTIVATION = {name: kernel_activation(name) for name in ACTIVATIONS}
_REFUSED_KEPT = 256  # (kernel, shapes, strides) refused by a kernel, remembered so a refusal is not re-checked


def _layouts(x: Tensor) -> "tuple[Layout, ...]":
    """The packed layouts a 2-D tensor has (both when an extent of 1 makes it either), none when it has gaps."""
    rows, cols = x.shape
    s_row, s_col = x.stride()
    out = []
    if (cols <= 1 or s_col == 1) and (rows <= 1 or s_row == cols):
        out.append(Layout.ROW)
    if (rows <= 1 or s_row == 1) and (cols <= 1 or s_col == rows):
        out.append(Layout.COL)
    return tuple(out)


def _find(A: Tensor, B: Tensor, bias: bool, activation: Activation):
    """(Found, '') for a kernel that takes D = epilogue(A·B), or (None, the fallback reason)."""
    if not A.is_cuda:  # (is_cuda is an attribute read; .device builds an object per call)
        return None, f"tensors on {A.device.type}"
    dtype = _DTYPES.get(A.dtype)
    if dtype is None:
        return None, f"dtype {str(A.dtype)[6:]} (the kernels take bfloat16 or float16)"
    (m, k), n = A.shape, B.shape[1]
    if m == 0 or n == 0 or k == 0:
        return None, "an empty operand"
    a_layouts, b_layouts = _layouts(A), _layouts(B)
    if not a_layouts or not b_layouts:
        return None, "an operand that is neither packed row- nor column-major"
    gpu = gpu_key(A.get_device())
    for a in a_layouts:
        for b in b_layouts:
            found = REGISTRY.find(dtype, a, b, bias, activation, m, n, k, gpu)
            if found is not None:
                return found, ""
    epilogue = Epilogue(bias=bias, activation=activation).tag
    where = gpu or f"{torch.cuda.get_device_name(A.get_device())} (not in gemmgen's catalogue)"
    return None, (f"no tuned kernel for {dtype.value} {a_layouts[0].letter}{b_layouts[0].letter} {epilogue} "
                  f"products with N={n} on {where} (gemmgen tune-linear stores them)")


_refused: "dict[tuple, str]" = {}


def _refusal_key(found, A: Tensor, B: Tensor, D: Tensor) -> tuple:
    return (id(found.kernel), A.shape, A.stride(), B.shape, B.stride(), A.data_ptr() % 16, B.data_ptr() % 16,
            D.data_ptr() % 16)


def _launch(found, A: Tensor, B: Tensor, D: Tensor, bias: "Tensor | None") -> str:
    """Run the kernel into D; '' on success, else why the kernel refused these operands (nothing ran)."""
    if _refused:
        why = _refused.get(_refusal_key(found, A, B, D))
        if why is not None:
            return why
    try:
        found.kernel(A, B, D, bias=bias)
    except InvalidInput as exc:  # the kernel checks before it launches: nothing ran, torch can take over
        why = f"kernel from {found.origin} refused the call: {exc.rule}"
        key = _refusal_key(found, A, B, D)
        if len(_refused) >= _REFUSED_KEPT:
            _refused.pop(next(iter(_refused)))
        _refused[key] = why
        return why
    return ""


def _mm_ok(A: Tensor, B: Tensor) -> bool:
    """The real impl's fast test of what _check_mm checks (concrete sizes: plain comparisons)."""
    return A.dim() == 2 and B.dim() == 2 and A.shape[1] == B.shape[0] and A.dtype == B.dtype and \
        A.device == B.device


def _check_mm(A: Tensor, B: Tensor) -> None:
    torch._check(A.dim() == 2 and B.dim() == 2, lambda: f"gemmgen::mm needs 2-D A and B, but got {A.dim()}-D "
                                                         f"and {B.dim()}-D")
    torch._check(A.shape[1] == B.shape[0], lambda: f"gemmgen::mm needs A: M×K and B: K×N, but got A "
                                                   f"{tuple(A.shape)} and B {tuple(B.shape)}")
    torch._check(A.dtype == B.dtype, lambda: f"gemmgen::mm needs A and B of one dtype, but got {A.dtype} and "
                                             f"{B.dtype}")
    torch._check(A.device == B.device, lambda: f"gemmgen::mm needs A and B on one device, but got {A.device} "
                                               f"and {B.device}")


def _linear_ok(X: Tensor, W: Tensor, bias: "Tensor | None", activation: str) -> bool:
    """The real impl's fast test of what _check_linear checks."""
    return activation in ACTIVATIONS and X.dim() >= 1 and W.dim() == 2 and X.shape[-1] == W.shape[1] and \
        X.dtype == W.dtype and (bias is None or (bias.dim() == 1 and bias.shape[0] == W.shape[0] and
                                                 bias.dtype == W.dtype))


def _check_linear(X: Tensor, W: Tensor, bias: "Tensor | None", activation: str) -> None:
    torch._check(activation in ACTIVATIONS, lambda: f"gemmgen::linear activation must be one of "
                                                    f"{', '.join(ACTIVATIONS)}, but got {activation!r}")
    torch._check(X.dim() >= 1 and W.dim() == 2, lambda: f"gemmgen::linear needs X (..., in) and W [out, in], "
                                                        f"but got X {tuple(X.shape)} and W {tuple(W.shape)}")
    torch._check(X.shape[-1] == W.shape[1], lambda: f"gemmgen::linear needs X (..., in) and W [out, in], but got "
                                                    f"X {tuple(X.shape)} and W {tuple(W.shape)}")
    torch._check(X.dtype == W.dtype, lambda: f"gemmgen::linear needs X and W of one dtype, but got {X.dtype} "
                                             f"and {W.dtype}")
    if bias is not None:
        torch._check(bias.dim() == 1 and bias.shape[0] == W.shape[0],
                     lambda: f"gemmgen::linear needs bias [out] = [{W.shape[0]}], but got {tuple(bias.shape)}")
        torch._check(bias.dtype == W.dtype, lambda: f"gemmgen::linear needs bias of W's dtype {W.dtype}, "
                                                    f"but got {bias.dtype}")


# --- gemmgen::mm ---------------------------------------------------------------------------------------------

@torch.library.custom_op("gemmgen::mm", mutates_args=())
def mm_op(A: Tensor, B: Tensor) -> Tensor:
    """D = A·B on a gemmgen kernel when one is registered for the product, else torch.mm."""
    if not _mm_ok(A, B):
        _check_mm(A, B)  # raises, naming the rule
    found, reason = _find(A, B, False, Activation.NONE)
    if found is not None:
        D = torch.empty((A.shape[0], B.shape[1]), dtype=A.dtype, device=A.device)
        reason = _launch(found, A, B, D, None)
        if not reason:
            stats.kernel_call("mm")
            return D
    stats.fallback("mm", reason)
    return torch.mm(A, B)


@mm_op.register_fake
def _mm_fake(A: Tensor, B: Tensor) -> Tensor:
    _check_mm(A, B)
    return A.new_empty((A.shape[0], B.shape[1]))


def _mm_setup(ctx, inputs, output) -> None:
    A, B = inputs
    ctx.save_for_backward(A, B)


def _mm_backward(ctx, dD: Tensor):
    A, B = ctx.saved_tensors
    dD = dD.contiguous()
    dA = torch.ops.gemmgen.mm(dD, B.t()) if ctx.needs_input_grad[0] else None
    dB = torch.ops.gemmgen.mm(A.t(), dD) if ctx.needs_input_grad[1] else None
    return dA, dB


mm_op.register_autograd(_mm_backward, setup_context=_mm_setup)


# --- gemmgen::linear -----------------------------------------------------------------------------------------

def _activate_(Y: Tensor, activation: str) -> Tensor:
    """Apply the layer activation to Y in place (GELU: the tanh approximation, as the kernels compute it)."""
    if activation == "relu":
        torch.relu_(Y)
    elif activation == "gelu":
        torch.ops.aten.gelu_(Y, approximate="tanh")
    elif activation == "silu":
        torch.nn.functional.silu(Y, inplace=True)
    return Y


@torch.library.custom_op("gemmgen::linear", mutates_args=())
def linear_op(X: Tensor, W: Tensor, bias: Optional[Tensor], activation: str) -> Tensor:
    """Y = act(X·Wᵀ + b) on a gemmgen kernel when one is registered for the product, else torch."""
    if not _linear_ok(X, W, bias, activation):
        _check_linear(X, W, bias, activation)  # raises, naming the rule
    out_features, in_features = W.shape
    Y = torch.empty((*X.shape[:-1], out_features), dtype=X.dtype, device=X.device)
    X2, Y2 = X.reshape(-1, in_features), Y.view(-1, out_features)
    fused = _KERNEL_ACTIVATION[activation]
    # The kernel with the activation fused first; else the plain kernel, then the activation on torch.
    reason = ""
    for epilogue_activation in dict.fromkeys((fused, Activation.NONE)):
        found, why = _find(X2, W.t(), bias is not None, epilogue_activation)
        if found is not None:
            why = _launch(found, X2, W.t(), Y2, bias)
            if not why:
                if epilogue_activation.value != activation:
                    _activate_(Y, activation)
                stats.kernel_call("linear")
                return Y
        reason = reason or why
    stats.fallback("linear", reason)
    torch.addmm(bias, X2, W.t(), out=Y2) if bias is not None else torch.mm(X2, W.t(), out=Y2)
    return _activate_(Y, activation)


@linear_op.register_fake
def _linear_fake(X: Tensor, W: Tensor, bias: Optional[Tensor], activation: str) -> Tensor:
    _check_linear(X, W, bias, activation)
    return X.new_empty((*X.shape[:-1], W.shape[0]))


def _linear_setup(ctx, inputs, output) -> None:
    X, W, bias, activation = inputs
    ctx.activation = activation
    ctx.save_for_backward(X, W, bias, output if activation == "relu" else None)


def _linear_backward(ctx, dY: Tensor):
    X, W, bias, Y = ctx.saved_tensors
    activation = ctx.activation
    if activation == "relu":
        dZ = torch.where(Y > 0, dY, torch.zeros_like(dY))
    elif activation in ("gelu", "silu"):
        Z = torch.ops.gemmgen.linear(X, W, bias, "none")  # the pre-activation, recomputed
        dZ = (torch.ops.aten.gelu_backward(dY, Z, approximate="tanh") if activation == "gelu"
              else torch.ops.aten.silu_backward(dY, Z))
    else:
        dZ = dY
    return linear_grads(ctx.needs_input_grad, dZ, X, W)


def linear_grads(needs, dZ: Tensor, X: Tensor, W: Tensor):
    """(dX, dW, db, None) from the pre-activation gradient dZ: dX = dZ·W and dW = dZᵀ·X through gemmgen::mm,
    db the column sums of dZ."""
    out_features, in_features = W.shape
    dZ2 = dZ.reshape(-1, out_features).contiguous()
    dX = torch.ops.gemmgen.mm(dZ2, W).view(X.shape) if needs[0] else None
    dW = torch.ops.gemmgen.mm(dZ2.t(), X.reshape(-1, in_features).contiguous()) if needs[1] else None
    db = dZ2.sum(0) if needs[2] else None
    return dX, dW, db, None


linear_op.register_autograd(_linear_backward, setup_context=_linear_setup)


# --- Python entry points -------------------------------------------------------------------------------------

def linear(X: Tensor, W: Tensor, bias: "Tensor | None" = None, activation: str = "none") -> Tensor:
    """Y = act(X·Wᵀ + b) through gemmgen::linear."""
    return torch.ops.gemmgen.linear(X, W, bias, activation)


def mm(A, B):
    """D = A·B through gemmgen::mm for torch tensors, or for any array with __dlpack__ (numpy, cupy, jax):
    taken without a copy, computed, and handed back in the first operand's library when it has from_dlpack
    (on the GPU under the DLPack stream handshake; on the CPU, the fallback)."""
    if isinstance(A, Tensor) and isinstance(B, Tensor):
        return torch.ops.gemmgen.mm(A, B)
    for name, x in (("A", A), ("B", B)):
        if not isinstance(x, Tensor) and not hasattr(x, "__dlpack__"):
            raise InvalidInput(f"{name} must be a torch tensor or an array with __dlpack__", type(x).__name__)
    tA = A if isinstance(A, Tensor) else torch.from_dlpack(A)
    tB = B if isinstance(B, Tensor) else torch.from_dlpack(B)
    D = torch.ops.gemmgen.mm(tA, tB)
    if isinstance(A, Tensor):
        return D
    library = sys.modules.get(type(A).__module__.split(".")[0])
    from_dlpack = getattr(library, "from_dlpack", None)
    return from_dlpack(D) if from_dlpack is not None else D


__all__ = ["linear", "linear_grads", "linear_op", "mm", "mm_op"]
