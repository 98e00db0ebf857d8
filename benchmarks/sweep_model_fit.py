#!/usr/bin/env python3
"""How the model ranks configurations that `benchmarks/ncu_kernels.py --time` measured (no GPU).

    PYTHONPATH=$PWD python3 benchmarks/sweep_model_fit.py docs/lab-data/h100-sxm/batch-sweep-20261127-1504.txt [...]

Reads the timing lines of one or more `ncu_kernels.py --time` outputs ("<M>x<N>x<K>_bf16_<layouts>  <us> us (...)
<tag>"), finds each configuration in its problem's ranked space (harness.ranked_space: every family, the model
with the H100's shipped calibration, as a dry run ranks) and prints per problem: the Spearman correlation between
predicted and measured time over the measured configurations, the measured time of the model's pick among them
over the best, and the median measured/predicted ratio of ping-pong and of cooperative sm90 configurations
(docs/perf-notes.md, "Batched inference" and "Ping-pong on an M-major A"), then the geomean of pick/best, over all
problems and split at --small-us (the best measured time: small products, where fixed costs weigh most, apart from
the rest). --only-small lists and scores the small ones alone. Configurations the current rules refuse are skipped
and counted.
"""
from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import run_main  # noqa: E402

# A timed configuration; a line that ends in ' +EDIT' (ncu_kernels.py --edit: the configuration with its source
# edited, some wrong by design) is not the configuration's time and must not overwrite it.
LINE = re.compile(r"(\d+)x(\d+)x(\d+)_bf16_([rc]{2})\s+([\d.]+) us .*?\)\s+(\S+)(?: \(entry [^)]*\)?)?\s*$")


def ranks(values: "list[float]") -> "list[int]":
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0] * len(values)
    for rank, i in enumerate(order):
        out[i] = rank
    return out


def spearman(a: "list[float]", b: "list[float]") -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="outputs of benchmarks/ncu_kernels.py --time")
    ap.add_argument("--small-us", type=float, default=20.0,
                    help="a problem is small when its best measured configuration ran under this many us (default 20)")
    ap.add_argument("--only-small", action="store_true", help="list and score only the small problems")
    args = ap.parse_args(argv)
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.rank.calibration import params_for

    gpu = lookup_gpu("h100")
    params, _ = params_for(gpu)
    measured: "dict[str, dict[str, float]]" = {}
    for path in args.files:
        for line in Path(path).read_text().splitlines():
            m = LINE.match(line)
            if m and m.group(6) != "cuBLAS":
                key = f"{m.group(1)},{m.group(2)},{m.group(3)},{m.group(4)}"
                measured.setdefault(key, {})[m.group(6)] = float(m.group(5))
    ratios, small = [], []
    for key, times in measured.items():
        if args.only_small and min(times.values()) >= args.small_us:
            continue
        problem = harness.shape_problem(key)
        predicted = {r.config.tag: r.time_s * 1e6 for r in harness.ranked_space(problem, gpu, params)}
        rows = [(us, predicted[tag], tag) for tag, us in times.items() if tag in predicted]
        if len(rows) < 2:
            continue
        meas, pred = [r[0] for r in rows], [r[1] for r in rows]
        pick = min(rows, key=lambda r: r[1])[0] / min(meas)
        ratios.append(pick)
        small.append(min(times.values()) < args.small_us)
        by_schedule = {kind: [us / p for us, p, tag in rows if tag.startswith("sm90") and ("_pp" in tag) == pp]
                       for kind, pp in (("ping-pong", True), ("cooperative", False))}
        schedules = "  ".join(f"{kind} meas/pred {statistics.median(v):.2f} (n={len(v)})"
                              for kind, v in by_schedule.items() if v)
        print(f"{problem.label:28} n={len(rows):3} (skipped {len(times) - len(rows)})  spearman {spearman(meas, pred):+.2f}"
              f"  pick/best {pick:.3f}  {schedules}")
    def geomean(values):
        return math.exp(statistics.fmean(math.log(r) for r in values)) if values else float("nan")

    if ratios:
        print(f"geomean pick/best over {len(ratios)} problems: {geomean(ratios):.3f}")
        parts = [(f"under {args.small_us:g} us", [r for r, s in zip(ratios, small) if s])]
        if not args.only_small:
            parts.append(("the rest", [r for r, s in zip(ratios, small) if not s]))
        print("  " + "; ".join(f"{label} (best measured): {geomean(v):.4f} over {len(v)}" for label, v in parts))
    return 0


if __name__ == "__main__":
    run_main(main, "sweep_model_fit.py")
