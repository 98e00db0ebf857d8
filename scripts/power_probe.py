#!/usr/bin/env python3
"""Energy per GEMM next to cuBLAS: at the card's power limit, is our kernel slower at the same energy, or does it
spend more energy per product?

    PYTHONPATH=$PWD python3 scripts/power_probe.py --shapes sq4096,llm_qkv --out $OUT [--seconds 1.5] [--rounds 3]
        [--config FILE ...] [--set NAME=VALUE ...]

Large GEMMs run at the H100's power limit (docs/perf-notes.md, "The store warp and the power limit": the main loop
at 99% of the per-clock peak, the clock at 1560-1650 MHz), so their time follows their energy. For each suite
shape (bf16, A and B row-major): the stored winner, each --config, all rendered with the --set template
parameters, and cuBLAS (torch.matmul) on the same operands, each launched back to back for --seconds, in
interleaved rounds. NVML (the driver's libnvidia-ml through ctypes) reads the energy counter before and after
each run and samples the SM clock and the power every 20 ms; CUDA events time the run. Every kernel is verified
once first (gemmgen.tune.bench: fresh inputs, NaN-poisoned D, fp32 cuBLAS reference). Prints per kernel the median
over rounds of: us per GEMM, TFLOP/s, mean W, median SM MHz, mJ per GEMM, and time and energy relative to cuBLAS;
writes power_probe.json to --out.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from ab_lab import parse_value  # noqa: E402
from gemmgen.model.errors import NoGpu  # noqa: E402
from lab_common import run_main, write_report  # noqa: E402
from lab_runners import runners as make_runners, verified_builds  # noqa: E402

NVML_CLOCK_SM = 1
SAMPLE_S = 0.02


class Nvml:
    """The three NVML readings this probe needs, from the driver's own library (no Python package)."""

    def __init__(self, index: int = 0):
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as exc:
            raise NoGpu("NVML (libnvidia-ml.so.1) is not loadable", str(exc)) from None
        self._check("nvmlInit_v2", self.lib.nvmlInit_v2())
        self.handle = ctypes.c_void_p()
        self._check("nvmlDeviceGetHandleByIndex_v2",
                    self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)))

    def _check(self, call: str, code: int) -> None:
        if code != 0:
            self.lib.nvmlErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{call} failed: {self.lib.nvmlErrorString(code).decode()} ({code})")

    def energy_mj(self) -> int:
        """Energy consumed since the driver loaded, in millijoules (Volta and later)."""
        value = ctypes.c_ulonglong()
        self._check("nvmlDeviceGetTotalEnergyConsumption",
                    self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(value)))
        return value.value

    def sm_mhz(self) -> int:
        value = ctypes.c_uint()
        self._check("nvmlDeviceGetClockInfo", self.lib.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM,
                                                                              ctypes.byref(value)))
        return value.value

    def power_w(self) -> float:
        value = ctypes.c_uint()
        self._check("nvmlDeviceGetPowerUsage", self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(value)))
        return value.value / 1000.0


def summarize(count: int, seconds: float, energy_mj: float, clocks: "list[int]", powers: "list[float]",
              flop: float) -> dict:
    """One run of `count` back-to-back GEMMs of `flop` each: per-GEMM time and energy, and what the card ran at.
    Energy comes from NVML's counter; where it did not advance over the run (seen on the lent H100's virtual
    machine, 2026-11-23), from the sampled power times the run's length, and `energy_source` says which."""
    per_s = seconds / count
    sampled = statistics.mean(powers) if powers else float("nan")
    source = "counter" if energy_mj > 0 else "sampled"
    if source == "sampled":
        energy_mj = sampled * seconds * 1e3
    return {"count": count, "us": per_s * 1e6, "tflops": flop / per_s / 1e12,
            "mj_per_gemm": energy_mj / count, "watts": energy_mj / 1e3 / seconds, "sampled_watts": sampled,
            "energy_source": source, "sm_mhz": statistics.median(clocks) if clocks else float("nan")}


