#!/usr/bin/env python3
"""What gemmgen.torch's opt-in JIT (GEMMGEN_JIT) costs a model's first call of a product nothing was tuned for.

    PYTHONPATH=$PWD python3 benchmarks/jit_latency.py [--shape M,N,K ...] [--out DIR]

For each shape (bf16, A row-major, B row-major, as torch.matmul passes contiguous tensors): the wall time of the
first gemmgen.mm call (rank, compile, store, load, launch: the stall a model sees once per bucket of M; a shape
whose bucket was built is served by that kernel), of the second call (the plan cached), and of torch.matmul, each
one call, synchronised (wall times of single calls: the host's synchronisation is in them). The kernel store and the compile cache are
fresh temporary folders, so every first call compiles; then the same shapes again in a second store with the
compile cache kept (a later process whose store lacks the product but whose NVRTC cache has the kernel). A table
is printed last.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import run_main, write_report  # noqa: E402

# Two pairs share a bucket of M (jit.bucket: 65..80 and 1..16), so the second of each is served without compiling.
SHAPES = ("333,4096,4096", "77,14336,4096", "70,14336,4096", "2048,2048,2048", "1,11008,4096", "9,11008,4096")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, metavar="M,N,K")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gemmgen-jit-"))
    os.environ["GEMMGEN_CACHE"] = str(work / "cache")   # before gemmgen reads it
    import torch

    import gemmgen
    from gemmgen.torch import jit
    from gemmgen.torch.registry import REGISTRY

    jit.enable()
    shapes = [tuple(int(x) for x in s.split(",")) for s in (args.shape or SHAPES)]
    rows = []
    for store in ("fresh cache", "warm cache"):
        REGISTRY.clear()   # the bucket-mates registered in this process go too: a new process's registry
        REGISTRY.use_store(work / store.replace(" ", "-"))
        for m, n, k in shapes:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            times, outs = [], []
            for fn in (lambda: gemmgen.mm(a, b), lambda: gemmgen.mm(a, b), lambda: torch.matmul(a, b)):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                outs.append(fn())
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            want = a.float() @ b.float()
            err = ((outs[1].float() - want).norm() / want.norm()).item()
            rows.append({"store": store, "shape": f"{m}x{n}x{k}", "first_s": times[0], "second_s": times[1],
                         "torch_s": times[2], "rel_error": err, "stats": gemmgen.stats()["fallbacks"]})
            print(f"{store:11} {m}x{n}x{k:<8} first call {times[0]:7.2f} s  second {times[1] * 1e6:8.1f} us  "
                  f"torch.matmul {times[2] * 1e6:8.1f} us  error {err:.1e}", flush=True)
    print(f"\n{torch.cuda.get_device_name()}: fallbacks {gemmgen.stats()['fallbacks']}, build failures "
          f"{jit.failures() or 'none'}")
    if args.out:
        print("written:", write_report(args.out, "jit_latency.json", {"device": torch.cuda.get_device_name(),
                                                                    "rows": rows}))
    return 0


if __name__ == "__main__":
    run_main(main, "jit_latency.py")
