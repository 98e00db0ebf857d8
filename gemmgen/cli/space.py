"""`gemmgen space [--arch] [--dtype] [--a] [--b] [--gpu] [--compile] [--jobs N]`: the valid configurations."""
from __future__ import annotations

import sys

from ..model.arch import Arch
from ..model.problem import Problem
from ..model.arch import DType
from ._common import JOBS_MAX, add_gpu_arg, int_arg, print_json, resolve_gpu, table, text_arg


def register(subparsers) -> None:
    parser = subparsers.add_parser("space", help="list (and optionally compile) the valid configurations",
                                   description="List the configurations of the search spaces that pass the "
                                               "feasibility check; --compile compiles them all.")
    parser.add_argument("--arch", default=None, type=text_arg("--arch"),
                        help="target: sm_80, sm_86, sm_89, sm_90a (default: the GPU's)")
    parser.add_argument("--dtype", default="bf16", type=text_arg("--dtype"),
                        help="bf16 (default); the error for another lists what the GPU's families take")
    parser.add_argument("--b-dtype", default=None, type=text_arg("--b-dtype"),
                        help="B's dtype when it differs from A's (--dtype, the default): fp8 pairs only")
    parser.add_argument("--a", dest="a_layout", default="row", type=text_arg("--a"),
                        help="layout of A: row (default) or col")
    parser.add_argument("--b", dest="b_layout", default="row", type=text_arg("--b"),
                        help="layout of B: row (default) or col")
    add_gpu_arg(parser)
    parser.add_argument("--compile", action="store_true", help="compile every configuration and report")
    parser.add_argument("--jobs", type=int_arg("--jobs", 1, JOBS_MAX), default=None,
                        help="compile processes (default: all cores)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..model.errors import InvalidInput
    from ..rank.space import check_target, enumerate_space, families_for
    from ..model.tiles import Kernel

    # Bad input (an arch, a dtype, a layout) is refused before the GPU is looked for: on a machine without one it
    # was "no GPU available".
    given_arch = Arch.parse(args.arch) if args.arch else None
    if args.jobs is not None and not args.compile:
        raise InvalidInput("--jobs needs --compile (it is how many processes compile)", args.jobs)
    dtype = DType.parse(args.dtype)
    b_dtype = DType.parse(args.b_dtype) if args.b_dtype is not None else dtype
    # The operands of a packed problem of this dtype: 16-byte vectors, and (as Problem.create) fp8 writes a 16-bit D.
    # Built first: it refuses a mixed pair that is not fp8 whatever the GPU.
    probe = Problem.create(4096, 4096, 4096, dtype.value, args.a_layout, args.b_layout, b_dtype=b_dtype.value)
    gpu = resolve_gpu(args.gpu)
    arch = given_arch or gpu.arch
    check_target(gpu, arch, dtype, b_dtype)
    operands = probe.operands
    kernels = [Kernel(arch, operands, c) for family in families_for(arch)
               for c in enumerate_space(family, gpu, arch, None, operands)]
    if not kernels:  # every rule that says why up front has passed; still say it, and fail
        from ..rank.space import excluded_families

        why = "; ".join(f"{family}: {rule}" for family, rule in excluded_families(None, gpu, arch, operands))
        raise InvalidInput(f"the search spaces must hold a configuration valid on {gpu.key} for {arch.value}",
                           operands.tag, why)
    if not args.compile:
        if args.json:
            print_json({"gpu": gpu.key, "arch": arch.value, "count": len(kernels),
                        "configurations": [k.config.to_dict() | {"name": k.name} for k in kernels]})
            return 0
        print(f"{len(kernels)} valid configurations for {arch.value} on {gpu.key} ({operands.tag})")
        for k in kernels:
            print(k.name)
        return 0

    from ..model.errors import CompileError
    from ..codegen.nvrtc import compile_many

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty() or done == total:
            end = "\n" if done == total else ""
            print(f"\rcompiled {done}/{total}", end=end, file=sys.stderr, flush=True)

    results = compile_many(kernels, args.jobs, on_done=progress)
    failures = [r for r in results if isinstance(r, CompileError)]
    rows = []
    for kernel, result in zip(kernels, results):
        if isinstance(result, CompileError):
            rows.append([kernel.config.tag, "FAILED", None, None, str(result)])
        else:
            spill = result.spill_bytes
            serialized = result.resources.wgmma_serialized or any(e.wgmma_serialized for _, e in result.entries)
            note = ", ".join(n for n, on in (("spills", spill), ("wgmma serialized", serialized)) if on)
            rows.append([kernel.config.tag, "ok", result.resources.registers, spill, note])
    if args.json:
        # A failed compile has no registers or spills: null, not "" in a field that is otherwise an integer.
        print_json({"gpu": gpu.key, "arch": arch.value, "count": len(kernels), "failed": len(failures),
                    "results": [dict(zip(["config", "status", "registers", "spill_bytes", "note"], r)) for r in rows]})
    else:
        shown = [["" if cell is None else cell for cell in row] for row in rows]
        print(table(shown, ["configuration", "status", "regs", "spill B", "note"]))
        spilled = sum(1 for r in rows if r[1] == "ok" and r[3])
        serial = sum(1 for r in rows if r[1] == "ok" and "wgmma serialized" in r[4])
        print(f"{len(kernels)} compiled for {arch.value}: {len(failures)} failed, {spilled} spill, "
              f"{serial} with serialized wgmma")
    return 1 if failures else 0
