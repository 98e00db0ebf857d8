#!/usr/bin/env python3
"""A few chosen kernels and cuBLAS, each verified and then launched a few times, for Nsight Compute to profile.

    PYTHONPATH=$PWD python3 benchmarks/ncu_kernels.py --shape M,N,K,LAYOUTS [--top 1] [--match TEXT]
        [--change KNOB=VALUE ...] [--calls 3]
    ncu --target-processes all -k regex:'gemmgen|nvjet|sm90_xmma' --clock-control none \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python3 benchmarks/ncu_kernels.py ...

The kernels are chosen as benchmarks/small_latency.py chooses them (the model's top few over every family, plus
the best-ranked configurations whose tag contains each --match text, and the first of those with each --change),
compiled, exported and loaded with gemmgen.load, verified once on fresh inputs with D poisoned. Then each, and
cuBLAS (torch.matmul), runs --calls times on a rotating input set, separated by a synchronisation, so the profiler
sees whole kernels in a known order; the order and each gemmgen kernel's entry name are printed first, to match the
profiler's rows. --time instead graph-times each (harness.graph_timed; the median of --passes interleaved passes, in
alternating order) and prints a table, for a run without the profiler. --table CSV [ID ...] prints a profiler CSV (ncu --csv --page details) as one
column per profiled kernel (the given IDs, or all), a row per metric: no GPU needed.

--edit NAME also runs, for each kernel it applies to, a variant made by editing its rendered source here (never a
switch in the templates): `unicast` (clustered kernels), a 2-CTA cluster whose CTAs each load the whole shared
operand themselves instead of multicasting a slice each (the cluster, its coupled ring and remote releases kept),
which tells what the multicast itself costs or saves; `desc_offset` (sm90 kernels), every wgmma's shared-memory
descriptors made as one descriptor per operand plus an offset, instead of each built from its address (the k-loop
37% shorter; measured and not kept: docs/perf-notes.md, "Descriptors by offset"); `k_rotate` (sm90 kernels), each
tile's k-loop started at a K offset of its own (benchmarks/k_rotate.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import run_main  # noqa: E402
from benchmarks.small_latency import changed  # noqa: E402

SETS = 3
# Source edits (--edit): name -> [(regular expression that must match once, replacement)].
EDITS = {
    "unicast": [(r"if \(A_MCAST\) \{", "if (false) {"), (r"if \(B_MCAST\) \{", "if (false) {")],
    # Each wgmma's descriptors as a descriptor made once plus an offset in 16-byte units (the start-address field is
    # the address over 16), instead of built from the address (~10 uniform instructions a wgmma): measured 2026-11-27,
    # not kept (docs/perf-notes.md, "Descriptors by offset").
    "desc_offset": [
        (r"smem_desc\(sb \+ wn \* 128 \+ kk \* B_KSTEP, B_LBO, B_SBO, B_MODE\)",
         "smem_desc(ring + A_BYTES + wn * 128, B_LBO, B_SBO, B_MODE) + (s * (STAGE_BYTES / 16) + kk * (B_KSTEP / 16))"),
        (r"smem_desc\(sa \+ \(wm \+ 64 \* mi\) \* 128 \+ kk \* A_KSTEP, A_LBO, A_SBO, A_MODE\)",
         "smem_desc(ring + wm * 128, A_LBO, A_SBO, A_MODE) + (s * (STAGE_BYTES / 16) + (mi * BLOCK_BYTES + kk * A_KSTEP) / 16)")],
    # The producer's k-loop rotated per tile: cluster tile (tm, tn) loads k-tile (t + tm + tn) mod its K tiles at
    # step t (a cluster's CTAs agree, so multicast slices match), so CTAs running side by side read different K
    # offsets (benchmarks/k_rotate.py). The sum's order changes, not its terms; only for kernels whose consumers
    # index nothing by k-tile (no fp8 block scales, no promotion).
    "k_rotate": [(r"const int k0 = kt \* BK;",
                  "const int k0 = (w.kt0 + (kt - w.kt0 + (int)((unsigned)(tm + tn) % (unsigned)w.kcount)) % w.kcount) * BK;")],
    # Stream-K without its fix-up: remainder units that hand a partial over run the ordinary epilogue instead (their
    # tile's D is written by several CTAs: wrong results by design, timed only), so the edit's time minus the
    # kernel's is what the partials, flags and adds cost (docs/perf-notes.md, "Stream-K range mode").
    "sk_nofixup": [(r"if \(w\.t >= walk\.dp_tiles\(num_ctiles\)\) \{", "if (false) {")],
    # The fix-up taken apart (timed only: wrong results): the owner adds without waiting for the flags (sk_nowait),
    # or waits and adds nothing (sk_noadd); its time minus the kernel's is the wait, or the partials' reads.
    "sk_nowait": [(r"for \(int z = 1; z < walk\.slices; \+\+z\) sk_wait\([^;]*;", ";"),
                  (r"for \(int c = lo; c < g; \+\+c\) sk_wait\([^;]*;", ";")],
    "sk_noadd": [(r"for \(int z = 1; z < walk\.slices; \+\+z\) sk_add\([^;]*;", ";"),
                 (r"for \(int c = lo; c < g; \+\+c\) sk_add\([^;]*;", ";")],
    # K-slice mode with the owner's slice (z = 0) longer by SKEW/2..SKEW K tiles than the others', so a contributor's
    # partial is stored and flagged while the owner still runs its main loop (verified: the sum is the same).
    **{f"sk_skew{e}": [(r"w\.kt0 = w\.z \* k_tiles / slices;\s*w\.kcount = \(w\.z \+ 1\) \* k_tiles / slices - w\.kt0;",
                       f"w.kt0 = w.z == 0 ? 0 : min(k_tiles - (slices - w.z), w.z * k_tiles / slices + {e} * (slices - w.z) / slices);"
                       f" const int sk_end = w.z + 1 == slices ? k_tiles : min(k_tiles - (slices - w.z - 1), (w.z + 1) * k_tiles / slices"
                       f" + {e} * (slices - w.z - 1) / slices); w.kcount = sk_end - w.kt0;")] for e in (4, 8)},
    # The fix-up's partial loads in groups of 16 or 32 float4s a thread instead of 8: more bytes in flight per SM
    # when the owner reads a 128 KB partial (ptxas reports no spills at either on the 128x256 and 256x128 tiles).
    "sk_group16": [(r"constexpr int SK_GROUP = 8;", "constexpr int SK_GROUP = 16;")],
    "sk_group32": [(r"constexpr int SK_GROUP = 8;", "constexpr int SK_GROUP = 32;")],
}
CLUSTERED_ONLY = {"unicast"}
# Edits whose results are wrong by design: timed without the verification every other variant passes.
UNVERIFIED = {"sk_nofixup", "sk_nowait", "sk_noadd"}


def edited(kernel, problem, built, edit: str):
    """`built` with EDITS[edit] applied to its source, recompiled and loaded; None where a pattern does not match."""
    from gemmgen.codegen.nvrtc import compile_source, options_for

    source = built.source
    for pattern, replacement in EDITS[edit]:
        source, count = re.subn(pattern, lambda _m, r=replacement: r, source, count=1)
        if count != 1:
            return None
    cubin, log = compile_source(built.name, source, options_for(kernel))
    return harness.load_compiled(kernel, problem, dataclasses.replace(built, cubin=cubin, source=source, log=log),
                                 "gemmgen-ncu-")


def table(path: str, ids: "list[str]") -> None:
    """Print the profiler's CSV at `path` as a metric x kernel table (kernels `ids`, or all of them)."""
    import csv

    rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
    col = {name: i for i, name in enumerate(rows[0])}
    values: "dict[str, dict[str, str]]" = {}
    names = {}
    for row in rows[1:]:
        if len(row) <= col["Metric Value"]:
            continue
        names[row[col["ID"]]] = f"{row[col['Kernel Name']][-40:]} grid {row[col['Grid Size']]}"
        values.setdefault(row[col["ID"]], {})[row[col["Metric Name"]]] = row[col["Metric Value"]]
    keys = [k for k in values if not ids or k in ids]
    for k in keys:
        print(f"{k:>4} {names[k]}")
    for metric in dict.fromkeys(m for k in keys for m in values[k]):
        print(f"{metric[:48]:48} " + " ".join(f"{values[k].get(metric, '-')[:12]:>12}" for k in keys))


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--table"]:
        table(argv[1], argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", required=True, metavar="M,N,K,LAYOUTS")
    ap.add_argument("--top", type=int, default=1, help="model-ranked configurations per shape (all families)")
    ap.add_argument("--distinct", action="store_true",
                    help="--top counts configurations that differ in more than their ring depth (the best-ranked "
                         "depth of each), so a sweep covers tiles, decompositions and clusters, not stage counts")
    ap.add_argument("--match", action="append", default=[], metavar="TEXT",
                    help="also the best-ranked configuration whose tag contains TEXT (repeatable)")
    ap.add_argument("--change", action="append", default=[], metavar="KNOB=VALUE[,KNOB=VALUE]",
                    help="also the first --match'ed configuration with these fields changed (repeatable)")
    ap.add_argument("--calls", type=int, default=3, help="launches of each kernel")
    ap.add_argument("--edit", action="append", default=[], choices=sorted(EDITS),
                    help="also each kernel it applies to with this source edit (repeatable)")
    ap.add_argument("--time", action="store_true", help="graph-time each kernel instead (no profiler needed)")
    ap.add_argument("--passes", type=int, default=3, help="--time: interleaved passes, the median is printed")
    args = ap.parse_args(argv)
    import torch

    gpu, ranked_by_shape = harness.ranked_shapes(args.shape)
    plans = []
    for problem, ranked in ranked_by_shape:
        if args.distinct:
            seen, chosen = set(), []
            for r in ranked:
                key = re.sub(r"_s\d+_", "_", r.config.tag)
                if key not in seen and len(chosen) < args.top:
                    seen.add(key)
                    chosen.append(r)
        else:
            chosen = list(ranked[:args.top])
        for text in args.match:
            matched = [r for r in ranked if text in r.config.tag and r not in chosen][:1]
            chosen += matched
            chosen += [v for r in matched for v in changed(r, args.change, problem, gpu) if v not in chosen]
        plans.append((problem, chosen))
    for problem, built in harness.compile_plans(plans, gpu.arch):
        sets = [harness.layout_operands(torch, problem, torch.bfloat16) for _ in range(SETS)]
        entries = [("cuBLAS", lambda s: torch.matmul(s[0], s[1], out=s[2]))]
        for _, kernel, compiled in built:
            gemm, _ = harness.checked_load(torch, kernel, problem, compiled, sets[0], "gemmgen-ncu-")
            if gemm is None:
                continue
            entries.append((f"{kernel.config.tag} (entry {kernel.name})", lambda s, g=gemm: g(*s)))
            for edit in args.edit:
                if edit in CLUSTERED_ONLY and kernel.config.cluster.size == 1:
                    continue
                variant = edited(kernel, problem, compiled, edit)
                err = variant and harness.poisoned_error(torch, variant, *sets[0])
                if variant is not None and edit in UNVERIFIED:
                    print(f"  {kernel.config.tag} +{edit}: error {err:.3g} (wrong by design, timed only)")
                elif variant is None or not err < 1e-2:
                    print(f"  {kernel.config.tag} +{edit}: {'does not apply' if variant is None else err}")
                    continue
                entries.append((f"{kernel.config.tag} +{edit}", lambda s, g=variant: g(*s)))
        if args.time:
            # Interleaved passes, so clock drift touches every kernel alike, in alternating order.
            seconds = harness.interleaved_times(torch, dict(entries), sets, harness.graph_timed, args.passes,
                                                alternate=True)
            for name, _ in entries:
                us = [t * 1e6 for t in seconds[name]]
                print(f"{problem.label:24} {statistics.median(us):8.2f} us ({f'{min(us):.1f}-{max(us):.1f}':>15})  "
                      f"{name[:100]}", flush=True)
        else:
            for i, (name, fn) in enumerate(entries):
                print(f"{problem.label} #{i}: {name}", flush=True)
                for j in range(args.calls):
                    fn(sets[j % SETS])
                    torch.cuda.synchronize()
        del sets
    return 0


if __name__ == "__main__":
    run_main(main, "ncu_kernels.py")
