"""Dispatch folders across the M they serve: each folder's kernel for every M of a list, verified and graph-timed
beside cuBLAS (torch.matmul) in the same run.

    python3 benchmarks/dispatch_sweep.py --n 4096 --k 4096 --m 1..128:8 --bucketings pow2,auto [--out DIR]
    python3 benchmarks/dispatch_sweep.py --folders tuned/pow2 tuned/auto --m 33..64:1

Without --folders it builds, with public APIs, the model's dispatch folder for each bucketing over the M range
(tune.dispatch.model_buckets, the shape-set dry run: what `gemmgen tune --m ... --dry-run` exports); with
--folders it reads tuned ones (gemmgen tune --m ... --out). For every M: fresh random operands in the folder's
layouts (3 sets, rotated, so that L2 does not serve B), D poisoned with NaN, each folder's output checked against
an fp32 product (relative Frobenius error at most 1e-2; NaN fails), then each folder and torch.matmul graph-timed
(benchmarks/harness.graph_timed: 40 calls in a CUDA graph, median of 9 replays). The table's last rows are each
folder's geomean against cuBLAS and its geomean against the best folder per M.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

import harness
from harness import detected_gpu, run_main, write_report


def m_values(text: str) -> "list[int]":
    """'LO..HI:STEP' (every STEP-th M from LO, and HI), 'LO..HI' (step 1) or 'a,b,c'; InvalidInput otherwise."""
    from gemmgen.model.errors import InvalidInput

    try:
        if ".." in text:
            span, _, step = text.partition(":")
            lo, _, hi = span.partition("..")
            lo, hi, step = int(lo), int(hi), int(step or 1)
            values = list(range(lo, hi + 1, step)) if 1 <= lo <= hi and step >= 1 else []
            values = values if not values or values[-1] == hi else values + [hi]
        else:
            values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise InvalidInput("--m must be LO..HI[:STEP] or a,b,c with positive integers", text)
    return values


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folders", nargs="*", default=None, help="dispatch folders to compare (else model-built)")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--m", default="1..128:8", help="M values: LO..HI:STEP or a,b,c (default 1..128:8)")
    parser.add_argument("--layouts", default="rc", help="A and B layouts for model-built folders (default rc)")
    parser.add_argument("--bucketings", default="pow2,auto", help="model-built folders' bucketings")
    parser.add_argument("--out", default=None, metavar="DIR", help="write dispatch_sweep.json here")
    args = parser.parse_args(argv)
    import torch

    import gemmgen
    from gemmgen import Problem
    from gemmgen.tune.buckets import pow2_buckets
    from gemmgen.tune.dispatch import model_buckets

    ms = m_values(args.m)   # a bad --m is named before the GPU is looked for
    gpu = detected_gpu()
    folders: "dict[str, Path]" = {}
    scratch = tempfile.TemporaryDirectory(prefix="gemmgen-sweep-")
    if args.folders:
        folders = {Path(f).name or str(f): Path(f) for f in args.folders}
    else:
        layouts = {"r": "row", "c": "col"}
        base = Problem.create(max(ms), args.n, args.k, "bf16", layouts[args.layouts[0]], layouts[args.layouts[1]])
        for bucketing in args.bucketings.split(","):
            out = Path(scratch.name) / bucketing
            model_buckets(base, pow2_buckets(min(ms), max(ms), args.n, args.k), gpu, bucketing=bucketing,
                          out=str(out))
            folders[bucketing] = out
            print(f"built {bucketing}: {out}", file=sys.stderr)
    gemms = {label: gemmgen.load(str(path)) for label, path in folders.items()}
    layouts = {(g.payload["problem"]["a_layout"], g.payload["problem"]["b_layout"]) for g in gemms.values()}
    if len(layouts) != 1:
        raise gemmgen.InvalidInput("the folders compared must share their layouts", sorted(layouts))
    a_col, b_col = (layout == "col" for layout in layouts.pop())
    dtype = torch.bfloat16

    def randn(rows, cols, col_major):
        x = torch.randn(cols, rows, device="cuda").t() if col_major else torch.randn(rows, cols, device="cuda")
        return x.to(dtype)

    rows, report = [], []
    for m in ms:
        sets = [(randn(m, args.k, a_col), randn(args.k, args.n, b_col), torch.empty(m, args.n, device="cuda",
                                                                                       dtype=dtype))
                for _ in range(3)]
        a, b, _ = sets[0]
        ref = a.float() @ b.float()
        entry = {"m": m, "n": args.n, "k": args.k}
        for label, gemm in gemms.items():
            d = torch.full((m, args.n), float("nan"), device="cuda", dtype=dtype)
            try:
                gemm(a, b, d)
                torch.cuda.synchronize()
                err = float((d.float() - ref).norm() / ref.norm())
            except Exception as exc:  # a refusal or a failed launch: the row says so, the sweep goes on
                entry[label] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                continue
            ok = math.isfinite(err) and err <= 1e-2
            kernel = gemm.kernel_for(m, args.n, args.k).name
            t = harness.graph_timed(torch, lambda s, g=gemm: g(*s), sets) if ok else None
            entry[label] = {"rel_error": err, "ok": ok, "kernel": kernel, "time_s": t}
        entry["cublas_time_s"] = harness.graph_timed(torch, lambda s: torch.matmul(s[0], s[1], out=s[2]), sets)
        times = [entry[label].get("time_s") for label in gemms if entry.get(label, {}).get("time_s")]
        best = min(times) if times else None
        row = [str(m)]
        for label in gemms:
            e = entry[label]
            if not e.get("time_s"):
                row += [e.get("error", f"FAILED err {e.get('rel_error')}"), "-", "-"]
                continue
            e["vs_cublas"] = entry["cublas_time_s"] / e["time_s"]
            e["vs_best"] = best / e["time_s"]
            tile = e["kernel"].split("_cta")[-1].split("_w")[0] if "_cta" in e["kernel"] else e["kernel"][-30:]
            row += [f"{tile}{' swap' if e['kernel'].endswith('_swap') else ''}", f"{e['time_s'] * 1e6:.1f}",
                    f"{e['vs_cublas']:.2f}x"]
        row.append(f"{entry['cublas_time_s'] * 1e6:.1f}")
        rows.append(row)
        report.append(entry)
        print(" ".join(row), file=sys.stderr)

    def geo(xs):
        xs = [x for x in xs if x]
        return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")

    header = ["M"] + [f"{label} {what}" for label in gemms for what in ("tile", "us", "vs cuBLAS")] + ["cuBLAS us"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"{gpu.key}, N x K = {args.n}x{args.k}, graph-timed; folders: "
          + ", ".join(f"{label}={path}" for label, path in folders.items()))
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    summary = {label: {"geomean_vs_cublas": geo(e[label].get("vs_cublas") for e in report),
                       "geomean_vs_best": geo(e[label].get("vs_best") for e in report),
                       "failed": sum(1 for e in report if not e[label].get("time_s"))} for label in gemms}
    for label, s in summary.items():
        print(f"{label}: geomean {s['geomean_vs_cublas']:.3f}x cuBLAS, {s['geomean_vs_best']:.3f} of the best "
              f"folder per M, {s['failed']} failed")
    if args.out:
        write_report(args.out, "dispatch_sweep.json", {"gpu": gpu.key, "folders": {k: str(v) for k, v in
                                                                                    folders.items()},
                                                       "rows": report, "summary": summary})
    scratch.cleanup()
    return 0 if all(s["failed"] == 0 for s in summary.values()) else 1


if __name__ == "__main__":
    run_main(main, __file__)
