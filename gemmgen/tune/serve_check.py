"""A tuned winner verified at shapes it claims to serve besides its own.

A bundle's manifest says which problems its cubin serves (`serves`: the multiples M, N and K must keep for the
compiled alignment, k_min for split-K, m_max for a swapped tile), and gemmgen.load runs it on any of them. The
tune verified it at its own shape only, so the suite checks two more: shapes next to the tuned one that step off
its tile grid (M - 1 when M may be any value), each on fresh random inputs with D poisoned (NaN) first
(GpuBenchmark.verify through the measuring worker), so an edge the kernel mishandles shows as a wrong result.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..model.errors import InvalidInput
from ..model.problem import Problem


@dataclass(frozen=True)
class ShapeCheck:
    """One verification of a winner at another shape it serves. ok None: not run (no GPU: replayed timings)."""

    m: int
    n: int
    k: int
    ok: "bool | None"
    rel_error: "float | None" = None
    reason: str = ""

    @property
    def label(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


def other_shapes(manifest: dict, count: int = 2) -> "list[Problem]":
    """Up to `count` problems other than the manifest's own that its kernel serves (runtime/serve.check_serves
    passes), near the tuned shape: each axis moved by one step of the alignment the manifest states."""
    from ..runtime.serve import check_serves, kernel_of

    kernel = kernel_of(manifest)
    if kernel is None:
        return []
    base = Problem.from_dict(manifest["problem"])
    serves = manifest.get("serves") or {}
    step = {axis: max(1, int((serves.get("multiple_of") or {}).get(axis, 1) or 1)) for axis in "MNK"}
    a, b, c = step["M"], step["N"], step["K"]
    m, n, k = base.m, base.n, base.k
    # Off the tile grid first (M - 1 with N one step up), then the other directions, for tiny or capped shapes.
    candidates = [(m - a, n + b, k), (m + a, n, k + c), (m, n - b, k - c), (m - a, n - b, k + c),
                  (m + a, n + b, k + c), (m - a, n, k), (m, n + b, k), (m, n, k + c)]
    out: "list[Problem]" = []
    for mm, nn, kk in candidates:
        if min(mm, nn, kk) <= 0 or (mm, nn, kk) == (m, n, k):
            continue
        problem = _moved(base, mm, nn, kk)
        try:
            check_serves(kernel, problem)
        except InvalidInput:
            continue
        if problem not in out:
            out.append(problem)
        if len(out) == count:
            break
    return out


def _moved(base: Problem, m: int, n: int, k: int) -> Problem:
    """`base` at another shape, a view keeping the gaps between its rows (each leading dimension moves with its
    operand's width), so the check runs the same kind of operands the kernel was tuned on."""
    moved = base.with_shape(m, n, k)
    if base.packed:
        return moved
    packed = base.with_shape(base.m, base.n, base.k)
    return moved.with_leading(moved.lda + base.lda - packed.lda, moved.ldb + base.ldb - packed.ldb,
                              moved.ldc + base.ldc - packed.ldc)


def verify_other_shapes(manifest: dict, cubin: bytes, measurer, count: int = 2) -> "tuple[ShapeCheck, ...]":
    """The winner verified at `count` other shapes it serves, through `measurer.verify` (None from a measurer
    without a GPU: the shapes are listed as not run). Never raises: a failure is that shape's reason."""
    from ..runtime.serve import kernel_of, manifest_for

    try:
        shapes = other_shapes(manifest, count)
        kernel = kernel_of(manifest)
    except Exception as exc:  # noqa: BLE001 - a check that cannot start is reported in the table, not fatal
        return (ShapeCheck(0, 0, 0, False, reason=f"no shapes to check: {type(exc).__name__}: {exc}"[:160]),)
    verify = getattr(measurer, "verify", None)
    out = []
    for problem in shapes:
        if verify is None:
            out.append(ShapeCheck(problem.m, problem.n, problem.k, None, reason="not run: no GPU"))
            continue
        try:
            outcome = verify(manifest_for(manifest, kernel, problem), bytes(cubin), problem)
        except Exception as exc:  # noqa: BLE001 - as above
            out.append(ShapeCheck(problem.m, problem.n, problem.k, False, reason=f"{type(exc).__name__}: {exc}"))
            continue
        if outcome is None:
            out.append(ShapeCheck(problem.m, problem.n, problem.k, None, reason="not run: no GPU"))
        else:
            out.append(ShapeCheck(problem.m, problem.n, problem.k, bool(outcome.ok), outcome.rel_error,
                                  "" if outcome.ok else str(outcome.reason)[:160]))
    return tuple(out)


def summary(checks: "tuple[ShapeCheck, ...]") -> str:
    """The table's cell: '2/2 ok', 'FAIL 4095x4104x4096: wrong result ...', 'not run (no GPU)' or '-'."""
    if not checks:
        return "-"
    if all(c.ok is None for c in checks):
        return "not run (" + (checks[0].reason.split(": ", 1)[-1] or "no GPU") + ")"
    failed = [c for c in checks if c.ok is False]
    if failed:
        return "; ".join(f"FAIL {c.label}: {c.reason}" for c in failed)[:120]
    passed = [c for c in checks if c.ok]
    return f"{len(passed)}/{len(checks)} ok (" + ", ".join(c.label for c in passed) + ")"


__all__ = ["ShapeCheck", "other_shapes", "summary", "verify_other_shapes"]
