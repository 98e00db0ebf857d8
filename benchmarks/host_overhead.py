"""Host time per call of a loaded gemmgen kernel, against torch.matmul and a bare launch of the same kernel.

    python3 benchmarks/host_overhead.py [--size 256] [--calls 5000]

A 256^3 bf16 product takes a few microseconds on the GPU, so a loop of calls with no synchronisation measures the
host's cost per call (the queue never runs dry of work only if the host is slower than the GPU; both are printed).
Builds the model's pick for the size with public APIs (rank, codegen, tune.export), checks it against torch.matmul,
then times, per call: the bound launch sequence's run() alone (gemm.bind(A, B, D).run: a bare cuLaunchKernel), gemmgen.load(...)(A, B, D)
with the same arrays, the same with rotating activation buffers, the launch the torch ops keep (bind_launch: inputs
bound, a new output from torch.empty each call, re-pointed in place), gemmgen.mm with the kernel registered for
the product (the whole op layer: eager fast path, plan lookup, torch.empty, launch), and torch.matmul(A, B, out=D)
and torch.matmul(A, B).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import detected_gpu, run_main  # noqa: E402


def per_call_us(fn, calls: int, repeats: int = 5) -> float:
    """Median over `repeats` of the host wall time per call of `calls` back-to-back calls."""
    import torch

    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args(argv)
    import torch

    import gemmgen
    from gemmgen import Kernel, Problem
    from gemmgen.codegen.nvrtc import compile_kernel
    from gemmgen.rank.space import default_config
    from gemmgen.tune.export import export_bundle

    gpu = detected_gpu()
    n = args.size
    problem = Problem.create(n, n, n, "bf16")
    kernel = Kernel(gpu.arch, problem.operands, default_config(problem, gpu))
    folder = Path(tempfile.mkdtemp(prefix="gemmgen-overhead-"))
    export_bundle(folder, kernel, problem, compile_kernel(kernel), measured=None, verification=None, environment={})
    gemm = gemmgen.load(folder)

    A = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    D = torch.full((n, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(A, B, D)
    torch.cuda.synchronize()
    ref = (A.double() @ B.double())
    err = float((D.double() - ref).norm() / ref.norm())
    if not err < 1e-2:
        print(f"verification failed: relative error {err}", file=sys.stderr)
        return 1
    sequence = gemm.bind(A, B, D)   # the launch sequence bound to these arrays
    stream = torch.cuda.current_stream().cuda_stream
    rotating = [(torch.randn(n, n, device="cuda", dtype=torch.bfloat16), torch.empty_like(D)) for _ in range(4)]
    state = {"i": 0}

    def rotate():
        a, d = rotating[state["i"] % 4]
        state["i"] += 1
        gemm(a, B, d)

    bound = gemm.bind_launch(A, B, D)

    def new_output():
        bound.launch(torch.empty((n, n), device="cuda", dtype=torch.bfloat16).data_ptr(), stream)

    from gemmgen.model.arch import DType
    from gemmgen.model.linear import KernelClass
    from gemmgen.model.problem import Activation, Layout
    from gemmgen.torch.registry import REGISTRY, register

    register(KernelClass(DType.BF16, Layout.ROW, Layout.ROW, False, Activation.NONE, None, n, n), gemm)
    gemmgen.reset_stats()
    with torch.no_grad():
        Dm = gemmgen.mm(A, B)
        torch.cuda.synchronize()
        err_mm = float((Dm.double() - ref).norm() / ref.norm())
        rows = [
            ("bare launch (bound sequence.run)", per_call_us(lambda: sequence.run(stream), args.calls)),
            ("gemmgen.load(...)(A, B, D), same arrays", per_call_us(lambda: gemm(A, B, D), args.calls)),
            ("gemmgen.load(...)(A, B, D), 4 rotating A/D", per_call_us(rotate, args.calls)),
            ("bind_launch(A, B, D).launch(new D), torch.empty", per_call_us(new_output, args.calls)),
            ("gemmgen.mm(A, B), kernel registered", per_call_us(lambda: gemmgen.mm(A, B), args.calls)),
            ("torch.ops.gemmgen.mm(A, B), kernel registered", per_call_us(lambda: torch.ops.gemmgen.mm(A, B),
                                                                          args.calls)),
            ("torch.matmul(A, B, out=D)", per_call_us(lambda: torch.matmul(A, B, out=D), args.calls)),
            ("torch.matmul(A, B)", per_call_us(lambda: torch.matmul(A, B), args.calls)),
        ]
    counts = gemmgen.stats()
    REGISTRY.clear()
    if counts["fallbacks"] or not err_mm < 1e-2:
        print(f"gemmgen.mm did not run the kernel correctly: error {err_mm}, {counts}", file=sys.stderr)
        return 1
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(200):
        sequence.run(stream)
    end.record()
    torch.cuda.synchronize()
    print(f"device: {torch.cuda.get_device_name()}  kernel: {kernel.name}  rel. error {err:.2e}")
    print(f"GPU time per kernel (200 back to back): {start.elapsed_time(end) / 200 * 1e3:.2f} us")
    width = max(len(r[0]) for r in rows)
    for label, us in rows:
        print(f"{label:<{width}}  {us:7.2f} us/call")
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
