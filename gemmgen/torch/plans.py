"""The ops' one implementation, D = A·B and Y = act(X·Wᵀ + b), and the per-call plans that make a repeated call cheap.

Both the custom ops (ops.py: gemmgen::mm, gemmgen::linear) and their eager fast path call `mm` and `linear` here.
A call's plan says what runs for its inputs: a kernel bound to their addresses (or a registered callable), the
activation to apply on torch after it, or torch with the fallback reason. Plans are kept under the inputs' identity

    mm:      (A.data_ptr(), B.data_ptr(), shapes, strides, dtypes, A's device index)
    linear:  the same of X and W, bias (address, shape, stride, dtype) or None, the activation

so a call seen before costs that tuple, one dict lookup, torch.empty for the output and the launch: the checks,
the registry lookup, the kernel's own identity key and its parameter packing are skipped. A runtime kernel (a
loaded bundle or dispatch table) is held as a BoundLaunch (runtime/loader.py): the inputs stay bound, and the
output, new every call, is re-pointed in the packed parameters (or bound once per address where a tensor map reads
it). A plan never outlives what it was made for: the key holds every address, shape and stride the binding read
(the output's shape and strides follow from them: torch.empty, contiguous), the registry drops all plans when
registrations or the store change, and a BoundLaunch binds again when its kernel's workspace moves. Device
addresses are unique across devices and the host (unified addressing), so B's device index is implied by its
address and A's. Plans hold no tensors: a freed input's address reused by a tensor of the same shape, strides and
dtype is served correctly by the same binding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..model.arch import DType
from ..model.errors import InvalidInput
from ..model.linear import ACTIVATIONS, kernel_activation
from ..model.problem import Activation, Epilogue, Layout
from . import jit, stats
from .registry import CPU, REGISTRY, gpu_key

_DTYPES = {torch.bfloat16: DType.BF16, torch.float16: DType.F16}
_KERNEL_ACTIVATION = {name: kernel_activation(name) for name in ACTIVATIONS}
# The layer activations as torch's own out-of-place ops (GELU: the tanh approximation, as the kernels compute it).
TORCH_ACTIVATIONS = {"none": lambda z: z, "relu": torch.relu, "silu": torch.nn.functional.silu,
                     "gelu": lambda z: torch.nn.functional.gelu(z, approximate="tanh")}
# Why a call on an operand with no data pointer that passed the checks (dense, of the right shapes) runs on torch.
UNSTORED = ("an operand without storage (legacy vmap's BatchedTensor: torch.autograd.functional.jacobian or "
            "hessian with vectorize=True, gradcheck's batched gradients; a lazy tensor)")
PLANS_KEPT = 256  # input sets with a plan (a model's layers, each with a few rotating activation buffers)
_plans = REGISTRY.plans  # cleared by the registry whenever what it finds may change


# --- the checks ------------------------------------------------------------------------------------------------

def _layouts(x: Tensor) -> "tuple[tuple[Layout, ...], bool]":
    """The layouts a 2-D tensor has (both when an extent of 1 makes it either), counting a view whose rows (columns)
    lie further apart than its width (height), as a column slice of a wider tensor does; and whether it has such gaps
    in every layout it has (not packed). No layouts when neither."""
    rows, cols = x.shape
    s_row, s_col = x.stride()
    out, packed = [], False
    if (cols <= 1 or s_col == 1) and (rows <= 1 or s_row >= cols):
        out.append(Layout.ROW)
        packed = packed or rows <= 1 or s_row == cols
    if (rows <= 1 or s_row == 1) and (cols <= 1 or s_col >= rows):
        out.append(Layout.COL)
        packed = packed or cols <= 1 or s_col == rows
    return tuple(out), not packed


def _find(A: Tensor, B: Tensor, bias: bool, activation: Activation, row_sums: bool = False):
    """(Found, '') for a kernel that takes D = epilogue(A·B) (row_sums: and writes A's row sums), or (None, the
    fallback reason)."""
    if A.is_cuda:  # (is_cuda is an attribute read; .device builds an object per call)
        gpu = None
    elif A.device.type == "cpu" and REGISTRY.serves_cpu:
        gpu = CPU
    else:
        return None, f"tensors on {A.device.type}"
    dtype = _DTYPES.get(A.dtype)
    if dtype is None:
        return None, f"dtype {str(A.dtype)[6:]} (the kernels take bfloat16 or float16)"
    (m, k), n = A.shape, B.shape[1]
    if m == 0 or n == 0 or k == 0:
        return None, "an empty operand"
    (a_layouts, a_gaps), (b_layouts, b_gaps) = _layouts(A), _layouts(B)
    if not a_layouts or not b_layouts:
        return None, "an operand that is neither row- nor column-major (with unit stride along one axis)"
    # A view with gaps goes to gemmgen's own kernels, which take leading dimensions (and refuse, by a rule that
    # becomes the fallback's reason, one their alignment cannot take); a callable registered by the user was
    # promised packed operands.
    gapped = a_gaps or b_gaps
    gpu = gpu or gpu_key(A.get_device())
    # A plain product may also run on a kernel built with row sums (called without them, it skips them): a layer
    # whose store holds only the weight gradient with its bias gradient still finds it when the bias is frozen.
    for with_sums in (True,) if row_sums else (False, True):
        for a in a_layouts:
            for b in b_layouts:
                found = REGISTRY.find(dtype, a, b, bias, activation, m, n, k, gpu, with_sums)
                if found is not None and gapped and not hasattr(found.kernel, "bind_launch"):
                    return None, "a view with gaps between its rows, and a registered kernel that takes packed operands"
                if found is not None:
                    return found, ""
    if gpu is not None and gpu != CPU and not gapped and jit.enabled() and not torch.cuda.is_current_stream_capturing():
        # Opt-in: the model's pick compiled now and stored (jit.py); a failure is not retried.
        if jit.build(dtype, a_layouts[0], b_layouts[0], bias, activation, m, n, k, gpu, row_sums):
            found = REGISTRY.find(dtype, a_layouts[0], b_layouts[0], bias, activation, m, n, k, gpu, row_sums)
            if found is not None:
                return found, ""
    epilogue = Epilogue(bias=bias, activation=activation).tag
    where = gpu or f"{torch.cuda.get_device_name(A.get_device())} (not in gemmgen's catalogue)"
    return None, (f"no tuned kernel for {dtype.value} {a_layouts[0].letter}{b_layouts[0].letter} {epilogue} "
                  f"products with N={n} on {where} (gemmgen tune-linear stores them)")


def _mm_ok(A: Tensor, B: Tensor) -> bool:
    """The real impl's fast test of what check_mm checks (concrete sizes: plain comparisons)."""
    return A.dim() == 2 and B.dim() == 2 and A.shape[1] == B.shape[0] and A.dtype == B.dtype and \
        A.device == B.device


