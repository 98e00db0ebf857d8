"""How well the performance model predicts shapes it was not fitted on, from stored H100 records (no GPU).

The split is fixed in the repo before any fit (benchmarks/suites/heldout.yaml); every variant is fitted on the
other shapes' records only, then judged per held-out problem (both dtypes of a shape are held out together):

  rho       Spearman between predicted and measured time over the problem's measured configurations
  zero-shot measured best / measured time of the model's first pick among the measured configurations
            (1.0 = the model picks the tuned best; the goal is >= 0.909, i.e. within 10%, on >= 85% of problems)
  top-16    whether the measured best is among the model's diverse top 16 over the whole current space
            (what a tune measures first)

Records of one problem (a burst tune in results/h100-sxm/tunes and a sustained one in
results/sustained/h100-sxm/tunes) are pooled: each configuration's time is the geometric mean of its records'.

    python3 benchmarks/calibration_eval.py                       # table; JSON into docs/lab-data/h100-sxm/
    python3 benchmarks/calibration_eval.py --write-calibration results/h100-sxm/calibration.json
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from harness import ROOT, run_main, write_report

DEFAULT_RECORDS = ("results/h100-sxm/tunes", "results/sustained/h100-sxm/tunes")
# Large shapes: where the issue's Spearman goal (>= 0.7) applies (>= 2 GFLOP... here >= 2*2048^3).
LARGE_FLOPS = 2 * 2048 ** 3


def heldout_shapes(path: Path) -> "tuple[str, ...]":
    import yaml

    from gemmgen.model.errors import InvalidInput

    data = yaml.safe_load(path.read_text())
    rows = data.get("shapes") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise InvalidInput("a held-out file must hold a non-empty `shapes` list", str(path))
    return tuple(f"{int(r['M'])}x{int(r['N'])}x{int(r['K'])}" for r in rows)


def load_groups(dirs, gpu):
    from gemmgen.tune.fit import groups_from_records, merge_groups

    records = []
    for d in dirs:
        for f in sorted((ROOT / d).glob("*.json")):
            records.append(json.loads(f.read_text()))
    return merge_groups(groups_from_records(records, gpu))


def repeatability(dirs, gpu) -> "list[dict]":
    """Spearman between two independent timings of the same configurations (records of one problem in two folders
    whose times differ, i.e. re-measured, not copied): the ceiling any model's rho can reach on these records."""
    from gemmgen.tune.calibrate import spearman
    from gemmgen.tune.fit import groups_from_records

    per_dir = []
    for d in dirs:
        by_label = {}
        for f in sorted((ROOT / d).glob("*.json")):
            for g in groups_from_records([json.loads(f.read_text())], gpu):
                by_label[g.problem.label] = {c.tag: t for c, t in g.samples}
        per_dir.append(by_label)
    rows = []
    for i, a in enumerate(per_dir):
        for b in per_dir[i + 1:]:
            for label in sorted(set(a) & set(b)):
                common = sorted(set(a[label]) & set(b[label]))
                if len(common) >= 5 and any(a[label][c] != b[label][c] for c in common):
                    rows.append({"problem": label, "configs": len(common),
                                 "spearman": spearman([a[label][c] for c in common], [b[label][c] for c in common])})
    return rows


