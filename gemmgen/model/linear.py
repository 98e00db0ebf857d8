"""A Linear layer's three products, and the kernel class each one is stored under.

    forward      Y  = act(X·Wᵀ + b)   M = tokens, N = out, K = in    X row-major, Wᵀ column-major (W is [out, in])
    data grad    dX = dZ·W            M = tokens, N = in,  K = out   both row-major
    weight grad  dW = dZᵀ·X           M = out,    N = in,  K = tokens dZᵀ column-major, X row-major

(dZ is the gradient at the pre-activation.) A kernel is compiled for dtypes, layouts and an epilogue, not one shape,
so what a stored kernel is *for* is its KernelClass: those, plus the two dimensions that stay fixed while the token
count varies (the third is None). `gemmgen tune-linear` writes one folder per class; gemmgen.torch finds it by
the class of the product at hand.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .arch import DType
from .errors import InvalidInput
from .files import load_json, read_text
from .tiles import parse_bool
from .problem import Activation, Epilogue, Layout, Problem, parse_dim

CLASS_FORMAT = "gemmgen-kernel-class/1"
CLASS_FILE = "class.json"
# Activations a Linear layer takes; every family's epilogue fuses each of them.
ACTIVATIONS = ("none", "relu", "gelu", "silu")
# 'preact': the forward without its activation (bias only), which a GELU or SiLU layer runs while training so that
# autograd keeps the pre-activation for the activation's backward (gemmgen.nn.Linear.forward); only those layers
# have it. Inference runs 'forward', the activation fused.
ROLES = ("forward", "preact", "dgrad", "wgrad")
PREACT_ACTIVATIONS = ("gelu", "silu")
# A layer's bias gradient: 'fused', written by the weight-gradient kernel beside dW (the row sums of dZᵀ, where a
# family writes them: one launch and one read of dZ fewer); 'separate', a reduction of dZ on torch. Measured on
# the H100 (benchmarks/row_sums.py, docs/perf-notes.md), the fused kernel against the best plain one plus torch's
# reduction: 1.21x at 16 tokens, 1.11x at 1024, 0.99x at 4096 (out 14336) and 1.02x at 8192.
BIAS_GRADS = ("fused", "separate")


def kernel_activation(activation: str) -> Activation:
    """The epilogue activation a kernel fuses for a layer activation."""
    if activation not in ACTIVATIONS:
        raise InvalidInput(f"activation must be one of {', '.join(ACTIVATIONS)}", activation)
    return Activation(activation)


@dataclass(frozen=True)
class KernelClass:
    """The problems one stored kernel is tuned for: dtype, layouts, epilogue, and the fixed dimensions
    (None where the token count goes)."""

    dtype: DType
    a_layout: Layout
    b_layout: Layout
    bias: bool = False
    activation: Activation = Activation.NONE
    m: "int | None" = None
    n: "int | None" = None
    k: "int | None" = None
    # The kernel also writes the row sums of A (a weight gradient's bias gradient, Epilogue.row_sums).
    row_sums: bool = False

    @property
    def operands_key(self) -> tuple:
        return (self.dtype, self.a_layout, self.b_layout, self.bias, self.activation, self.row_sums)

    @property
    def key(self) -> str:
        """Folder name: 'bf16_rc_bias_gelu_mT_n14336_k4096' (T marks the dimension that varies)."""
        dims = "_".join(f"{axis}{'T' if value is None else value}"
                        for axis, value in (("m", self.m), ("n", self.n), ("k", self.k)))
        epilogue = Epilogue(bias=self.bias, activation=self.activation, row_sums=self.row_sums).tag
        return f"{self.dtype.value}_{self.a_layout.letter}{self.b_layout.letter}_{epilogue}_{dims}"

    def matches(self, m: int, n: int, k: int) -> bool:
        """Whether a product of this shape belongs to the class (its fixed dimensions agree)."""
        return all(want is None or want == got for want, got in ((self.m, m), (self.n, n), (self.k, k)))

    def to_dict(self) -> dict:
        return {"dtype": self.dtype.value, "a_layout": self.a_layout.value, "b_layout": self.b_layout.value,
                "bias": self.bias, "activation": self.activation.value, "m": self.m, "n": self.n, "k": self.k,
                **({"row_sums": True} if self.row_sums else {})}

    @classmethod
    def from_dict(cls, raw: dict) -> "KernelClass":
        if not isinstance(raw, dict):
            raise InvalidInput("a kernel class must be a JSON object", type(raw).__name__)
        try:
            dims = {axis: None if raw.get(axis) is None else parse_dim(axis.upper(), raw[axis]) for axis in "mnk"}
            return cls(DType.parse(raw["dtype"]), Layout.parse(raw["a_layout"]), Layout.parse(raw["b_layout"]),
                       parse_bool("bias", raw.get("bias", False)), Activation.parse(raw.get("activation")), **dims,
                       row_sums=parse_bool("row_sums", raw.get("row_sums", False)))
        except KeyError as exc:
            raise InvalidInput("a kernel class must name dtype, a_layout and b_layout", f"missing {exc}") from None

    @classmethod
    def of(cls, problem: Problem, varies: str) -> "KernelClass":
        """The class of `problem` with dimension `varies` ('m' or 'k') left free."""
        dims = {"m": problem.m, "n": problem.n, "k": problem.k}
        dims[varies] = None
        return cls(problem.a_dtype, problem.a_layout, problem.b_layout, problem.epilogue.bias,
                   problem.epilogue.activation, **dims, row_sums=problem.epilogue.row_sums)


@dataclass(frozen=True)
class LinearLayer:
    """A Linear layer as a tuning question: features, dtype, epilogue and the token range it serves."""

    in_features: int
    out_features: int
    dtype: DType = DType.BF16
    bias: bool = False
    activation: str = "none"
    tokens_min: int = 1
    tokens_max: int = 8192
    # Where a layer with a bias gets its bias gradient (BIAS_GRADS): 'fused' tunes the weight gradient as a
    # kernel that also writes it; 'separate' leaves it to a reduction on torch.
    bias_grad: str = "fused"

    @classmethod
    def create(cls, in_features, out_features, dtype="bf16", bias=False, activation="none",
               tokens="1..8192", bias_grad="fused") -> "LinearLayer":
        """Validated from loose values (CLI text): tokens is 'LO..HI' or one count."""
        lo, hi = parse_tokens(tokens)
        kernel_activation(str(activation))
        dt = DType.parse(dtype)
        if dt not in (DType.BF16, DType.F16):
            raise InvalidInput("a Linear layer's dtype must be bf16 or f16 (the kernel families' inputs)", dt.value)
        if bias_grad not in BIAS_GRADS:
            raise InvalidInput(f"--bias-grad must be one of {', '.join(BIAS_GRADS)}", bias_grad)
        return cls(parse_dim("IN", in_features), parse_dim("OUT", out_features), dt, bool(bias), str(activation),
                   lo, hi, bias_grad)

    def problems(self, tokens: "int | None" = None) -> "dict[str, Problem]":
        """The forward, data-grad and weight-grad products at `tokens` (default: the top of the range, the
        shape where throughput matters), and for a GELU or SiLU layer the training forward without its activation
        ('preact')."""
        t = self.tokens_max if tokens is None else tokens
        plain = Epilogue()
        forward = Problem(t, self.out_features, self.in_features, self.dtype, self.dtype, self.dtype,
                          a_layout=Layout.ROW, b_layout=Layout.COL,
                          epilogue=Epilogue(bias=self.bias, activation=kernel_activation(self.activation)))
        dgrad = Problem(t, self.in_features, self.out_features, self.dtype, self.dtype, self.dtype,
                        a_layout=Layout.ROW, b_layout=Layout.ROW, epilogue=plain)
        wgrad = Problem(self.out_features, self.in_features, t, self.dtype, self.dtype, self.dtype,
                        a_layout=Layout.COL, b_layout=Layout.ROW, epilogue=Epilogue(row_sums=self.fused_bias_grad))
        out = {"forward": forward, "dgrad": dgrad, "wgrad": wgrad}
        if self.activation in PREACT_ACTIVATIONS:
            out["preact"] = replace(forward, epilogue=Epilogue(bias=self.bias))
        return out

    def classes(self) -> "dict[str, KernelClass]":
        """The kernel class of each product (the token dimension free)."""
        return {role: KernelClass.of(problem, "k" if role == "wgrad" else "m")
                for role, problem in self.problems().items()}

    @property
    def fused_bias_grad(self) -> bool:
        """Whether the weight gradient is tuned as a kernel that also writes the bias gradient."""
        return self.bias and self.bias_grad == "fused"

    def without_fused_bias_grad(self) -> "LinearLayer":
        return replace(self, bias_grad="separate")

    def with_tokens(self, lo: int, hi: int) -> "LinearLayer":
        return replace(self, tokens_min=lo, tokens_max=hi)


def read_class(folder) -> "tuple[KernelClass, dict] | None":
    """A class folder's (KernelClass, class.json), or None when the file is missing, unreadable or another
    format (a reader skips such a folder rather than failing a model's forward)."""
    path = Path(folder) / CLASS_FILE
    try:
        # Through the files reader: json.loads' RecursionError (nesting thousands deep) escaped the registry's
        # lookup into the model's forward, and /dev/zero was read until memory ran out.
        raw = load_json("class.json", read_text("class.json", path), str(path))
        if not (isinstance(raw, dict) and raw.get("format") == CLASS_FORMAT):
            return None
        return KernelClass.from_dict(raw.get("class")), raw
    except InvalidInput:
        return None


def parse_tokens(text) -> "tuple[int, int]":
    """'LO..HI' or 'N' (or an int) as (lo, hi) with 1 <= lo <= hi."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = parse_dim("tokens", text)
        return value, value
    # Not stripped: surrounding spaces are refused here as in every value (model/parse.py), '--dtype "bf16 "' too.
    raw = str(text)
    lo_text, sep, hi_text = raw.partition("..")
    try:
        lo = parse_dim("tokens", lo_text)
        hi = parse_dim("tokens", hi_text) if sep else lo
    except InvalidInput:
        raise InvalidInput("--tokens must be a positive count or a range LO..HI of them", text) from None
    if lo > hi:
        raise InvalidInput("--tokens range LO..HI must have LO <= HI", text)
    return lo, hi


__all__ = ["ACTIVATIONS", "BIAS_GRADS", "CLASS_FILE", "CLASS_FORMAT", "KernelClass", "LinearLayer", "PREACT_ACTIVATIONS", "ROLES", "kernel_activation",
           "parse_tokens", "read_class"]