def check_tensors(op: str, **operands) -> None:
    """TypeError naming an operand that is not a tensor: a custom op's schema lets None through as a Tensor."""
    for name, x in operands.items():
        if not isinstance(x, Tensor):
            raise TypeError(f"gemmgen::{op} needs {name} to be a torch.Tensor, but got {type(x).__name__}")


def check_dense(op: str, **operands) -> None:
    """RuntimeError naming an operand that is not a dense (strided) tensor: a sparse or nested one has no data
    pointer for a kernel, or sizes for a plan's key."""
    for name, x in operands.items():
        torch._check(x is None or x.layout == torch.strided,
                     lambda: f"gemmgen::{op} needs {name} dense (torch.strided), but got {x.layout}")
        # (a nested tensor of torch.strided layout: its shape raised "Internal error: NestedTensorImpl doesn't
        # support sizes. Please file an issue.")
        torch._check(x is None or not x.is_nested,
                     lambda: f"gemmgen::{op} needs {name} dense, but got a nested tensor")


def check_mm(A: Tensor, B: Tensor) -> None:
    check_tensors("mm", A=A, B=B)
    check_dense("mm", A=A, B=B)
    torch._check(A.dim() == 2 and B.dim() == 2, lambda: f"gemmgen::mm needs 2-D A and B, but got {A.dim()}-D "
                                                         f"and {B.dim()}-D")
    torch._check(A.shape[1] == B.shape[0], lambda: f"gemmgen::mm needs A: M×K and B: K×N, but got A "
                                                   f"{tuple(A.shape)} and B {tuple(B.shape)}")
    torch._check(A.dtype == B.dtype, lambda: f"gemmgen::mm needs A and B of one dtype, but got {A.dtype} and "
                                             f"{B.dtype}")
    torch._check(A.device == B.device, lambda: f"gemmgen::mm needs A and B on one device, but got {A.device} "
                                               f"and {B.device}")


