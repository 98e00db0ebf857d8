#!/usr/bin/env python3
"""The sm80_mma family on a real GPU, in one bounded run: environment, correctness matrix, and a sweep of
the search space against cuBLAS measured in the same run.

    # on the GPU machine (compiles there with NVRTC, over a process pool):
    PYTHONPATH=$PWD python3 scripts/gpu_check.py --out $OUT
    # or compile here first and carry the cubins (the GPU machine then needs no NVRTC):
    python3 scripts/gpu_check.py --prepare .gpucheck            # CPU only
    PYTHONPATH=$PWD python3 scripts/gpu_check.py --prepared .gpucheck --out $OUT

(a) NVRTC on this machine (version, and whether cuda.pathfinder finds libnvrtc), the device, the driver.
(b) Correctness: all four layouts x {bf16, f16} at a tile-multiple shape; M, N, K drawn from
    {1, 17, 1000, 3000, 4097}; beta, bias, ReLU and GELU epilogues; split-K; one case per CTA tile shape
    and shared-memory layout. Each is verified against cuBLAS through torch (fp32) with the dtype thresholds
    of gemmgen.tune.bench, NaN-poisoned outputs, fresh random inputs.
(c) The sweep: the model's top-N configurations (all of them with --top 0) on 4096^3 and 8192^3 bf16,
    timed with rotated inputs; cuBLAS timed in the same run; the best three re-measured, interleaved.
Every measurement runs in a worker process behind a watchdog (gemmgen.tune.worker), so a hang or an illegal
address costs one case, not the run; --budget-s stops the sweep early, keeping what was measured.
Writes gpu_check.json (everything) to --out and prints a short table last.
"""
from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmgen.model.arch import Arch, lookup_gpu  # noqa: E402
from gemmgen.model.problem import Problem  # noqa: E402
from gemmgen.rank.space import enumerate_space, heuristic_time  # noqa: E402
from gemmgen.model.tiles import DecompKind, Family, Kernel, SmemLayout, TileConfig  # noqa: E402

LAYOUTS = (("row", "row"), ("row", "col"), ("col", "row"), ("col", "col"))
ODD_SHAPES = ((4097, 1000, 17), (1, 4097, 3000), (17, 3000, 4097), (3000, 17, 1000), (1000, 1, 4097),
              (4097, 17, 1), (3000, 4097, 1000), (17, 1, 17))
EPILOGUES = (dict(beta=1.0), dict(bias=True), dict(activation="relu", bias=True),
             dict(alpha=0.5, beta=-2.0, bias=True, activation="gelu"))


@dataclass(frozen=True)
class Case:
    group: str
    problem: Problem
    config: TileConfig

    def kernel(self, arch: Arch) -> Kernel:
        return Kernel(arch, self.problem.operands, self.config)


# --- choosing configurations ---------------------------------------------------------------------

def ranked(problem: Problem, gpu, arch: Arch) -> "list[TileConfig]":
    """The sm80_mma space for this problem, best first by the roofline model (heuristic where it has no answer)."""
    try:
        from gemmgen.rank.predict import predict
    except ImportError:
        predict = None
    scored = []
    for config in enumerate_space(Family.SM80_MMA, gpu, arch, problem, problem.operands):
        model = float("inf")
        if predict is not None:
            try:
                model = predict(problem, config, gpu).time_s
            except Exception:  # noqa: BLE001 - unpriced config: rank it by the heuristic alone
                pass
        scored.append((model, heuristic_time(problem, config, gpu), config.tag, config))
    return [s[3] for s in sorted(scored, key=lambda s: s[:3])]


