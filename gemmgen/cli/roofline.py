"""`gemmgen roofline M N K`: the problem on the GPU's roofline, and the model's prediction for
configurations: given ones (--config FILE), or else a handful of reference configurations.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..model.arch import Gpu
from ..families.rules import check
from ..model.errors import InvalidInput
from .. import families
from ..calc.intensity import roofline
from ..rank.calibration import params_for
from ..rank.predict import predict
from ..model.problem import Problem
from ..model.tiles import TileConfig
from ._kernel import read_config
from ._common import (add_gpu_arg, add_problem_args, check_problem, print_json, problem_from_args, resolve_gpu, table,
                      text_arg)

def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "roofline", help="roofline and predicted time of a problem on a GPU",
        description="Minimum-traffic roofline of M x N x K on a GPU, and the model's prediction (tiled traffic, "
                    "L2 reuse, waves, occupancy, time, bound) for each --config, or for reference configurations.")
    add_problem_args(parser)
    add_gpu_arg(parser)
    parser.add_argument("--config", action="append", default=[], metavar="FILE", type=text_arg("--config"),
                        help="a configuration (YAML/JSON, or a manifest); repeat for several")
    parser.add_argument("--plot", metavar="FILE", type=text_arg("--plot"),
                        help="draw the roofline chart to FILE (.png, .svg, .pdf)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def reference_configs(problem: Problem, gpu: Gpu) -> "list[TileConfig]":
    """The reference configurations that are feasible for `problem` on `gpu`."""
    configs = [TileConfig.from_dict(d) for family in families.all_families() for d in family.examples]
    return [c for c in configs if not check(c, gpu, problem=problem)]


def label(config: TileConfig) -> str:
    """A short human label: family, CTA/warp tiles, stages, decomposition, cluster, flags."""
    # The architecture part of the family name is short, but two families may share it (the Ampere-style ones):
    # the one listed first in the registry keeps the short form, the others their whole name.
    first = next(f.name for f in families.all_families() if f.name.split("_")[0] == config.family.split("_")[0])
    short = config.family.split("_")[0] if config.family == first else config.family
    parts = [short, f"{config.cta}/{config.warp}", f"s{config.stages}",
             config.decomposition.tag]
    if config.cluster.size > 1:
        parts.append(f"cl{config.cluster}")
    return " ".join(parts + config.knob_tags())


def run(args) -> int:
    problem = problem_from_args(args)
    gpu = resolve_gpu(args.gpu)
    check_problem(problem, gpu)  # what tune and compile refuse, the roofline refuses the same way
    given = [read_config(p) for p in args.config]
    configs = given or reference_configs(problem, gpu)
    picked = not configs
    if picked:  # a problem no reference fits (fp8 block scaling, 3xTF32): the model's pick over the search space
        from ..rank.space import default_config

        configs = [default_config(problem, gpu)]
    roof = roofline(problem, gpu)
    # The model as a tune, a dry run, compile and bench price a configuration: with the GPU's calibration where one is
    # stored (it was the defaults here, so the same configuration read 601 TFLOP/s here and 685 in the dry run).
    params, calibration = params_for(gpu)
    # A given configuration that breaks a rule raises InvalidConfig here: one line, exit 2.
    ranked = sorted(((predict(problem, c, gpu, params), c) for c in configs), key=lambda pc: pc[0].time_s)
    best = ranked[0][0] if ranked else None

    if args.plot:
        from ..tune.plot import roofline_chart  # matplotlib only when asked

        roofline_chart(roof, args.plot, [(label(c), p) for p, c in ranked])

    if args.json:
        payload = roof.to_dict()
        payload["configs_given"] = bool(given)
        payload["configs"] = "given" if given else "model's pick" if picked else "reference"
        payload["predictions"] = [{"config": c.to_dict(), "label": label(c), "tag": c.tag, **p.to_dict()}
                                  for p, c in ranked]
        payload["predicted_bound"] = best.bound if best else None
        payload["calibration"] = str(calibration) if calibration is not None else None
        if args.plot:
            payload["plot"] = args.plot
        print_json(payload)
        return 0

    if calibration is not None:  # after every check: an error stays the one line on stderr
        print(f"note: the model predicts with the calibration in {calibration}", file=sys.stderr)
    p = problem
    dt = f"{p.a_dtype.value} x {p.b_dtype.value}" if p.mixed else p.a_dtype.value
    print(f"problem   {p.m}x{p.n}x{p.k} {dt}, A {p.a_layout.value}, B {p.b_layout.value}: "
          f"{p.flops / 1e9:.1f} GFLOP, minimum traffic {p.min_bytes / 1e6:.1f} MB")
    print(f"GPU       {gpu.key} ({gpu.name}): {roof.peak_flops / 1e12:.1f} TFLOP/s {dt} dense, "
          f"{roof.bandwidth / 1e12:.2f} TB/s DRAM, ridge {roof.ridge:.1f} FLOP/byte")
    print(f"roofline  {roof.min_intensity:.1f} FLOP/byte at minimum traffic: {roof.bound}-bound; "
          f"at best {roof.time_lower_bound_s * 1e6:.1f} us ({roof.attainable_flops / 1e12:.1f} TFLOP/s)")
    which = ("given configurations" if given else
             "model's pick over the search space (no reference configuration fits this problem; pass --config FILE "
             "for others)" if picked else "reference configurations (pass --config FILE for others)")
    print(f"\nmodel predictions, fastest first, for the {which}:")
    rows = [[label(c), pr.units, f"{pr.waves:.2f}", f"{pr.wave_efficiency:.2f}",
             pr.ctas_per_sm, f"{pr.occupancy:.2f}", f"{pr.tiled_bytes / 1e6:.1f}", f"{pr.dram_bytes / 1e6:.1f}",
             f"{pr.intensity:.1f}", pr.bound, pr.limiter, f"{pr.time_s * 1e6:.1f}", f"{pr.tflops:.1f}"]
            for pr, c in ranked]
    headers = ["configuration", "CTAs", "waves", "wave eff", "CTAs/SM", "occupancy", "tiled MB",
               "DRAM MB", "FLOP/byte", "bound", "limiter", "time us", "TFLOP/s"]
    if any(pr.prepass_bytes for pr, _ in ranked):
        # Operands copied before the main loop (rows TMA cannot read; fp8/tf32 stored MN-major, transposed).
        headers[-2:-2] = ["pack MB", "pack us"]
        for row, (pr, _) in zip(rows, ranked):
            row[-2:-2] = [f"{pr.prepass_bytes / 1e6:.1f}", f"{pr.prepass_s * 1e6:.1f}"]
    print(table(rows, headers))
    top_pred, top = ranked[0]
    # The fastest of the listed configurations, not the search's pick over the whole space (tune --dry-run).
    print(f"\nbound: {top_pred.bound} (fastest listed: {label(top)}: {top_pred.time_s * 1e6:.1f} us, "
          f"{top_pred.tflops:.1f} TFLOP/s, {top_pred.tflops * 1e12 / roof.peak_flops:.0%} of peak)")
    if top_pred.prepass_bytes:
        # Why there is a copy: TMA reads rows whose starts are 16-byte multiples; fp8 and tf32 wgmma read K-major
        # operands only; 3xTF32 writes the operands' small parts.
        why = []
        if not all(problem.operands.rows_aligned):
            why.append("rows that are not 16-byte multiples apart are copied to aligned ones")
        if problem.a_dtype.bytes != 2:
            why.append("fp8 and tf32 run K-major: A row-major, B column-major need no transpose")
        if getattr(top, "split3", False):
            why.append("3xTF32 writes the operands' small parts")
        print(f"pack: {top_pred.prepass_bytes / 1e6:.1f} MB read and written before the main loop, "
              f"{top_pred.prepass_s * 1e6:.1f} us of the time ({'; '.join(why)})")
    if top_pred.power_s:
        # The third ceiling: held at the board power limit, energy per second sets the clock (rank/predict.py).
        clock_bound = max(top_pred.compute_s, top_pred.memory_s)
        print(f"power: at the {gpu.power_limit_w:.0f} W limit the pick's energy needs {top_pred.power_s * 1e6:.1f} us "
              f"against {clock_bound * 1e6:.1f} us at the datasheet clock (wave by wave, with the last wave's empty "
              f"slots at their own draw: {top_pred.power_bound_s * 1e6:.1f} us)"
              + (": power-bound, so fewer bytes moved per FLOP is what speeds it up" if top_pred.bound == "power"
                 else ": not binding"))
    if top_pred.correction != 1.0:
        # The calibration's learned terms (rank/terms.py) scale the physical time: said, so the time above is
        # not read as below the ceilings printed beside it.
        print(f"terms: the calibration's learned terms scale the pick's time by {top_pred.correction:.3f}")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
