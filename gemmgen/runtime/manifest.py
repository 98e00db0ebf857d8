"""Launch manifests (docs/architecture.md, "Launch manifest"): everything a launcher needs, per family.

Each kernel family registers a builder in BUILDERS (Family -> function(kernel, problem) -> launches,
workspace_bytes[, workspace_zero]); make_manifest wraps the launches with the problem, configuration,
resources and NVRTC version. The Hopper family adds its own builder with `register(Family.SM90_WGMMA)`.

`workspace_zero` says what a launcher must zero: {"bytes": N, "when": "run"} zeroes the workspace's first
N bytes before every run of the launches; "when": "bind" zeroes them once, when the workspace is first
bound to the kernel (Stream-K flags, which every run leaves zero again). A manifest without the key
means the whole workspace before every run (format 1's contract, which sm80 split-K relies on).
"""
from __future__ import annotations

import math
from typing import Callable

from ..families import rules as constraints
from ..model.errors import InvalidInput
from ..model.problem import Operands, Problem
from ..codegen.render import REDUCE_THREADS
from ..model.tiles import DecompKind, Family, Kernel

FORMAT = "gemmgen-manifest/1"

# (kernel, problem) -> (launches, workspace_bytes)
Builder = Callable[[Kernel, Problem], "tuple[list[dict], int]"]
BUILDERS: "dict[Family, Builder]" = {}


def register(family: Family):
    """Decorator: the launch builder of one kernel family."""

    def wrap(builder: Builder) -> Builder:
        BUILDERS[family] = builder
        return builder

    return wrap


def tensor_param(name: str, ctype: str) -> dict:
    return {"name": name, "ctype": ctype, "kind": "tensor", "tensor": name}


def scalar_param(name: str, ctype: str, value) -> dict:
    return {"name": name, "ctype": ctype, "kind": "scalar", "value": value}


def scalar_params(problem: Problem) -> "list[dict]":
    """M N K lda ldb ldc ldd alpha beta: the scalar tail both families share."""
    return [scalar_param("M", "int", problem.m), scalar_param("N", "int", problem.n), scalar_param("K", "int", problem.k),
            scalar_param("lda", "int", problem.lda), scalar_param("ldb", "int", problem.ldb),
            scalar_param("ldc", "int", problem.ldc), scalar_param("ldd", "int", problem.ldc),
            scalar_param("alpha", "float", problem.epilogue.alpha), scalar_param("beta", "float", problem.epilogue.beta)]


def sm80_params(problem: Problem) -> "list[dict]":
    """The sm80_mma ABI: (A, B, C, D, bias, workspace, M, N, K, lda, ldb, ldc, ldd, alpha, beta)."""
    t = problem.a_dtype.cuda_type
    c = problem.c_dtype.cuda_type
    return [tensor_param("A", f"const {t}*"), tensor_param("B", f"const {t}*"), tensor_param("C", f"const {c}*"),
            tensor_param("D", f"{c}*"), tensor_param("bias", f"const {c}*"),
            {"name": "workspace", "ctype": "float*", "kind": "workspace"}] + scalar_params(problem)


@register(Family.SM80_MMA)
def sm80_launches(kernel: Kernel, problem: Problem) -> "tuple[list[dict], int]":
    """One launch (data-parallel), or the partial-sum kernel and its reduction (split-K)."""
    cfg = kernel.config
    tiles = math.ceil(problem.m / cfg.cta.m) * math.ceil(problem.n / cfg.cta.n)
    splitk = cfg.decomposition.kind is DecompKind.SPLIT_K
    splits = cfg.decomposition.splits if splitk else 1
    params = sm80_params(problem)
    main = {"entry": kernel.name, "grid": [tiles, 1, splits], "block": [cfg.threads, 1, 1], "cluster": [1, 1, 1],
            "dynamic_smem": constraints.smem_bytes(cfg, kernel.operands), "params": params}
    if not splitk:
        return [main], 0
    pairs = problem.m * math.ceil(problem.n / 2)  # the reduction runs one thread per two columns
    reduce = {"entry": f"{kernel.name}_reduce", "grid": [math.ceil(pairs / REDUCE_THREADS), 1, 1],
              "block": [REDUCE_THREADS, 1, 1], "cluster": [1, 1, 1], "dynamic_smem": 0, "params": params}
    return [main, reduce], splits * problem.m * problem.n * 4


def workspace_zero(manifest: "dict | None", workspace_bytes: "int | None" = None) -> dict:
    """The manifest's workspace zeroing rule, with format 1's default (all of it, before every run)."""
    nbytes = int((manifest or {}).get("workspace_bytes", 0) or 0) if workspace_bytes is None else workspace_bytes
    rule = (manifest or {}).get("workspace_zero") or {"bytes": nbytes, "when": "run"}
    when = rule.get("when", "run")
    if when not in ("run", "bind"):
        raise InvalidInput("workspace_zero.when must be 'run' or 'bind'", when)
    return {"bytes": min(int(rule.get("bytes", nbytes)), nbytes), "when": when}


def _builder(family: Family) -> Builder:
    if family not in BUILDERS and family is Family.SM90_WGMMA:
        from ..families.sm90_wgmma import launch as sm90  # the Hopper family's launch (TMA descriptors, clusters)

        BUILDERS[family] = sm90.manifest_launches  # one launch, or split-K's partial-sum kernel and its reduction
    builder = BUILDERS.get(family)
    if builder is None:
        raise InvalidInput("no launch manifest builder for this kernel family", family.value)
    return builder


def _check_match(kernel: Kernel, problem: Problem) -> None:
    """The problem must be one the kernel was compiled for: same dtypes, layouts and epilogue kind,
    and leading dimensions at least as aligned as the kernel's vector accesses assume."""
    have, need = problem.operands, kernel.operands
    same = (have.a_dtype, have.c_dtype, have.a_layout, have.b_layout, have.bias, have.activation) == \
           (need.a_dtype, need.c_dtype, need.a_layout, need.b_layout, need.bias, need.activation)
    if not same:
        raise InvalidInput("the problem's dtypes, layouts and epilogue must match the kernel's", problem.label,
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
            "activation": ops.activation.value}


def make_manifest(kernel: Kernel, problem: Problem, compiled=None) -> dict:
    """The launch manifest of `kernel` run on `problem` (compiled: nvrtc.Compiled, for resources)."""
    _check_match(kernel, problem)
    built = _builder(kernel.config.family)(kernel, problem)
    launches, workspace = built[0], built[1]
    zero = built[2] if len(built) > 2 else workspace_zero(None, workspace)
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
        "launches": launches,
        "resources": resources,
        "nvrtc_version": nvrtc_version,
        "measured": None,
        "verification": None,
    }


__all__ = ["BUILDERS", "FORMAT", "make_manifest", "workspace_zero", "operands_dict", "register", "scalar_params", "sm80_params", "tensor_param"]
