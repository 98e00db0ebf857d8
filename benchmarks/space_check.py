#!/usr/bin/env python3
"""Every configuration of every kernel family's search space, run and verified on the GPU: the spaces' hang check.

    PYTHONPATH=$PWD python3 benchmarks/space_check.py --out $OUT [--family sm90_wgmma] [--limit N] [--match _swap]

Each valid configuration on the GPU (the H100's catalogue entry unless --gpu) is compiled with gemmgen's own
render and NVRTC options, then run through the tuner's measuring worker (benchmarks/harness.verify_all) on two odd
problems, 1096x1000x200 and 640x2304x1544 (configurations whose rules bound M, such as a swapped kernel's tile,
or a skinny kernel's, on the largest M they serve). Layouts and dtypes rotate over the space (a layout a configuration rules out passes
to the next); every fourth configuration also runs with beta != 0, a bias and GELU, so the general epilogue path
runs, not only the short one. Prints failures and a summary line; writes space_check.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import time

from harness import kernel_for, run_main, verify_all, write_report

SHAPES = ((1096, 1000, 200), (640, 2304, 1544))
LAYOUTS = (("row", "col"), ("row", "row"), ("col", "col"), ("col", "row"))


def cases(gpu_name: str = "h100", family: str = "", limit: int = 0, match: str = "") -> list:
    """(label, problem, kernel) per configuration: the first layout and problem its rules accept."""
    from gemmgen import Problem, lookup_gpu
    from gemmgen.families.rules import check
    from gemmgen.rank.space import all_configs, families_for

    gpu = lookup_gpu(gpu_name)
    out = []
    for name in [family] if family else families_for(gpu.arch):
        configs = [c for c in all_configs(name) if not check(c, gpu, gpu.arch)]
        for i, cfg in enumerate(configs[:limit] if limit else configs):
            if match not in cfg.tag:
                continue
            dtype = "f16" if i % 3 == 0 else "bf16"
            extra = {"beta": 0.5, "bias": True, "activation": "gelu"} if i % 4 == 3 else {}
            found = False
            for j, (m, n, k) in enumerate(SHAPES):
                for shift in range(len(LAYOUTS)):
                    a, b = LAYOUTS[(i + j + shift) % len(LAYOUTS)]
                    # a swapped tile serves M up to its N; a skinny one up to its M
                    for rows in (m, cfg.cta.n, cfg.cta.n - 3, cfg.cta.m, max(1, cfg.cta.m - 3)):
                        problem = Problem.create(rows, n, k, dtype, a, b, **extra)
                        if not check(cfg, gpu, gpu.arch, problem):
                            out.append((f"{name}/{i:03d}", problem, kernel_for(problem, cfg, gpu.arch)))
                            found = True
                            break
                    if found:
                        break
                found = False
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--gpu", default="h100", help="catalogue GPU whose limits select the configurations")
    ap.add_argument("--family", default="", help="one family only")
    ap.add_argument("--limit", type=int, default=0, help="only the first N configurations of each family")
    ap.add_argument("--match", default="", help="only configurations whose tag contains this (e.g. _swap)")
    ap.add_argument("--watchdog", type=float, default=60.0)
    args = ap.parse_args()
    t0 = time.time()
    todo = cases(args.gpu, args.family, args.limit, args.match)
    rows = verify_all(todo, args.watchdog)
    bad = [r for r in rows if not r["ok"]]
    hung = [r for r in bad if r["kind"] == "hang"]
    worst = max((r["rel_error"] or 0.0 for r in rows if r["ok"]), default=0.0)
    write_report(args.out, "space_check.json",
                 {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "rows": rows})
    print(f"space_check: {len(rows) - len(bad)}/{len(rows)} runs verified over {len({r['case'] for r in rows})} "
          f"configurations, {len(hung)} hung, worst rel. error {worst:.2e}, {time.time() - t0:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    run_main(main, __file__)   # no GPU, a bad argument: one line, exit 2
