"""Host time per call of a dispatch folder (gemmgen.load on dispatch.json), against a bare launch of the same
kernel, a single-kernel bundle and torch.matmul.

    python3 benchmarks/dispatch_overhead.py [--size 256] [--calls 5000] [--out DIR]

Builds, with public APIs, the model's pick for each power-of-two bucket of M in 1..size at N = K = size
(tune.dispatch.model_buckets: the shape-set dry run), exported as one dispatch folder; verifies every bucket's
kernel against a float64 product; then times, as benchmarks/host_overhead.py does (back-to-back calls, no
synchronisation; small products, so the host is the bottleneck):
  bare launch          the bound launch sequence's run() (cuLaunchKernel through ctypes)
  single bundle        gemmgen.load(<one kernel's manifest>)(A, B, D), same arrays
  dispatch, same       gemmgen.load(<dispatch folder>)(A, B, D), same arrays
  dispatch, 4 shapes   the dispatch callable cycling through 4 arrays sets of 4 different M (4 buckets)
  torch.matmul         torch.matmul(A, B, out=D)
The goal (issue 20): dispatch within 5 us of the bare launch, and below torch.matmul.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness import detected_gpu, run_main, write_report
from host_overhead import per_call_us


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="N = K, and the largest M (default 256)")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--out", default=None, metavar="DIR", help="write dispatch_overhead.json here")
    args = parser.parse_args(argv)
    import torch

    import gemmgen
    from gemmgen import Problem
    from gemmgen.tune.buckets import pow2_buckets
    from gemmgen.tune.dispatch import model_buckets

    gpu = detected_gpu()
    n = args.size
    folder = Path(tempfile.mkdtemp(prefix="gemmgen-dispatch-overhead-"))
    built = model_buckets(Problem.create(n, n, n, "bf16"), pow2_buckets(1, n, n, n), gpu, jobs=8, out=str(folder))
    gemm = gemmgen.load(folder)
    largest = built.tables[0]["buckets"][-1]["kernel"]
    single = gemmgen.load(folder / f"{largest}.json")

    B = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    errors = {}
    for bucket in built.tables[0]["buckets"]:
        m = bucket["m_max"]
        A = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(A, B, D)
        torch.cuda.synchronize()
        ref = A.double() @ B.double()
        errors[m] = float((D.double() - ref).norm() / ref.norm())
        if not errors[m] < 1e-2:
            print(f"verification failed at M={m} ({bucket['kernel']}): relative error {errors[m]}", file=sys.stderr)
            return 1

    A = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    D = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    sequence = single.bind(A, B, D)
    stream = torch.cuda.current_stream().cuda_stream
    ms = [n, max(1, n // 3), max(1, n // 17), 1]
    rotating = [(torch.randn(m, n, device="cuda", dtype=torch.bfloat16),
                 torch.empty(m, n, device="cuda", dtype=torch.bfloat16)) for m in ms]
    state = {"i": 0}

    def four_shapes():
        a, d = rotating[state["i"] & 3]
        state["i"] += 1
        gemm(a, B, d)

    rows = [
        ("bare launch (bound sequence.run)", per_call_us(lambda: sequence.run(stream), args.calls)),
        ("single bundle: gemmgen.load(manifest)(A, B, D)", per_call_us(lambda: single(A, B, D), args.calls)),
        ("dispatch: gemmgen.load(folder)(A, B, D), same arrays", per_call_us(lambda: gemm(A, B, D), args.calls)),
        (f"dispatch, 4 shapes (M = {', '.join(map(str, ms))})", per_call_us(four_shapes, args.calls)),
        ("torch.matmul(A, B, out=D)", per_call_us(lambda: torch.matmul(A, B, out=D), args.calls)),
    ]
    bare = rows[0][1]
    print(f"device: {torch.cuda.get_device_name()}  {len(built.kernels)} kernels for M 1..{n} at N = K = {n}; "
          f"max rel. error {max(errors.values()):.2e}")
    width = max(len(r[0]) for r in rows)
    for label, us in rows:
        print(f"{label:<{width}}  {us:7.2f} us/call  ({us - bare:+6.2f} over the bare launch)")
    same = rows[2][1]
    verdict = "met" if same - bare <= 5.0 and same < rows[4][1] else "NOT met"
    print(f"goal (dispatch <= bare + 5 us and below torch.matmul): {verdict}")
    if args.out:
        write_report(args.out, "dispatch_overhead.json",
                     {"device": torch.cuda.get_device_name(), "size": n, "calls": args.calls,
                      "kernels": list(built.kernels), "rel_errors": errors,
                      "us_per_call": {label: us for label, us in rows}})
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
