#!/usr/bin/env python3
"""Where a kernel's time goes, per CTA, from %globaltimer stamps (Nsight is not on the lent machine).

    PYTHONPATH=$PWD python3 scripts/timeline.py --shapes sq1024,sq4096 --out $OUT [--runs 5] [--set epi_fast=true]

For each suite shape's stored sm90 winner (results/h100-sxm/tunes, bf16, A and B row-major, data-parallel only)
the template is rendered with its `timeline` lab switch (plus any --set): thread 0 of each CTA stamps kernel
entry and the end of the start barrier; consumer warpgroup 0's first thread stamps the first full stage, the end
of each tile's main loop and of its epilogue (first 16 tiles), and its exit. The kernel runs once to warm up,
then --runs times with the stamps read back after each; D is checked against cuBLAS once (gemmgen.tune.bench's
worker). Prints, per shape, medians over CTAs and runs: launch skew, start-up, first data, main loop per tile,
the boxes' fill and the epilogue per tile, the SM clock (%clock64 over %globaltimer) and the main
loop's FLOP per SM clock (wgmma's peak is 4096 for 16-bit inputs), and the first and last CTA exits from the
first CTA's entry; writes timeline.json. With the ping-pong schedule warpgroup 0 owns every other tile, so its
"main loop" spans the other warpgroup's tile too (and FLOP per clock reads half).
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from lab_common import write_report  # noqa: E402
from ab_lab import build, parse_value, stored_winner  # noqa: E402
from gemmgen.model.arch import Arch  # noqa: E402
from gemmgen.families.sm90_wgmma import launch as sm90  # noqa: E402
from gemmgen.runtime.manifest import make_manifest  # noqa: E402
from gemmgen.model.tiles import Family, Kernel  # noqa: E402

TL_TILES = 16                # the template's TL_TILES
TL_SLOTS = 4 + 3 * TL_TILES  # the template's TL_SLOTS


def summarize(stamps, grid: int, tile_flops: float = 0.0) -> dict:
    """Medians in microseconds over the CTAs of one run. stamps: 2 x grid x TL_SLOTS u64, first %globaltimer ns,
    then %clock64 at the same moments (0 = not written). tile_flops: 2*BM*BN*K, for FLOP per SM clock."""
    rows = [stamps[c * TL_SLOTS:(c + 1) * TL_SLOTS] for c in range(grid)]
    clks = [stamps[(grid + c) * TL_SLOTS:(grid + c + 1) * TL_SLOTS] for c in range(grid)]
    t0 = min(int(r[0]) for r in rows if r[0])
    us = lambda a, b: (int(b) - int(a)) / 1e3  # noqa: E731
    start = [us(r[0], r[1]) for r in rows if r[0] and r[1]]
    first = [us(r[0], r[2]) for r in rows if r[0] and r[2]]
    loops, fills, epis, tiles, loop_clk, mhz = [], [], [], [], [], []
    for r, c in zip(rows, clks):
        prev_end, prev_clk = r[2], c[2]
        n = 0
        for i in range(TL_TILES):
            end_loop, end_fill, end_epi = r[4 + 3 * i], r[5 + 3 * i], r[6 + 3 * i]
            if not end_loop or not end_epi:
                break
            loops.append(us(prev_end, end_loop))
            epis.append(us(end_loop, end_epi))
            if end_fill:
                fills.append(us(end_loop, end_fill))
            cycles = int(c[4 + 3 * i]) - int(prev_clk)
            loop_clk.append(cycles)
            if end_loop > prev_end:
                mhz.append(cycles / (int(end_loop) - int(prev_end)) * 1e3)
            prev_end, prev_clk = end_epi, c[6 + 3 * i]
            n += 1
        tiles.append(n)
    exits = [int(r[3]) for r in rows if r[3]]
    med = lambda v: statistics.median(v) if v else float("nan")  # noqa: E731
    return {"ctas": grid, "launch_skew_us": (max(int(r[0]) for r in rows if r[0]) - t0) / 1e3,
            "start_us": med(start), "first_data_us": med(first), "tiles_per_cta": med(tiles),
            "mainloop_per_tile_us": med(loops), "fill_per_tile_us": med(fills), "epilogue_per_tile_us": med(epis),
            "mainloop_clk_per_tile": med(loop_clk), "sm_mhz": med(mhz),
            "mainloop_flop_per_clk": tile_flops / med(loop_clk) if loop_clk and tile_flops else float("nan"),
            "last_exit_us": (max(exits) - t0) / 1e3 if exits else float("nan"),
            "first_exit_us": (min(exits) - t0) / 1e3 if exits else float("nan")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="sq1024,sq2048,sq4096")
    ap.add_argument("--set", action="append", default=[], help="extra template parameters, NAME=VALUE")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    override = {"timeline": True}
    for item in args.set:
        name, value = item.split("=", 1)
        override[name] = parse_value(value)

    import numpy as np

    from gemmgen.tune.bench import GpuBenchmark
    from gemmgen.runtime.device import Device

    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "override": override,
              "shapes": {}}
    built = {}   # shape -> (problem, manifest, cubin), timed here and verified below
    with Device() as dev:
        report["device"] = dev.props.to_dict()
        for shape in args.shapes.split(","):
            problem, cfg = stored_winner(shape)
            m, n, k = problem.m, problem.n, problem.k
            kernel = Kernel(Arch.SM90A, problem.operands, cfg)
            if cfg.family is not Family.SM90_WGMMA or sm90.splits(kernel) > 1 or sm90.is_streamk(kernel):
                print(f"skip {shape}: its winner {cfg.tag} is not a data-parallel sm90 kernel")
                continue
            _, (cubin, _, resources) = build(kernel, override)
            manifest = make_manifest(kernel, problem)
            grid = manifest["launches"][0]["grid"][0]
            manifest["workspace_bytes"] = 2 * grid * TL_SLOTS * 8
            built[shape] = (problem, manifest, cubin)
            module = dev.load(cubin)
            bufs = {name: dev.alloc(rows * cols * 2) for name, rows, cols in (("A", m, k), ("B", k, n), ("D", m, n))}
            dev.fill_uniform(bufs["A"], "bf16", m * k, seed=1)
            dev.fill_uniform(bufs["B"], "bf16", k * n, seed=2)
            ws = dev.alloc(manifest["workspace_bytes"])
            seq = dev.prepare(manifest, module, {name: b.ptr for name, b in bufs.items()}, ws)
            seq.run()
            dev.synchronize(f"{shape} warm-up")
            runs = []
            for _ in range(args.runs):
                dev.memset(ws, 0)
                seq.run()
                dev.synchronize(f"{shape} timeline run")
                runs.append(summarize(dev.copy_to_host(ws, np.uint64, 2 * grid * TL_SLOTS), grid, 2.0 * cfg.cta.m * cfg.cta.n * k))
            keys = runs[0].keys()
            report["shapes"][shape] = {"config": cfg.tag, "grid": grid,
                                       "median": {key: statistics.median(r[key] for r in runs) for key in keys},
                                       "runs": runs}
            for b in list(bufs.values()) + [ws]:
                dev.free(b)
            dev.unload(module)
            print(f"{shape}: {cfg.tag} grid {grid}: {report['shapes'][shape]['median']}", flush=True)

    # The stamps must not change the answer: the same kernel verified once against cuBLAS (gemmgen.tune.bench).
    bench = GpuBenchmark(verify=True)
    for shape, row in report["shapes"].items():
        problem, manifest, cubin = built[shape]
        meas = bench.measure(manifest, cubin, problem)
        row["verified"], row["time_us"] = meas.ok, (meas.time_s or 0) * 1e6
        row["cublas_us"] = bench.cublas_time(problem, fresh=True) * 1e6
    bench.close()

    write_report(args.out, "timeline.json", report)
    print(f"\ndevice {report['device'].get('name')}; medians over CTAs, then over {args.runs} runs (us)")
    print(f"{'shape':10s} {'ok':>3s} {'kernel':>7s} {'cuBLAS':>7s} {'skew':>5s} {'start':>6s} {'1st data':>8s} "
          f"{'tiles':>5s} {'loop/t':>7s} {'fill/t':>6s} {'epi/t':>6s} {'MHz':>5s} {'FLOP/clk':>8s} {'1st exit':>8s} {'last exit':>9s}")
    for shape, row in report["shapes"].items():
        md = row["median"]
        print(f"{shape:10s} {'yes' if row.get('verified') else 'NO':>3s} {row.get('time_us', 0):7.1f} "
              f"{row.get('cublas_us', 0):7.1f} {md['launch_skew_us']:5.2f} {md['start_us']:6.2f} "
              f"{md['first_data_us']:8.2f} {md['tiles_per_cta']:5.1f} {md['mainloop_per_tile_us']:7.2f} "
              f"{md['fill_per_tile_us']:6.2f} {md['epilogue_per_tile_us']:6.2f} {md['sm_mhz']:5.0f} "
              f"{md['mainloop_flop_per_clk']:8.0f} {md['first_exit_us']:8.2f} {md['last_exit_us']:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