def _linear_ok(X: Tensor, W: Tensor, bias: "Tensor | None", activation: str) -> bool:
    """The real impl's fast test of what check_linear checks."""
    return activation in ACTIVATIONS and X.dim() >= 1 and W.dim() == 2 and X.shape[-1] == W.shape[1] and \
        X.dtype == W.dtype and X.device == W.device and \
        (bias is None or (bias.dim() == 1 and bias.shape[0] == W.shape[0] and bias.dtype == W.dtype and
                          bias.device == W.device))


def check_linear(X: Tensor, W: Tensor, bias: "Tensor | None", activation: str) -> None:
    check_tensors("linear", X=X, W=W)
    check_dense("linear", X=X, W=W, bias=bias)
    torch._check(activation in ACTIVATIONS, lambda: f"gemmgen::linear activation must be one of "
                                                    f"{', '.join(ACTIVATIONS)}, but got {activation!r}")
    torch._check(X.dim() >= 1 and W.dim() == 2, lambda: f"gemmgen::linear needs X (..., in) and W [out, in], "
                                                        f"but got X {tuple(X.shape)} and W {tuple(W.shape)}")
    torch._check(X.shape[-1] == W.shape[1], lambda: f"gemmgen::linear needs X (..., in) and W [out, in], but got "
                                                    f"X {tuple(X.shape)} and W {tuple(W.shape)}")
    torch._check(X.dtype == W.dtype, lambda: f"gemmgen::linear needs X and W of one dtype, but got {X.dtype} "
                                             f"and {W.dtype}")
    torch._check(X.device == W.device, lambda: f"gemmgen::linear needs X and W on one device, but got "
                                               f"{X.device} and {W.device}")
    if bias is not None:
        torch._check(bias.dim() == 1 and bias.shape[0] == W.shape[0],
                     lambda: f"gemmgen::linear needs bias [out] = [{W.shape[0]}], but got {tuple(bias.shape)}")
        torch._check(bias.dtype == W.dtype, lambda: f"gemmgen::linear needs bias of W's dtype {W.dtype}, "
                                                    f"but got {bias.dtype}")
        torch._check(bias.device == W.device, lambda: f"gemmgen::linear needs bias on W's device {W.device}, "
                                                      f"but got {bias.device}")


def rows(x: Tensor, width: int) -> Tensor:
    """x (..., width) as a 2-D (tokens, width), a view where its strides allow. (reshape(-1, 0) cannot infer the
    token count: a layer with in_features or out_features of 0. -1 otherwise: Size.numel() would specialise a
    dynamic token count under torch.compile, which traces the backward through here.)"""
    return x.reshape(-1, width) if width != 0 else x.reshape(math.prod(x.shape[:-1]), 0)


def activate_(Y: Tensor, activation: str) -> Tensor:
    """Apply the layer activation to Y in place (GELU: the tanh approximation, as the kernels compute it)."""
    if activation == "relu":
        torch.relu_(Y)
    elif activation == "gelu":
        torch.ops.aten.gelu_(Y, approximate="tanh")
    elif activation == "silu":
        torch.nn.functional.silu(Y, inplace=True)
    return Y


