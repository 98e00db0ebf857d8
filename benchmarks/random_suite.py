#!/usr/bin/env python3
"""A suite file of random products, for checks on shapes nobody chose (the public and hard suites were chosen).

    python3 benchmarks/random_suite.py --seed 11 --count 20 > benchmarks/suites/random-seed11.yaml

M is drawn in three bands (decode 1-16, 17-512, 513-8192: 25/25/50%), N and K log-uniform in 256-16384, each
dimension odd (off multiples of 8) with probability 0.3, A and B each column-major with probability 0.5; products
above 2.2e12 FLOP are redrawn so a timing run stays short. The same seed gives the same file.
"""
from __future__ import annotations

import argparse
import math
import random


def draw(rng: random.Random) -> "tuple[int, int, int, str, str]":
    while True:
        band = rng.random()
        lo, hi = (1, 16) if band < 0.25 else (17, 512) if band < 0.5 else (513, 8192)
        dims = [round(math.exp(rng.uniform(math.log(lo), math.log(hi))))]
        dims += [round(math.exp(rng.uniform(math.log(256), math.log(16384)))) for _ in range(2)]
        dims = [d if d < 16 or rng.random() < 0.3 else max(8, d // 8 * 8) for d in dims]
        m, n, k = dims
        if 2 * m * n * k <= 2.2e12:
            return m, n, k, rng.choice(("row", "col")), rng.choice(("row", "col"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, default=20)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    print(f"# Drawn by benchmarks/random_suite.py --seed {args.seed} --count {args.count} (do not edit by hand).")
    print(f"suite: random-seed{args.seed}")
    print("shapes:")
    for i in range(args.count):
        m, n, k, a, b = draw(rng)
        print(f"  - {{name: r{i:02d}, M: {m}, N: {n}, K: {k}, a: {a}, b: {b}}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
