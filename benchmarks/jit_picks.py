#!/usr/bin/env python3
"""What gemmgen.torch's JIT buckets cost: a token count served by the kernel picked for its bucket's top.

    PYTHONPATH=$PWD python3 benchmarks/jit_picks.py [--shape M,N,K,LAYOUTS ...] [--out DIR]

For each shape (bf16; LAYOUTS as A then B, r row-major, c column-major), gemmgen.mm with GEMMGEN_JIT builds its
kernel in three fresh kernel stores: with the JIT's buckets (jit.bucket: quarter octaves), with power-of-two
buckets (its rule before 2026-11-27 20:00 UTC), and at the exact count (no bucket); the rule is swapped by replacing
jit.bucket here, in the benchmark. Each build's wall time is recorded; the three kernels and torch.matmul are then
graph-timed (harness.graph_timed, three input sets, two interleaved passes) and checked against torch's fp32
product. A table is printed last.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import run_main, write_report  # noqa: E402

# Token counts away from their buckets' tops, through layers of random and LLM widths.
SHAPES = ("88,8808,384,cc", "2440,264,344,rr", "104,14648,376,rr", "240,536,1132,cr", "2088,2800,1224,rc",
          "4496,344,2128,cc", "300,4096,4096,rc", "700,11008,4096,rc", "1100,4096,4096,rc", "40,4096,4096,rc")


def octave(count: int) -> int:
    """The JIT's buckets before 2026-11-27 20:00 UTC: powers of two from 16 to 16384."""
    return count if count > 16384 else max(16, 1 << (count - 1).bit_length())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, metavar="M,N,K,LAYOUTS")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gemmgen-jit-picks-"))
    os.environ["GEMMGEN_CACHE"] = str(work / "cache")
    import torch

    import gemmgen
    from gemmgen.torch import jit
    from gemmgen.torch.registry import REGISTRY

    jit.enable()
    rules = {"quarter": jit.bucket, "octave": octave, "exact": lambda count: count}
    rows = []
    for text in args.shape or SHAPES:
        problem = harness.shape_problem(text)
        m = problem.m
        sets = [harness.layout_operands(torch, problem, torch.bfloat16)[:2] for _ in range(3)]
        ref = sets[0][0].float() @ sets[0][1].float()
        stores, build_s, errors = {}, {}, {}

        def use(rule):
            # A build registers its bucket's other counts in this process: cleared, so each store is read alone.
            jit.bucket = rules[rule]
            REGISTRY.clear()
            REGISTRY.use_store(stores[rule])

        for rule in rules:
            stores[rule] = work / f"kernels-{rule}-{text.replace(',', '-')}"
            use(rule)
            t0 = time.perf_counter()
            out = gemmgen.mm(*sets[0])
            torch.cuda.synchronize()
            build_s[rule] = time.perf_counter() - t0
            errors[rule] = float((out.float() - ref).norm() / ref.norm())
        times = {rule: [] for rule in (*rules, "torch")}
        for _ in range(2):
            for rule in rules:
                use(rule)
                times[rule].append(harness.graph_timed(torch, lambda s: gemmgen.mm(*s), sets))
            times["torch"].append(harness.graph_timed(torch, lambda s: torch.matmul(*s), sets))
        us = {rule: statistics.median(t) * 1e6 for rule, t in times.items()}
        row = {"shape": text, "us": us, "build_s": build_s, "rel_error": errors,
               "built_at": {rule: rules[rule](m) for rule in rules},
               "kernels": {rule: sorted(p.stem for p in stores[rule].rglob("*.cubin")) for rule in rules},
               "fallbacks": gemmgen.stats()["fallbacks_by_reason"]}
        rows.append(row)
        print(f"{text:20} " + "  ".join(f"{r} {us[r]:7.1f} us (at {row['built_at'][r]})" for r in rules)
              + f"  torch {us['torch']:7.1f} us  err {max(errors.values()):.1e}", flush=True)
    jit.bucket = rules["quarter"]
    REGISTRY.clear()
    REGISTRY.use_store(None)
    print(f"\n{torch.cuda.get_device_name()}: gemmgen.mm with GEMMGEN_JIT by bucket rule, graph-timed "
          f"(x torch.matmul = torch's time / ours)")
    print(f"{'shape':20} {'quarter octaves':>16} {'powers of two':>14} {'exact':>8}")
    for r in rows:
        t = r["us"]
        print(f"{r['shape']:20} {t['torch'] / t['quarter']:16.2f} {t['torch'] / t['octave']:14.2f} "
              f"{t['torch'] / t['exact']:8.2f}")
    if args.out:
        write_report(args.out, "jit_picks.json", {"device": torch.cuda.get_device_name(), "rows": rows})
    return 0


if __name__ == "__main__":
    run_main(main, "jit_picks.py")
