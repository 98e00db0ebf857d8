"""Host time per call of gemmgen's torch op layer alone, on the CPU: a fake kernel, so no GPU is needed.

    PYTHONPATH=$PWD python3 benchmarks/op_overhead_cpu.py [--calls 20000] [--size 256] [--out out/op_overhead]

A do-nothing kernel (--kernel bundle: shaped like a loaded bundle, with bind_launch; callable: a plain function)
is registered for CPU tensors (gemmgen.torch.registry.register(..., gpu="cpu")) for the
256^3 bf16 products gemmgen.mm and gemmgen.nn.Linear make, so each call runs the whole op layer (eager fast path
or torch.library dispatcher, plan lookup, output allocation, counters) but no product: what remains is the layer's
own cost, which the GPU path pays on top of the launch (benchmarks/host_overhead.py and linear_bench.py
--host-only time the launch on the GPU). torch.empty of the output alone and torch.matmul of a 1x1 product (torch's
own per-call floor on the CPU) are printed beside it, and a training step of the layer (forward, then backward
through its data and weight gradients, the bias gradient from the weight gradient's row sums: the three products
registered as fakes), --calls / 4 of them. Times are medians of 5 runs of --calls back-to-back calls.
"""
from __future__ import annotations

import argparse
import statistics
import time

from harness import run_main, write_report


def per_call_us(fn, calls: int, repeats: int = 5) -> float:
    """Median over `repeats` of the host wall time per call of `calls` back-to-back calls."""
    for _ in range(100):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--kernel", default="bundle", choices=("bundle", "callable"),
                        help="the fake: a bundle-like kernel with bind_launch (the plan holds a bound launch, as for "
                             "a loaded bundle on the GPU), or a plain callable called with the tensors")
    parser.add_argument("--out", default=None, help="folder for op_overhead_cpu.json (default: print only)")
    args = parser.parse_args(argv)
    import warnings

    import torch

    import gemmgen
    from gemmgen.model.arch import DType
    from gemmgen.model.linear import KernelClass
    from gemmgen.model.problem import Activation, Layout
    from gemmgen.torch.registry import CPU, REGISTRY, register

    n = args.size

    class FakeBundle:
        """What the op layer uses of a loaded bundle: a call, and bind_launch -> an object with launch(ptr,
        stream). Nothing is computed: only the layer's cost is timed."""

        def __call__(self, A, B, D, C=None, bias=None, row_sums=None):
            return D

        def bind_launch(self, A, B, D, C=None, bias=None, row_sums=None):
            return self

        def launch(self, d_ptr, stream, row_sums_ptr=None):
            pass

    def fake_callable(A, B, D, C=None, bias=None, row_sums=None):
        return D

    kernel = FakeBundle() if args.kernel == "bundle" else fake_callable
    for a, b, bias in ((Layout.ROW, Layout.ROW, False), (Layout.ROW, Layout.COL, True)):
        register(KernelClass(DType.BF16, a, b, bias, Activation.NONE, None, n, n), kernel, gpu=CPU)
    # The layer's weight gradient dZ^T X with its bias gradient (the row sums of dZ^T): K is the token count.
    register(KernelClass(DType.BF16, Layout.COL, Layout.ROW, False, Activation.NONE, n, n, None, row_sums=True),
             kernel, gpu=CPU)
    A = torch.randn(n, n, dtype=torch.bfloat16)
    B = torch.randn(n, n, dtype=torch.bfloat16)
    Ag = A.clone().requires_grad_()
    tiny = torch.randn(1, 1)
    layer = gemmgen.nn.Linear(n, n, dtype=torch.bfloat16)
    dY = torch.randn(n, n, dtype=torch.bfloat16)

    def step():   # a training step's layer work: forward, then the data, weight and bias gradients
        layer.weight.grad = layer.bias.grad = Ag.grad = None
        layer(Ag).backward(dY)
    gemmgen.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            rows = [
                ("torch.matmul 1x1x1 fp32 (torch's floor)", per_call_us(lambda: torch.matmul(tiny, tiny), args.calls)),
                ("torch.empty of the output alone", per_call_us(
                    lambda: torch.empty((n, n), dtype=A.dtype, device=A.device), args.calls)),
                ("gemmgen.mm, no grad", per_call_us(lambda: gemmgen.mm(A, B), args.calls)),
                ("torch.ops.gemmgen.mm, no grad", per_call_us(lambda: torch.ops.gemmgen.mm(A, B), args.calls)),
                ("gemmgen.nn.Linear, no grad", per_call_us(lambda: layer(A), args.calls)),
            ]
        rows += [
            ("gemmgen.mm, A requiring grad (forward only)", per_call_us(lambda: gemmgen.mm(Ag, B), args.calls)),
            ("gemmgen.nn.Linear, grad enabled (forward only)", per_call_us(lambda: layer(A), args.calls)),
            ("gemmgen.nn.Linear, forward + backward (three products, bias gradient fused)",
             per_call_us(step, max(1, args.calls // 4))),
        ]
    counts = gemmgen.stats()
    REGISTRY.clear()
    print(f"torch {torch.__version__}, CPU, fake {args.kernel} kernel at {n}^3 bf16, host us per call")
    width = max(len(label) for label, _ in rows)
    for label, us in rows:
        print(f"  {label:<{width}}  {us:7.2f}")
    print(f"  gemmgen stats: kernel calls {counts['kernel_calls']}, fallbacks {counts['fallbacks']}")
    if counts["fallbacks"]:
        print("note: some calls fell back to torch: " + "; ".join(counts["fallbacks_by_reason"]))
    if args.out:
        path = write_report(args.out, "op_overhead_cpu.json", {"torch": torch.__version__, "size": n, "kernel": args.kernel,
                                                                "host_us": dict(rows), "stats": counts})
        print(f"record: {path}")
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
