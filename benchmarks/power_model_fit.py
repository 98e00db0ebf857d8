#!/usr/bin/env python3
"""Fit the model's power ceiling to sustained timings, and score it on shapes it was not fitted to (no GPU).

    PYTHONPATH=$PWD python3 benchmarks/power_model_fit.py [--fit H100_JSON:SHAPE ...] [--score JSON ...]
                                                          [--dram-pj 31] [--write-calibration FILE]

Inputs are benchmarks/model_rank.py reports run with --hold (each configuration timed at the power limit). The
energy figures of rank/predict.py (pJ per tensor-core FLOP, per DRAM byte, per byte from L2) are chosen on a grid
to minimise the squared log error of predicted against measured time over the --fit rows only (default: the
H100's 8192^3); every report row is then scored with and without the ceiling: Spearman's rho across the sampled
configurations and the measured time of the model's pick against the sample's best. The calibration file of the
report's GPU is used as the tuner uses it (rank.calibration.params_for).

On a new GPU: run `benchmarks/model_rank.py --hold 0.3 --shape <a large shape>` there, then this with
--fit <its JSON>:<shape> --write-calibration results/<gpu>/calibration.json: the fitted energies go into that
calibration file's params (created if missing; `gemmgen calibrate --fit` keeps them when it refits the rest).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_FIT = ["docs/lab-data/h100-sxm/model_rank-sustained-20261126-1933.json:8192x8192x8192"]
DEFAULT_SCORE = ["docs/lab-data/h100-sxm/model_rank-sustained-20261126-1933.json",
                 "docs/lab-data/h200/model_rank-sustained-20261126-1929.json",
                 "docs/lab-data/h100-sxm/model_rank-20261125-1745.json"]
GRID = {"energy_pj_per_flop": [0.30 + 0.05 * i for i in range(19)],
        "energy_pj_per_dram_byte": [0, 10, 20, 30, 40, 50, 60, 80, 100],
        "energy_pj_per_l2_byte": [0, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 60]}


def gpu_of(device: str):
    from gemmgen.model.arch import lookup_gpu

    return lookup_gpu("h200" if "H200" in device else "h100")


def rows_of(path: str):
    """(gpu, shape, [(config, measured median s)]) per report row; configurations today's rules refuse are
    left out (named on stderr)."""
    from gemmgen.model.problem import Problem
    from gemmgen.rank.space import enumerate_space

    from gemmgen.model.errors import InvalidInput

    try:
        report = json.loads((ROOT / path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInput("a model_rank.py report must be a readable JSON file", path, str(exc)[:120]) from None
    gpu = gpu_of(report["device"])
    for row in report["rows"]:
        m, n, k = (int(v) for v in row["shape"].split("x"))
        problem = Problem.create(m, n, k, row["dtype"], "row", "col")
        space = {c.tag: c for c in enumerate_space(row["family"], gpu, problem=problem)}
        configs = []
        for c in row["configs"]:
            if c["config"] not in space:
                print(f"{path}: {c['config']} is no longer in the space", file=sys.stderr)
                continue
            configs.append((space[c["config"]], statistics.median(c["measured_s"])))
        yield gpu, problem, row, configs


def spearman(a, b) -> float:
    from gemmgen.tune.calibrate import spearman as rho

    return rho(list(a), list(b))


def score(gpu, problem, configs, params):
    from gemmgen.rank.predict import predict

    predicted = [predict(problem, c, gpu, params).time_s for c, _ in configs]
    measured = [t for _, t in configs]
    pick = min(range(len(configs)), key=predicted.__getitem__)
    log_err = [math.log(p / t) for p, t in zip(predicted, measured)]
    return spearman(predicted, measured), min(measured) / measured[pick], log_err


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", nargs="*", default=DEFAULT_FIT, metavar="JSON:SHAPE")
    parser.add_argument("--score", nargs="*", default=DEFAULT_SCORE, metavar="JSON")
    parser.add_argument("--write-calibration", default=None, metavar="FILE",
                        help="put the fitted energies into this calibration file's params (created if missing)")
    parser.add_argument("--dram-pj", type=float, default=None,
                        help="hold the DRAM energy per byte at this value instead of fitting it")
    args = parser.parse_args(argv)

    from gemmgen.rank.calibration import params_for

    grid = dict(GRID)
    if args.dram_pj is not None:
        grid["energy_pj_per_dram_byte"] = [args.dram_pj]

    fit_rows = []
    for spec in args.fit:
        path, shape = spec.rsplit(":", 1)
        fit_rows += [(gpu, problem, configs) for gpu, problem, row, configs in rows_of(path) if row["shape"] == shape]
    if not fit_rows:
        from gemmgen.model.errors import InvalidInput

        raise InvalidInput("--fit must name a report row as FILE:MxNxK", " ".join(args.fit))
    base = {gpu.key: params_for(gpu)[0] for gpu, _, _ in fit_rows}
    tried = []
    for values in itertools.product(*grid.values()):
        energy = dict(zip(grid, values))
        err = []
        for gpu, problem, configs in fit_rows:
            err += score(gpu, problem, configs, dataclasses.replace(base[gpu.key], **energy))[2]
        sse = sum(e * e for e in err)
        tried.append((sse, energy, statistics.mean(err)))
    tried.sort(key=lambda t: t[0])
    sse, energy, bias = tried[0]
    print("fitted on " + ", ".join(args.fit))
    print("  " + ", ".join(f"{k} = {v:g}" for k, v in energy.items())
          + f"   (rms log error {math.sqrt(sse / sum(len(c) for *_, c in fit_rows)):.3f}, mean {bias:+.3f})")
    n_fit = sum(len(c) for *_, c in fit_rows)
    print("  next best: " + "; ".join(", ".join(f"{v:g}" for v in e.values()) + f" (rms {math.sqrt(q / n_fit):.3f})"
                                      for q, e, _ in tried[1:6]))
    print(f"\n{'report':48} {'shape':16} {'n':>3} {'rho before':>10} {'rho after':>9} {'pick/best before':>16} "
          f"{'after':>6} {'rms log err before':>18} {'after':>6}")
    for path in args.score:
        for gpu, problem, row, configs in rows_of(path):
            params = params_for(gpu)[0]
            r0, p0, e0 = score(gpu, problem, configs, dataclasses.replace(params, **{k: 0.0 for k in GRID}))
            r1, p1, e1 = score(gpu, problem, configs, dataclasses.replace(params, **energy))
            rms = lambda e: math.sqrt(sum(x * x for x in e) / len(e))  # noqa: E731
            fitted = any(row["shape"] == s.rsplit(":", 1)[1] and path == s.rsplit(":", 1)[0] for s in args.fit)
            label = Path(path).name[:44] + (" *" if fitted else "")
            print(f"{label:48} {row['shape']:16} {len(configs):3} {r0:+10.2f} {r1:+9.2f} {p0:16.3f} {p1:6.3f} "
                  f"{rms(e0):18.3f} {rms(e1):6.3f}")
    print("\n* the row the energies were fitted to (in-sample)")
    if args.write_calibration:
        print(f"written: {write_energies(Path(args.write_calibration), fit_rows[0][0], energy, args.fit)}")
    return 0


def write_energies(path: Path, gpu, energy: dict, fitted_on: "list[str]") -> Path:
    """The energies into `path`'s params (its other fields kept; a new file names the GPU), written atomically."""
    from gemmgen.rank.calibration import CALIBRATION_FORMAT, read_calibration
    from gemmgen.tune.results import now, write_json_atomic

    if path.is_file():
        read_calibration(path)   # refuses a file that is not a calibration, naming the field
        data = json.loads(path.read_text())
    else:
        data = {"format": CALIBRATION_FORMAT, "gpu": gpu.key, "params": {}}
    data["params"].update({k: float(v) for k, v in energy.items()})
    data["power_fit"] = {"by": "benchmarks/power_model_fit.py", "fitted": now(), "on": list(fitted_on),
                         "energies": energy}
    write_json_atomic(path, data)
    return path


if __name__ == "__main__":
    from benchmarks.harness import run_main

    run_main(main, __file__)
