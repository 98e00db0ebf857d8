"""`gemmgen bench M N K`: compile one kernel (the model's pick or --config), verify it, time it, and compare
with the roofline prediction and with cuBLAS measured in the same run."""
from __future__ import annotations

from ._common import add_gpu_arg, add_problem_args, print_json, table
from ._kernel import add_kernel_args, check_inputs, kernel_from_args


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="verify and time one kernel on this GPU, against cuBLAS",
                                   description=__doc__)
    add_problem_args(parser)
    add_gpu_arg(parser)
    add_kernel_args(parser)
    parser.add_argument("--reference", default="auto", choices=("auto", "torch", "cupy", "kernel"),
                        help="what D is checked against (default: cuBLAS via torch or cupy, else gemmgen's own)")
    parser.add_argument("--no-cublas", action="store_true", help="skip timing cuBLAS")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def _prediction_s(problem, config, gpu) -> "float | None":
    """The model's time for the kernel, as a tune predicts it (with the GPU's calibration where one is stored)."""
    try:
        from ..rank.calibration import calibrated_predict
    except ImportError:
        return None
    try:
        return calibrated_predict(problem, config, gpu).time_s
    except Exception:  # noqa: BLE001 - a model without an answer for this config still leaves the measurement
        return None


def run(args) -> int:
    from ..tune.bench import GpuBenchmark
    from ..codegen.nvrtc import compile_kernel

    problem, arch, config = check_inputs(args)  # bad input is reported as such, before the GPU is looked for
    if args.gpu is not None:
        # A problem the named GPU's families cannot run (fp8 on an A100, a dimension no family indexes), or a
        # --config that breaks a rule there, is bad input on any machine: it was "no GPU available" where there
        # is none.
        from ..families import rules as constraints
        from ..model.arch import lookup_gpu
        from ._common import check_problem

        named = lookup_gpu(args.gpu)
        check_problem(problem, named, arch)
        if config is not None:
            constraints.validate(config, named, arch or named.arch, problem)
    benchmark = GpuBenchmark(reference=args.reference)
    props = benchmark.device.props  # NoGpu here, before compiling anything: exit 2 with one line
    if args.arch is None:
        args.arch = props.arch.value
    kernel, problem, gpu = kernel_from_args(args)
    from ..runtime.manifest import make_manifest

    compiled = compile_kernel(kernel, gpu)
    # The launches for this device: a persistent grid of one wave of its SMs (an H100 PCIe's 114, not the 132 of
    # the families' default, which timed 18 CTAs waiting for a second wave).
    manifest = make_manifest(kernel, problem, compiled, sm_count=props.sm_count)
    measured = benchmark.measure(manifest, compiled.cubin, problem)
    cublas_s = None if args.no_cublas or not measured.ok else benchmark.cublas_time(problem)
    predicted_s = _prediction_s(problem, kernel.config, gpu)
    benchmark.close()

    payload = {"kernel": kernel.name, "device": props.to_dict(), "problem": problem.to_dict(),
               "config": kernel.config.to_dict(), "measurement": measured.to_dict(),
               "predicted_time_s": predicted_s, "cublas_time_s": cublas_s,
               "pct_of_prediction": (100 * predicted_s / measured.time_s) if predicted_s and measured.ok else None,
               "vs_cublas": (cublas_s / measured.time_s) if cublas_s and measured.ok else None}
    if args.json:
        print_json(payload)
    else:
        _print(payload, measured, problem)
    return 0 if measured.ok else 1


def _print(payload: dict, measured, problem) -> None:
    print(f"{payload['kernel']}")
    print(f"on {payload['device']['name']} (driver {payload['device']['driver']}), {problem.label}")
    if not measured.ok:
        print(f"FAILED: {measured.reason}")
        return
    rows = [["gemmgen", f"{measured.time_s * 1e3:.4f}", f"{measured.tflops:.1f}",
             _pct(payload["pct_of_prediction"]), _ratio(payload["vs_cublas"])]]
    if payload["cublas_time_s"]:
        t = payload["cublas_time_s"]
        rows.append(["cuBLAS", f"{t * 1e3:.4f}", f"{problem.flops / t / 1e12:.1f}", "", "1.00x"])
    if payload["predicted_time_s"]:
        t = payload["predicted_time_s"]
        rows.append(["roofline model", f"{t * 1e3:.4f}", f"{problem.flops / t / 1e12:.1f}", "", ""])
    print(table(rows, ["", "time ms", "TFLOP/s", "% of prediction", "vs cuBLAS"]))
    print(f"verified against {measured.backend}: relative error {measured.rel_error:.2e} "
          f"(limit {measured.threshold:.1e}); median of {len(measured.times_s)} runs, "
          f"p10-p90 spread {100 * (measured.spread or 0):.1f}%")


def _pct(value) -> str:
    return f"{value:.0f}%" if value else "n/a"


def _ratio(value) -> str:
    return f"{value:.2f}x" if value else "n/a"
