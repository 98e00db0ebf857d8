#!/usr/bin/env python3
"""Kernel durations and launch gaps from CUPTI (torch.profiler), ours against cuBLAS, back to back.

    PYTHONPATH=$PWD python3 scripts/kernel_trace.py --shapes sq4096 --out $OUT [--config FILE] [--rounds 3]

Event timing (gemmgen.tune.bench) measures from a start event to an end event around one launch: the kernel plus
whatever lies between the events and the kernel. This asks which of the two holds cuBLAS's lead at 4096^3: for
each suite shape's stored winner (bf16, A and B row-major; verified first) and cuBLAS (torch.matmul) it warms
up for --warmup seconds back to back, then records --launches launches under torch.profiler and takes, from
the GPU's own timestamps, each kernel's duration, the period from one kernel's start to the next and the gap
between one's end and the next's start (negative where kernels overlap, as programmatic dependent launch
allows); then, without the profiler, the period of the same launches back to back (one event pair around
all), the median of an event pair around each launch (what gemmgen.tune.bench times), and the period again. Rounds alternate the order. Prints medians per kernel and writes kernel_trace.json to --out.
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from lab_common import run_main, write_report  # noqa: E402
from lab_runners import runners as make_runners, verified_builds  # noqa: E402


def trace(run_one, launches: int, warmup_s: float) -> dict:
    """Warm up back to back, then profile `launches` launches; medians of the GPU-side intervals in us."""
    import torch

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup_s:
        for _ in range(20):
            run_one()
        torch.cuda.synchronize()
    for _ in range(20):     # keep the queue full across the profiler's start
        run_one()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(launches):
            run_one()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                      and "memset" not in e.name.lower() and "memcpy" not in e.name.lower()),
                     key=lambda e: e.time_range.start)
    # The same launches without the profiler: one event pair around all of them (the period), then a pair
    # around each (what gemmgen.tune.bench times), back to back.
    # The batch is timed before and after the per-launch pairs, so a drift of the clock between the two phases
    # shows as two different periods.
    def batch() -> "tuple":
        first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        first.record()
        for _ in range(launches):
            run_one()
        last.record()
        return first, last

    before = batch()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(launches)]
    for a, b in pairs:
        a.record()
        run_one()
        b.record()
    after = batch()
    torch.cuda.synchronize()
    batch_period = before[0].elapsed_time(before[1]) * 1e3 / launches
    batch_after = after[0].elapsed_time(after[1]) * 1e3 / launches
    per_launch = statistics.median(a.elapsed_time(b) * 1e3 for a, b in pairs)
    starts = [e.time_range.start for e in kernels]
    ends = [e.time_range.end for e in kernels]
    durations = [b - a for a, b in zip(starts, ends)]
    periods = [b - a for a, b in zip(starts, starts[1:])]
    gaps = [s - e for e, s in zip(ends, starts[1:])]
    return {"kernels": len(kernels), "names": sorted({e.name for e in kernels}),
            "duration_us": statistics.median(durations) if durations else None,
            "period_us": statistics.median(periods) if periods else None,
            "gap_us": statistics.median(gaps) if gaps else None,
            "min_gap_us": min(gaps) if gaps else None,
            "unprofiled_period_us": batch_period, "event_per_launch_us": per_launch,
            "unprofiled_period_after_us": batch_after}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="sq4096")
    ap.add_argument("--config", action="append", default=[], help="a config YAML/JSON to trace besides the winner")
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds back to back before each trace")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from gemmgen.runtime.device import Device

    variants = verified_builds(args.shapes, args.config)   # each verified first

    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "launches": args.launches,
              "warmup_s": args.warmup, "rounds": args.rounds, "shapes": {}}
    with Device() as dev:
        report["device"] = dev.props.to_dict()
        for shape, (problem, built) in variants.items():
            runners = make_runners(dev, problem, built)
            runs = {name: [] for name in runners}
            for r in range(args.rounds):
                for name in (list(runners) if r % 2 == 0 else list(reversed(list(runners)))):
                    runs[name].append(trace(runners[name], args.launches, args.warmup))
                print(f"{shape}: round {r + 1}/{args.rounds}", flush=True)
            med = {name: {key: statistics.median(x[key] for x in rs)
                          for key in ("duration_us", "period_us", "gap_us", "min_gap_us", "unprofiled_period_us",
                                      "event_per_launch_us", "unprofiled_period_after_us")}
                   for name, rs in runs.items()}
            report["shapes"][shape] = {"median": med, "runs": runs}

    write_report(args.out, "kernel_trace.json", report)
    print(f"\ndevice {report['device'].get('name')}; medians over {args.rounds} rounds of {args.launches} launches "
          f"after {args.warmup:g} s back to back")
    print(f"{'shape':8s} {'kernel':60s} {'kernel us':>9s} {'period us':>9s} {'gap us':>7s} {'min gap':>7s} "
          f"{'period*':>8s} {'events*':>8s} {'period*':>8s}   (* without the profiler, in this order)")
    for shape, row in report["shapes"].items():
        for name, md in row["median"].items():
            print(f"{shape:8s} {name[:60]:60s} {md['duration_us']:9.2f} {md['period_us']:9.2f} {md['gap_us']:7.2f} "
                  f"{md['min_gap_us']:7.2f} {md['unprofiled_period_us']:8.2f} {md['event_per_launch_us']:8.2f} "
                  f"{md['unprofiled_period_after_us']:8.2f}")
        for name, rs in row["runs"].items():
            print(f"  {name[:60]}: kernels seen {[x['kernels'] for x in rs]}, names {rs[0]['names'][:2]}")
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
