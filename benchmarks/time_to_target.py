#!/usr/bin/env python3
"""Time to within 2% of the full tune: a fresh, short tune of each shape against its stored full-tune winner.

    python3 benchmarks/time_to_target.py --out DIR                  # held-out shapes, bf16, 20 s each (GPU, optuna)
    python3 benchmarks/time_to_target.py --plot DIR/time_to_target-<date>.json     # the chart again, no GPU

For each shape of --shapes (default benchmarks/suites/heldout.yaml) in each of --dtypes:
  fresh tune   `gemmgen tune` as a user runs it on a shape never tuned: a new study in a temporary storage, a fresh
               compile cache, the stored records of every OTHER shape (results/<gpu>/tunes, the shape itself left
               out in every dtype) to transfer from (--transfer nearest; tune/transfer.py), the calibration shipped
               in results/<gpu>/calibration.json (fitted without the held-out shapes), --budget-s of search
               (--timeout), then its usual finalist rounds. Every measured trial is logged: wall time since the
               tune() call (ranking, compiles and the measuring process's start-up included), its TFLOP/s and
               the best so far.
  re-timing    each configuration that was ever the fresh tune's best so far, the fresh tune's winner, the stored
               full-tune winner (the reference: the lowest stored median of results/<gpu>/tunes and
               results/sustained/<gpu>/tunes, as benchmarks/zero_shot.py takes it) and cuBLAS, compiled, verified
               and timed interleaved in one run (benchmarks/zero_shot.py's timing).
  time to 2%   the wall time from which the tune's best so far stays within 2% of the reference, both re-timed
               here (reference time / its time >= 0.98); `first within` is the first time it got there. None when
               it never did within the budget.
JSON under --out (time_to_target-<date>.json) and the chart beside it: best so far (re-timed, as a fraction of the
full tune) against wall time, one line per shape; a PNG with matplotlib, else an SVG written without it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import ROOT, load_compiled, run_main, write_report  # noqa: E402

TARGET = 0.02  # within 2% of the full tune's time
GOAL_S = 15.0  # the issue's goal: within 2% in <= 15 s of tuning


# --- the figures, from a run's steps (no GPU) -------------------------------------------------------------------

def time_to_target(steps: "list[dict]", target: float = TARGET) -> "tuple[float | None, float | None]":
    """(time from which the best so far stays within `target`, first time it is within), from steps ordered by
    time, each {t_s, vs_reference}; a step that could not be re-timed (vs_reference None) counts as outside."""
    first = None
    stays = None
    for step in steps:
        inside = step.get("vs_reference") is not None and step["vs_reference"] >= 1.0 - target
        if inside and first is None:
            first = step["t_s"]
        if inside and stays is None:
            stays = step["t_s"]
        elif not inside:
            stays = None
    return stays, first


def best_so_far_steps(trials: "list[dict]") -> "list[dict]":
    """The trials that raised the best TFLOP/s so far, in order: {t_s, number, tag, tflops, source}."""
    steps, best = [], 0.0
    for trial in sorted(trials, key=lambda t: t["t_s"]):
        if trial.get("tflops") and trial["tflops"] > best:
            best = trial["tflops"]
            steps.append({k: trial.get(k) for k in ("t_s", "number", "tag", "tflops", "source")})
    return steps


# --- the chart ----------------------------------------------------------------------------------------------------

def _series(row: dict) -> "list[tuple[float, float]]":
    """(wall s, best so far as a fraction of the full tune, re-timed) as a step line to the end of the search."""
    points = [(s["t_s"], s["vs_reference"]) for s in row.get("steps", []) if s.get("vs_reference") is not None]
    if points:
        points.append((max(row.get("search_end_s") or 0.0, points[-1][0]), points[-1][1]))
    return points


def render(report: dict, path: "str | Path") -> Path:
    """The chart of a report: PNG (or the suffix's format) with matplotlib, else an SVG beside `path`."""
    path = Path(path)
    rows = [r for r in report["rows"] if _series(r)]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _render_svg(report, rows, path.with_suffix(".svg"))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for row in rows:
        xs, ys = zip(*_series(row))
        ax.step(xs, ys, where="post", label=f"{row['shape']} {row['dtype']}")
    ax.axhline(1.0 - report["target"], color="grey", linestyle="--", linewidth=1, label="within 2%")
    ax.axvline(report["goal_s"], color="red", linestyle=":", linewidth=1, label=f"{report['goal_s']:g} s goal")
    ax.set_xlabel("wall time of the fresh tune (s)")
    ax.set_ylabel("best so far / full-tune winner (re-timed)")
    ax.set_title(f"time to within 2% of the full tune, {report.get('device', '')}")
    ax.set_ylim(max(0.0, min(y for r in rows for _, y in _series(r)) - 0.05) if rows else 0.0, 1.1)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _render_svg(report: dict, rows: "list[dict]", path: Path) -> Path:
    """The same chart as plain SVG: no plotting library needed."""
    w, h, left, right, top, bottom = 720, 400, 60, 170, 30, 45
    x_max = max([report["goal_s"]] + [x for r in rows for x, _ in _series(r)]) * 1.05
    y_lo = min([0.9] + [y for r in rows for _, y in _series(r)]) - 0.02
    y_hi = 1.05

    def sx(x):
        return left + (w - left - right) * x / x_max

    def sy(y):
        return top + (h - top - bottom) * (y_hi - y) / (y_hi - y_lo)

    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
           f'font-size="11"><rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="18">time to within 2% of the full tune, {report.get("device", "")}</text>',
           f'<line x1="{left}" y1="{sy(y_lo)}" x2="{w - right}" y2="{sy(y_lo)}" stroke="black"/>',
           f'<line x1="{left}" y1="{sy(y_lo)}" x2="{left}" y2="{sy(y_hi)}" stroke="black"/>',
           f'<text x="{(left + w - right) / 2}" y="{h - 8}" text-anchor="middle">wall time of the fresh tune (s)'
           '</text>',
           f'<text x="14" y="{(top + h - bottom) / 2}" transform="rotate(-90 14 {(top + h - bottom) / 2})" '
           'text-anchor="middle">best so far / full tune (re-timed)</text>']
    step = 5 if x_max <= 40 else 10
    for x in range(0, int(x_max) + 1, step):
        out.append(f'<text x="{sx(x)}" y="{sy(y_lo) + 14}" text-anchor="middle">{x}</text>')
    tick = 0.05 if y_hi - y_lo <= 0.5 else 0.1
    y = math.ceil(y_lo / tick) * tick
    while y <= y_hi:
        out.append(f'<text x="{left - 4}" y="{sy(y) + 4}" text-anchor="end">{y:.2f}</text>')
        y = round(y + tick, 2)
    target_y = sy(1.0 - report["target"])
    out.append(f'<line x1="{left}" y1="{target_y}" x2="{w - right}" y2="{target_y}" stroke="grey" '
               'stroke-dasharray="5,4"/>')
    out.append(f'<line x1="{sx(report["goal_s"])}" y1="{sy(y_lo)}" x2="{sx(report["goal_s"])}" y2="{sy(y_hi)}" '
               'stroke="red" stroke-dasharray="2,3"/>')
    for i, row in enumerate(rows):
        color = colors[i % len(colors)]
        pts, prev = [], None
        for x, y in _series(row):
            if prev is not None:
                pts.append(f"{sx(x):.1f},{sy(prev):.1f}")
            pts.append(f"{sx(x):.1f},{sy(y):.1f}")
            prev = y
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(pts)}"/>')
        out.append(f'<text x="{w - right + 8}" y="{top + 14 * (i + 1)}" fill="{color}">'
                   f'{row["shape"]} {row["dtype"]}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")
    return path


def print_table(report: dict) -> None:
    def fmt(v, spec):
        return "-".rjust(int(spec.split(".")[0] or 0)) if v is None else format(v, spec)

    print(f"{'shape':16s} {'dtype':5s} {'trials':>6s} {'to 2% s':>8s} {'first s':>8s} {'fresh/full':>10s} "
          f"{'full/cuBLAS':>11s} {'search s':>8s}  first within 2% from")
    for r in report["rows"]:
        print(f"{r['shape']:16s} {r['dtype']:5s} {r.get('measured', 0):6d} {fmt(r.get('time_to_target_s'), '8.1f')} "
              f"{fmt(r.get('first_within_s'), '8.1f')} {fmt(r.get('fresh_winner_vs_reference'), '10.3f')} "
              f"{fmt(r.get('reference_vs_cublas'), '11.3f')} {fmt(r.get('search_end_s'), '8.1f')}  "
              f"{r.get('first_within_source') or r.get('error') or '-'}")
    s = report.get("summary") or {}
    if s:
        print(f"within 2% in <= {report['goal_s']:g} s: {s['within_goal']}/{s['shapes']} shapes; "
              f"median time to 2%: {fmt(s.get('median_time_to_target_s'), '.1f')} s (of those that got there)")


# --- the run (GPU) ------------------------------------------------------------------------------------------------

def shape_rows(files) -> "list[tuple[str, int, int, int]]":
    import yaml

    out = []
    for f in files:
        for row in yaml.safe_load(Path(f).read_text())["shapes"]:
            out.append((row["name"], int(row["M"]), int(row["N"]), int(row["K"])))
    return out


def fresh_results(tmp: Path, gpu_key: str, shape: "tuple[int, int, int]") -> "tuple[Path, int]":
    """A results folder holding every stored record of the GPU except the shape's own (all dtypes), and the
    shipped calibration: what a user's checkout holds before this shape is ever tuned. (folder, records copied)"""
    from gemmgen import Problem

    src = ROOT / "results" / gpu_key
    dst = tmp / "results" / gpu_key
    (dst / "tunes").mkdir(parents=True)
    copied = 0
    for f in sorted((src / "tunes").glob("*.json")):
        try:
            p = Problem.from_dict(json.loads(f.read_text())["problem"])
        except (ValueError, KeyError, TypeError):
            continue
        if (p.m, p.n, p.k) != shape:
            shutil.copy(f, dst / "tunes" / f.name)
            copied += 1
    if (src / "calibration.json").is_file():
        shutil.copy(src / "calibration.json", dst / "calibration.json")
    return tmp / "results", copied


def fresh_tune(problem, gpu, args, tmp: Path) -> dict:
    """One fresh tune with transfer and the calibrated model, every measured trial logged with its wall time."""
    from gemmgen.rank.calibration import params_for
    from gemmgen.tune.search import TuneOptions, tune
    from gemmgen.tune.worker import WorkerBenchmark, gpu_benchmark

    results, copied = fresh_results(tmp, gpu.key, (problem.m, problem.n, problem.k))
    saved = {k: os.environ.get(k) for k in ("GEMMGEN_RESULTS", "GEMMGEN_CACHE", "GEMMGEN_DATA")}
    os.environ.update(GEMMGEN_RESULTS=str(results), GEMMGEN_CACHE=str(tmp / "cache"), GEMMGEN_DATA=str(tmp / "data"))
    trials, marks = [], {}
    try:
        calibration = params_for(gpu)[1]
        options = TuneOptions(trials=10_000, timeout_s=args.budget_s, patience=None, top_k=args.top_k,
                              transfer=args.transfer, seed=args.seed, storage=f"sqlite:///{tmp / 'studies.db'}",
                              jobs=args.jobs or max(1, (os.cpu_count() or 2) - 1))
        measurer = WorkerBenchmark(gpu_benchmark, 60.0)
        t0 = time.monotonic()

        def on_event(kind, info):
            now = time.monotonic() - t0
            if kind == "start":
                marks["search_start_s"] = now
                marks["transferred"] = len(info.get("transferred") or {})
            elif kind == "trial" and info.get("state") == "COMPLETE":
                trials.append({"t_s": now, "number": info["number"], "tag": info["tag"], "tflops": info["tflops"]})
            elif kind == "finalists":
                marks["search_end_s"] = now

        try:
            result = tune(problem, gpu, measurer, options, on_event=on_event)
        finally:
            measurer.close()
        wall = time.monotonic() - t0
        record = json.loads(Path(result.record_path).read_text())
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    by_number = {t["number"]: t for t in record["trials"]}
    for t in trials:
        t["source"] = by_number.get(t["number"], {}).get("source")
    configs = {t["config_tag"]: t["config"] for t in record["trials"] if t.get("config_tag") and t.get("config")}
    w = result.winner
    return {"records_to_transfer_from": copied, "calibration": str(calibration) if calibration else None,
            "transferred": marks.get("transferred", 0), "search_start_s": marks.get("search_start_s"),
            "search_end_s": marks.get("search_end_s", wall), "wall_s": wall, "stop_reason": result.stop_reason,
            "measured": result.counts["measured"], "trials": trials, "configs": configs,
            "winner": w.config.tag if w else None, "winner_config": w.config.to_dict() if w else None,
            "winner_tune_time_s": w.median_s if w else None, "cublas_tune_time_s": result.cublas_time_s}


def retime(torch, problem, dtype, contenders: "dict[str, object]", jobs) -> "tuple[dict, dict]":
    """{label: median time} of each (label -> TileConfig) and cuBLAS, verified then timed interleaved; {label:
    error} for those that did not compile or verify."""
    import benchmarks.zero_shot as zs
    from gemmgen import Kernel
    from gemmgen.codegen.nvrtc import compile_many
    from gemmgen.runtime.detect import detect_gpu

    arch = detect_gpu().gpu.arch
    kernels = {label: Kernel(arch, problem.operands, config) for label, config in contenders.items()}
    built = dict(zip(kernels, compile_many(list(kernels.values()), jobs)))
    fns, errors, loaded = {}, {}, []
    for label, kernel in kernels.items():
        if isinstance(built[label], Exception):
            errors[label] = f"compile: {str(built[label])[:160]}"
            continue
        gemm = load_compiled(kernel, problem, built[label], "gemmgen-ttt-")
        loaded.append(gemm)
        err = zs.verified(torch, gemm, problem, dtype)
        if isinstance(err, float) and err < 1e-2:
            fns[label] = lambda s, g=gemm: g(*s)
        else:
            errors[label] = f"verification failed: {err}"
    sets = [harness.layout_operands(torch, problem, dtype) for _ in range(zs.SETS)]
    fns["cublas"] = lambda s: torch.matmul(s[0], s[1], out=s[2])
    for fn in fns.values():
        for s in sets:
            fn(s)
    torch.cuda.synchronize()
    times = {label: [] for label in fns}
    for _ in range(zs.PASSES):
        for label, fn in fns.items():
            times[label].append(zs.timed(torch, fn, sets))
    for gemm in loaded:
        gemm.close()
    return {label: statistics.median(ts) for label, ts in times.items()}, errors


def run_shape(torch, name, problem, dtype_name, gpu, reference, args) -> dict:
    from gemmgen.model.tiles import TileConfig

    row = {"name": name, "shape": f"{problem.m}x{problem.n}x{problem.k}", "dtype": dtype_name}
    if reference is None:
        return dict(row, error="no stored full-tune record for this shape: nothing to compare with")
    row["reference"] = {"config": TileConfig.from_dict(reference["config"]).tag, "record": reference["record"],
                        "stored_time_s": reference["median_time_s"]}
    with tempfile.TemporaryDirectory(prefix="gemmgen-ttt-") as tmp:
        tune_out = fresh_tune(problem, gpu, args, Path(tmp))
        steps = best_so_far_steps(tune_out["trials"])
        contenders = {"reference": TileConfig.from_dict(reference["config"])}
        for s in steps:
            contenders.setdefault(s["tag"], TileConfig.from_dict(tune_out["configs"][s["tag"]]))
        if tune_out["winner"]:
            contenders.setdefault(tune_out["winner"], TileConfig.from_dict(tune_out["winner_config"]))
        dtype = getattr(torch, {"bf16": "bfloat16", "f16": "float16"}[dtype_name])
        times, errors = retime(torch, problem, dtype, contenders, args.jobs)
    ref = times.get("reference")
    for s in steps:
        s["retimed_s"] = times.get(s["tag"])
        s["vs_reference"] = ref / s["retimed_s"] if ref and s["retimed_s"] else None
    stays, first = time_to_target(steps, args.target)
    first_source = next((s["source"] for s in steps if s["t_s"] == first), None) if first is not None else None
    winner_s = times.get(tune_out["winner"])
    row.update({k: v for k, v in tune_out.items() if k not in ("configs", "winner_config")})
    row.update(steps=steps, retimed_s=times, retime_errors=errors, time_to_target_s=stays, first_within_s=first,
               first_within_source=first_source, reference_time_s=ref, cublas_time_s=times.get("cublas"),
               reference_vs_cublas=times["cublas"] / ref if ref else None,
               fresh_winner_vs_reference=ref / winner_s if ref and winner_s else None,
               fresh_winner_vs_cublas=times["cublas"] / winner_s if winner_s else None)
    return row


def summary(rows, goal_s) -> dict:
    reached = [r["time_to_target_s"] for r in rows if r.get("time_to_target_s") is not None]
    return {"shapes": len(rows), "reached": len(reached),
            "within_goal": sum(t <= goal_s for t in reached),
            "median_time_to_target_s": statistics.median(reached) if reached else None,
            "winners_within_2pct": sum((r.get("fresh_winner_vs_reference") or 0) >= 1 - TARGET for r in rows)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=[str(ROOT / "benchmarks/suites/heldout.yaml")])
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--budget-s", type=float, default=20.0, help="search time of each fresh tune (--timeout)")
    ap.add_argument("--transfer", type=int, default=3, help="nearest stored shapes to transfer from (0: none)")
    ap.add_argument("--top-k", type=int, default=10, help="the model's picks measured first")
    ap.add_argument("--target", type=float, default=TARGET, help="within this fraction of the full tune")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=None, help="parallel NVRTC compiles (default: cores - 1)")
    ap.add_argument("--out", default=None, help="write time_to_target-<date>.json and its chart here")
    ap.add_argument("--plot", default=None, metavar="FROM_JSON", help="only draw the chart of an earlier run's JSON")
    args = ap.parse_args(argv)
    if args.plot:
        report = json.loads(Path(args.plot).read_text())
        print_table(report)
        print(f"chart: {render(report, Path(args.plot).with_suffix('.png'))}")
        return 0
    try:
        import optuna  # noqa: F401  (the tuner's search)
    except ImportError:
        print("time_to_target.py: the fresh tunes need optuna (pip install optuna); --plot needs neither it nor a "
              "GPU", file=sys.stderr)
        return 2
    import torch

    import benchmarks.zero_shot as zs
    from gemmgen import Problem
    from gemmgen.runtime.detect import detect_gpu

    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = detect_gpu().gpu
    tuned = zs.tuned_records(gpu.key)
    t_start = time.time()
    rows = []
    for name, m, n, k in shape_rows(args.shapes):
        for dtype_name in args.dtypes.split(","):
            problem = Problem.create(m, n, k, dtype_name)
            row = run_shape(torch, name, problem, dtype_name, gpu, tuned.get(problem.label), args)
            rows.append(row)
            print(f"{row['shape']:16s} {dtype_name:5s} to 2%: {row.get('time_to_target_s')} s "
                  f"(first {row.get('first_within_s')} s, {row.get('measured', 0)} trials, "
                  f"{row.get('transferred', 0)} transferred); fresh winner / full tune "
                  f"{row.get('fresh_winner_vs_reference')}", flush=True)
    report = {"device": torch.cuda.get_device_name(), "gpu": gpu.key, "target": args.target, "goal_s": GOAL_S,
              "budget_s": args.budget_s, "transfer": args.transfer, "top_k": args.top_k, "seed": args.seed,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "wall_s": time.time() - t_start,
              "timing": "wall time since the tune() call; re-timed with benchmarks/zero_shot.py's interleaved "
                        "CUDA-event timing", "rows": rows, "summary": summary(rows, GOAL_S)}
    print_table(report)
    print(f"wall {report['wall_s']:.0f} s")
    if args.out:
        path = write_report(args.out, f"time_to_target-{time.strftime('%Y%m%d-%H%M')}.json", report)
        print(f"written: {path}")
        print(f"chart: {render(report, path.with_suffix('.png'))}")
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