# --- plans -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Refusal:
    """A kernel refused a call before launching anything: where the kernel came from and the rule it named (which
    may name the call's shape: one reason per token count its rules exclude)."""

    origin: str
    rule: str

    def __str__(self) -> str:
        return f"kernel from {self.origin} refused the call: {self.rule}"


class _Fallback:
    """torch (aten) runs the product; the reason is counted, and warned about once (a kernel's refusals: once per
    kernel, not once per shape it refuses)."""

    __slots__ = ("reason", "warn_key")

    def __init__(self, reason: "str | Refusal"):
        self.reason = str(reason)
        self.warn_key = f"kernel from {reason.origin} refused a call" if isinstance(reason, Refusal) else self.reason

    def mm(self, A: Tensor, B: Tensor) -> Tensor:
        stats.fallback("mm", self.reason, self.warn_key)
        # out=: autocast leaves it alone, so the op returns A's dtype as its fake impl says
        return torch.mm(A, B, out=torch.empty((A.shape[0], B.shape[1]), dtype=A.dtype, device=A.device))

    def linear(self, X: Tensor, W: Tensor, bias: "Tensor | None", activation: str) -> Tensor:
        stats.fallback("linear", self.reason, self.warn_key)
        out_features, in_features = W.shape
        Y = torch.empty((*X.shape[:-1], out_features), dtype=X.dtype, device=X.device)
        X2, Y2 = rows(X, in_features), rows(Y, out_features)
        torch.addmm(bias, X2, W.t(), out=Y2) if bias is not None else torch.mm(X2, W.t(), out=Y2)
        return activate_(Y, activation)


class _Kernel:
    """A kernel runs the product into a new output of `shape`, then `post` (an activation no kernel fused) on
    torch. Holds a BoundLaunch (a runtime kernel: the inputs bound, the output re-pointed per call), or a
    registered callable called with the tensors."""

    __slots__ = ("bound", "kernel", "origin", "shape", "dtype", "device", "ordinal", "post", "stream")

    def __init__(self, found, bound, shape, like: Tensor, post: "str | None"):
        self.bound, self.kernel, self.origin = bound, found.kernel, found.origin
        self.shape, self.dtype, self.device, self.post = tuple(shape), like.dtype, like.device, post
        self.ordinal = like.get_device()
        self.stream = _stream_getter() if like.is_cuda else _no_stream

    def launch(self, A: Tensor, B: Tensor, D: Tensor, bias: "Tensor | None",
               row_sums: "Tensor | None" = None) -> "str | Refusal":
        """Run into D (and row_sums, for a kernel that writes A's row sums); '' on success, else why the kernel
        refused (nothing ran: torch can take over)."""
        try:
            if self.bound is not None:
                if row_sums is None:
                    self.bound.launch(D.data_ptr(), self.stream(self.ordinal))
                else:
                    self.bound.launch(D.data_ptr(), self.stream(self.ordinal), row_sums.data_ptr())
            elif row_sums is not None:
                self.kernel(A, B, D, bias=bias, row_sums=row_sums)
            else:
                self.kernel(A, B, D, bias=bias)
        except InvalidInput as exc:
            return Refusal(self.origin, exc.rule)
        return ""

    def mm(self, A: Tensor, B: Tensor) -> Tensor:
        D = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        why = self.launch(A, B, D, None)
        if why:
            return _Fallback(why).mm(A, B)  # (not kept: it refused this output only)
        stats.kernel_call("mm")
        return D

    def mm_row_sums(self, A: Tensor, B: Tensor) -> "tuple[Tensor, Tensor | None]":
        D = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        row_sums = torch.empty(self.shape[:1], dtype=self.dtype, device=self.device)
        if self.launch(A, B, D, None, row_sums):
            return mm(A, B), None  # refused this output: the plain product, A's rows summed by the caller
        stats.kernel_call("mm")
        return D, row_sums

    def linear(self, X: Tensor, W: Tensor, bias: "Tensor | None", activation: str) -> Tensor:
        Y = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if self.bound is not None:
            why = self.launch(X, W, Y, bias)  # the bound launch reads only Y's address
        else:
            out_features, in_features = W.shape
            why = self.launch(rows(X, in_features), W.t(), rows(Y, out_features), bias)
        if why:
            return _Fallback(why).linear(X, W, bias, activation)
        if self.post is not None:
            activate_(Y, self.post)
        stats.kernel_call("linear")
        return Y


