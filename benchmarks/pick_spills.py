#!/usr/bin/env python3
"""Do the model's picks spill? The dry run's pick (rank, compile the best-ranked, no GPU) for random products on each
GPU of a list, with its registers and spilled bytes from the NVRTC log: a register rule that undercounts shows here
before anyone runs the kernel.

    PYTHONPATH=$PWD python3 benchmarks/pick_spills.py [--seed 5] [--count 7] [--gpus a100,rtx4090,rtx3090,h100]

CPU only. Products: M, N, K drawn from a few sizes (odd ones included), bf16 or f16, any layout, a bias and GELU in
about a third. One line per (GPU, product), the spilling picks listed last.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import run_main  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--count", type=int, default=7, help="random products (default 7)")
    ap.add_argument("--gpus", default="a100,rtx4090,rtx3090,h100")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    from gemmgen import Problem, lookup_gpu
    from gemmgen.tune.dryrun import dry_run
    from gemmgen.tune.search import default_engines

    rng = random.Random(args.seed)
    products = []
    for _ in range(args.count):
        bias = rng.random() < 0.3
        products.append(Problem.create(rng.choice([1, 7, 16, 64, 200, 1000, 3000, 4095, 4096]),
                                       rng.choice([77, 1000, 3001, 4095, 4096, 8192]),
                                       rng.choice([64, 333, 1024, 4095, 4096]), rng.choice(["bf16", "f16"]),
                                       rng.choice(["row", "col"]), rng.choice(["row", "col"]), bias=bias,
                                       activation="gelu" if bias else None))
    engines = default_engines(args.jobs)
    spilling = []
    try:
        for name in args.gpus.split(","):
            gpu = lookup_gpu(name)
            for problem in products:
                pick = dry_run(problem, gpu, top_k=1, engines=engines).pick
                if pick is None or not pick.ok:
                    print(f"{gpu.key:10s} {problem.label:28s} no compiled pick", flush=True)
                    continue
                res = pick.compiled.resources
                line = (f"{gpu.key:10s} {problem.label:28s} {pick.kernel.config.tag[:72]:72s} {res.registers:3d} regs, "
                        f"{pick.compiled.spill_bytes} B spilled")
                print(line, flush=True)
                if pick.compiled.spill_bytes:
                    spilling.append(line)
    finally:
        engines.close()
    print(f"\npicks that spill: {len(spilling)}")
    for line in spilling:
        print("  " + line)
    return 0


if __name__ == "__main__":
    run_main(main, "pick_spills.py")
