"""What a kernel family is: the interface every family package implements, and the pieces they share.

A family is one kernel design (a template and the rules that make it correct): its own frozen config type
(shared tile fields from model.tiles.TileConfig plus its knobs), its feasibility rules, its search space, the
values its templates read (render context) and its launch description (grid, shared memory, tensor maps,
workspace). The rest of gemmgen asks the registry (gemmgen.families) and never names a family.

Pure Python: a family's modules import neither jinja2, PyYAML, Optuna nor cuda-python at import time, so the
runtime can build and check launch descriptions with numpy and cuda-bindings alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

from ..model.arch import Arch, DType, Gpu
from ..model.errors import InvalidInput
from ..model.problem import Operands, Problem, Scaling
from ..model.tiles import DecompKind, Kernel, Shape3, TileConfig, parse_int

REG_LIMIT = 255
# The kernels index operands with 32-bit integers: no operand may hold more elements than that reaches.
MAX_OPERAND_ELEMENTS = 2**31 - 1
REG_ALLOC_UNIT = 8  # registers are allocated per thread in multiples of 8 (256 per warp)

# rule(ok, name, value, limit): how a family's check reports a broken rule.
Rule = Callable[[bool, str, object, object], None]


@dataclass(frozen=True)
class ModelTraits:
    """What the shared performance model (rank.predict) needs to know about one kernel of a family."""

    tensor_efficiency: float  # fraction of the dtype's peak the main loop sustains when nothing else limits it
    smem_reads: str  # how a warp tile reads shared memory: "fragments" (ldmatrix / scalar loads) or "wgmma"
    tma_loads: bool  # operands arrive through TMA: unaligned rows slow it; stages must cover its latency
    persistent: bool  # a persistent tile loop: no per-wave launch fill
    epilogue_hidden: bool  # another warpgroup's main loop overlaps each tile's epilogue (ping-pong)
    epilogue_exposed: float  # fraction of a persistent cooperative kernel's epilogue left on the critical path
    consumer_tile: Shape3  # the tile one consumer computes per pipeline stage (latency coverage)
    stages_ahead: float  # stages in flight ahead of the one being consumed
    swapped: bool = False  # the main loop runs on D^T = B^T A^T


@dataclass(frozen=True)
class Prepass:
    """Launches a kernel runs before its main loop on one problem (packing operands): what the model charges."""

    dram_bytes: int = 0       # read and written by the pre-pass launches
    launches: int = 0
    packed_a: bool = False    # the main loop reads a copy of A (B) whose rows start on 128-byte boundaries
    packed_b: bool = False
    k_factor: int = 1         # the main loop runs over k_factor * K (3xTF32's split copies)


@dataclass(frozen=True)
class Launches:
    """A kernel's launch description for one problem: the manifest's launches, workspace and zeroing rule."""

    launches: "list[dict]"
    workspace_bytes: int
    workspace_zero: dict


class KernelFamily:
    """One kernel family. Subclasses fill in the class attributes and the methods that raise here."""

    name: ClassVar[str] = ""
    config_type: ClassVar["type[TileConfig]"] = TileConfig
    min_arch: ClassVar[Arch] = Arch.SM80
    needs_wgmma: ClassVar[bool] = False  # only sm_90a (not sm_90) has wgmma and setmaxnreg
    dtypes: ClassVar["frozenset[DType]"] = frozenset()
    # (A's, B's) dtype pairs of different types the family also takes (an fp8 gradient GEMM: e4m3 x e5m2);
    # none unless a family says so. dtype_pairs() is every pair: these and each of `dtypes` with itself.
    mixed_dtypes: ClassVar["frozenset[tuple[DType, DType]]"] = frozenset()
    decompositions: ClassVar["frozenset[DecompKind]"] = frozenset({DecompKind.DATA_PARALLEL})
    # The most K slices a split-K configuration may cut (families/rules.py).
    max_splits: ClassVar[int] = 16
    # fp8 dequantization scalings the family's kernels apply (model/problem.Scaling); per tensor unless it says more.
    scalings: ClassVar["frozenset[Scaling]"] = frozenset({Scaling.TENSOR})
    # The kernels can also write the row sums of A (Epilogue.row_sums, a Linear layer's bias gradient).
    row_sums: ClassVar[bool] = False
    # The width of the signed integers the kernel's ABI passes M, N, K and the leading dimensions in (`int`):
    # every dimension and leading dimension must fit (families/rules.py).
    index_bits: ClassVar[int] = 32
    # The width of the element offsets its templates compute (row * ld + col): every operand's element count
    # must fit. A family whose templates compute them in 64 bits (size_t) says 64, and serves operands of more
    # than 2^31 elements (an LM head's logits at many tokens) while its dimensions stay within index_bits.
    offset_bits: ClassVar[int] = 32
    # Templates: `template` (the kernel's entry file) relative to `template_root`; search space file.
    template_root: ClassVar[Path] = Path()
    template: ClassVar[str] = ""
    space_file: ClassVar[Path] = Path()
    # A family built for one class of problems (few rows of D, say): that it cannot run the others is expected,
    # so the CLI does not announce it (a general family's refusal is news: a fallback to something slower).
    specialist: ClassVar[bool] = False
    # Hand-picked configurations (dict form) that illustrate the family in `gemmgen roofline`; not its space.
    examples: ClassVar["tuple[dict, ...]"] = ()
    # A module with check(config, gpu, arch, problem, operands, rule), smem_bytes(config, operands) and
    # regs_estimate(config): the methods below use it unless a family overrides them.
    rules: ClassVar[object] = None

    # --- targets -------------------------------------------------------------------------
    def supports_arch(self, arch: Arch) -> bool:
        return arch.cc >= self.min_arch.cc and (arch.has_wgmma or not self.needs_wgmma)

    def available(self) -> bool:
        """The family's template and search space are present (an installed copy may lack a family's files)."""
        return (self.template_root / self.template).is_file() and self.space_file.is_file()

    def dtype_pairs(self) -> "frozenset[tuple[DType, DType]]":
        """Every (A dtype, B dtype) the family takes."""
        return frozenset((d, d) for d in self.dtypes) | self.mixed_dtypes

    # --- rules and resources ---------------------------------------------------------------
    def check(self, config: TileConfig, gpu: Gpu, arch: Arch, problem: "Problem | None",
              operands: "Operands | None", rule: Rule) -> None:
        """Report every family rule `config` breaks through `rule` (the shared rules are checked by
        families.rules.check: arch, dtype, tile divisibility, block shape, decomposition, resources)."""
        self.rules.check(config, gpu, arch, problem, operands, rule)

    def smem_bytes(self, config: TileConfig, operands: "Operands | None" = None) -> int:
        """Dynamic shared memory one CTA needs."""
        return self.rules.smem_bytes(config, operands)

    def regs_estimate(self, config: TileConfig) -> int:
        """Registers per thread the kernel needs."""
        return self.rules.regs_estimate(config)

    def regs_allocated(self, config: TileConfig) -> int:
        """Registers per CTA after rounding each thread's count to the allocation unit."""
        per_thread = min(REG_LIMIT, self.regs_estimate(config))
        return config.threads * (-(-per_thread // REG_ALLOC_UNIT) * REG_ALLOC_UNIT)

    # --- model, codegen, launch --------------------------------------------------------------
    def efficiency(self, gpu: Gpu) -> float:
        """Fraction of the dtype's peak the family's main loop sustains on `gpu` when nothing else limits it
        (the model constant a calibration refits)."""
        raise NotImplementedError

    def traits(self, config: TileConfig, gpu: Gpu) -> ModelTraits:
        """What the shared performance model needs to know about `config`'s kernel."""
        raise NotImplementedError

    def gemm_problem(self, config: TileConfig, problem: Problem) -> Problem:
        """The product the main loop computes for `problem` (the problem itself unless the kernel swaps)."""
        return problem

    def prepass(self, config: TileConfig, problem: Problem) -> Prepass:
        """Launches before the main loop on `problem` (none unless the family packs operands)."""
        return Prepass()

    def bytes_in_flight(self, config: TileConfig, problem: Problem) -> "float | None":
        """Operand bytes one CTA has requested from memory and not yet received, in steady state (Little's law
        bounds a grid's bandwidth by it), or None for the model's default: the stages ahead of the one consumed."""
        return None

    def sm_load_rate(self, config: TileConfig, problem: Problem, warps_per_sm: float) -> "float | None":
        """Bytes per second one SM's loads sustain for this kernel on `problem` with `warps_per_sm` of its warps
        resident (its load path's own limit, e.g. L1 requests per byte), or None where only DRAM and bytes in
        flight limit it. The model caps the memory rate at this times the SMs the grid occupies."""
        return None

    def load_efficiency(self, config: TileConfig, problem: Problem) -> float:
        """Fraction of the memory rate the model assumes that this kernel's loads reach on `problem` (1 unless a
        family's way of reading some operands, e.g. unaligned rows read as shifted pairs, measurably costs more)."""
        return 1.0

    def edge_fill_s(self, config: TileConfig, problem: Problem, ctas: int) -> float:
        """Seconds the CTA holding the most edge tiles of `problem` (the caller's, not swapped) spends on load
        boxes past the operands' edges, beside streaming its share, with `ctas` CTAs resident (0 by default: loads
        predicated per element cost nothing past the edge)."""
        return 0.0

    def compute_efficiency(self, config: TileConfig, problem: Problem, gpu: "Gpu | None" = None) -> float:
        """Fraction of its main loop's rate (traits' tensor_efficiency) this kernel keeps on `problem` (1 unless a
        family's way of reading some operands, e.g. unaligned rows copied through registers, takes issue slots and
        latency the main loop needs: a cost on every tile, not only on the bytes from DRAM). `gpu`, where given,
        is the GPU it is priced for (a cost one architecture has and another has not)."""
        return 1.0

    def store_overhead_s(self, config: TileConfig, problem: Problem, gpu: Gpu) -> float:
        """Seconds the kernel's stores of D add that nothing overlaps and the tile epilogue term does not cover
        (e.g. D's rows off 16-byte boundaries, where no TMA store can write them); 0 by default."""
        return 0.0

    def context(self, kernel: Kernel) -> dict:
        """Every value the family's templates read, derived from the Kernel alone."""
        raise NotImplementedError

    def serves(self, kernel: Kernel) -> dict:
        """The shapes one compiled kernel serves, for the manifest (the loader checks each call exactly with
        families.rules.check): packed operands whose leading dimensions keep the kernel's alignment (or views
        whose leading dimensions, in elements, are multiples of `leading_multiple_of`), element offsets within the
        family's offset_bits, and the family's problem-dependent limits."""
        ops, cfg = kernel.operands, kernel.config
        multiple = {"M": 1, "N": 1, "K": 1}
        for axis, align in ((("K" if ops.a_layout.value == "row" else "M"), ops.align_a),
                            (("N" if ops.b_layout.value == "row" else "K"), ops.align_b), ("N", ops.align_c)):
            multiple[axis] = math.lcm(multiple[axis], align)
        out = {"multiple_of": multiple, "leading_multiple_of": {"lda": ops.align_a, "ldb": ops.align_b,
                                                                "ldc": ops.align_c},
               "max_operand_elements": 2 ** (self.offset_bits - 1) - 1}
        if cfg.decomposition.kind is DecompKind.SPLIT_K:
            out["k_min"] = (cfg.decomposition.splits - 1) * cfg.cta.k + 1  # every slice gets a K tile
        return out

    def launches(self, kernel: Kernel, problem: Problem, sm_count: "int | None" = None,
                 max_clusters: "int | None" = None) -> Launches:
        """Grid, block, cluster, shared memory, parameters and workspace of `kernel` run on `problem`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<kernel family {self.name}>"


class FewRowsFamily(KernelFamily):
    """A family for a few rows of D whose every CTA covers all M rows (sm80_skinny, sm80_gemv): a kernel serves M
    up to its CTA tile M, and its loads' rate per SM grows with the warps resident, up to a cap."""

    def serves(self, kernel: Kernel) -> dict:
        out = super().serves(kernel)
        out["m_max"] = kernel.config.cta.m
        return out


def warp_scaled_rate(rate: "tuple[float, float]", warps_per_sm: float) -> float:
    """Bytes per second one SM's loads sustain from (per resident warp, cap per SM) and its resident warps."""
    per_warp, cap = rate
    return min(cap, warps_per_sm * per_warp)


def elt_bytes(operands: "Operands | None") -> int:
    """Bytes per A/B element (16-bit when no operands are given, as the space is checked without a problem)."""
    return operands.a_dtype.bytes if operands else 2


def pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


# --- the launch ABI pieces families share ------------------------------------------------------

def tensor_param(name: str, ctype: str) -> dict:
    return {"name": name, "ctype": ctype, "kind": "tensor", "tensor": name}


def scalar_param(name: str, ctype: str, value) -> dict:
    return {"name": name, "ctype": ctype, "kind": "scalar", "value": value}


def workspace_param() -> dict:
    return {"name": "workspace", "ctype": "float*", "kind": "workspace"}


def scalar_params(problem: Problem) -> "list[dict]":
    """M N K lda ldb ldc ldd alpha beta: the scalar tail every family's ABI ends with."""
    return [scalar_param("M", "int", problem.m), scalar_param("N", "int", problem.n), scalar_param("K", "int", problem.k),
            scalar_param("lda", "int", problem.lda), scalar_param("ldb", "int", problem.ldb),
            scalar_param("ldc", "int", problem.ldc), scalar_param("ldd", "int", problem.ldc),
            scalar_param("alpha", "float", problem.epilogue.alpha), scalar_param("beta", "float", problem.epilogue.beta)]


def pointer_params(problem: Problem) -> "list[dict]":
    """(A, B, C, D, bias, workspace): the pointer head of the plain (non-TMA) ABI."""
    a, b, c = problem.a_dtype.cuda_type, problem.b_dtype.cuda_type, problem.c_dtype.cuda_type
    return [tensor_param("A", f"const {a}*"), tensor_param("B", f"const {b}*"), tensor_param("C", f"const {c}*"),
            tensor_param("D", f"{c}*"), tensor_param("bias", f"const {c}*"), workspace_param()]


def reduce_launch(kernel: Kernel, problem: Problem, params: "list[dict]", threads: int) -> dict:
    """The split-K reduction launch `<name>_reduce`: one thread per two columns of D."""
    pairs = problem.m * -(-problem.n // 2)
    return {"entry": f"{kernel.name}_reduce", "grid": [-(-pairs // threads), 1, 1], "block": [threads, 1, 1],
            "cluster": [1, 1, 1], "dynamic_smem": 0, "params": params}


def column_block_launches(kernel: Kernel, problem: Problem, dynamic_smem: int, reduce_threads: int) -> Launches:
    """The launches of a plain-ABI kernel whose CTAs each cover every row of D for cta.n columns (sm80_skinny,
    sm80_gemv): grid (ceil(N / cta.n), 1, splits); with split-K, fp32 partials in workspace[z][M][N] and the shared
    reduction launch after it. Nothing needs zeroing: every partial is written."""
    cfg = kernel.config
    splitk = cfg.decomposition.kind is DecompKind.SPLIT_K
    splits = cfg.decomposition.splits if splitk else 1
    params = pointer_params(problem) + scalar_params(problem)
    main = {"entry": kernel.name, "grid": [math.ceil(problem.n / cfg.cta.n), 1, splits],
            "block": [cfg.threads, 1, 1], "cluster": [1, 1, 1], "dynamic_smem": dynamic_smem, "params": params}
    if not splitk:
        return Launches([main], 0, {"bytes": 0, "when": "run"})
    return Launches([main, reduce_launch(kernel, problem, params, reduce_threads)], splits * problem.m * problem.n * 4,
                    {"bytes": 0, "when": "run"})


@dataclass(frozen=True)
class KWarpsConfig(TileConfig):
    """Shared by the configurations whose warps also split K inside a CTA (`k_warps` copies of the warps across N,
    meeting in shared memory at the end): the knob, its name part and its parsing. Not a family of its own."""

    k_warps: int = 1

    KNOBS = {"k_warps": 1}

    @property
    def math_threads(self) -> int:
        return self.warps_n * self.k_warps * 32

    def knob_tags(self) -> "list[str]":
        return [f"kw{self.k_warps}"] if self.k_warps != 1 else []

    def knob_values(self) -> dict:
        return {"k_warps": self.k_warps}

    @classmethod
    def parse_knobs(cls, raw: dict) -> dict:
        # Parsed here, judged by the family's rules (which k_warps it takes), like every other field.
        return {"k_warps": parse_int("k_warps", raw["k_warps"])}


def header_context(kernel: Kernel) -> dict:
    """The template values every family's kernel header and the common sm80 helpers read: names, the
    configuration as YAML comment lines, the input dtype's PTX and C names."""
    cfg, ops = kernel.config, kernel.operands
    return {"name": kernel.name, "arch": kernel.arch.value, "family": cfg.family,
            "config_yaml": cfg.to_yaml().rstrip("\n").splitlines(),
            "dtype": ops.a_dtype.ptx, "elem_ctype": ops.a_dtype.cuda_type}


def require_family(config: TileConfig, family: KernelFamily) -> None:
    if config.family != family.name:
        raise InvalidInput(f"{family.name} needs a {family.name} configuration", config.family)


__all__ = ["FewRowsFamily", "KWarpsConfig", "KernelFamily", "Launches", "Prepass", "column_block_launches", "MAX_OPERAND_ELEMENTS", "ModelTraits", "REG_ALLOC_UNIT", "REG_LIMIT", "Rule", "elt_bytes", "header_context", "pointer_params", "warp_scaled_rate",
           "pow2", "reduce_launch", "require_family", "scalar_param", "scalar_params", "tensor_param", "workspace_param"]
