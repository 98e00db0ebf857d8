"""Which problems one compiled kernel serves, and its launches for any of them.

A kernel takes M, N, K and the leading dimensions as arguments; what ties it to a shape is only its compile-time
operand description (dtypes, layouts, alignment, epilogue) and its family's problem-dependent rules (a split-K
factor needs that many K tiles, a swapped kernel's tile must hold all of M). So a loaded kernel serves every
problem that keeps those, on packed operands or on views with wider leading dimensions of the same alignment, and
its grid and workspace are computed for the problem at hand.
"""
from __future__ import annotations

from .. import families
from ..families.rules import check
from ..model.arch import Arch, loosest_gpu
from ..model.errors import InvalidInput
from ..model.problem import Layout, Problem
from ..model.tiles import Kernel, TileConfig
from .manifest import check_match


def kernel_of(manifest: dict) -> "Kernel | None":
    """The Kernel a manifest was built from, or None for a kernel no registered family describes."""
    config = manifest.get("config") or {}
    if config.get("family") not in families.names():
        return None
    return Kernel(Arch.parse(manifest["arch"]), Problem.from_dict(manifest["problem"]).operands,
                  TileConfig.from_dict(config))


def problem_from_shapes(base: Problem, a_shape, b_shape, d_shape, a_strides=None, b_strides=None,
                        d_strides=None) -> Problem:
    """`base` with the M, N, K that the arrays' logical shapes (A: M x K, B: K x N, D: M x N) give, and the
    leading dimensions their element strides give where an operand is a view wider than itself (rows of a
    row-major operand further apart than its width, say a column slice). Strides that fit no leading dimension of
    the kernel's layouts leave the operand packed, for check_operand to refuse by name."""
    for name, shape in (("A", a_shape), ("B", b_shape), ("D", d_shape)):
        if len(tuple(shape)) != 2:  # a batch of matrices or a vector was a bare ValueError from the unpacking
            raise InvalidInput(f"{name} must be a 2-D array (this kernel multiplies one matrix pair, not a batch "
                               "or a vector)", tuple(shape))
    (m, k), (k2, n), d = tuple(a_shape), tuple(b_shape), tuple(d_shape)
    if k2 != k or d != (m, n):
        raise InvalidInput("operands must be A: M x K, B: K x N and D: M x N", f"A {a_shape}, B {b_shape}, D {d_shape}")
    if min(m, n, k) <= 0:
        raise InvalidInput("M, N and K must be positive", (m, n, k))
    problem = base.with_shape(int(m), int(n), int(k))
    ops = base.operands
    return problem.with_leading(_leading(a_strides, (m, k), base.a_layout, ops.align_a),
                                _leading(b_strides, (k, n), base.b_layout, ops.align_b),
                                _leading(d_strides, (m, n), Layout.ROW, ops.align_c))


def _leading(strides, shape, layout: Layout, align: int) -> int:
    """The leading dimension (elements) that `strides` give a rows x cols operand in `layout`, or 0 (packed, or
    strides that are no leading dimension of that layout). An operand of one row (one column, column-major) has
    no second row to step to: its leading dimension is whatever the kernel's alignment (elements) needs."""
    (rows, cols) = shape
    outer, inner = (rows, cols) if layout is Layout.ROW else (cols, rows)
    if outer == 1:
        return 0 if inner % align == 0 else -(-inner // align) * align
    if strides is None:
        return 0
    s_outer, s_inner = (int(strides[0]), int(strides[1])) if layout is Layout.ROW else (int(strides[1]), int(strides[0]))
    if (s_inner == 1 or inner == 1) and s_outer > inner:
        return s_outer
    return 0


def check_serves(kernel: Kernel, problem: Problem) -> None:
    """InvalidInput naming the first rule `kernel` breaks for `problem`: the compile-time operand match, 32-bit
    indexing, and the family's rules for this problem."""
    check_match(kernel, problem)
    broken = check(kernel.config, loosest_gpu(kernel.arch), kernel.arch, problem)
    if broken:
        raise InvalidInput(f"this kernel does not serve {problem.m}x{problem.n}x{problem.k}: {broken[0]}",
                           kernel.name)


def manifest_for(manifest: dict, kernel: Kernel, problem: Problem, sm_count: "int | None" = None,
                 max_clusters: "int | None" = None) -> dict:
    """`manifest` with its problem, launches and workspace for `problem` (after check_serves). Each launch keeps
    the parameters its cubin was exported with (keep_exported_params)."""
    check_serves(kernel, problem)
    built = families.of(kernel.config).launches(kernel, problem, sm_count, max_clusters)
    launches = keep_exported_params(built.launches, manifest.get("launches") or [])
    return dict(manifest, problem=problem.to_dict(), launches=launches, workspace_bytes=built.workspace_bytes,
                workspace_zero=built.workspace_zero)


def device_manifest(manifest: dict, kernel: Kernel, problem: Problem, sm_count: int, module) -> dict:
    """`manifest`'s launches for `problem` on a device of `sm_count` SMs, whose loaded `module` holds the kernel: a
    persistent grid (and a Stream-K workspace) follows the device's SMs, and a persistent cluster kernel's grid the
    clusters the device holds at once (cuOccupancyMaxActiveClusters). A manifest is built on a host that may have no
    GPU, for the catalogue's H100 SXM (132 SMs): launched as is on an H100 PCIe (114), 18 CTAs of a persistent grid
    would wait for a second wave. gemmgen.load and the tuner's measurements launch through this."""
    built = manifest_for(manifest, kernel, problem, sm_count)
    # The GEMM launch (pack launches, where a family has them, come before it under other entry names).
    main = next((l for l in built["launches"] if l["entry"] == kernel.name), built["launches"][0])
    if getattr(kernel.config, "persistent", False) and main.get("cluster", [1, 1, 1])[0] > 1:
        from . import tma

        function = module.function(main["entry"])
        function.set_dynamic_smem(int(main.get("dynamic_smem", 0)))
        clusters = tma.max_active_clusters(function.handle, main)
        built = manifest_for(manifest, kernel, problem, sm_count, clusters)
    return built


def keep_exported_params(launches: "list[dict]", exported: "list[dict]") -> "list[dict]":
    """`launches` with each entry's parameters cut to those the exported launch of the same entry lists: a bundle
    from an earlier gemmgen was compiled for the parameter list it shipped with (sm90 kernels exported before
    2026-11-27 take no edge maps tmAe/tmBe), and parameters are passed by position. A parameter the bundle lists
    that this gemmgen no longer builds is refused by name: the cubin needs re-exporting."""
    by_entry = {launch.get("entry"): [p["name"] for p in launch.get("params", [])] for launch in exported}
    out = []
    for launch in launches:
        names = by_entry.get(launch.get("entry"))
        if names is None:
            out.append(launch)
            continue
        params = [p for p in launch["params"] if p["name"] in names]
        if [p["name"] for p in params] != names:
            missing = [n for n in names if n not in {p["name"] for p in params}]
            raise InvalidInput(f"{launch.get('entry')}: the bundle's kernel takes parameters this gemmgen no longer "
                               "builds (re-export the bundle)", missing or names)
        out.append(dict(launch, params=params))
    return out


__all__ = ["check_serves", "device_manifest", "keep_exported_params", "kernel_of", "manifest_for", "problem_from_shapes"]
