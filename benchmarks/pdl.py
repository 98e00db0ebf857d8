#!/usr/bin/env python3
"""Programmatic dependent launch (PDL): gemmgen's sm90 kernels back to back with and without it, against cuBLAS.

    PYTHONPATH=$PWD python3 benchmarks/pdl.py [--top 2] [--only NAME ...] [--out DIR]

sm90_wgmma manifests mark the GEMM launch `programmatic`: the runtime launches it with the programmatic-stream-
serialization attribute, so it may start (barriers, tensor-map and L2 prefetches) while the previous kernel of the
stream finishes, and waits for it (griddepcontrol.wait) before touching global memory. The gain is the launch gap
and start-up between consecutive kernels: a few microseconds, which matters where a product takes 10-20 us (decode).

For each case the model's top sm90 configurations are compiled, exported and loaded with gemmgen.load (public APIs),
verified once on fresh inputs with D poisoned, then timed as CALLS launches back to back on rotating input sets
(queued behind a hold kernel so the host's enqueueing is not timed), median of ROUNDS: the bound launch sequence with
PDL (as shipped), the same launches without the attribute, and torch.matmul (cuBLAS) on the same tensors. Bandwidth
is the bytes of A, B and D over the time per call (the H100 copies at 3.02 TB/s). A table is printed last.

--edits also times a variant of each kernel made by editing its rendered source here (never a switch in the
templates), launched with PDL: `late` (no griddepcontrol.launch_dependents at the start, so the next kernel is
scheduled only when this one ends), `early` (the call put back where a kernel does without it: the swapped tiles of
M <= 64), `nostore`, `nomma`, `bare` (where a decode-sized product's time goes; wrong results by design). Until 2026-11-27 the kernels also prefetched their first stages into L2 before
the grid dependency wait; this script at commit 3cbc04c (--edits `noprefetch`, `noprefetch_late`) measured that
prefetch costing 0.1-3.4 us a call, and it was removed (docs/perf-notes.md, "PDL's L2 prefetch"). --config FILE
(JSON, repeatable) times the given sm90_wgmma configurations instead of the model's picks.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import detected_gpu, load_compiled, run_main, write_report  # noqa: E402
from benchmarks.misaligned import candidates, operand  # noqa: E402

CASES = {  # name: (M, N, K, A layout, B layout)
    "m1": (1, 4096, 4096, "row", "col"),
    "m8": (8, 4096, 4096, "row", "col"),
    "m16": (16, 4096, 4096, "row", "col"),
    "m32": (32, 4096, 4096, "row", "col"),
    "m64": (64, 4096, 4096, "row", "col"),
    "m128": (128, 4096, 4096, "row", "col"),
    "m16_up": (16, 14336, 4096, "row", "col"),
    "sq512": (512, 512, 512, "row", "col"),
    "sq1024": (1024, 1024, 1024, "row", "col"),
    "sq2048": (2048, 2048, 2048, "row", "col"),
    "sq4096": (4096, 4096, 4096, "row", "col"),
    "t513": (513, 4096, 4096, "row", "col"),     # 513 tokens through a 4096-wide nn.Linear: one wave of 128 tiles
}
# Source edits (--edits): name -> [(regular expression that must match once, replacement)].
START_DEPENDENTS = r"\n    allow_dependents\(\);\n"
# Where a decode-sized product's fixed time goes (wrong results by design; timing only): `nostore`, the swapped
# epilogue stages the tile but stores nothing of D; `nomma`, the consumers wait for each stage and release it
# without issuing its wgmmas (the TMA stream and the ring alone); `bare`, both.
NO_STORE = (r"if \(drow < N && dcol < M\) \{", "if (false) {")
NO_MMA = (r"wgmma_step\(acc\[mi\], da, db, \(kt > 0 \|\| kk > 0\) \? 1 : 0\);", "(void)da; (void)db;")
# `early`: the swapped tiles of M <= 64 let their dependents start only at the end (since 2026-11-27 13:16); this
# puts the call back at the start, where every other kernel has it.
LATE_DEPENDENTS = r"// Launched with PDL, the next kernel is scheduled when this one ends[^\n]*\n"
# `krot`: each CTA walks its k-tiles from a different start (blockIdx.x * 7 tiles along, wrapping), so the CTAs'
# concurrent loads fall at different column offsets of the weights' rows instead of all at the same one (the sum is
# the same up to fp32 ordering; plain bf16/f16 kernels only).
K_ROTATE = (r"const int k0 = kt \* BK;",
            "const int k0 = (w.kt0 + (kt - w.kt0 + (int)(blockIdx.x * 7u % (unsigned)w.kcount)) % w.kcount) * BK;")
EDITS = {"late": [(START_DEPENDENTS, "\n")], "early": [(LATE_DEPENDENTS, "allow_dependents();\n")],
         "nostore": [NO_STORE], "nomma": [NO_MMA], "bare": [NO_STORE, NO_MMA], "krot": [K_ROTATE]}
SETS = 4            # rotating input sets: 4 x 33.5 MB of B exceed the 50 MB L2
ROUNDS, CALLS = 9, 100
HOLD_CYCLES = 6_000_000   # ~3.5 ms at 1.7 GHz: covers enqueueing CALLS launches from Python


def timed(torch, run, stream) -> float:
    """Median over rounds of the time per call of CALLS back-to-back calls, queued behind a hold kernel."""
    samples = []
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(HOLD_CYCLES)
        start.record(stream)
        for i in range(CALLS):
            run(i)
        end.record(stream)
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / CALLS)
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=2, help="model picks of sm90_wgmma (default 2)")
    parser.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    parser.add_argument("--edits", action="store_true", help="also the source-edited variants (see above)")
    parser.add_argument("--config", action="append", default=None, metavar="FILE",
                        help="an sm90_wgmma configuration (JSON) to time instead of the model's picks; repeatable")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import json
    import re
    import torch

    from gemmgen import Kernel, Problem, TileConfig
    from gemmgen.codegen.nvrtc import compile_many, compile_source, options_for
    from gemmgen.families.rules import check
    from gemmgen.runtime.launch import LaunchSequence

    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = detected_gpu()
    device = torch.cuda.get_device_name()
    stream = torch.cuda.current_stream()
    handle = stream.cuda_stream
    rows, summary = [], []
    for name, (m, n, k, a, b) in CASES.items():
        if args.only and name not in args.only:
            continue
        problem = Problem.create(m, n, k, "bf16", a, b)
        if args.config:
            configs = [TileConfig.from_dict(json.loads(Path(f).read_text())) for f in args.config]
            configs = [c for c in configs if not check(c, gpu, gpu.arch, problem)]
        else:
            configs = [r.config for r in candidates(problem, gpu, args.top) if r.config.family == "sm90_wgmma"]
            configs = configs[:args.top]
        kernels = [Kernel(gpu.arch, problem.operands, c) for c in configs]
        sets = [(operand(torch, m, k, a, torch.bfloat16), operand(torch, k, n, b, torch.bfloat16),
                 torch.empty(m, n, device="cuda", dtype=torch.bfloat16)) for _ in range(SETS)]
        moved = sum(x.numel() * 2 for x in sets[0])

        def cublas(i):
            s = sets[i % SETS]
            torch.matmul(s[0], s[1], out=s[2])

        best = None
        for config, kernel, built in zip(configs, kernels, compile_many(kernels)):
            if isinstance(built, Exception):
                print(f"  {name} {config.tag}: compile failed: {str(built)[:160]}", flush=True)
                continue
            gemm = load_compiled(kernel, problem, built, "gemmgen-pdl-")
            err = harness.poisoned_error(torch, gemm, *sets[0])
            bound = [gemm.bind(*s) for s in sets]
            plain = [LaunchSequence([dataclasses.replace(l, programmatic=False) for l in q.launches], q.workspace,
                                    "plain", q.zero_each_run) for q in bound]
            assert any(l.programmatic for l in bound[0].launches), "the manifest marks no launch programmatic"
            runs = {"pdl": lambda i, q=bound: q[i % SETS].run(handle),
                    "plain": lambda i, q=plain: q[i % SETS].run(handle), "cublas": cublas}
            edited_errors = {}
            for edit in (EDITS if args.edits else ()):
                source, matched = built.source, True
                for pattern, replacement in EDITS[edit]:
                    source, count = re.subn(pattern, lambda _m, r=replacement: r, source, count=1, flags=re.S)
                    matched = matched and count == 1
                if not matched:   # e.g. `late` on a kernel that already starts its dependents late
                    print(f"  {name} {config.tag[:60]}: edit {edit} does not apply", flush=True)
                    continue
                cubin, log = compile_source(built.name, source, options_for(kernel))
                variant = load_compiled(kernel, problem, dataclasses.replace(built, cubin=cubin, source=source,
                                                                             log=log), "gemmgen-pdl-")
                edited_errors[edit] = harness.poisoned_error(torch, variant, *sets[0])
                runs[edit] = lambda i, q=[variant.bind(*s) for s in sets]: q[i % SETS].run(handle)
            for run in runs.values():
                for i in range(SETS):
                    run(i)
            torch.cuda.synchronize()
            us = {key: [] for key in runs}
            for _ in range(3):   # interleaved, so clock drift touches all three alike
                for key, run in runs.items():
                    us[key].append(timed(torch, run, stream) * 1e6)
            us = {key: statistics.median(v) for key, v in us.items()}
            row = {"case": name, "shape": f"{m}x{n}x{k}", "config": config.tag, "rel_error": err,
                   "edits_us": {e: us[e] for e in edited_errors}, "edits_rel_error": edited_errors,
                   "pdl_us": us["pdl"], "plain_us": us["plain"], "cublas_us": us["cublas"],
                   "pdl_vs_cublas": us["cublas"] / us["pdl"], "plain_vs_cublas": us["cublas"] / us["plain"],
                   "pdl_GBps": moved / us["pdl"] / 1e3, "ok": err == err and err < 1e-2}
            rows.append(row)
            edited = "".join(f", {e} {us[e]:.2f} us (err {edited_errors[e]:.1e})" for e in edited_errors)
            print(f"  {name} {config.tag[:60]}: err {err:.1e}, pdl {us['pdl']:.2f} us, plain {us['plain']:.2f} us, "
                  f"cuBLAS {us['cublas']:.2f} us{edited}", flush=True)
            if row["ok"] and (best is None or row["pdl_us"] < best["pdl_us"]):
                best = row
            gemm.close()
        summary.append(best or {"case": name, "config": None})
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "calls": CALLS,
              "rounds": ROUNDS, "rows": rows, "summary": summary}
    if args.out:
        write_report(args.out, "pdl.json", report)
    print(f"\n{device}, {report['date']}, bf16, {CALLS} calls back to back, us per call (median of {ROUNDS} rounds)")
    print(f"{'case':8} {'shape':16} {'PDL':>7} {'plain':>7} {'cuBLAS':>7} {'x cuB':>6} {'plain x':>7} {'GB/s':>6}  config")
    for s in summary:
        if s.get("config") is None:
            print(f"{s['case']:8} no verified kernel")
            continue
        print(f"{s['case']:8} {s['shape']:16} {s['pdl_us']:7.2f} {s['plain_us']:7.2f} {s['cublas_us']:7.2f} "
              f"{s['pdl_vs_cublas']:6.2f} {s['plain_vs_cublas']:7.2f} {s['pdl_GBps']:6.0f}  {s['config'][:60]}")
    return 0 if all(s.get("config") for s in summary) else 1


if __name__ == "__main__":
    run_main(main, __file__)