def timed_run(nvml: Nvml, run_one, count: int, flop: float) -> dict:
    """`count` launches of run_one back to back, with NVML's energy counter around them and a sampler thread."""
    import torch

    clocks, powers, stop = [], [], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            clocks.append(nvml.sm_mhz())
            powers.append(nvml.power_w())
            time.sleep(SAMPLE_S)

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    sampler = threading.Thread(target=sample, daemon=True)
    e0 = nvml.energy_mj()
    sampler.start()
    start.record()
    for _ in range(count):
        run_one()
    end.record()
    torch.cuda.synchronize()
    e1 = nvml.energy_mj()
    stop.set()
    sampler.join()
    return summarize(count, start.elapsed_time(end) / 1e3, float(e1 - e0), clocks, powers, flop)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="sq4096")
    ap.add_argument("--config", action="append", default=[], help="a config YAML/JSON to probe besides the winner")
    ap.add_argument("--set", action="append", default=[], help="template parameters for every variant, NAME=VALUE")
    ap.add_argument("--seconds", type=float, default=1.5, help="length of each back-to-back run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    override = {}
    for item in args.set:
        name, value = item.split("=", 1)
        override[name] = parse_value(value)

    from gemmgen.runtime.device import Device

    nvml = Nvml()   # fails with one line on a machine without a GPU driver, before anything compiles
    variants = verified_builds(args.shapes, args.config, override)   # each verified first

    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "override": override,
              "seconds": args.seconds, "rounds": args.rounds, "shapes": {}}
    with Device() as dev:
        import torch

        report["device"] = dev.props.to_dict()
        for shape, (problem, built) in variants.items():
            flop = 2.0 * problem.m * problem.n * problem.k
            runners = make_runners(dev, problem, built)
            counts = {}
            for name, run_one in runners.items():
                # Warm up first, then time 50 launches for the count that lasts --seconds: the first calls of
                # cuBLAS carry its set-up, and counting from them gave a 44 ms cuBLAS run against 1.1 s of ours
                # (the first run on the H100, 2026-11-23).
                for _ in range(20):
                    run_one()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(50):
                    run_one()
                torch.cuda.synchronize()
                counts[name] = max(50, int(args.seconds / ((time.perf_counter() - t0) / 50)))
            runs = {name: [] for name in runners}
            for r in range(args.rounds):
                for name in (list(runners) if r % 2 == 0 else list(reversed(list(runners)))):
                    runs[name].append(timed_run(nvml, runners[name], counts[name], flop))
                print(f"{shape}: round {r + 1}/{args.rounds}", flush=True)
            med = {name: {key: statistics.median(run[key] for run in rs) for key in rs[0] if key != "energy_source"}
                   for name, rs in runs.items()}
            for row in med.values():
                row["time_vs_cublas"] = row["us"] / med["cuBLAS"]["us"]
                row["energy_vs_cublas"] = row["mj_per_gemm"] / med["cuBLAS"]["mj_per_gemm"]
            report["shapes"][shape] = {"median": med, "runs": runs}

    write_report(args.out, "power_probe.json", report)
    print(f"\ndevice {report['device'].get('name')}; medians over {args.rounds} rounds of {args.seconds} s each")
    print(f"{'shape':8s} {'kernel':90s} {'us':>8s} {'TFLOP/s':>8s} {'W':>6s} {'MHz':>5s} {'mJ/GEMM':>8s} "
          f"{'t/cuBLAS':>8s} {'E/cuBLAS':>8s}")
    for shape, row in report["shapes"].items():
        for name, md in row["median"].items():
            print(f"{shape:8s} {name[:90]:90s} {md['us']:8.1f} {md['tflops']:8.1f} {md['watts']:6.0f} "
                  f"{md['sm_mhz']:5.0f} {md['mj_per_gemm']:8.2f} {md['time_vs_cublas']:8.3f} {md['energy_vs_cublas']:8.3f}")
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