def variants(train, gpu, ridge: float, physical: bool, prior: float):
    """name -> params, each fitted on `train` only."""
    from gemmgen.rank.predict import DEFAULT_PARAMS
    from gemmgen.tune.fit import fit, fit_with_terms

    out = {"defaults": DEFAULT_PARAMS}
    t0 = time.perf_counter()
    out["terms"] = fit_with_terms(train, DEFAULT_PARAMS, gpu, ridge)
    print(f"  terms fitted in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if physical:
        t0 = time.perf_counter()
        out["constants"] = fit(train, gpu, prior=prior)
        out["constants+terms"] = fit_with_terms(train, out["constants"], gpu, ridge)
        print(f"  constants fitted in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


def per_problem(params, groups, gpu) -> "list[dict]":
    from gemmgen.tune.fit import judge

    rows = []
    for g, j in zip(groups, judge(params, groups, gpu)):
        rows.append({"problem": j.label, "shape": g.shape, "flops": g.problem.flops, "configs": j.configs,
                     "spearman": j.spearman, "zero_shot": j.zero_shot, "within_10pct": j.zero_shot >= 1 / 1.1,
                     "top16_hit": j.top_k_hit})
    return rows


def summarise(rows: "list[dict]") -> dict:
    large = [r["spearman"] for r in rows if r["flops"] >= LARGE_FLOPS and r["spearman"] is not None]
    rhos = [r["spearman"] for r in rows if r["spearman"] is not None]
    hits = [r["top16_hit"] for r in rows if r["top16_hit"] is not None]
    return {"problems": len(rows),
            "median_spearman": statistics.median(rhos) if rhos else None,
            "median_spearman_large": statistics.median(large) if large else None,
            "min_spearman_large": min(large) if large else None,
            "within_10pct": sum(r["within_10pct"] for r in rows),
            "within_10pct_frac": sum(r["within_10pct"] for r in rows) / len(rows) if rows else None,
            "zero_shot_geomean": math.exp(statistics.fmean(math.log(r["zero_shot"]) for r in rows)) if rows else None,
            "top16_hits": sum(hits), "top16_of": len(hits)}


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heldout", default=str(ROOT / "benchmarks/suites/heldout.yaml"))
    ap.add_argument("--records", nargs="+", default=list(DEFAULT_RECORDS), help="folders of tune records (repo-relative)")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--ridge", type=float, default=None, help="L2 weight on the learned terms (default: fit's)")
    ap.add_argument("--constants", action="store_true",
                    help="also refit the physical constants (tune/fit.fit, coordinate descent) before the terms")
    ap.add_argument("--prior", type=float, default=0.02, help="--constants' pull towards the default constants")
    ap.add_argument("--out", default=str(ROOT / "docs/lab-data/h100-sxm"))
    ap.add_argument("--write-calibration", default=None, help="write the 'terms' variant as a calibration file")
    args = ap.parse_args()

    from gemmgen.model.arch import lookup_gpu
    from gemmgen.rank.calibration import CALIBRATION_FORMAT, params_to_dict
    from gemmgen.tune.fit import TERMS_RIDGE, split

    gpu = lookup_gpu(args.gpu)
    ridge = TERMS_RIDGE if args.ridge is None else args.ridge
    holdout = heldout_shapes(Path(args.heldout))
    groups = load_groups(args.records, gpu)
    train, held = split(groups, holdout)
    print(f"{len(train)} training problems ({sum(len(g.samples) for g in train)} configurations), {len(held)} held out "
          f"({sum(len(g.samples) for g in held)}): {', '.join(holdout)}", file=sys.stderr)
    fitted = variants(train, gpu, ridge, args.constants, args.prior)
    report = {"gpu": gpu.key, "heldout": list(holdout), "records": args.records, "ridge": ridge,
              "train_problems": sorted(g.problem.label for g in train), "variants": {}}
    for name, params in fitted.items():
        held_rows, train_rows = per_problem(params, held, gpu), per_problem(params, train, gpu)
        report["variants"][name] = {"held_out": {"rows": held_rows, "summary": summarise(held_rows)},
                                    "train": {"summary": summarise(train_rows), "rows": train_rows},
                                    "terms": dict(params.terms)}
        print(f"\n== {name}: held-out problems")
        print(f"{'problem':28s} {'configs':>7s} {'rho':>6s} {'zero-shot':>9s} {'<=10%':>5s} {'top-16':>6s}")
        for r in held_rows:
            print(f"{r['problem']:28s} {r['configs']:7d} {fmt(r['spearman'], '+.2f'):>6s} {r['zero_shot']:9.3f} "
                  f"{'yes' if r['within_10pct'] else 'NO':>5s} {fmt(r['top16_hit'], ''):>6s}")
    print("\n== summary (goals: within 10% on >= 85%, geomean >= 0.95, rho >= 0.7 on large shapes)")
    print(f"{'variant':10s} {'set':9s} {'med rho':>7s} {'med rho L':>9s} {'min rho L':>9s} {'<=10%':>7s} "
          f"{'geomean':>7s} {'top-16':>6s}")
    for name, v in report["variants"].items():
        for part in ("held_out", "train"):
            s = v[part]["summary"]
            print(f"{name:10s} {part:9s} {fmt(s['median_spearman'], '+.2f'):>7s} "
                  f"{fmt(s['median_spearman_large'], '+.2f'):>9s} {fmt(s['min_spearman_large'], '+.2f'):>9s} "
                  f"{s['within_10pct']:>3d}/{s['problems']:<3d} {fmt(s['zero_shot_geomean'], '.3f'):>7s} "
                  f"{s['top16_hits']:>3d}/{s['top16_of']:<2d}")
    report["repeatability"] = repeatability(args.records, gpu)
    print("\n== repeatability: Spearman between two independent timings of the same configurations")
    for r in report["repeatability"]:
        print(f"{r['problem']:28s} {r['configs']:7d} {fmt(r['spearman'], '+.2f'):>6s}")
    stamp = time.strftime("%Y%m%d")
    path = write_report(args.out, f"calibration_eval-{stamp}.json", report)
    print(f"\nwritten: {path}", file=sys.stderr)
    if args.write_calibration:
        params = fitted["terms"]
        payload = {"format": CALIBRATION_FORMAT, "gpu": gpu.key, "fitted": time.strftime("%Y-%m-%dT%H:%M:%S"),
                   "params": params_to_dict(params),
                   "fit": {"by": "benchmarks/calibration_eval.py", "ridge": ridge, "holdout": list(holdout),
                           "train_problems": report["train_problems"],
                           "held_out": report["variants"]["terms"]["held_out"]["summary"],
                           "train": report["variants"]["terms"]["train"]["summary"]}}
        Path(args.write_calibration).write_text(json.dumps(payload, indent=1) + "\n")
        print(f"written: {args.write_calibration}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
