"""One gemmgen tree's bundles graph-timed beside torch.matmul, through that tree's own gemmgen.load: a regression
hunt across commits (how the 2026-11-25 PDL prefetch's cost was found: docs/perf-notes.md, "PDL's L2 prefetch").

    git archive REV | tar -x -C /tmp/trees/REV                     # each tree to compare
    (cd /tmp/trees/REV && PYTHONPATH=$PWD python3 -m gemmgen compile 1024 1024 1024 --config cfg.json \
        --out ROOT/sq1024)                                          # same configuration, that tree's templates
    python3 benchmarks/tree_timing.py /tmp/trees/REV ROOT OUT.json  # on the GPU, one process per tree

ROOT holds one folder per case named sq<N> (N x N x N, bf16, row-major A and B), each with one bundle. Bundles
written by `gemmgen compile` before it wrote cubin_sha256 need that field added first. 30 calls on 3 rotating
input sets captured in a CUDA graph, median of 15 replays, each case verified once against the fp32 product.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys


def time_case(torch, gemmgen, path: str, n: int) -> dict:
    """The bundle at `path` and torch.matmul on n x n x n bf16, graph-timed in turns."""
    kernel = gemmgen.load(path)
    sets = [tuple(torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            + (torch.empty(n, n, device="cuda", dtype=torch.bfloat16),) for _ in range(3)]
    stream = torch.cuda.Stream()

    def ours(a, b, d):
        try:   # older loaders take the stream as an argument; newer ones use torch's current stream
            kernel(a, b, d, stream=torch.cuda.current_stream().cuda_stream)
        except TypeError:
            kernel(a, b, d)

    def cublas(a, b, d):
        torch.matmul(a, b, out=d)

    a, b, d = sets[0]
    d.fill_(float("nan"))
    ours(a, b, d)
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    err = ((d.float() - ref).norm() / ref.norm()).item()   # NaN (an unwritten element) never passes below
    graphs = {}
    for name, fn in (("ours", ours), ("cublas", cublas)):
        with torch.cuda.stream(stream):
            for args in sets:
                fn(*args)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(30):
                fn(*sets[i % 3])
        graphs[name] = graph
    times = {"ours": [], "cublas": []}
    for _ in range(15):
        for name, graph in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / 30)
    return {"err": err, "ok": err < 1e-2, "ours_us": statistics.median(times["ours"]),
            "cublas_us": statistics.median(times["cublas"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", help="the gemmgen tree whose gemmgen.load runs the bundles")
    parser.add_argument("root", help="folder of cases sq<N>, each holding one bundle")
    parser.add_argument("out", help="JSON file to write")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.tree))   # that tree's gemmgen, not this one's
    import gemmgen
    import torch

    results = {}
    for case in sorted(os.listdir(args.root)):
        row = time_case(torch, gemmgen, glob.glob(f"{args.root}/{case}/*.json")[0], int(case[2:]))
        results[case] = row
        print(f"{os.path.basename(os.path.abspath(args.tree))} {case}: err {row['err']:.1e}, ours "
              f"{row['ours_us']:.2f} us, cuBLAS {row['cublas_us']:.2f} us, ratio {row['cublas_us'] / row['ours_us']:.3f}",
              flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
