#!/usr/bin/env python3
"""Split a kernel's time into a fixed part and a per-K part, beside cuBLAS, on the H100.

    PYTHONPATH=$PWD python3 scripts/k_sweep.py --shape sq1024 --ks 128,256,512,1024,2048 --out $OUT [--rounds 5]
        [--config scripts/configs/X.yaml] [--config-set cluster=1x2]

M and N come from the suite shape; K is swept. The kernels are the shape's stored winner (results/h100-sxm/tunes,
bf16, A and B row-major) and any --config, each with the --config-set changes applied as well when given. Every
kernel is verified at every K (gemmgen.tune.bench: fresh inputs, poisoned D, cuBLAS fp32 reference) in a watchdog
worker, then timed with cuBLAS in interleaved rounds (events behind a stream-holding kernel, rotated inputs).
A least-squares line T(K) = fixed + per_k * K over the medians says how much of the gap to cuBLAS is start-up,
epilogue and exit (fixed) and how much is the main loop (per K). Prints a short table last; writes k_sweep.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from lab_common import write_report  # noqa: E402
from ab_lab import SUITE, build, stored_winner, with_fields  # noqa: E402
from gemmgen.model.arch import Arch  # noqa: E402
from gemmgen.runtime.manifest import make_manifest  # noqa: E402
from gemmgen.model.problem import Problem  # noqa: E402
from gemmgen.model.tiles import Kernel, TileConfig  # noqa: E402


def fit(ks: "list[int]", ts: "list[float]") -> "tuple[float, float]":
    """Least-squares (intercept, slope) of ts over ks."""
    n = len(ks)
    mk, mt = sum(ks) / n, sum(ts) / n
    sxx = sum((k - mk) ** 2 for k in ks)
    slope = sum((k - mk) * (t - mt) for k, t in zip(ks, ts)) / sxx if sxx else 0.0
    return mt - slope * mk, slope


def main() -> int:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, choices=sorted(SUITE))
    ap.add_argument("--ks", default="128,256,512,1024,2048,4096")
    ap.add_argument("--config", action="append", default=[])
    ap.add_argument("--config-set", action="append", default=[])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    m, n, _ = SUITE[args.shape]
    ks = [int(k) for k in args.ks.split(",")]
    configs = [stored_winner(args.shape)[1]]
    configs += [TileConfig.from_dict(yaml.safe_load(Path(f).read_text())) for f in args.config]
    if args.config_set:
        fields = [item.split("=", 1) for item in args.config_set]
        configs += [with_fields(c, fields) for c in configs]
    cases = []
    for cfg in configs:
        for k in ks:
            problem = Problem.create(m, n, k, "bf16")
            kernel = Kernel(Arch.SM90A, problem.operands, cfg)
            _, (cubin, _, _) = build(kernel, {})
            cases.append({"config": cfg.tag, "k": k, "problem": problem, "manifest": make_manifest(kernel, problem),
                          "cubin": cubin})
    print(f"{len(cases)} kernels built ({len(configs)} configs x {len(ks)} K)", flush=True)

    from gemmgen.tune.worker import WorkerBenchmark

    worker = WorkerBenchmark()
    worker.start()
    for c in cases:
        o = worker.measure(c["manifest"], c["cubin"], c["problem"])
        c["verified"], c["rel_error"] = o.ok, o.rel_error
        if not o.ok:
            print(f"  FAIL {c['config']} K={c['k']}: {o.reason[:160]}", flush=True)
    worker.close()

    from gemmgen.tune.bench import GpuBenchmark

    bench = GpuBenchmark(verify=False)
    ours, cublas = {}, {}
    t0 = time.time()
    for r in range(args.rounds):
        order = cases if r % 2 == 0 else list(reversed(cases))
        for c in order:
            if not c["verified"]:
                continue
            meas = bench.measure(c["manifest"], c["cubin"], c["problem"])
            if meas.ok:
                ours.setdefault((c["config"], c["k"]), []).append(meas.time_s)
                cublas.setdefault(c["k"], []).append(bench.cublas_time(c["problem"], fresh=True))
        print(f"round {r + 1}/{args.rounds} at {time.time() - t0:.0f}s", flush=True)

    med = {key: statistics.median(v) * 1e6 for key, v in ours.items()}
    cub = {k: statistics.median(v) * 1e6 for k, v in cublas.items()}
    lines = {"cuBLAS": fit(sorted(cub), [cub[k] for k in sorted(cub)])}
    for cfg in configs:
        got = sorted(k for (tag, k) in med if tag == cfg.tag)
        if len(got) >= 2:
            lines[cfg.tag] = fit(got, [med[(cfg.tag, k)] for k in got])
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "device": bench.device.props.to_dict(), "shape": args.shape, "m": m, "n": n, "ks": ks,
              "cublas_us": cub, "ours_us": {f"{tag} K={k}": t for (tag, k), t in med.items()},
              "fits_us": {name: {"fixed_us": a, "per_1024_k_us": b * 1024} for name, (a, b) in lines.items()},
              "verified": sum(c["verified"] for c in cases), "kernels": len(cases)}
    write_report(args.out, "k_sweep.json", report)
    print(f"\n{args.shape}: M={m} N={n}; verified {report['verified']}/{len(cases)}; device {bench.device.props.name}")
    names = ["cuBLAS"] + [cfg.tag for cfg in configs]
    print("K       " + " ".join(f"{i:>9d}" for i in range(len(names))) + "   (columns: 0 = cuBLAS, then configs)")
    for k in ks:
        row = [cub.get(k)] + [med.get((cfg.tag, k)) for cfg in configs]
        print(f"{k:<8d}" + " ".join(f"{t:9.2f}" if t else f"{'-':>9s}" for t in row))
    print("fit: fixed us + us per 1024 K")
    for i, name in enumerate(names):
        if name in lines:
            a, b = lines[name]
            print(f"  {i} {a:8.2f} + {b * 1024:7.2f}  {name}")
    bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
