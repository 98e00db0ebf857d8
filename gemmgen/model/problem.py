"""The matrix product a user asks for: D = act(alpha * op(A) @ op(B) + beta * C + bias)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum

from .arch import DType
from .errors import InvalidInput
from . import parse


class Layout(str, Enum):
    """Storage order. For A (M×K) row-major means K is contiguous; for B (K×N) row-major means N is."""

    ROW = "row"
    COL = "col"

    @property
    def letter(self) -> str:
        return "r" if self is Layout.ROW else "c"

    @property
    def flipped(self) -> "Layout":
        """The layout of the transposed matrix: a row-major X is a column-major X^T."""
        return Layout.COL if self is Layout.ROW else Layout.ROW

    @classmethod
    def parse(cls, text: "str | Layout") -> "Layout":
        if isinstance(text, Layout):
            return text
        return cls(parse.name("layout", text, ("row", "col"), {"r": "row", "c": "col", "column": "col", "n": "row",
                                                                 "t": "col"}, listed="'row' or 'col'"))


class Activation(str, Enum):
    NONE = "none"
    RELU = "relu"
    GELU = "gelu"  # tanh approximation, as in most frameworks' fast path
    SILU = "silu"  # x * sigmoid(x) (swish), the activation of LLaMA-style MLPs

    @classmethod
    def parse(cls, text: "str | Activation | None") -> "Activation":
        if text is None:
            return cls.NONE
        if isinstance(text, Activation):
            return text
        return cls(parse.name("activation", text, [a.value for a in cls]))


SCALE_BLOCK = 128   # the block scales' extent along K (A and B) and along N (B): DeepGEMM's 1x128 and 128x128


class Scaling(str, Enum):
    """How fp8 operands are dequantized: D = alpha * sa * sb * (A @ B) + ...

    tensor: one float32 scale per operand (scale_a, scale_b: device scalars, null meaning 1).
    rowcol: a scale per row of A (scale_a: M float32) and per column of B (scale_b: N float32), as
    torch._scaled_mm's rowwise scaling: D[m, n] = alpha * scale_a[m] * scale_b[n] * (A @ B)[m, n] + ...
    block: DeepGEMM's fine-grained scales: A's per row and 128-wide block of K (scale_a: [M, ceil(K/128)]), B's per
    128 x 128 block of N x K (scale_b: [ceil(N/128), ceil(K/128)]), both float32 row-major:
    D[m, n] = alpha * sum_kb scale_a[m, kb] * scale_b[n // 128, kb] * (A[m, kb] @ B[kb, n]) + ...
    """

    TENSOR = "tensor"
    ROWCOL = "rowcol"
    BLOCK = "block"

    @classmethod
    def parse(cls, text: "str | Scaling | None") -> "Scaling":
        return _parse_choice(cls, text, cls.TENSOR, "scaling",
                             {"rowwise": "rowcol", "blockwise": "block", "per-tensor": "tensor"})


def _parse_choice(cls, text, default, what: str, aliases: dict):
    """A str-valued Enum member from loose text (None: `default`; a member: itself), naming the rule if not one."""
    if text is None:
        return default
    if isinstance(text, cls):
        return text
    return cls(parse.name(what, text, [member.value for member in cls], aliases))


@dataclass(frozen=True)
class Epilogue:
    """What happens to the fp32 accumulator before it is stored."""

    alpha: float = 1.0
    beta: float = 0.0
    bias: bool = False  # one value per column of D, same dtype as C
    activation: Activation = Activation.NONE
    # Also write row_sums[m] = sum_k A[m, k] (fp32 sums, stored in C's dtype): a Linear layer's bias gradient
    # (the column sums of dZ, the rows of A = dZ^T) as a by-product of the weight gradient that reads A anyway.
    row_sums: bool = False

    @property
    def tag(self) -> str:
        """Compile-time part of the epilogue, for kernel names (alpha and beta are run-time)."""
        parts = ["bias"] if self.bias else []
        if self.activation is not Activation.NONE:
            parts.append(self.activation.value)
        if self.row_sums:
            parts.append("rowsum")
        return "_".join(parts) or "linear"


def _alignment(leading_dim: int, dtype: DType) -> int:
    """Widest vector (elements, at most 16 bytes) that every row start of this operand admits."""
    widest = 16 // dtype.bytes
    for width in (widest, widest // 2, widest // 4, widest // 8):
        if width >= 1 and leading_dim % width == 0:
            return width
    return 1


class Fp32Math(str, Enum):
    """How fp32 inputs reach the tensor cores.

    tf32: one product, each input truncated to tf32 by wgmma (about 1e-3 relative error; the default).
    3xtf32: three tf32 products, big·big + big·small + small·big (big the input truncated to tf32, small the
    rest rounded to tf32), partial sums promoted into fp32: fp32-class accuracy at about a third of tf32's speed
    (the `split3` kernels). Only fp32 inputs have a choice."""

    TF32 = "tf32"
    X3 = "3xtf32"

    @classmethod
    def parse(cls, text: "str | Fp32Math | None") -> "Fp32Math":
        return _parse_choice(cls, text, cls.TF32, "--math", {"x3": "3xtf32", "fp32": "3xtf32"})


class Fp8Accum(str, Enum):
    """How fp8 products accumulate along K (torch._scaled_mm's use_fast_accum).

    fast: the wgmma accumulators hold the whole sum; Hopper's fp8 wgmma adds into them with reduced precision
    (about 1.3x the error of fp32 accumulation at K = 4096 with a bf16 D; the default).
    fp32: the partial sums are promoted into fp32 accumulators every 1-4 k-tiles of 128 (the `promote` knob):
    cuBLAS's default accuracy (measured on the H100: equal every 128 of K, 1.7% above it every 512), at a cost in
    speed. Only fp8 inputs have a choice."""

    FAST = "fast"
    FP32 = "fp32"

    @classmethod
    def parse(cls, text: "str | Fp8Accum | None") -> "Fp8Accum":
        return _parse_choice(cls, text, cls.FAST, "--accumulate", {"promoted": "fp32", "f32": "fp32"})


@dataclass(frozen=True)
class Operands:
    """The compile-time description of a product: dtypes, layouts, alignment and epilogue kind."""

    a_dtype: DType = DType.BF16
    b_dtype: DType = DType.BF16
    c_dtype: DType = DType.BF16
    acc_dtype: DType = DType.F32
    a_layout: Layout = Layout.ROW
    b_layout: Layout = Layout.ROW
    align_a: int = 8  # elements per vector access
    align_b: int = 8
    align_c: int = 8
    bias: bool = False
    activation: Activation = Activation.NONE
    scaling: Scaling = Scaling.TENSOR   # fp8 dequantization scales: per tensor, per row/column, or in blocks
    row_sums: bool = False   # the kernel also writes the row sums of A (Epilogue.row_sums)

    @property
    def tag(self) -> str:
        """'bf16bf16_bf16_f32_rr_a8x8x8' style: dtypes, layouts and alignments (and '_rowcol' or '_block' for fp8
        kernels with those scales; per-tensor scaling is not named, so older names stay)."""
        dts = f"{self.a_dtype.value}{self.b_dtype.value}_{self.c_dtype.value}_{self.acc_dtype.value}"
        epi = Epilogue(bias=self.bias, activation=self.activation, row_sums=self.row_sums).tag
        scaled = "" if self.scaling is Scaling.TENSOR else f"_{self.scaling.value}"
        return (f"{dts}_{self.a_layout.letter}{self.b_layout.letter}_a{self.align_a}x{self.align_b}x{self.align_c}_"
                f"{epi}{scaled}")

    @property
    def rows_aligned(self) -> "tuple[bool, bool]":
        """(A, B) whose rows all start on 16-byte boundaries: the widest vector loads, and what TMA requires."""
        return self.align_a * self.a_dtype.bytes >= 16, self.align_b * self.b_dtype.bytes >= 16

    def swapped(self) -> "Operands":
        """The operands of D^T = B^T @ A^T as a swapped kernel's main loop sees them: A' = B^T and B' = A^T
        (dtypes, flipped layouts and alignments exchanged). C, D, the bias and align_c stay the caller's: only
        the reduction launch touches them, in the caller's frame."""
        return replace(self, a_dtype=self.b_dtype, b_dtype=self.a_dtype, a_layout=self.b_layout.flipped,
                       b_layout=self.a_layout.flipped, align_a=self.align_b, align_b=self.align_a)


@dataclass(frozen=True)
class Problem:
    """A GEMM instance: shape, dtypes, layouts and epilogue."""

    m: int
    n: int
    k: int
    a_dtype: DType = DType.BF16
    b_dtype: DType = DType.BF16
    c_dtype: DType = DType.BF16
    acc_dtype: DType = DType.F32
    a_layout: Layout = Layout.ROW
    b_layout: Layout = Layout.ROW
    epilogue: Epilogue = field(default_factory=Epilogue)
    scaling: Scaling = Scaling.TENSOR
    fp32_math: Fp32Math = Fp32Math.TF32   # fp32 inputs: one tf32 product, or 3xTF32's fp32-class accuracy
    fp8_accum: Fp8Accum = Fp8Accum.FAST   # fp8 inputs: wgmma's own accumulation, or promoted into fp32
    # Leading dimensions in elements (the stride between rows of a row-major operand, columns of a column-major
    # one) where they are wider than the operand (a view into a larger array); 0: packed, the width itself. C and
    # D share c_ld.
    a_ld: int = 0
    b_ld: int = 0
    c_ld: int = 0

    def __post_init__(self):
        # The constructor takes the model's types; a name ('bf16', 'row') went through and failed later as an
        # AttributeError ('str' object has no attribute 'bytes') wherever the field was first used.
        for name, kind in (("a_dtype", DType), ("b_dtype", DType), ("c_dtype", DType), ("acc_dtype", DType),
                           ("a_layout", Layout), ("b_layout", Layout), ("epilogue", Epilogue), ("scaling", Scaling),
                           ("fp32_math", Fp32Math), ("fp8_accum", Fp8Accum)):
            if not isinstance(getattr(self, name), kind):
                raise InvalidInput(f"Problem's {name} must be a {kind.__name__} (Problem.create takes names such as "
                                   "'bf16' and 'row')", getattr(self, name))
        for axis in ("m", "n", "k"):
            value = getattr(self, axis)
            if isinstance(value, str) or isinstance(value, bool) or not isinstance(value, int):
                raise InvalidInput(f"{axis.upper()} must be a positive integer", value)
            parse_dim(axis.upper(), value)
        epilogue_scalar("alpha", self.epilogue.alpha)
        epilogue_scalar("beta", self.epilogue.beta)
        for name, given, least in (("lda", self.a_ld, self._packed_ld("a")), ("ldb", self.b_ld, self._packed_ld("b")),
                                   ("ldc", self.c_ld, self.n)):
            if isinstance(given, bool) or not isinstance(given, int) or (given and given < least):
                raise InvalidInput(f"{name} must be at least the operand's packed leading dimension ({least}), or 0 "
                                   f"for packed", given)
        if self.acc_dtype is not DType.F32:
            raise InvalidInput("accumulator dtype must be f32 (the only one the kernel families use)", self.acc_dtype.value)
        if self.a_dtype is not self.b_dtype and not (self.a_dtype.bytes == 1 and self.b_dtype.bytes == 1):
            # Only fp8 tensor-core instructions take two input types (wgmma .e4m3.e5m2, for gradients in e5m2
            # against e4m3 weights or activations); 16- and 32-bit products read one type for both.
            raise InvalidInput("A and B must have the same dtype unless both are fp8 (e4m3, e5m2)",
                               f"{self.a_dtype.value}/{self.b_dtype.value}")
        if self.scaling is not Scaling.TENSOR and not (self.a_dtype.bytes == 1 and self.b_dtype.bytes == 1):
            # Scales dequantize fp8 values; 16- and 32-bit inputs carry their own range and take alpha only.
            raise InvalidInput(f"scaling '{self.scaling.value}' needs fp8 inputs (e4m3, e5m2)",
                               f"{self.a_dtype.value}/{self.b_dtype.value}")
        if self.fp32_math is Fp32Math.X3 and self.a_dtype is not DType.F32:
            raise InvalidInput("--math 3xtf32 is for fp32 inputs (--dtype f32)", self.a_dtype.value)
        if self.fp8_accum is Fp8Accum.FP32 and self.a_dtype.bytes != 1:
            raise InvalidInput("--accumulate fp32 is for fp8 inputs (e4m3, e5m2); other dtypes accumulate in fp32",
                               self.a_dtype.value)

    @classmethod
    def create(cls, m, n, k, dtype="bf16", a="row", b="row", c_dtype=None, alpha=1.0, beta=0.0,
               bias=False, activation=None, b_dtype=None, scaling=None, row_sums=False,
               fp32_math=None, fp8_accum=None, lda=0, ldb=0, ldc=0) -> "Problem":
        """Build a Problem from loose values (strings from a CLI or YAML), validating each. `dtype` is A's
        (and B's unless `b_dtype` names another: fp8 pairs only); `scaling` is fp8's (Scaling, default tensor);
        `row_sums` asks for the row sums of A beside D (Epilogue.row_sums); `fp32_math` is fp32 inputs' (Fp32Math,
        default tf32), `fp8_accum` fp8 inputs' accumulation (Fp8Accum, default fast); lda, ldb, ldc the leading
        dimensions of views wider than their operands (0: packed)."""
        ab = DType.parse(dtype)
        bb = DType.parse(b_dtype) if b_dtype is not None else ab
        # fp8 products write a 16-bit D unless told otherwise (fp8 outputs need a scale the epilogue lacks).
        default_out = DType.BF16 if ab.bytes == 1 else ab
        return cls(parse_dim("M", m), parse_dim("N", n), parse_dim("K", k), ab, bb,
                   DType.parse(c_dtype) if c_dtype is not None else default_out, DType.F32, Layout.parse(a),
                   Layout.parse(b), Epilogue(epilogue_scalar("alpha", alpha), epilogue_scalar("beta", beta),
                                             _flag("bias", bias), Activation.parse(activation),
                                             _flag("row_sums", row_sums)),
                   Scaling.parse(scaling), Fp32Math.parse(fp32_math),
                   Fp8Accum.parse(fp8_accum)).with_leading(*(parse.integer(name, v, 0, parse.INT64_MAX)
                                                             for name, v in (("lda", lda), ("ldb", ldb), ("ldc", ldc))))

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def _packed_ld(self, operand: str) -> int:
        """The leading dimension of operand 'a' or 'b' when packed: its extent along the contiguous axis."""
        if operand == "a":
            return self.k if self.a_layout is Layout.ROW else self.m
        return self.n if self.b_layout is Layout.ROW else self.k

    @property
    def lda(self) -> int:
        return self.a_ld or self._packed_ld("a")

    @property
    def ldb(self) -> int:
        return self.b_ld or self._packed_ld("b")

    @property
    def ldc(self) -> int:
        return self.c_ld or self.n  # C and D are row-major

    @property
    def packed(self) -> bool:
        """Every operand is packed (no leading dimension wider than its operand)."""
        return not (self.a_ld or self.b_ld or self.c_ld)

    def rows_straddle_lines(self, packed_a: bool = False, packed_b: bool = False) -> "tuple[bool, bool]":
        """(A, B) whose rows, as the main loop reads them, do not start on 128-byte boundaries: a TMA box row then
        spans two 128-byte lines. A packed operand (`packed_a`, `packed_b`: copied into aligned rows first) does not."""
        return (bool(self.lda * self.a_dtype.bytes % 128) and not packed_a,
                bool(self.ldb * self.b_dtype.bytes % 128) and not packed_b)

    def k_major_rows(self) -> "Problem":
        """This problem with a single row of A (column of B) read as K-major: a packed 1 x K column-major A is the same
        K contiguous elements as a row-major one, and a K x 1 row-major B those of a column-major one. The K-major
        layout is what the tensor-core families read in place, where a one-row column-major A has a 2-byte leading
        dimension that TMA cannot take and was packed first (1x5168x576 cr: 6.2 us against cuBLAS's 4.1;
        docs/perf-notes.md, "One row of A"). The runtime ignores strides along an extent of 1, so a kernel built
        for the result takes the caller's arrays. For a request (the CLI's tune, suite rows, shape sets); stored
        problems (manifests, records) are read as written, so a bundle keeps the layout it was built for."""
        out = self
        if self.m == 1 and self.a_layout is Layout.COL and not self.a_ld:
            out = replace(out, a_layout=Layout.ROW)
        if self.n == 1 and self.b_layout is Layout.ROW and not self.b_ld:
            out = replace(out, b_layout=Layout.COL)
        return out

    def with_leading(self, lda: int = 0, ldb: int = 0, ldc: int = 0) -> "Problem":
        """This problem on views whose leading dimensions are lda, ldb, ldc (0, or the packed value: packed)."""
        return replace(self, a_ld=0 if lda == self._packed_ld("a") else lda,
                       b_ld=0 if ldb == self._packed_ld("b") else ldb, c_ld=0 if ldc == self.n else ldc)

    @property
    def operands(self) -> Operands:
        return Operands(self.a_dtype, self.b_dtype, self.c_dtype, self.acc_dtype, self.a_layout, self.b_layout,
                        _alignment(self.lda, self.a_dtype), _alignment(self.ldb, self.b_dtype),
                        _alignment(self.ldc, self.c_dtype), self.epilogue.bias, self.epilogue.activation,
                        self.scaling, self.epilogue.row_sums)

    @property
    def min_bytes(self) -> int:
        """Compulsory traffic: A and B read once, D written once (and C read once if beta != 0, and the fp8
        scale vectors or blocks: block scales of A add 4 bytes per 128 of its 1-byte elements, ~3%)."""
        c_reads = self.m * self.n * self.c_dtype.bytes if self.epilogue.beta != 0 else 0
        bias = self.n * self.c_dtype.bytes if self.epilogue.bias else 0
        bias += self.m * self.c_dtype.bytes if self.epilogue.row_sums else 0
        scales = 0 if self.scaling is Scaling.TENSOR else 4 * sum(math.prod(s) for s in self.scale_shapes)
        return (self.m * self.k * self.a_dtype.bytes + self.k * self.n * self.b_dtype.bytes
                + self.m * self.n * self.c_dtype.bytes + c_reads + bias + scales)

    @property
    def scale_shapes(self) -> "tuple[tuple[int, ...], tuple[int, ...]]":
        """The shapes of scale_a and scale_b (float32, row-major): (1,) each per tensor; (M,) and (N,) for rowcol;
        (M, ceil(K/128)) and (ceil(N/128), ceil(K/128)) for block scaling."""
        if self.scaling is Scaling.ROWCOL:
            return (self.m,), (self.n,)
        if self.scaling is Scaling.BLOCK:
            kb = -(-self.k // SCALE_BLOCK)
            return (self.m, kb), (-(-self.n // SCALE_BLOCK), kb)
        return (1,), (1,)

    @property
    def mixed(self) -> bool:
        """A and B have different dtypes (an fp8 pair: e4m3 x e5m2 or e5m2 x e4m3)."""
        return self.a_dtype is not self.b_dtype

    @property
    def dtype_label(self) -> str:
        """The input dtypes as names show them: 'bf16', or 'e4m3e5m2' for a mixed pair (as Operands.tag)."""
        return self.a_dtype.value + (self.b_dtype.value if self.mixed else "")

    @property
    def label(self) -> str:
        scaled = "" if self.scaling is Scaling.TENSOR else f"_{self.scaling.value}"
        x3 = "_3xtf32" if self.fp32_math is Fp32Math.X3 else ""
        acc = "_acc32" if self.fp8_accum is Fp8Accum.FP32 else ""
        lds = "" if self.packed else f"_ld{self.lda}x{self.ldb}x{self.ldc}"
        return (f"{self.m}x{self.n}x{self.k}_{self.dtype_label}_{self.a_layout.letter}{self.b_layout.letter}"
                f"{scaled}{x3}{acc}{lds}")

    def swapped(self) -> "Problem":
        """The product a swapped kernel's main loop computes: D^T (N x M) = B^T @ A^T over the same memory.
        B^T of a row-major B is column-major with B's leading dimension, so lda/ldb of the result are ldb/lda
        of this one. Its C, D and bias are not the caller's (D^T is column-major): launch code takes those, and
        ldc, from the original problem."""
        return replace(self, m=self.n, n=self.m, a_dtype=self.b_dtype, b_dtype=self.a_dtype,
                       a_layout=self.b_layout.flipped, b_layout=self.a_layout.flipped, a_ld=self.b_ld, b_ld=self.a_ld,
                       c_ld=0)

    def with_shape(self, m: int, n: int, k: int) -> "Problem":
        """The same product at another shape, on packed operands."""
        return replace(self, m=m, n=n, k=k, a_ld=0, b_ld=0, c_ld=0)

    def to_dict(self) -> dict:
        return {"M": self.m, "N": self.n, "K": self.k, "a_dtype": self.a_dtype.value, "b_dtype": self.b_dtype.value,
                "c_dtype": self.c_dtype.value, "acc_dtype": self.acc_dtype.value, "a_layout": self.a_layout.value,
                "b_layout": self.b_layout.value, "alpha": self.epilogue.alpha, "beta": self.epilogue.beta,
                "bias": self.epilogue.bias, "activation": self.epilogue.activation.value,
                # omitted for per-tensor scaling, so problems written before the field existed stay identical
                **({"scaling": self.scaling.value} if self.scaling is not Scaling.TENSOR else {}),
                **({"row_sums": True} if self.epilogue.row_sums else {}),
                **({"fp32_math": self.fp32_math.value} if self.fp32_math is Fp32Math.X3 else {}),
                **({"fp8_accum": self.fp8_accum.value} if self.fp8_accum is Fp8Accum.FP32 else {}),
                **({"lda": self.lda, "ldb": self.ldb, "ldc": self.ldc} if not self.packed else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "Problem":
        """The problem of a record, manifest or dispatch table (to_dict's form), each field checked as create's."""
        if not isinstance(d, dict):
            raise InvalidInput("a problem must be a mapping with M, N and K", type(d).__name__)
        for axis in ("M", "N", "K"):
            if axis not in d:  # was a bare KeyError: 'M' out of gemmgen.load and the record readers
                raise InvalidInput("a problem must give M, N and K", f"missing {axis}")
        return cls.create(d["M"], d["N"], d["K"], d.get("a_dtype", "bf16"), d.get("a_layout", "row"),
                          d.get("b_layout", "row"), d.get("c_dtype"), d.get("alpha", 1.0), d.get("beta", 0.0),
                          d.get("bias", False), d.get("activation"), d.get("b_dtype"), d.get("scaling"),
                          d.get("row_sums", False), d.get("fp32_math"), d.get("fp8_accum"),
                          d.get("lda", 0), d.get("ldb", 0), d.get("ldc", 0))


FLOAT32_MAX = 3.4028234663852886e38   # alpha and beta are `float` in every family's ABI


def epilogue_scalar(what: str, value) -> float:
    """alpha or beta: a finite number that float32 holds; a larger one (1e39) reached the kernel as inf."""
    try:
        return parse.real(what, value, -FLOAT32_MAX, FLOAT32_MAX)
    except InvalidInput as exc:
        raise InvalidInput(exc.rule, exc.value, f"the kernels take {what} as a float32") from None


def parse_dim(axis: str, value) -> int:
    """A matrix dimension: a positive integer (int or ASCII decimal text) of at most 2^63-1, the widest index
    any kernel can use. What a kernel family's own indexing reaches is its rule (families/rules.py)."""
    return parse.integer(axis, value, 1, parse.INT64_MAX)


def _flag(what: str, value) -> bool:
    if isinstance(value, bool):
        return value
    raise InvalidInput(f"{what} must be true or false", value)
