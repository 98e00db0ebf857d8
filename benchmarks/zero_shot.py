#!/usr/bin/env python3
"""Zero-shot against tuned and cuBLAS on the GPU: the model's pick for every suite shape, untuned, in one run.

    python3 benchmarks/zero_shot.py --out docs/lab-data/h100-sxm                 # ~3-5 min on an H100
    python3 benchmarks/zero_shot.py --calibration none --dtypes bf16               # the default constants

Shapes: results/shapes.yaml (the public suite) and benchmarks/suites/heldout.yaml (held out of the calibration fit),
each in bf16 and f16. For each problem:
  zero-shot   the model's first pick (what `gemmgen tune --dry-run` exports: rank the space, compile the top few,
              the best-ranked one that compiled), with the calibration file given (default
              results/<gpu>/calibration.json when present) and, with --defaults, with the default constants too
  tuned       the winner of the stored tune records (results/<gpu>/tunes, results/sustained/<gpu>/tunes: the one
              with the lowest stored time), compiled from its configuration and timed here, in the same run
  cuBLAS      torch.matmul on the same tensors
Every kernel is compiled first, all at once over a process pool (NVRTC, --jobs), then each is exported, loaded with
gemmgen.load from its manifest, verified at the shape on fresh random inputs with D poisoned (NaN) first against
an fp32 reference, then timed interleaved with the others of its problem (CUDA events, rounds over rotating input
sets so L2 does not hold the operands; median of passes). Table: zero-shot/tuned (same run), zero-shot/cuBLAS,
and the stored tuned time for comparison; JSON under --out.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import ROOT, load_compiled, run_main, write_report  # noqa: E402

SETS = 3
ROUNDS, CALLS, PASSES = 5, 10, 3
TOP = 3  # candidates compiled per pick, as a dry run does (the first that compiles is the pick)


def shapes(files) -> "list[tuple[str, int, int, int, str, str, bool]]":
    """(name, M, N, K, A's layout, B's layout, held out) for each distinct shape of the files, in order."""
    import yaml

    seen, out = {}, []
    held = set()
    for f in files:
        for row in yaml.safe_load(Path(f).read_text())["shapes"]:
            key = (int(row["M"]), int(row["N"]), int(row["K"]), row.get("a", "row"), row.get("b", "row"))
            if "heldout" in Path(f).name:
                held.add(key)
            if key not in seen:
                seen[key] = row["name"]
                out.append(key)
    return [(seen[k], *k, k in held) for k in out]


def tuned_records(gpu_key: str) -> "dict[str, dict]":
    """problem label -> the stored winner with the lowest median time over the record folders."""
    from gemmgen import Problem

    best = {}
    for folder in (ROOT / "results" / gpu_key / "tunes", ROOT / "results" / "sustained" / gpu_key / "tunes"):
        for f in sorted(folder.glob("*.json")):
            record = json.loads(f.read_text())
            winner = record.get("winner") or {}
            if record.get("simulated") or not winner.get("median_time_s") or not winner.get("config"):
                continue
            label = Problem.from_dict(record["problem"]).label
            if label not in best or winner["median_time_s"] < best[label]["median_time_s"]:
                best[label] = dict(winner, record=str(f.relative_to(ROOT)))
    return best


def model_picks(problem, gpu, params, top: int):
    """The model's top configurations for `problem` (public rank APIs; the dry run's ranking)."""
    from gemmgen.rank.ranking import model_top

    return model_top(harness.ranked_space(problem, gpu, params), top)


def plan(shape_files, dtypes, gpu, variants, tuned):
    """(problems, kernels by name): each problem's candidate kernels per variant (model picks, best first) and its
    stored tuned winner; every distinct kernel once. CPU only."""
    from gemmgen import Kernel, Problem
    from gemmgen.model.tiles import TileConfig

    problems, kernels = [], {}
    for name, m, n, k, a, b, held in shapes(shape_files):
        for dtype in dtypes:
            problem = Problem.create(m, n, k, dtype, a, b).k_major_rows()   # as `gemmgen tune` reads it
            entry = {"name": name, "problem": problem, "held_out": held, "dtype": dtype, "kernels": {}}
            for variant, p in variants.items():
                entry["kernels"][variant] = [Kernel(gpu.arch, problem.operands, r.config)
                                             for r in model_picks(problem, gpu, p, TOP)]
            rec = tuned.get(problem.label)
            if rec is not None:
                entry["tuned_record"] = rec
                entry["kernels"]["tuned"] = [Kernel(gpu.arch, problem.operands, TileConfig.from_dict(rec["config"]))]
            for ks in entry["kernels"].values():
                for kernel in ks:
                    kernels.setdefault(kernel.name, kernel)
            problems.append(entry)
    return problems, kernels


def timed(torch, fn, sets) -> float:
    """Median over ROUNDS of the mean time per call of CALLS calls (CUDA events), cycling through the input sets."""
    return harness.timed(torch, fn, sets, ROUNDS, CALLS)


def verified(torch, gemm, problem, dtype) -> "float | str":
    """Relative error at the shape on fresh inputs with D poisoned first (NaN never passes), or why it failed."""
    a, b, d = harness.layout_operands(torch, problem, dtype)
    d.fill_(float("nan"))
    try:
        gemm(a, b, d)
        torch.cuda.synchronize()
    except Exception as exc:  # a refusal or a launch failure: the row says so, the run goes on
        return f"{type(exc).__name__}: {exc}"[:200]
    ref = a.float() @ b.float()
    if not bool(torch.isfinite(d).all()):
        return "non-finite output"
    return float((d.float() - ref).norm() / ref.norm())


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def summary_line(label: str, s: dict) -> str:
    """The issue's goals on one line: zero-shot within 10% of tuned on >= 85% of shapes, geomean >= 0.95."""
    def num(v):
        return "-" if v is None else f"{v:.3f}"

    share = s["within_10pct_of_tuned"] / s["with_tuned"] if s["with_tuned"] else None
    return (f"{label}: zero-shot within 10% of tuned on {s['within_10pct_of_tuned']}/{s['with_tuned']} problems "
            f"({'-' if share is None else f'{100 * share:.0f}%'}; goal >= 85%), geomean zero-shot/tuned "
            f"{num(s['geomean_vs_tuned'])} (goal >= 0.95), geomean zero-shot/cuBLAS {num(s['geomean_vs_cublas'])}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=[str(ROOT / "results/shapes.yaml"),
                                                    str(ROOT / "benchmarks/suites/heldout.yaml")])
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--calibration", default=None,
                    help="calibration file for the pick (default: results/<gpu>/calibration.json if present; "
                         "'none': the default constants)")
    ap.add_argument("--defaults", action="store_true", help="also time the default constants' pick")
    ap.add_argument("--jobs", type=int, default=None, help="parallel NVRTC compiles (default: every core)")
    ap.add_argument("--timing", choices=("events", "graph"), default="events",
                    help="events (default: back-to-back calls between two events, host-bound below ~20 us per "
                         "call) or graph (the calls captured in a CUDA graph: the kernels' GPU time alone)")
    ap.add_argument("--out", default=None, help="write zero_shot-<date>.json here")
    args = ap.parse_args(argv)
    import torch

    from gemmgen.codegen.nvrtc import compile_many
    from gemmgen.rank.calibration import params_for, read_calibration
    from gemmgen.rank.predict import DEFAULT_PARAMS
    from gemmgen.runtime.detect import detect_gpu

    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = detect_gpu().gpu
    if args.calibration == "none":
        params, cal = DEFAULT_PARAMS, None
    elif args.calibration:
        params, cal = read_calibration(args.calibration)[0], args.calibration
    else:  # what tuning and dry runs use on this GPU (its own calibration, or its chip's)
        params, found = params_for(gpu)
        cal = str(found) if found else None
    variants = {"zero_shot": params}
    if args.defaults and cal is not None:
        variants["zero_shot_defaults"] = DEFAULT_PARAMS
    tuned = tuned_records(gpu.key)
    t_start = time.time()

    problems, kernels = plan(args.shapes, args.dtypes.split(","), gpu, variants, tuned)
    names = list(kernels)
    print(f"{len(problems)} problems, {len(names)} distinct kernels to compile", flush=True)
    t0 = time.time()
    built = dict(zip(names, compile_many([kernels[n] for n in names], args.jobs)))
    print(f"compiled in {time.time() - t0:.1f} s", flush=True)

    # 2. Per problem: load, verify, time interleaved with cuBLAS.
    rows = []
    for entry in problems:
        problem, dtype = entry["problem"], getattr(torch, {"bf16": "bfloat16", "f16": "float16"}[entry["dtype"]])
        row = {"name": entry["name"], "shape": f"{problem.m}x{problem.n}x{problem.k}", "dtype": entry["dtype"],
               "held_out": entry["held_out"]}
        contenders = {}
        for variant, ks in entry["kernels"].items():
            kernel = next((k for k in ks if not isinstance(built[k.name], Exception)), None)
            if kernel is None:
                row[variant] = {"error": "no candidate compiled"}
                continue
            gemm = load_compiled(kernel, problem, built[kernel.name], "gemmgen-zeroshot-")
            err = verified(torch, gemm, problem, dtype)
            row[variant] = {"config": kernel.config.tag, "rel_error": err}
            if isinstance(err, float) and err < 1e-2:
                contenders[variant] = gemm
            else:
                row[variant]["error"] = f"verification failed: {err}"
        sets = [harness.layout_operands(torch, problem, dtype) for _ in range(SETS)]

        def cublas(s):
            torch.matmul(s[0], s[1], out=s[2])

        fns = {"cublas": cublas, **{v: (lambda s, g=g: g(*s)) for v, g in contenders.items()}}
        time_one = ((lambda torch, fn, sets: harness.graph_timed(torch, fn, sets, CALLS * 2, ROUNDS))
                    if args.timing == "graph" else (lambda torch, fn, sets: timed(torch, fn, sets)))
        times = harness.interleaved_times(torch, fns, sets, time_one, PASSES)
        med = {v: statistics.median(ts) for v, ts in times.items()}
        row["cublas_time_s"] = med["cublas"]
        for v in contenders:
            row[v]["time_s"] = med[v]
            row[v]["vs_cublas"] = med["cublas"] / med[v]
            if "tuned" in contenders:
                row[v]["vs_tuned"] = med["tuned"] / med[v]
        if "tuned_record" in entry:
            row["tuned_stored_time_s"] = entry["tuned_record"]["median_time_s"]
            row["tuned_record"] = entry["tuned_record"]["record"]
            if "zero_shot" in contenders:
                row["zero_shot"]["vs_tuned_stored"] = entry["tuned_record"]["median_time_s"] / med["zero_shot"]
        for gemm in contenders.values():
            gemm.close()
        del sets
        rows.append(row)
        zs = row.get("zero_shot", {})
        print(f"{row['name']:12s} {row['shape']:16s} {row['dtype']:4s} {'held' if row['held_out'] else '    '} "
              f"zs/tuned {zs.get('vs_tuned', float('nan')):.3f}  zs/cuBLAS {zs.get('vs_cublas', float('nan')):.3f}  "
              f"{zs.get('config', zs.get('error', ''))}", flush=True)

    def summary(sel):
        zs = [r["zero_shot"] for r in sel if "time_s" in r.get("zero_shot", {})]
        vt = [z["vs_tuned"] for z in zs if "vs_tuned" in z]
        out = {"problems": len(sel), "timed": len(zs), "geomean_vs_tuned": geomean(vt),
               "within_10pct_of_tuned": sum(x >= 1 / 1.1 for x in vt), "with_tuned": len(vt),
               "geomean_vs_cublas": geomean([z["vs_cublas"] for z in zs])}
        if "zero_shot_defaults" in variants:
            d = [r["zero_shot_defaults"] for r in sel if "time_s" in r.get("zero_shot_defaults", {})]
            out["defaults_geomean_vs_tuned"] = geomean([z["vs_tuned"] for z in d if "vs_tuned" in z])
            out["defaults_geomean_vs_cublas"] = geomean([z["vs_cublas"] for z in d])
        return out

    report = {"device": torch.cuda.get_device_name(), "gpu": gpu.key, "calibration": cal, "timing_mode": args.timing,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "wall_s": time.time() - t_start,
              "timing": (f"CUDA graphs of {CALLS * 2} calls over {SETS} input sets, median of {ROUNDS} replays"
                         if args.timing == "graph" else
                         f"CUDA events, {ROUNDS} rounds x {CALLS} calls over {SETS} input sets, median of {PASSES} "
                         "interleaved passes"), "rows": rows,
              "summary": {"all": summary(rows), "held_out": summary([r for r in rows if r["held_out"]])}}
    print(json.dumps(report["summary"], indent=1))
    for scope, label in (("all", "suite + held-out"), ("held_out", "held-out (benchmarks/suites/heldout.yaml)")):
        print(summary_line(label, report["summary"][scope]))
    print(f"wall {report['wall_s']:.0f} s")
    if args.out:
        path = write_report(args.out, f"zero_shot-{time.strftime('%Y%m%d-%H%M')}.json", report)
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
