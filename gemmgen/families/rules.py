"""The one entry to feasibility: check(config, gpu, ...) lists every rule a configuration breaks.

The rules every family shares (arch, dtype, tile divisibility, block shape, decomposition, resources) are
here; each family adds its own through `KernelFamily.check`. Rules carry the offending value and the limit,
so a rejected configuration explains itself. The resource estimates (shared memory, registers, occupancy)
are the family's, looked up through the registry.
"""
from __future__ import annotations

import math

from ..model.arch import Arch, Gpu
from ..model.errors import InvalidConfig, Violation
from ..model.problem import Operands, Problem
from ..model.tiles import DecompKind, Kernel, TileConfig
from . import of
from .base import REG_LIMIT


def smem_bytes(config: TileConfig, operands: "Operands | None" = None) -> int:
    """Dynamic shared memory one CTA of `config` needs (the family's estimate)."""
    return of(config).smem_bytes(config, operands)


def regs_estimate(config: TileConfig) -> int:
    return of(config).regs_estimate(config)


def regs_allocated(config: TileConfig) -> int:
    return of(config).regs_allocated(config)


def ctas_per_sm(config: TileConfig, gpu: Gpu, operands: "Operands | None" = None) -> int:
    """Occupancy: resident CTAs per SM, limited by threads, shared memory and registers."""
    limits = [gpu.max_ctas_per_sm, gpu.max_threads_per_sm // max(1, config.threads)]
    smem = smem_bytes(config, operands) + 1024  # the driver reserves 1 KB per CTA
    limits.append(gpu.smem_per_sm // smem)
    limits.append(gpu.regs_per_sm // max(1, regs_allocated(config)))
    return max(0, min(limits))


def check(config: TileConfig, gpu: Gpu, arch: "Arch | None" = None, problem: "Problem | None" = None,
          operands: "Operands | None" = None) -> "list[Violation]":
    """Every feasibility rule `config` breaks on `gpu` (for `arch`, and for `problem` if given)."""
    arch = arch or gpu.arch
    if operands is None and problem is not None:
        operands = problem.operands
    family = of(config)
    out: "list[Violation]" = []

    def rule(ok: bool, name: str, value, limit):
        if not ok:
            out.append(Violation(name, value, limit))

    cta, warp, mma = config.cta, config.warp, config.mma
    decomp = config.decomposition

    # Architecture and dtype support.
    rule(family.supports_arch(arch), f"family {family.name} needs arch", arch.value, family.min_arch.value)
    rule(arch.cc <= gpu.arch.cc, "arch must not exceed the GPU's", arch.value, gpu.arch.value)
    if operands is not None:
        rule(operands.a_dtype in family.dtypes, f"family {family.name} supports dtypes", operands.a_dtype.value,
             sorted(d.value for d in family.dtypes))
        if operands.b_dtype is not operands.a_dtype:
            rule((operands.a_dtype, operands.b_dtype) in family.dtype_pairs(),
                 f"family {family.name} supports A/B dtype pairs", pair_text(operands.a_dtype, operands.b_dtype),
                 mixed_text(family.mixed_dtypes) or "matching A and B dtypes only")
        rule(operands.scaling in family.scalings, f"family {family.name} supports fp8 scalings",
             operands.scaling.value, sorted(s.value for s in family.scalings))
        if operands.row_sums:
            rule(family.row_sums, f"family {family.name} cannot write the row sums of A", "row_sums",
                 "a family that declares row_sums")

    if problem is not None:
        _check_indexing(family, problem, rule)

    # Divisibility between tile levels.
    rule(cta.m % warp.m == 0, "CTA tile M must be a multiple of warp tile M", f"{cta.m} % {warp.m}", 0)
    rule(cta.n % warp.n == 0, "CTA tile N must be a multiple of warp tile N", f"{cta.n} % {warp.n}", 0)
    rule(warp.k == cta.k, "warp tile K must equal CTA tile K (warps split M and N only)", warp.k, cta.k)
    rule(warp.m % mma.m == 0, "warp tile M must be a multiple of MMA M", f"{warp.m} % {mma.m}", 0)
    rule(warp.n % mma.n == 0, "warp tile N must be a multiple of MMA N", f"{warp.n} % {mma.n}", 0)
    rule(cta.k % mma.k == 0, "CTA tile K must be a multiple of MMA K", f"{cta.k} % {mma.k}", 0)

    # The family's own rules (instruction shapes, pipeline, layouts, its knobs).
    family.check(config, gpu, arch, problem, operands, rule)

    # Block shape.
    rule(32 <= config.threads <= 1024, "threads per block must be 32..1024", config.threads, 1024)
    rule(config.raster.group in (1, 2, 4, 8, 16), "rasterization group must be 1, 2, 4, 8 or 16",
         config.raster.group, "1,2,4,8,16")

    # Decomposition.
    rule(decomp.kind in family.decompositions, f"family {family.name} supports decompositions", decomp.kind.value,
         sorted(d.value for d in family.decompositions))
    if decomp.fused:
        rule(decomp.kind is DecompKind.SPLIT_K, "a fused reduction is a split-K option", decomp.kind.value,
             DecompKind.SPLIT_K.value)
        rule(getattr(family, "fused_splitk", False), f"family {family.name} has no fused split-K reduction",
             family.name, "a family with one")
    if decomp.kind is DecompKind.SPLIT_K:
        most = family.max_splits
        rule(2 <= decomp.splits <= most, f"split-K factor must be 2..{most}", decomp.splits, f"2..{most}")
        if problem is not None:
            k_tiles = math.ceil(problem.k / cta.k)
            rule(decomp.splits <= k_tiles, "split-K factor must not exceed the K tiles", decomp.splits, k_tiles)
    else:
        rule(decomp.splits == 1, "split factor must be 1 unless split-K", decomp.splits, 1)

    # Resources.
    smem = smem_bytes(config, operands)
    rule(smem <= gpu.smem_per_block_optin, "shared memory per block must fit the GPU's opt-in limit", smem,
         gpu.smem_per_block_optin)
    regs = regs_estimate(config)
    rule(regs <= REG_LIMIT, "estimated registers per thread must be at most 255", regs, REG_LIMIT)
    rule(regs_allocated(config) <= gpu.regs_per_sm, "registers per block must fit the register file",
         regs_allocated(config), gpu.regs_per_sm)
    return out


def pair_text(a, b) -> str:
    """An (A, B) dtype pair as errors show it: 'e4m3 x e5m2'."""
    return f"{a.value} x {b.value}"


def mixed_text(pairs) -> str:
    """Mixed (A, B) dtype pairs as errors list them: 'e4m3 x e5m2, e5m2 x e4m3' ('' for none)."""
    return ", ".join(sorted(pair_text(a, b) for a, b in pairs))


def _check_indexing(family, problem: Problem, rule) -> None:
    """Every dimension and leading dimension must fit the family's index integers (index_bits) and every element
    offset its offset integers (offset_bits): beyond them the kernel's `int` arguments or offsets wrap, and it
    reads and writes outside the operands."""
    bits = family.index_bits
    limit = 2 ** (bits - 1) - 1
    what = f"must fit family {family.name}'s {bits}-bit indexing"
    for name, value in (("M", problem.m), ("N", problem.n), ("K", problem.k), ("lda", problem.lda),
                        ("ldb", problem.ldb), ("ldc", problem.ldc)):
        rule(value <= limit, f"{name} {what}", value, limit)
    bits = family.offset_bits
    limit = 2 ** (bits - 1) - 1
    what = f"must fit family {family.name}'s {bits}-bit indexing"
    # A view's last row starts (rows - 1) * ld elements in: with ld above the width, that is past rows * width.
    for name, elements in (("A (M*K)", _extent(problem.m, problem.k, problem.lda, problem.a_layout.value)),
                           ("B (K*N)", _extent(problem.k, problem.n, problem.ldb, problem.b_layout.value)),
                           ("D (M*N)", _extent(problem.m, problem.n, problem.ldc, "row"))):
        rule(elements <= limit, f"the element offsets of {name} {what}", elements, limit)


def _extent(rows: int, cols: int, ld: int, layout: str) -> int:
    """Elements from a (rows x cols) operand's first to one past its last, with leading dimension ld."""
    return (rows - 1) * ld + cols if layout == "row" else (cols - 1) * ld + rows


def validate(config: TileConfig, gpu: Gpu, arch: "Arch | None" = None, problem: "Problem | None" = None,
             operands: "Operands | None" = None) -> TileConfig:
    """Return `config` unchanged, or raise InvalidConfig listing every broken rule."""
    violations = check(config, gpu, arch, problem, operands)
    if violations:
        ops = operands or (problem.operands if problem else Operands())
        raise InvalidConfig(Kernel(arch or gpu.arch, ops, config).name, violations)
    return config


__all__ = ["check", "ctas_per_sm", "regs_allocated", "regs_estimate", "smem_bytes", "validate"]
