#!/usr/bin/env python3
"""Every configuration of the sm90_wgmma search space, run and verified on the GPU: the space's hang check.

    PYTHONPATH=$PWD python3 scripts/space_check.py --out $OUT [--limit N] [--match _swap] [--watchdog 60]

Each valid configuration (search_spaces/sm90_wgmma.yaml on the H100) is compiled with gemmgen's own render
and NVRTC options, then run through gemmgen.tune.worker (the tuner's measuring process: fresh random inputs, D and
workspace poisoned with NaN, relative error against cuBLAS, a watchdog that kills a hung kernel) on two odd
problems, 1096x1000x200 and 640x2304x1544 (swapped configurations, which serve M up to their tile's N, on
13x1000x200 and 16x2304x1544, or 30x... for 32-wide tiles). Layouts and dtypes rotate over the space (a layout a configuration
rules out passes to the next); every fourth configuration also runs with beta != 0, a bias and GELU, so the
general epilogue path runs, not only the short one. Prints failures and a summary line; writes space_check.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmgen.families import rules as constraints  # noqa: E402
from gemmgen.model.arch import Arch, lookup_gpu  # noqa: E402
from gemmgen.runtime.manifest import make_manifest  # noqa: E402
from gemmgen.model.problem import Problem  # noqa: E402
from gemmgen.rank.space import enumerate_space  # noqa: E402
from gemmgen.model.tiles import Family, Kernel  # noqa: E402

SHAPES = ((1096, 1000, 200), (640, 2304, 1544))
SWAP_SHAPES = {16: ((13, 1000, 200), (16, 2304, 1544)), 32: ((13, 1000, 200), (30, 2304, 1544))}
LAYOUTS = (("row", "col"), ("row", "row"), ("col", "col"), ("col", "row"))


def cases(limit: int, match: str = "") -> "list[tuple[str, Problem, Kernel]]":
    gpu = lookup_gpu("h100")
    out = []
    configs = enumerate_space(Family.SM90_WGMMA, gpu, Arch.SM90A, operands=Problem.create(8, 8, 8).operands)
    for i, cfg in enumerate(configs[:limit] if limit else configs):
        if match not in cfg.tag:
            continue
        dtype = "f16" if i % 3 == 0 else "bf16"
        extra = {"beta": 0.5, "bias": True, "activation": "gelu"} if i % 4 == 3 else {}
        for j, (m, n, k) in enumerate(SWAP_SHAPES[cfg.cta.n] if cfg.swap_ab else SHAPES):
            for shift in range(len(LAYOUTS)):
                a, b = LAYOUTS[(i + j + shift) % len(LAYOUTS)]
                problem = Problem.create(m, n, k, dtype, a, b, **extra)
                if not constraints.check(cfg, gpu, Arch.SM90A, operands=problem.operands):
                    out.append((f"{i:03d}", problem, Kernel(Arch.SM90A, problem.operands, cfg)))
                    break
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--limit", type=int, default=0, help="only the first N configurations")
    ap.add_argument("--match", default="", help="only configurations whose tag contains this (e.g. _swap)")
    ap.add_argument("--watchdog", type=float, default=60.0)
    args = ap.parse_args()
    from gemmgen.codegen.nvrtc import CompileError, compile_many
    from gemmgen.tune.worker import WorkerBenchmark

    todo = cases(args.limit, args.match)
    t0 = time.time()
    built = compile_many([kernel for _, _, kernel in todo])
    print(f"{len(todo)} runs compiled in {time.time() - t0:.0f}s", flush=True)
    worker = WorkerBenchmark(watchdog_s=args.watchdog)
    worker.start()
    rows = []
    for (index, problem, kernel), result in zip(todo, built):
        row = {"config": index, "name": kernel.name, "problem": f"{problem.m}x{problem.n}x{problem.k}",
               "epilogue": str(problem.epilogue)}
        if isinstance(result, CompileError):
            row.update(ok=False, kind="compile", reason=str(result)[:300])
        else:
            outcome = worker.measure(make_manifest(kernel, problem), result.cubin, problem)
            row.update(ok=outcome.ok, kind=outcome.kind, rel_error=outcome.rel_error, reason=outcome.reason[:300])
        rows.append(row)
        if not row["ok"]:
            print(f"  FAIL {index} {kernel.config.tag} {row['problem']}: {row['kind']} {row['reason'][:160]}", flush=True)
    worker.close()
    bad = [r for r in rows if not r["ok"]]
    hung = [r for r in bad if r["kind"] == "hang"]
    worst = max((r["rel_error"] or 0.0 for r in rows if r["ok"]), default=0.0)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "space_check.json").write_text(json.dumps(
        {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "rows": rows}, indent=1, default=str))
    print(f"space_check: {len(rows) - len(bad)}/{len(rows)} runs verified over {len({r['config'] for r in rows})} "
          f"configurations, {len(hung)} hung, worst rel. error {worst:.2e}, {time.time() - t0:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    from lab_common import run_main

    run_main(main, __file__)   # no GPU, a bad argument: one line, exit 2