def build_cases(gpu, arch: Arch, top: int) -> "list[Case]":
    cases = []

    def pick(problem, want=None):
        configs = ranked(problem, gpu, arch)
        if want:
            configs = [c for c in configs if want(c)]
        return configs[0] if configs else None

    def add(group, problem, config):
        if config is not None:
            cases.append(Case(group, problem, config))

    for dtype in ("bf16", "f16"):
        for a, b in LAYOUTS:
            p = Problem.create(1024, 768, 512, dtype, a, b)
            add("layouts", p, pick(p))
    for i, (m, n, k) in enumerate(ODD_SHAPES):
        a, b = LAYOUTS[i % 4]
        p = Problem.create(m, n, k, ("bf16", "f16")[i % 2], a, b)
        add("odd-shapes", p, pick(p, lambda c: c.decomposition.kind is DecompKind.DATA_PARALLEL))
    for i, epilogue in enumerate(EPILOGUES):
        a, b = LAYOUTS[(i + 1) % 4]
        p = Problem.create(1000, 3000, 1000, ("bf16", "f16")[i % 2], a, b, **epilogue)
        add("epilogue", p, pick(p))
    for i, splits in enumerate((2, 4, 8)):
        a, b = LAYOUTS[i % 4]
        p = Problem.create(256, 200, 4097, ("bf16", "f16")[i % 2], a, b, beta=0.5 * i, bias=bool(i % 2))
        add("split-k", p, pick(p, lambda c, s=splits: c.decomposition.kind is DecompKind.SPLIT_K
                              and c.decomposition.splits == s))
    # One case per CTA tile, stage count and shared-memory layout, on a shape that is no tile multiple.
    p = Problem.create(3000, 1000, 4097, "bf16", "col", "col")
    seen = set()
    for config in ranked(p, gpu, arch):
        key = (config.cta, config.warp, config.smem_layout)
        if config.decomposition.kind is DecompKind.DATA_PARALLEL and key not in seen:
            seen.add(key)
            add("configs", p, config)
    for stages in (2, 5):
        add("configs", p, pick(p, lambda c, s=stages: c.stages == s and c.smem_layout is SmemLayout.PAD))
    for size in (4096, 8192):
        p = Problem.create(size, size, size, "bf16")
        configs = ranked(p, gpu, arch)
        for config in configs[:top] if top else configs:
            add(f"sweep{size}", p, config)
    return cases


# --- compiling ------------------------------------------------------------------------------------

def compile_cases(cases, arch: Arch, jobs: int) -> "tuple[dict, dict]":
    """name -> cubin bytes, and name -> compile error text."""
    from gemmgen.codegen.nvrtc import compile_many

    kernels = {}
    for case in cases:
        kernel = case.kernel(arch)
        kernels.setdefault(kernel.name, kernel)
    results = compile_many(list(kernels.values()), jobs)
    cubins, errors = {}, {}
    for name, result in zip(kernels, results):
        if hasattr(result, "cubin"):
            cubins[name] = result.cubin
        else:
            errors[name] = str(result)
    return cubins, errors


def prepare(folder: Path, arch: Arch, gpu, top: int, jobs: int) -> None:
    """Compile every case here and write the cubins and cases.json for a run elsewhere."""
    cases = build_cases(gpu, arch, top)
    started = time.time()
    cubins, errors = compile_cases(cases, arch, jobs)
    folder.mkdir(parents=True, exist_ok=True)
    for name, cubin in cubins.items():
        (folder / f"{name}.cubin").write_bytes(cubin)
    from gemmgen.codegen.nvrtc import nvrtc_version

    (folder / "cases.json").write_text(json.dumps({
        "arch": arch.value, "gpu": gpu.key, "top": top, "nvrtc": nvrtc_version(), "compile_errors": errors,
        "cases": [{"group": c.group, "problem": c.problem.to_dict(), "config": c.config.to_dict()} for c in cases]}))
    print(f"prepared {len(cases)} cases, {len(cubins)} cubins ({len(errors)} compile errors) in "
          f"{time.time() - started:.0f}s -> {folder}")


def load_prepared(folder: Path) -> "tuple[list[Case], dict, dict, Arch]":
    data = json.loads((folder / "cases.json").read_text())
    cases = [Case(c["group"], Problem.from_dict(c["problem"]), TileConfig.from_dict(c["config"])) for c in data["cases"]]
    arch = Arch.parse(data["arch"])
    cubins = {p.stem: p.read_bytes() for p in folder.glob("*.cubin")}
    return cases, cubins, data.get("compile_errors", {}), arch


# --- the environment ------------------------------------------------------------------------------

def environment() -> dict:
    from gemmgen.runtime import device

    env = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
           "python": platform.python_version()}
    try:
        from cuda.bindings import __version__ as bindings_version
    except ImportError:
        bindings_version = None
    env["cuda_bindings"] = bindings_version
    env["nvrtc_version"] = device.nvrtc_version()
    try:
        import cuda.pathfinder as pathfinder

        loaded = pathfinder.load_nvidia_dynamic_lib("nvrtc")
        env["nvrtc_library"] = getattr(loaded, "abs_path", None) or str(loaded)
    except Exception as exc:  # noqa: BLE001 - the answer is the point
        env["nvrtc_library"] = f"not found: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    try:
        import torch

        env["torch"] = torch.__version__
    except ImportError:
        env["torch"] = None
    with device.Device() as dev:
        env["device"] = dev.props.to_dict()
    return env


# --- measuring ------------------------------------------------------------------------------------

