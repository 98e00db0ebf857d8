#!/usr/bin/env python3
"""Stream-K (sm90_wgmma, `decomposition: streamk`) on the H100, in one bounded device call.

    PYTHONPATH=$PWD python3 scripts/streamk_lab.py --out $OUT [--rounds 3] [--only sq1024,odd3000]

Compiles on the GPU machine (NVRTC, process pool), then:
(a) correctness, each case in a watchdog worker (gemmgen.tune.worker): every Stream-K tile shape on 3000^3; odd
    M, N, K from {1, 17, 1000, 3000, 4097} in all four layouts; fewer tiles than SMs; K of one tile; a tile
    count that is a multiple of the grid (the data-parallel path alone); bias/GELU and beta epilogues; f16;
    range mode (last wave more than half full) on seven problems; then every timed kernel, so that a hang is
    the watchdog's (20 s) and not this process's.
    gemmgen.tune.bench's verification: fresh inputs, D and workspace NaN-poisoned, relative Frobenius error vs
    an fp32 cuBLAS reference, NaN fails.
(b) the flags' invariant: one binding run twice, D poisoned between the runs, the second result verified
    and the flag words read back (all zero after a complete run, or the next launch would misread them).
(c) timing of the suite shapes (bf16, A and B row-major; --only picks shapes): the stored winner of each shape
    (results/h100-sxm/tunes) against the Stream-K variants, and cuBLAS re-timed in every round; rounds
    interleave all cases; gemmgen.tune.bench's timing (events, warm-up, rotated inputs, median).
Prints a short table last and writes streamk_lab.json to --out.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmgen.model.arch import Arch  # noqa: E402
from gemmgen.runtime.manifest import make_manifest, workspace_zero  # noqa: E402
from gemmgen.model.problem import Problem  # noqa: E402
from gemmgen.model.tiles import Kernel, TileConfig  # noqa: E402

from ab_lab import SUITE  # noqa: E402  (the suite's shapes: one list for the lab scripts)

LAYOUTS = (("row", "row"), ("row", "col"), ("col", "row"), ("col", "col"))


def sk(cta: str, warp: str, stages: int = 4) -> TileConfig:
    wn = int(warp.split("x")[1])
    return TileConfig.from_dict({"family": "sm90_wgmma", "cta": cta, "warp": warp, "mma": f"64x{wn}x16",
                                 "stages": stages, "raster": {"order": "row", "group": 8},
                                 "decomposition": {"kind": "streamk"}, "cluster": "1x1",
                                 "warp_specialized": True, "persistent": True})


SK = {"sk128x256s4": sk("128x256x64", "64x256x64"), "sk128x256s3": sk("128x256x64", "64x256x64", 3),
      "sk256x128s3": sk("256x128x64", "128x128x64", 3), "sk128x128s4": sk("128x128x64", "64x128x64"),
      "sk128x128s6": sk("128x128x64", "64x128x64", 6), "sk256x128s4": sk("256x128x64", "128x128x64"),
      "sk64x128s6": sk("64x128x64", "64x128x64", 6), "sk64x256s4": sk("64x256x64", "64x256x64")}


def correctness_cases() -> "list[tuple[str, Problem, TileConfig]]":
    cases = []
    for name, config in SK.items():
        cases.append(("3000^3 " + name, Problem.create(3000, 3000, 3000, "bf16"), config))
    # Odd extents wherever TMA allows them (leading dimensions must stay 16-byte multiples).
    odd = ((4097, 1000, 3000, "row", "row"), (1, 4096, 3000, "row", "row"), (17, 3000, 4104, "row", "col"),
           (4097, 17, 1000, "row", "col"), (3000, 4104, 17, "col", "row"), (1000, 1, 4104, "col", "col"),
           (4104, 17, 4097, "col", "row"), (17, 1000, 17, "row", "row"))
    names = list(SK)
    for i, (m, n, k, a, b) in enumerate(odd):
        for j in (0, 1):
            name = names[(2 * i + j) % len(names)]
            p = Problem.create(m, n, k, ("bf16", "f16")[(i + j) % 2], a, b)
            cases.append((f"odd {m}x{n}x{k} {a[0]}{b[0]} {name}", p, SK[name]))
    cases += [
        ("fewer tiles than SMs 1024^3", Problem.create(1024, 1024, 1024, "bf16"), SK["sk128x128s4"]),
        ("one K tile 2000x3000x64", Problem.create(2000, 3000, 64, "bf16"), SK["sk128x256s4"]),
        ("132 tiles = grid 1536x2816x1000", Problem.create(1536, 2816, 1000, "bf16"), SK["sk128x256s4"]),
        ("largek 1024x1024x65536", Problem.create(1024, 1024, 65536, "bf16"), SK["sk128x256s4"]),
        ("skinny 16x4096x4096", Problem.create(16, 4096, 4096, "f16"), SK["sk64x128s6"]),
        ("bias+gelu f16 cc", Problem.create(3000, 1000, 4104, "f16", "col", "col", bias=True, activation="gelu"),
         SK["sk256x128s4"]),
        ("beta -2, alpha 0.5, bias, relu rc", Problem.create(1000, 3000, 2056, "bf16", "row", "col", alpha=0.5,
                                                                beta=-2.0, bias=True, activation="relu"),
         SK["sk128x128s6"]),
    ]
    # Range mode (the last wave more than half full: its K iterations dealt out to every CTA in contiguous
    # ranges): ranges of one or two K tiles, tiles shared by two and three CTAs, odd edges, every epilogue.
    cases += [
        ("range 4096^3 rr", Problem.create(4096, 4096, 4096, "bf16"), SK["sk128x256s3"]),
        ("range 4096x6144x4096 rc", Problem.create(4096, 6144, 4096, "bf16", "row", "col"), SK["sk128x256s4"]),
        ("range K of 2 tiles 4000x4000x120 rr f16 bias+gelu",
         Problem.create(4000, 4000, 120, "f16", bias=True, activation="gelu"), SK["sk128x256s3"]),
        ("range 8192x8192x1000 cr", Problem.create(8192, 8192, 1000, "bf16", "col", "row"), SK["sk128x256s4"]),
        ("range 4097x6144x4104 beta/alpha/relu 256x128",
         Problem.create(4097, 6144, 4104, "bf16", alpha=0.5, beta=-2.0, bias=True, activation="relu"),
         SK["sk256x128s3"]),
        ("range 2000x3000x3000 rc f16 128x128 s6", Problem.create(2000, 3000, 3000, "f16", "row", "col"),
         SK["sk128x128s6"]),
        ("range 4096x4096x14336 rr", Problem.create(4096, 4096, 14336, "bf16"), SK["sk128x256s4"]),
    ]
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.families.rules import check

    gpu = lookup_gpu("h100")
    return [c for c in cases if not check(c[2], gpu, Arch.SM90A, c[1])]


def winner_config(m: int, n: int, k: int) -> "TileConfig | None":
    path = ROOT / "results" / "h100-sxm" / "tunes" / f"{m}x{n}x{k}_bf16_rr_bf16_linear.json"
    if not path.is_file():
        return None
    return TileConfig.from_dict(json.loads(path.read_text())["winner"]["config"])


RANGE_SHAPES = ("sq4096", "llm_qkv", "llm_down", "sq8192")


def timing_cases(only: "set[str] | None") -> "list[tuple[str, str, Problem, TileConfig]]":
    # Range mode where the last wave is more than half full: sq4096 (116 of 132), llm_qkv (108), sq8192 (68 of
    # 132 for 128x256), llm_down (116).
    pick = {"sq1024": ["sk128x128s4", "sk128x128s6", "sk128x256s4"],
            "sq4096": ["sk128x256s3", "sk128x256s4", "sk256x128s3"], "llm_qkv": ["sk128x256s3", "sk128x256s4"],
            "llm_down": ["sk128x256s4"],
            "sq8192": ["sk128x128s6", "sk128x256s4"], "llm_up": ["sk128x256s4"],
            "skinny_m16": ["sk64x128s6", "sk64x256s4"], "skinny_m128": ["sk128x128s6", "sk128x256s4"],
            "largek": ["sk128x256s4", "sk128x128s6"],
            "odd3000": ["sk128x256s4", "sk128x128s6", "sk256x128s4"]}
    out = []
    for shape, (m, n, k) in SUITE.items():
        if (only and shape not in only) or shape not in pick:
            continue
        p = Problem.create(m, n, k, "bf16")
        best = winner_config(m, n, k)
        if best is not None:
            out.append((shape, "stored winner " + best.tag, p, best))
        for name in pick[shape]:
            out.append((shape, name, p, SK[name]))
            if shape in RANGE_SHAPES:
                # The same tile data-parallel: what range mode is measured against.
                d = SK[name].to_dict()
                d["decomposition"] = {"kind": "dp"}
                out.append((shape, "dp" + name[2:], p, TileConfig.from_dict(d)))
    return out


def compile_all(kernels: "list[Kernel]") -> dict:
    from gemmgen.codegen.nvrtc import compile_many

    unique = {}
    for k in kernels:
        unique.setdefault(k.name, k)
    results = compile_many(list(unique.values()))
    return dict(zip(unique, results))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--skip-correctness", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, args.only.split(","))) or None
    arch = Arch.SM90A
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}

    checks = [] if args.skip_correctness else correctness_cases()
    timed = timing_cases(only)
    t0 = time.time()
    compiled = compile_all([Kernel(arch, p.operands, c) for _, p, c in checks] +
                           [Kernel(arch, p.operands, c) for _, _, p, c in timed])
    bad = {n: str(r) for n, r in compiled.items() if not hasattr(r, "cubin")}
    spills = {n: r.spill_bytes for n, r in compiled.items() if hasattr(r, "cubin") and r.spill_bytes}
    print(f"compiled {len(compiled)} kernels in {time.time() - t0:.0f}s; errors {len(bad)}; spilling {spills}",
          flush=True)
    report["compile_errors"], report["spills"] = bad, spills

    def artefacts(problem, config):
        kernel = Kernel(arch, problem.operands, config)
        c = compiled[kernel.name]
        if not hasattr(c, "cubin"):
            return None, None
        return make_manifest(kernel, problem, c), c.cubin

    # (a) correctness, behind the watchdog
    from gemmgen.tune.worker import WorkerBenchmark

    results = []
    if checks:
        worker = WorkerBenchmark(watchdog_s=20.0)   # every case runs in well under a second
        worker.start()
        # The timed kernels too, so that a hang is caught here by the watchdog, not in this process below.
        for label, problem, config in checks + [(f"timed {shape} {label}", p, c) for shape, label, p, c in timed]:
            manifest, cubin = artefacts(problem, config)
            if manifest is None:
                results.append({"case": label, "ok": False, "reason": "compile error"})
                continue
            o = worker.measure(manifest, cubin, problem)
            results.append({"case": label, "ok": o.ok, "rel_error": o.rel_error, "reason": o.reason[:200],
                            "grid": manifest["launches"][0]["grid"][0]})
            print(f"  {'ok  ' if o.ok else 'FAIL'} {label:48s} rel {o.rel_error if o.rel_error is not None else '-'}"
                  f" {o.reason[:100]}", flush=True)
        worker.close()
    report["correctness"] = results

    # (b) the flags' invariant, and (c) timing, in this process
    from gemmgen.tune.bench import GpuBenchmark, threshold, verdict
    from gemmgen.tune.reference import compare

    bench = GpuBenchmark(verify=False)
    dev = bench.device
    invariant = []
    passed = {r["case"] for r in results if r["ok"]}
    for label, problem, config in ([c for c in checks if ("3000^3 sk128x256" in c[0] or "fewer" in c[0]
                                    or "largek" in c[0] or c[0].startswith("range")) and c[0] in passed]
                                   if checks else []):
        manifest, cubin = artefacts(problem, config)
        module = dev.load(cubin)
        ws = dev.alloc(manifest["workspace_bytes"])
        dev.poison(ws, "f32")
        s = bench._sets_for(problem, 1)[0]
        bench._refill(s, problem)
        seq = dev.prepare(manifest, module, s.pointers.as_dict(), ws)
        seq.run(0)
        dev.poison(s.buffers["D"], problem.c_dtype)
        seq.run(0)
        dev.synchronize("second run")
        r = compare(dev, problem, s.pointers, "auto")
        why = verdict(r.rel_error, r.nonfinite, threshold(problem.c_dtype, problem.k), problem, r.sample_rel_error)
        zero = workspace_zero(manifest)["bytes"]
        import numpy as np

        flags = dev.copy_to_host(ws, np.uint32, zero // 4)
        entry = {"case": label, "second_run_rel_error": r.rel_error, "ok": not why, "reason": why,
                 "flags_nonzero_after": int((flags != 0).sum())}
        invariant.append(entry)
        print(f"  invariant {label}: second run rel {r.rel_error:.3g} {why or 'ok'}; nonzero flags after: "
              f"{entry['flags_nonzero_after']}", flush=True)
        dev.free(ws)
        dev.unload(module)
    report["invariant"] = invariant

    rows = {}
    for r in range(args.rounds):
        bench._cublas.clear()
        order = timed if r % 2 == 0 else list(reversed(timed))
        for shape, label, problem, config in order:
            key = (shape, label)
            if checks and f"timed {shape} {label}" not in passed:
                continue   # failed or hung under the watchdog
            manifest, cubin = artefacts(problem, config)
            if manifest is None:
                continue
            m = bench.measure(manifest, cubin, problem)
            cub = bench.cublas_time(problem, fresh=True)
            row = rows.setdefault(key, {"shape": shape, "config": label, "times": [], "cublas": [], "fail": ""})
            if m.ok:
                row["times"].append(m.time_s)
                row["cublas"].append(cub)
            else:
                row["fail"] = m.reason[:160]
        print(f"round {r + 1}/{args.rounds} done at {time.time() - t0:.0f}s", flush=True)
    table = []
    for (shape, label), row in rows.items():
        if row["times"]:
            t, c = statistics.median(row["times"]), statistics.median(row["cublas"])
            paired = statistics.median(cb / tt for tt, cb in zip(row["times"], row["cublas"]))
            flops = 2.0 * SUITE[shape][0] * SUITE[shape][1] * SUITE[shape][2]
            table.append({**row, "time_s": t, "cublas_s": c, "tflops": flops / t / 1e12,
                          "cublas_tflops": flops / c / 1e12, "ratio": c / t, "paired_ratio": paired})
        else:
            table.append({**row, "ratio": None})
    report["timing"] = table
    report["device"] = dev.props.to_dict()
    (out / "streamk_lab.json").write_text(json.dumps(report, indent=1, default=str))

    n_ok = sum(r["ok"] for r in results)
    print(f"\ncorrectness {n_ok}/{len(results)}; invariant {sum(e['ok'] and not e['flags_nonzero_after'] for e in invariant)}"
          f"/{len(invariant)}; device {dev.props.name}")
    print(f"{'shape':12s} {'config':70s} {'TF/s':>7s} {'cuBLAS':>7s} {'ratio':>6s} {'paired':>6s}")
    for row in table:
        if row.get("ratio") is None:
            print(f"{row['shape']:12s} {row['config'][:70]:70s} FAILED {row['fail'][:60]}")
        else:
            print(f"{row['shape']:12s} {row['config'][:70]:70s} {row['tflops']:7.1f} {row['cublas_tflops']:7.1f} "
                  f"{row['ratio']:6.3f} {row['paired_ratio']:6.3f}")
    bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
