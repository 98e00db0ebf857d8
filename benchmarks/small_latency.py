#!/usr/bin/env python3
"""Where a small product's time goes: each kernel's own GPU duration (CUPTI, through torch.profiler) beside the
graph-timed time per call, for gemmgen's candidates and cuBLAS, on products of a few microseconds.

    PYTHONPATH=$PWD python3 benchmarks/small_latency.py [--shape M,N,K,LAYOUTS ...] [--top 6] [--out DIR]

For each shape: the model's top configurations of every family (public rank APIs), compiled, exported and loaded
with gemmgen.load, verified once on fresh inputs with D poisoned against an fp32 product, then (1) CUDA-graph timed
(CALLS calls per replay over rotating input sets, median of replays) and (2) profiled: the summed duration of the
kernels one call launches, as CUPTI records them (the launch gaps between kernels excluded). The difference between
(1) and (2) is what a call costs outside its kernels' execution (launch latency in the graph, gaps between a pack or
reduce launch and the GEMM); (2) against the model's prediction shows the kernel's own fixed cost.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import run_main, write_report  # noqa: E402

SHAPES = ("88,4360,560,cc", "104,14648,376,rr", "236,1006,872,rr", "112,11952,1775,cr", "128,128,64,rr")
SETS, CALLS, REPLAYS = 4, 40, 7


def kernel_us(torch, fn, sets, calls: int = 20) -> "dict[str, float]":
    """GPU µs per call of each kernel name fn launches (CUPTI durations, summed over the calls)."""
    from torch.profiler import ProfilerActivity, profile

    for s in sets:
        fn(s)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for j in range(calls):
            fn(sets[j % len(sets)])
        torch.cuda.synchronize()
    out = {}
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", 0.0) or getattr(event, "cuda_time_total", 0.0)
        if us and not event.key.startswith(("cuda", "Memcpy")):
            out[event.key[-70:]] = us / calls
    return out


def with_fields(config, fields: dict, problem, gpu):
    """(`config` with `fields` replaced, "") where the configuration and the rules accept it for `problem`, else
    (None, why not)."""
    from gemmgen.families.rules import check

    try:
        other = config.from_dict(dict(config.to_dict(), **fields))
    except Exception as exc:  # noqa: BLE001 - a combination the config itself refuses
        return None, f"{config.tag} with {fields}: {exc}"
    broken = check(other, gpu, gpu.arch, problem)
    return (None, f"{other.tag}: {broken[0]}") if broken else (other, "")


def variants(pick, problem, gpu) -> list:
    """The pick, then the pick with one knob changed, where the rules allow (Ranked, unpredicted)."""
    from gemmgen.rank.ranking import Ranked

    out = [pick]
    cfg = pick.config
    if cfg.family != "sm90_wgmma":
        return out
    changes = [{"persistent": False}, {"persistent": False, "schedule": "cooperative"}, {"stages": 2}, {"stages": 3},
               {"stages": 4}, {"schedule": "cooperative"}]
    for change in changes:
        other, _ = with_fields(cfg, change, problem, gpu)
        if other is not None and other != cfg:
            out.append(Ranked(other, None, None, "", 0))
    return out


def changed(ranked, changes, problem, gpu) -> list:
    """`ranked`'s configuration with each change (text KNOB=VALUE[,KNOB=VALUE]) applied (unpredicted Ranked), where
    the rules allow it; the others reported."""
    from gemmgen.rank.ranking import Ranked

    out = []
    for change in changes:
        fields = {}
        for item in change.split(","):
            key, _, value = item.partition("=")
            fields[key] = int(value) if value.isdigit() else {"true": True, "false": False}.get(value, value)
        other, why = with_fields(ranked.config, fields, problem, gpu)
        if other is None:
            print(f"  {why}", flush=True)
            continue
        out.append(Ranked(other, None, None, "", 0))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, metavar="M,N,K,LAYOUTS")
    ap.add_argument("--top", type=int, default=6, help="model-ranked configurations per shape (all families)")
    ap.add_argument("--variants", action="store_true",
                    help="instead of the model's top few: its pick, and the pick changed one knob at a time "
                         "(not persistent, 2-4 stages, cooperative; benchmarks/pdl.py measures the launches "
                         "without programmatic dependent launch)")
    ap.add_argument("--match", action="append", default=[], metavar="TEXT",
                    help="also the two best-ranked configurations whose tag contains TEXT, e.g. sm80_skinny_cta128x "
                         "(repeatable)")
    ap.add_argument("--change", action="append", default=[], metavar="KNOB=VALUE[,KNOB=VALUE]",
                    help="also each --match'ed configuration with these fields changed, e.g. stages=8 or "
                         "cta=64x64,warp=64x64,mma=64x64x16 (repeatable; a change the rules refuse is reported)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    gpu, ranked_by_shape = harness.ranked_shapes(args.shape or SHAPES)
    plans = []
    for problem, ranked in ranked_by_shape:
        chosen = variants(ranked[0], problem, gpu) if args.variants else ranked[:args.top]
        for text in args.match:
            matched = [r for r in ranked if text in r.config.tag and r not in chosen][:2]
            chosen += matched
            chosen += [v for r in matched[:1] for v in changed(r, args.change, problem, gpu) if v not in chosen]
        plans.append((problem, chosen))
    rows = []
    for problem, built in harness.compile_plans(plans, gpu.arch):
        sets = [harness.layout_operands(torch, problem, torch.bfloat16) for _ in range(SETS)]

        def cublas(s):
            torch.matmul(s[0], s[1], out=s[2])

        entries = [("cuBLAS", None, cublas)]
        for r, kernel, compiled in built:
            gemm, _ = harness.checked_load(torch, kernel, problem, compiled, sets[0], "gemmgen-latency-")
            if gemm is None:
                continue
            entries.append((kernel.config.tag, r.time_s, lambda s, g=gemm: g(*s)))
        for name, predicted, fn in entries:
            graph_us = statistics.median(harness.graph_timed(torch, fn, sets, CALLS, REPLAYS) * 1e6 for _ in range(3))
            kernels_us = kernel_us(torch, fn, sets)
            rows.append({"shape": problem.label, "kernel": name, "predicted_us": predicted and predicted * 1e6,
                         "graph_us": graph_us, "kernel_us": sum(kernels_us.values()), "kernels": kernels_us})
            print(f"{problem.label:28s} {name[:78]:78s} graph {graph_us:6.1f} us  kernels {sum(kernels_us.values()):6.1f}"
                  f" us  predicted {'-' if not predicted else f'{predicted * 1e6:5.1f}'}", flush=True)
        del sets
    if args.out:
        print("written:", write_report(args.out, "small_latency.json", {"gpu": gpu.key, "rows": rows}))
    return 0


if __name__ == "__main__":
    run_main(main, "small_latency.py")