def manifest_for(case: Case, arch: Arch) -> dict:
    from gemmgen.runtime.manifest import make_manifest

    return make_manifest(case.kernel(arch), case.problem)


def run_cases(cases, cubins, errors, arch, policy, watchdog_s, deadline, log) -> "list[dict]":
    from gemmgen.tune.bench import GpuBenchmark
    from gemmgen.tune.worker import WorkerBenchmark

    results = []
    with WorkerBenchmark(factory=functools.partial(GpuBenchmark, policy=policy), watchdog_s=watchdog_s) as worker:
        for case in cases:
            kernel = case.kernel(arch)
            row = {"group": case.group, "problem": case.problem.label, "epilogue": case.problem.epilogue.tag,
                   "config": case.config.tag, "kernel": kernel.name}
            if time.time() > deadline:
                row.update(ok=False, reason="skipped: time budget spent", skipped=True)
            elif kernel.name not in cubins:
                row.update(ok=False, reason="compile error: " + errors.get(kernel.name, "no cubin"))
            else:
                outcome = worker.measure(manifest_for(case, arch), cubins[kernel.name], case.problem)
                row.update(outcome.to_dict())
                row.pop("times_s", None)
            results.append(row)
            log(row)
        cublas = {}
        for size in sorted({c.problem.m for c in cases if c.group.startswith("sweep")}):
            if time.time() < deadline + 60:
                cublas[size] = worker.cublas_time(Problem.create(size, size, size, "bf16"))
        results.append({"group": "cublas", "times": cublas})
    return results


