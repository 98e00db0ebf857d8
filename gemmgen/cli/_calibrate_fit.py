"""`gemmgen calibrate --fit`: refit the model to the stored trials and write the calibration file."""
from __future__ import annotations

import sys

from ..model.errors import InvalidInput
from ..model.files import writable_file
from ._common import print_json, table


def _holdout(text: "str | None") -> "tuple[str, ...]":
    from ..model.problem import parse_dim
    from ..tune.fit import HOLDOUT_SHAPES

    if text is None:
        return HOLDOUT_SHAPES
    shapes = []
    for item in text.split(","):
        dims = item.strip().lower().split("x")
        if len(dims) != 3:
            raise InvalidInput("--holdout must be a comma-separated list of MxNxK", item)
        shapes.append("x".join(str(parse_dim(axis, d)) for axis, d in zip("MNK", dims)))
    return tuple(shapes)


def _row(name: str, s: dict) -> list:
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    return [name, s["problems"], num(s["median_spearman"], "+.2f"), num(s["mean_spearman"], "+.2f"),
            f"{s['top_k_hits']}/{s['top_k_of']}", num(s["zero_shot_geomean"], ".3f"),
            f"{s['zero_shot_within_10pct']}/{s['problems']}"]


def run_fit(args, gpu, records) -> int:
    from dataclasses import replace

    from ..rank.calibration import CALIBRATION_FORMAT, POWER_FIELDS, params_for, params_to_dict, user_calibration_path
    from ..rank.predict import DEFAULT_PARAMS
    from ..tune.fit import (PRIOR_WEIGHT, TOP_K, changed, fit, fit_with_terms, groups_from_records, judge,
                            merge_groups, split, summary)
    from ..tune.results import gpu_dir, now, write_json_atomic

    prior = PRIOR_WEIGHT if args.prior is None else args.prior
    if not prior >= 0:
        raise InvalidInput("--prior must be a non-negative number", args.prior)
    holdout = _holdout(args.holdout)
    # Where the fit goes, checked before the fit (minutes) rather than after it.
    out = writable_file("--out must be a file gemmgen can write" if args.out else
                        "the calibration file must be one gemmgen can write (GEMMGEN_DATA moves it, or pass --out)",
                        args.out or user_calibration_path(gpu))
    groups = merge_groups(groups_from_records(records, gpu))
    train, held = split(groups, holdout)
    if not train:
        raise InvalidInput(f"a fit needs measured tunes outside the held-out shapes in {gpu_dir(gpu) / 'tunes'}",
                           gpu.key, f"run `gemmgen tune M N K` on a {gpu.key} first")
    if not args.json:
        print(f"fitting on {len(train)} tunes ({sum(len(g.samples) for g in train)} measured configurations); "
              f"{len(held)} held out ({', '.join(holdout)})", file=sys.stderr)
    # The power ceiling's energies come from sustained samples, not from these records: kept as the GPU's current
    # calibration has them.
    current = params_for(gpu)[0]
    start = replace(DEFAULT_PARAMS, **{name: getattr(current, name) for name in POWER_FIELDS})
    params = fit(train, gpu, start=start, prior=prior,
                 on_round=None if args.json else lambda r, v: print(f"  round {r}: loss {v:.5f}", file=sys.stderr))
    # Then the learned terms (rank/terms.py) on what the constants leave unexplained, fitted on the same tunes.
    params = fit_with_terms(train, params, gpu)
    report = {"train": {"before": summary(judge(DEFAULT_PARAMS, train, gpu)), "after": summary(judge(params, train, gpu))}}
    if held:
        report["held_out"] = {"before": summary(judge(DEFAULT_PARAMS, held, gpu)),
                              "after": summary(judge(params, held, gpu))}
    moved = changed(params, gpu)
    payload = {"format": CALIBRATION_FORMAT, "gpu": gpu.key, "fitted": now(), "params": params_to_dict(params),
               "fit": {"prior": prior, "top_k": TOP_K, "holdout": list(holdout),
                       "train_problems": sorted(g.problem.label for g in train),
                       "held_out_problems": sorted(g.problem.label for g in held),
                       "changed": {k: {"default": a, "fitted": b} for k, (a, b) in moved.items()},
                       "terms": len(params.terms), **report}}
    try:
        write_json_atomic(out, payload)
    except OSError as exc:
        raise InvalidInput("--out must be a file gemmgen can write", str(out), exc.strerror) from None
    # Where tuning looks, first found wins (rank/calibration.calibration_paths): an --out elsewhere, or one behind
    # another calibration of this GPU, is written but not ranked with.
    used = params_for(gpu)[1]
    in_use = used is not None and used.resolve() == out.resolve()
    if args.json:
        print_json(dict(payload, written=str(out), used_by_tuning=in_use))
        return 0
    rows = []
    for part in ("held_out", "train"):
        if part in report:
            rows += [_row(f"{part} {when}", report[part][when]) for when in ("before", "after")]
    print(f"model fit on {gpu.key}: Spearman per problem over its measured configurations; top-{TOP_K}: the measured "
          "best among the model's diverse top 16 of the whole space; zero-shot: measured best / the model's first "
          "among the measured")
    print(table(rows, ["set", "problems", "median rho", "mean rho", f"top-{TOP_K}", "zero-shot geomean",
                       "within 10%"]))
    print(table([[name, f"{a:.4g}", f"{b:.4g}"] for name, (a, b) in moved.items()], ["parameter", "default", "fitted"])
          if moved else "no parameter moved: the defaults already fit best")
    if in_use:
        print(f"written: {out} (tuning and --dry-run on {gpu.key} rank with it; delete it to go back to the defaults)")
    else:
        ranked_with = f"the calibration in {used}" if used is not None else "the model's defaults"
        print(f"written: {out} (not used: tuning and --dry-run on {gpu.key} rank with {ranked_with}; to rank with "
              f"this fit, write it to {user_calibration_path(gpu)})")
    return 0
