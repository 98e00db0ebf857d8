"""`gemmgen compile M N K [--dtype] [--a] [--b] [--arch] [--config FILE] [--gpu] --out DIR`.

Writes <name>.cu, <name>.cubin and <name>.json (the launch manifest: a bundle gemmgen.load takes) for the model's
pick, the dry run's first (the model with the GPU's calibration), or the given configuration, and prints registers
and spills.
"""
from __future__ import annotations

from pathlib import Path

from ..model.errors import InvalidInput
from ._common import add_gpu_arg, add_problem_args, check_cache, text_arg
from ._kernel import add_kernel_args, kernel_from_args


def register(subparsers) -> None:
    parser = subparsers.add_parser("compile", help="compile a kernel to a cubin and a launch manifest",
                                   description="Compile the model's pick for M N K (or --config) with NVRTC.")
    add_problem_args(parser)
    add_gpu_arg(parser)
    add_kernel_args(parser)
    parser.add_argument("--out", required=True, metavar="DIR", type=text_arg("--out"),
                        help="folder for <name>.cu, .cubin and .json")
    parser.add_argument("--lineinfo", action="store_true", help="compile with -lineinfo (for profilers)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..codegen.nvrtc import compile_kernel
    from ..runtime.manifest import make_manifest
    from ..tune.export import export_bundle
    from ..tune.results import fingerprint

    kernel, problem, gpu = kernel_from_args(args)
    check_cache()
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput("--out must be a folder that can be created", args.out, exc.strerror) from None
    compiled = compile_kernel(kernel, gpu, lineinfo=args.lineinfo)
    # A bundle like a dry run's (cubin hash, source, environment), so gemmgen.load and `gemmgen bench` take it.
    manifest = export_bundle(out, kernel, problem, compiled, measured=None, verification=None,
                             environment=fingerprint(gpu, None, str(compiled.nvrtc_version)),
                             note="not measured (gemmgen compile)",
                             # A persistent kernel's grid is one wave of --gpu's SMs (114 on an H100 PCIe, not
                             # the 132 of the families' default): a launcher in another language runs it as written.
                             manifest_fn=lambda k, p, c: make_manifest(k, p, c, sm_count=gpu.sm_count)).manifest
    print(f"kernel     {kernel.name}")
    print(f"target     {kernel.arch.value} (NVRTC {compiled.nvrtc_version}){' [cached]' if compiled.cached else ''}")
    for entry, res in compiled.entries:
        serialized = "; ptxas serialized its wgmma (a wait after each: slow)" if res.wgmma_serialized else ""
        print(f"entry      {entry}: {res.registers} registers, {res.spill_store_bytes} B spill stores, "
              f"{res.spill_load_bytes} B spill loads, {res.stack_bytes} B stack{serialized}")
    for launch in manifest["launches"]:
        print(f"launch     {launch['entry']}: grid {launch['grid']} block {launch['block']} "
              f"dynamic smem {launch['dynamic_smem']} B")
    if manifest["workspace_bytes"]:
        print(f"workspace  {manifest['workspace_bytes']} B")
    print(f"wrote      {out / kernel.name}.{{cu,cubin,json}}")
    return 0
