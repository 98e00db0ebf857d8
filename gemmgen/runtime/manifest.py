"""Launch manifests (docs/architecture.md, "Launch manifest"): everything a launcher needs, per family.

Each kernel family describes its launches (KernelFamily.launches: grid, block, cluster, shared memory,
parameters, workspace and its zeroing rule); make_manifest wraps them with the problem, configuration,
resources and NVRTC version.

`workspace_zero` says what a launcher must zero: {"bytes": N, "when": "run"} zeroes the workspace's first
N bytes before every run of the launches; "when": "bind" zeroes them once, when the workspace is first
bound to the kernel (Stream-K flags, which every run leaves zero again). A manifest without the key
means the whole workspace before every run (format 1's contract, which sm80 split-K relies on).
"""
from __future__ import annotations

from .. import families
from ..model.errors import InvalidInput
from ..model.problem import Operands, Problem
from ..model.tiles import Kernel

FORMAT = "gemmgen-manifest/1"


def workspace_zero(manifest: "dict | None", workspace_bytes: "int | None" = None) -> dict:
    """The manifest's workspace zeroing rule, with format 1's default (all of it, before every run)."""
    nbytes = int((manifest or {}).get("workspace_bytes", 0) or 0) if workspace_bytes is None else workspace_bytes
    rule = (manifest or {}).get("workspace_zero") or {"bytes": nbytes, "when": "run"}
    when = rule.get("when", "run")
    if when not in ("run", "bind"):
        raise InvalidInput("workspace_zero.when must be 'run' or 'bind'", when)
    return {"bytes": min(int(rule.get("bytes", nbytes)), nbytes), "when": when}


def check_match(kernel: Kernel, problem: Problem) -> None:
    """The problem must be one the kernel was compiled for: same dtypes, layouts and epilogue kind,
    and leading dimensions at least as aligned as the kernel's vector accesses assume."""
    have, need = problem.operands, kernel.operands
    same = (have.a_dtype, have.b_dtype, have.c_dtype, have.a_layout, have.b_layout, have.bias, have.activation,
            have.scaling, have.row_sums) == \
           (need.a_dtype, need.b_dtype, need.c_dtype, need.a_layout, need.b_layout, need.bias, need.activation,
            need.scaling, need.row_sums)
    if not same:
        raise InvalidInput("the problem's dtypes, layouts, scaling and epilogue must match the kernel's", problem.label,
                           kernel.name)
    for axis in ("a", "b", "c"):
        if getattr(have, f"align_{axis}") % getattr(need, f"align_{axis}"):
            raise InvalidInput(f"the problem's {axis.upper()} alignment must be a multiple of the kernel's",
                               getattr(have, f"align_{axis}"), f"kernel assumes {getattr(need, f'align_{axis}')}")


def operands_dict(ops: Operands) -> dict:
    """The compile-time operand description, as the manifest records it."""
    return {"a_dtype": ops.a_dtype.value, "b_dtype": ops.b_dtype.value, "c_dtype": ops.c_dtype.value,
            "acc_dtype": ops.acc_dtype.value, "a_layout": ops.a_layout.value, "b_layout": ops.b_layout.value,
            "align_a": ops.align_a, "align_b": ops.align_b, "align_c": ops.align_c, "bias": ops.bias,
            "activation": ops.activation.value, "scaling": ops.scaling.value,
            **({"row_sums": True} if ops.row_sums else {})}


def make_manifest(kernel: Kernel, problem: Problem, compiled=None, sm_count: "int | None" = None) -> dict:
    """The launch manifest of `kernel` run on `problem` (compiled: nvrtc.Compiled, for resources) on a GPU of
    `sm_count` SMs (a persistent kernel's grid; None: the families' default, an H100 SXM's)."""
    check_match(kernel, problem)
    built = families.of(kernel.config).launches(kernel, problem, sm_count)
    launches, workspace, zero = built.launches, built.workspace_bytes, built.workspace_zero
    resources = {"registers": 0, "spill_bytes": 0, "stack_bytes": 0, "smem_static": 0}
    nvrtc_version = None
    if compiled is not None:
        r = compiled.resources
        resources = {"registers": r.registers, "spill_bytes": compiled.spill_bytes, "stack_bytes": r.stack_bytes,
                     "smem_static": r.smem_static_bytes}
        nvrtc_version = compiled.nvrtc_version
    return {
        "format": FORMAT,
        "name": kernel.name,
        "arch": kernel.arch.value,
        "cubin": f"{kernel.name}.cubin",
        "problem": problem.to_dict(),
        "config": kernel.config.to_dict(),
        "operands": operands_dict(kernel.operands),
        "workspace_bytes": workspace,
        "workspace_zero": zero,
        "serves": families.of(kernel.config).serves(kernel),
        "launches": launches,
        "resources": resources,
        "nvrtc_version": nvrtc_version,
        "measured": None,
        "verification": None,
    }


__all__ = ["FORMAT", "check_match", "make_manifest", "operands_dict", "workspace_zero"]