def remeasure(best, cases_by_tag, cubins, arch, policy, rounds: int, log) -> dict:
    """The best few of one sweep, measured again `rounds` times, interleaved: median per config."""
    from gemmgen.tune.bench import GpuBenchmark
    from gemmgen.tune.worker import WorkerBenchmark

    import statistics

    times = {tag: [] for tag in best}
    paired = {tag: [] for tag in best}
    cublas = []
    problem = cases_by_tag[best[0]].problem
    with WorkerBenchmark(factory=functools.partial(GpuBenchmark, policy=policy), watchdog_s=60) as worker:
        for _ in range(rounds):
            # cuBLAS in every round beside the configs: the card's clocks drift with its power draw, so a
            # figure from another minute would skew the ratio (docs/perf-notes.md, "cuBLAS per round").
            c = worker.cublas_time(problem, fresh=True)
            if c:
                cublas.append(c)
            for tag in best:
                case = cases_by_tag[tag]
                outcome = worker.measure(manifest_for(case, arch), cubins[case.kernel(arch).name], case.problem)
                if outcome.ok:
                    times[tag].append(outcome.time_s)
                    if c:
                        paired[tag].append(c / outcome.time_s)

    out = {tag: statistics.median(ts) for tag, ts in times.items() if ts}
    ratios = {tag: statistics.median(rs) for tag, rs in paired.items() if rs}
    log({"remeasured": out, "cublas": cublas, "paired_ratio": ratios})
    return {"configs": out, "cublas": statistics.median(cublas) if cublas else None, "paired_ratio": ratios}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepare", metavar="DIR", help="compile here (no GPU) into DIR and stop")
    parser.add_argument("--prepared", metavar="DIR", help="use cases and cubins compiled by --prepare")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for gpu_check.json")
    parser.add_argument("--top", type=int, default=48, help="sweep the model's top N configurations (0: all)")
    parser.add_argument("--gpu", default="h100", help="catalogue GPU the space is checked against")
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--budget-s", type=float, default=300, help="stop starting new cases after this long")
    parser.add_argument("--groups", default="", help="comma-separated groups to run (default: all)")
    args = parser.parse_args(argv)
    gpu, arch = lookup_gpu(args.gpu), Arch.parse(args.arch)
    if args.prepare:
        prepare(Path(args.prepare), arch, gpu, args.top, args.jobs)
        return 0

    started = time.time()
    deadline = started + args.budget_s
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"environment": environment()}
    print("environment:", json.dumps(report["environment"]), flush=True)

    if args.prepared:
        cases, cubins, errors, arch = load_prepared(Path(args.prepared))
        report["compiled"] = f"locally, carried ({len(cubins)} cubins)"
    else:
        cases = build_cases(gpu, arch, args.top)
        t0 = time.time()
        cubins, errors = compile_cases(cases, arch, args.jobs)
        report["compiled"] = f"on this machine: {len(cubins)} cubins in {time.time() - t0:.0f}s, {args.jobs} jobs"
    if args.groups:
        wanted = set(args.groups.split(","))
        cases = [c for c in cases if c.group in wanted]
    print(f"{len(cases)} cases; {report['compiled']}; {len(errors)} compile errors", flush=True)

    from gemmgen.tune.bench import TimingPolicy

    log_file = open(out_dir / "gpu_check.log", "w")

    def log(row):
        line = json.dumps(row, default=str)
        log_file.write(line + "\n")
        log_file.flush()
        if not row.get("ok", True) or "remeasured" in row or row.get("group") == "cublas":
            print(line, flush=True)

    quick = TimingPolicy(warmup_s=0.002, measure_s=0.005, min_reps=3)
    matrix = [c for c in cases if not c.group.startswith("sweep")]
    sweep = [c for c in cases if c.group.startswith("sweep")]
    results = run_cases(matrix, cubins, errors, arch, quick, 60, deadline, log) if matrix else []
    results += run_cases(sweep, cubins, errors, arch, TimingPolicy(), 60, deadline, log) if sweep else []
    report["results"] = results

    summary = {}
    cublas_times = {}
    for row in results:
        if row.get("group") == "cublas":
            cublas_times.update(row["times"])
    for size in (4096, 8192):
        rows = [r for r in results if r.get("group") == f"sweep{size}" and r.get("ok")]
        if not rows:
            continue
        rows.sort(key=lambda r: r["time_s"])
        best = [r["config"] for r in rows[:3]]
        by_tag = {c.config.tag: c for c in sweep if c.problem.m == size}
        again = remeasure(best, by_tag, cubins, arch, TimingPolicy(), 5, log) if time.time() < deadline + 90 else {}
        flops = 2 * size ** 3
        cublas_s = (again or {}).get("cublas") or cublas_times.get(size)
        finals = (again or {}).get("configs") or {rows[0]["config"]: rows[0]["time_s"]}
        tag, best_s = min(finals.items(), key=lambda kv: kv[1])
        summary[size] = {"best_config": tag, "time_s": best_s, "tflops": flops / best_s / 1e12,
                         "cublas_time_s": cublas_s, "cublas_tflops": flops / cublas_s / 1e12 if cublas_s else None,
                         # The ratio: the median of per-round ratios where cuBLAS was re-timed beside each round.
                         "vs_cublas": ((again or {}).get("paired_ratio") or {}).get(tag)
                                      or (cublas_s / best_s if cublas_s else None),
                         "vs_cublas_of_medians": cublas_s / best_s if cublas_s else None,
                         "measured_configs": len(rows),
                         "failed_configs": sum(1 for r in results if r.get("group") == f"sweep{size}" and not r.get("ok")),
                         "top5": [(r["config"], r["tflops"]) for r in rows[:5]]}
    report["summary"] = summary
    report["elapsed_s"] = time.time() - started
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))

    # The short table, last.
    print()
    groups = {}
    for row in results:
        if row.get("group") in (None, "cublas") or row["group"].startswith("sweep"):
            continue
        g = groups.setdefault(row["group"], [0, 0, 0.0])
        g[0] += 1
        g[1] += bool(row.get("ok"))
        if row.get("rel_error") is not None and row.get("ok"):
            g[2] = max(g[2], row["rel_error"])
    dev = report["environment"]["device"]
    print(f"gpu_check on {dev['name']} (driver CUDA {dev['driver']}), {report['environment']['date']}, "
          f"NVRTC here: {report['environment']['nvrtc_version']}")
    print(f"{'correctness group':<18}{'passed':>10}{'max rel err':>14}")
    for name, (total, passed, worst) in groups.items():
        print(f"{name:<18}{passed:>5}/{total:<4}{worst:>14.2e}")
    for row in results:
        if row.get("group") not in (None, "cublas") and not row["group"].startswith("sweep") and not row.get("ok"):
            print(f"  FAIL {row['problem']} {row['epilogue']} {row['config']}: {row.get('reason', '')[:160]}")
    print(f"{'sweep (bf16)':<14}{'configs':>9}{'best TFLOP/s':>14}{'cuBLAS':>9}{'ratio':>8}  best config")
    for size, s in summary.items():
        cublas = f"{s['cublas_tflops']:.0f}" if s["cublas_tflops"] else "n/a"
        ratio = f"{s['vs_cublas']:.2f}x" if s["vs_cublas"] else "n/a"
        print(f"{size}^3{'':<8}{s['measured_configs']:>5}/{s['measured_configs'] + s['failed_configs']:<3}"
              f"{s['tflops']:>14.1f}{cublas:>9}{ratio:>8}  {s['best_config']}")
    print(f"elapsed {report['elapsed_s']:.0f}s; full report: {out_dir / 'gpu_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