def _no_stream(ordinal: int) -> int:
    return 0  # a CPU registration's bound launch (tests, benchmarks): there is no stream


def _stream_getter():
    """ordinal -> the current torch stream's raw handle (torch's own fast accessor where it has one)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda ordinal: int(torch.cuda.current_stream(ordinal).cuda_stream)


def _kernel_plan(found, A: Tensor, B: Tensor, D: Tensor, bias: "Tensor | None", shape, post: "str | None",
                 row_sums: "Tensor | None" = None):
    """(a _Kernel plan for `found` on these operands, '') or (None, the Refusal)."""
    bind_launch = getattr(found.kernel, "bind_launch", None)
    bound = None
    if bind_launch is not None:
        try:
            # checks every operand, binds the inputs
            bound = bind_launch(A, B, D, bias=bias) if row_sums is None else \
                bind_launch(A, B, D, bias=bias, row_sums=row_sums)
        except InvalidInput as exc:
            return None, Refusal(found.origin, exc.rule)
    return _Kernel(found, bound, shape, D, post), ""


def _keep(key: tuple, plan) -> None:
    if len(_plans) >= PLANS_KEPT:
        try:
            _plans.pop(next(iter(_plans)))  # the oldest plan
        except (KeyError, RuntimeError, StopIteration):  # another thread evicted or cleared meanwhile
            pass
    _plans[key] = plan


# --- the implementation ----------------------------------------------------------------------------------------

def _unstored_mm(A: Tensor, B: Tensor) -> Tensor:
    """torch.mm of operands that passed the checks but have no storage (UNSTORED): no kernel can read them, and
    no plan can be keyed on them. (No out=: legacy vmap's batching takes no out= op; in-place ops neither.)"""
    stats.fallback("mm", UNSTORED)
    return torch.mm(A, B)


def mm(A: Tensor, B: Tensor) -> Tensor:
    """D = A·B on a gemmgen kernel when one is registered for the product, else torch.mm."""
    try:
        key = (A.data_ptr(), B.data_ptr(), A.shape, B.shape, A.stride(), B.stride(), A.dtype, B.dtype,
               A.get_device())
    except RuntimeError:   # no data pointer: check_mm names a sparse operand; one it passes has no storage
        check_mm(A, B)
        return _unstored_mm(A, B)
    plan = _plans.get(key)
    if plan is not None:
        return plan.mm(A, B)
    if not _mm_ok(A, B):
        check_mm(A, B)  # raises, naming the rule
    found, reason = _find(A, B, False, Activation.NONE)
    if found is not None:
        shape = (A.shape[0], B.shape[1])
        D = torch.empty(shape, dtype=A.dtype, device=A.device)
        plan, reason = _kernel_plan(found, A, B, D, None, shape, None)
        if plan is not None:
            reason = plan.launch(A, B, D, None)
            if not reason:
                _keep(key, plan)
                stats.kernel_call("mm")
                return D
    plan = _Fallback(reason)
    _keep(key, plan)
    return plan.mm(A, B)


class _NoRowSums:
    """No kernel writes A's row sums beside this product: the plain product runs, the caller sums the rows."""

    __slots__ = ()

    def mm_row_sums(self, A: Tensor, B: Tensor) -> "tuple[Tensor, None]":
        return mm(A, B), None


_NO_ROW_SUMS = _NoRowSums()


def mm_row_sums(A: Tensor, B: Tensor) -> "tuple[Tensor, Tensor | None]":
    """(D = A·B, the row sums of A in A's dtype) from one kernel that writes both (the weight gradient dZᵀ·X and
    the bias gradient), when the registry holds one for the product; else (mm(A, B), None)."""
    try:
        key = ("row_sums", A.data_ptr(), B.data_ptr(), A.shape, B.shape, A.stride(), B.stride(), A.dtype, B.dtype,
               A.get_device())
    except RuntimeError:   # no data pointer: mm names the operand, or runs it on torch
        return mm(A, B), None
    plan = _plans.get(key)
    if plan is not None:
        return plan.mm_row_sums(A, B)
    if not _mm_ok(A, B):
        check_mm(A, B)  # raises, naming the rule
    found, _ = _find(A, B, False, Activation.NONE, row_sums=True)
    if found is not None:
        shape = (A.shape[0], B.shape[1])
        D = torch.empty(shape, dtype=A.dtype, device=A.device)
        row_sums = torch.empty(shape[:1], dtype=A.dtype, device=A.device)
        plan, _ = _kernel_plan(found, A, B, D, None, shape, None, row_sums)
        if plan is not None and not plan.launch(A, B, D, None, row_sums):
            _keep(key, plan)
            stats.kernel_call("mm")
            return D, row_sums
    _keep(key, _NO_ROW_SUMS)
    return _NO_ROW_SUMS.mm_row_sums(A, B)


def linear(X: Tensor, W: Tensor, bias: "Tensor | None", activation: str) -> Tensor:
    """Y = act(X·Wᵀ + b) on a gemmgen kernel when one is registered for the product, else torch."""
    try:
        key = (X.data_ptr(), W.data_ptr(), X.shape, W.shape, X.stride(), W.stride(), X.dtype, W.dtype,
               None if bias is None else (bias.data_ptr(), bias.shape, bias.stride(), bias.dtype),
               activation, X.get_device())
    except RuntimeError:   # no data pointer: check_linear names a sparse operand; one it passes has no storage
        check_linear(X, W, bias, activation)
        stats.fallback("linear", UNSTORED)
        return TORCH_ACTIVATIONS[activation](torch.nn.functional.linear(X, W, bias))   # (see _unstored_mm)
    plan = _plans.get(key)
    if plan is not None:
        return plan.linear(X, W, bias, activation)
    if not _linear_ok(X, W, bias, activation):
        check_linear(X, W, bias, activation)  # raises, naming the rule
    out_features, in_features = W.shape
    shape = (*X.shape[:-1], out_features)
    Y = torch.empty(shape, dtype=X.dtype, device=X.device)
    X2, Y2 = rows(X, in_features), rows(Y, out_features)
    # A reshape that copied X binds a temporary: such a plan serves this call only.
    keep = X2.data_ptr() == X.data_ptr() or X.numel() == 0
    fused = _KERNEL_ACTIVATION[activation]
    # The kernel with the activation fused first; else the plain kernel, then the activation on torch.
    reason = ""
    for epilogue_activation in dict.fromkeys((fused, Activation.NONE)):
        found, why = _find(X2, W.t(), bias is not None, epilogue_activation)
        if found is not None:
            post = None if epilogue_activation.value == activation else activation
            plan, why = _kernel_plan(found, X2, W.t(), Y2, bias, shape, post)
            if plan is not None:
                why = plan.launch(X2, W.t(), Y2, bias)
                if not why:
                    if keep:
                        _keep(key, plan)
                    if post is not None:
                        activate_(Y, post)
                    stats.kernel_call("linear")
                    return Y
        reason = reason or why
    plan = _Fallback(reason)
    _keep(key, plan)
    return plan.linear(X, W, bias, activation)


__all__ = ["PLANS_KEPT", "Refusal", "activate_", "check_dense", "check_linear", "check_mm", "check_tensors", "linear",
           "mm", "mm_row_sums", "rows"]
