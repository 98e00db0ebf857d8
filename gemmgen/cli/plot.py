"""`gemmgen plot STUDY-OR-RECORD`: roofline, best-so-far per worker and model calibration charts of a tune."""
from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("plot", help="charts of a tune: roofline of every measured configuration, "
                                           "best so far per worker, predicted vs measured time",
                              description="Plot a tuning record (results/<gpu>/tunes/*.json) or a study "
                                          "(its name, with --storage). Needs matplotlib: pip install 'gemmgen[plot]'.")
    from ._common import text_arg

    p.add_argument("source", metavar="STUDY-OR-RECORD", type=text_arg("STUDY-OR-RECORD"),
                   help="a tuning record JSON file, or a study name")
    p.add_argument("--storage", default=None, metavar="URL", type=text_arg("--storage"),
                   help="the study's storage (for a study name)")
    p.add_argument("--out", default=".", metavar="DIR", type=text_arg("--out"),
                   help="folder for the charts (default .)")
    p.add_argument("--format", default="png", type=text_arg("--format"), help="png (default) or svg")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..tune.tuning_plots import load_tune, plot_tune

    for path in plot_tune(load_tune(args.source, args.storage), args.out, args.format.lower()):
        print(f"written: {path}")
    return 0
