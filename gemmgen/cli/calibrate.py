"""`gemmgen calibrate [--gpu]`: the model's predictions against the measurements stored in results/."""
from __future__ import annotations

from ..model.errors import InvalidInput
from ._common import add_gpu_arg, float_arg, given, print_json, resolve_gpu, table, text_arg


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="predicted vs measured over the stored tunes (rank correlation, "
                                                "suggested model constants)",
                              description="Re-predict every measured trial in results/<gpu>/tunes with the current "
                                          "model and the parameters tuning ranks with (the GPU's calibration file, "
                                          "else the defaults; the report names which); print Spearman's rank "
                                          "correlation per tune and the measured/predicted ratio per kernel family "
                                          "with the efficiency it suggests.")
    add_gpu_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--defaults", action="store_true",
                   help="report the model's default parameters instead of the calibration tuning uses (to see what "
                        "the calibration gains)")
    p.add_argument("--fit", action="store_true",
                   help="refit the model's free parameters to the stored trials (held-out shapes excluded), report "
                        "rank correlation and top-16 hits on the held-out shapes before and after, and write a "
                        "calibration file that tuning and --dry-run then use")
    p.add_argument("--holdout", default=None, metavar="MxNxK,...", type=text_arg("--holdout"),
                   help="shapes the fit never sees (default: the list fixed in gemmgen/tune/fit.py)")
    p.add_argument("--prior", type=float_arg("--prior", 0.0, 1e6), default=None, metavar="W",
                   help="weight of the pull towards the default constants (default 0.02; 0: unregularised)")
    p.add_argument("--out", default=None, metavar="FILE", type=text_arg("--out"),
                   help="where --fit writes (default: <per-user data dir>/calibration/<gpu>.json; "
                        "results/<gpu>/calibration.json ships one with a checkout)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..rank.calibration import params_for
    from ..rank.predict import DEFAULT_PARAMS
    from ..tune.calibrate import calibrate
    from ..tune.results import gpu_dir, load_records

    for flag in ("--holdout", "--prior", "--out"):
        if given(args, flag) and not args.fit:
            raise InvalidInput(f"{flag} needs --fit (without it, nothing is fitted)", flag)
    if args.defaults and args.fit:
        raise InvalidInput("--defaults is for the report without --fit (--fit reports the defaults beside the fit)",
                           "--defaults")
    gpu = resolve_gpu(args.gpu)
    records = [record for _, record in load_records(gpu)]
    if args.fit:
        from ._calibrate_fit import run_fit

        return run_fit(args, gpu, records)
    # What a tune, a dry run and roofline rank with: the GPU's calibration where one is found, else the defaults.
    params, calibration = (DEFAULT_PARAMS, None) if args.defaults else params_for(gpu)
    tunes, families = calibrate(records, gpu, params)
    used = str(calibration) if calibration is not None else "the model's defaults"
    if not tunes:
        raise InvalidInput(f"calibration needs measured tunes in {gpu_dir(gpu) / 'tunes'}", gpu.key,
                           f"run `gemmgen tune M N K` on a {gpu.key} first")
    if args.json:
        print_json({"gpu": gpu.key, "calibration": str(calibration) if calibration is not None else None,
                    "parameters": "calibration" if calibration is not None else "defaults",
                    "tunes": [{"problem": t.label, "trials": t.trials, "spearman": t.spearman,
                               "median_measured_over_predicted": t.median_ratio} for t in tunes],
                    "families": [{"family": f.family, "trials": f.trials, "median_measured_over_predicted":
                                  f.median_ratio, "efficiency_now": f.efficiency_now,
                                  "efficiency_suggested": f.efficiency_suggested} for f in families]})
        return 0
    rows = [[t.label, t.trials, "-" if t.spearman is None else f"{t.spearman:+.2f}", f"{t.median_ratio:.2f}"]
            for t in tunes]
    print(f"model vs measurement on {gpu.key}, {len(tunes)} tunes (current model re-applied to every trial)")
    print(f"parameters: {used}" + (" (as tuning and --dry-run rank; --defaults compares with the model's defaults)"
                                   if calibration is not None else
                                   " (--defaults given)" if args.defaults else
                                   " (no calibration found for this GPU: tuning ranks with them too)"))
    print(table(rows, ["problem", "trials", "Spearman rho", "measured/predicted"]))
    rhos = [t.spearman for t in tunes if t.spearman is not None]
    if rhos:
        rhos.sort()
        print(f"median rho {rhos[len(rhos) // 2]:+.2f} (1 = the model orders configurations exactly as measured)")
    print()
    print(table([[f.family, f.trials, f"{f.median_ratio:.2f}", f"{f.efficiency_now:.2f}",
                  f"{f.efficiency_suggested:.2f}"] for f in families],
                ["family", "trials", "measured/predicted", "efficiency now", "suggested"]))
    return 0
