#!/usr/bin/env python3
"""Odd-shape lab: are TMA loads from rows that do not start on 128-byte boundaries what makes odd3000 slow?

    python scripts/odd_shapes_lab.py build     # here: render + NVRTC -> lab_build/odd/*.cubin, *.json
    python scripts/odd_shapes_lab.py device    # on the H100 (carry lab_build/odd): verify and time

bf16, A and B row-major (B MN-major), as the suite's odd3000. Cases: 3000^3 with ld 3000 (6000-byte rows,
6000 mod 128 = 112), 3072^3, 2944^3 (ld a multiple of 64 elements), and 3000^3 with A and B copied into
buffers of leading dimension 3008 or 3072 (128-byte rows): the kernel alone over padded operands, the pad
copy alone (torch copy into a strided view), and pad copy + kernel in one graph (one padded workspace reused,
as a real 'pad' launch would). The tensor maps are encoded by hand over the padded strides; the lda/ldb/ldc/ldd
kernel scalars are overridden with them.

Timing (as hopper_lab suite-perf): each case is a CUDA graph of REPS launches over rotated input sets (more
bytes than the 50 MB L2), the median of 3 replays per round, all cases interleaved in each round, median
over ROUNDS; 'paired' is the median per-round ratio to the same shape's cuBLAS (torch.matmul, TF32 off).
Verification: D poisoned with NaN before one launch, relative Frobenius error against fp32 torch.matmul.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import hopper_lab as lab  # noqa: E402
from gemmgen.runtime.manifest import operands_dict
from gemmgen.model.arch import Arch  # noqa: E402
from gemmgen.families.sm90_wgmma import launch as sm90  # noqa: E402
from gemmgen.model.problem import Problem  # noqa: E402
from gemmgen.model.tiles import Kernel  # noqa: E402

BUILD = ROOT / "lab_build" / "odd"
REPS, ROUNDS = 10, int(os.environ.get("ODD_ROUNDS", "7"))


def variants() -> "dict[str, Kernel]":
    """The two best sm90 configs for odd3000; align 8 holds for every ld used here (all multiples of 8)."""
    ops = lab.operands(b="row")
    g8 = ("row", 8)
    return {"dp256": Kernel(Arch.SM90A, ops, lab.config(raster=g8)),                                   # 128x256x64 s4
            "dp128s4": Kernel(Arch.SM90A, ops, lab.config("128x128x64", "64x128x64", 4, raster=g8))}   # 128x128x64 s4


def build() -> None:
    BUILD.mkdir(parents=True, exist_ok=True)
    for label, kernel in variants().items():
        src = lab.render(kernel)
        cubin, log = lab.compile_cubin(kernel, src)
        (BUILD / f"{label}.cu").write_text(src)
        (BUILD / f"{label}.cubin").write_bytes(cubin)
        meta = {"label": label, "name": kernel.name, "role": "perf", "config": kernel.config.to_dict(),
                "operands": operands_dict(kernel.operands), "log": log}
        (BUILD / f"{label}.json").write_text(json.dumps(meta, indent=1))
        print(label, kernel.name, " | ".join(l.strip() for l in log.splitlines() if "registers" in l or "spill" in l))


def bind(runner, m, n, k, a_store, b_store, d, lda, ldb, ldd, sm_count=132):
    """One launch over operands with explicit leading dimensions (elements): tensor maps and ld scalars."""
    problem = Problem.create(m, n, k, "bf16", "row", "row")
    runs, _ = sm90.launches(runner.kernel, problem, sm_count, runner.max_clusters)
    launch = runs[0]
    specs = {p["name"]: dict(p) for p in launch["params"] if p["kind"] == "tensormap"}
    specs["tmA"]["strides_bytes"] = [lda * 2]
    specs["tmB"]["strides_bytes"] = [ldb * 2]
    values = {"tmA": runner.tma.encode(specs["tmA"], a_store.data_ptr()),
              "tmB": runner.tma.encode(specs["tmB"], b_store.data_ptr()),
              "C": 0, "D": d.data_ptr(), "bias": 0, "workspace": 0,
              "lda": lda, "ldb": ldb, "ldc": ldd, "ldd": ldd}
    return runner.funcs[launch["entry"]], launch, values


def device() -> None:
    torch = lab._init_torch()
    from cuda.bindings import driver
    from gemmgen.runtime import tma
    props = torch.cuda.get_device_properties(0)
    _, drv = driver.cuDriverGetVersion()
    header = {"device": props.name, "sms": props.multi_processor_count, "driver_api": drv,
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    print(json.dumps(header), flush=True)
    runners = {label: lab.Runner(BUILD / f"{label}.json") for label in variants()}
    bf = torch.bfloat16
    dev = "cuda"

    def padded(rows, cols, ld):
        return torch.empty(rows, ld, device=dev, dtype=bf)[:, :cols]

    def n_sets(m, n, k):
        return max(2, min(8, -(-150_000_000 // ((m * k + k * n + m * n) * 2))))

    def graph_of(body):
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            body(s.cuda_stream)   # warm-up outside capture
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            body(torch.cuda.current_stream().cuda_stream)
        return g

    def verify(d, ref):
        dd = d.float()
        nan = int(torch.isnan(dd).sum())
        return (float((dd - ref).norm() / ref.norm()) if nan == 0 else float("nan")), nan

    cases = []  # dicts: name, group (cuBLAS key), flop, graph, err, nan, keep (tensors the graph uses)

    def add(name, group, flop, body, err=None, nan=None, keep=None):
        try:
            graph = graph_of(body)
        except Exception as exc:  # report the case and go on: one device call has to bring back the rest
            print(json.dumps({"case": name, "error": repr(exc)[-400:]}), flush=True)
            return
        print(json.dumps({"case": name, "err": err, "nan": nan}), flush=True)
        cases.append({"name": name, "group": group, "flop": flop, "graph": graph, "err": err, "nan": nan,
                      "keep": keep, "t": []})

    def setup():
        """Build every case; a failure past the first cases still lets the others be timed."""
        # ---- aligned-ld and plain shapes: cuBLAS and both kernels, operands at ld = N = K
        for size in (3000, 3072, 2944):
            m = n = k = size
            sets = n_sets(m, n, k)
            bufs = [(torch.randn(m, k, device=dev, dtype=bf), torch.randn(k, n, device=dev, dtype=bf),
                     torch.empty(m, n, device=dev, dtype=bf)) for _ in range(sets)]
            ref = bufs[0][0].float() @ bufs[0][1].float()
            flop = 2.0 * m * n * k
            group = f"{size}^3"
            bufs[0][2].fill_(float("nan"))
            torch.matmul(bufs[0][0], bufs[0][1], out=bufs[0][2])
            torch.cuda.synchronize()
            err, nan = verify(bufs[0][2], ref)
            add(f"cuBLAS {size}^3 ld{size}", group, flop,
                lambda st, bufs=bufs, sets=sets: [torch.matmul(bufs[i % sets][0], bufs[i % sets][1], out=bufs[i % sets][2])
                                                  for i in range(REPS)], err, nan, bufs)
            for label, runner in runners.items():
                bound = [bind(runner, m, n, k, a, b, d, k, n, n) for a, b, d in bufs]
                bufs[0][2].fill_(float("nan"))
                tma.launch_sm90(*bound[0], torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                err, nan = verify(bufs[0][2], ref)
                add(f"{label} {size}^3 ld{size}", group, flop,
                    lambda st, bound=bound, sets=sets: [tma.launch_sm90(*bound[i % sets], st) for i in range(REPS)],
                    err, nan, bufs)
            if size == 3000:
                base3000 = (bufs, ref, sets)

        # ---- 3000^3 over padded operands: kernel alone, pad copy alone, pad + kernel
        bufs, ref, sets = base3000
        m = n = k = 3000
        flop = 2.0 * m * n * k
        group = "3000^3"
        for ld in (3008, 3072):
            pads = [(padded(m, k, ld), padded(k, n, ld)) for _ in range(sets)]
            for (a, b, _), (ap, bp) in zip(bufs, pads):
                ap.copy_(a)
                bp.copy_(b)
            d_pad = [padded(m, n, ld) for _ in range(sets)]
            outs = [torch.empty(m, n, device=dev, dtype=bf) for _ in range(sets)]
            add(f"cuBLAS 3000^3 A,B ld{ld}", group, flop,
                lambda st, pads=pads, outs=outs: [torch.matmul(pads[i % sets][0], pads[i % sets][1], out=outs[i % sets])
                                                  for i in range(REPS)], *verify_cublas(torch, pads[0], outs[0], ref, verify),
                (pads, outs))
            for label, runner in runners.items():
                bound = [bind(runner, m, n, k, ap, bp, d, ld, ld, n) for (ap, bp), d in zip(pads, outs)]
                outs[0].fill_(float("nan"))
                tma.launch_sm90(*bound[0], torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                err, nan = verify(outs[0], ref)
                add(f"{label} 3000^3 A,B ld{ld} (kernel only)", group, flop,
                    lambda st, bound=bound: [tma.launch_sm90(*bound[i % sets], st) for i in range(REPS)],
                    err, nan, (pads, outs))
            if ld == 3072:  # D padded as well: separates the epilogue's row alignment
                label, runner = "dp256", runners["dp256"]
                bound = [bind(runner, m, n, k, ap, bp, d, ld, ld, ld) for (ap, bp), d in zip(pads, d_pad)]
                d_pad[0].fill_(float("nan"))
                tma.launch_sm90(*bound[0], torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                err, nan = verify(d_pad[0], ref)
                add(f"dp256 3000^3 A,B,D ld{ld} (kernel only)", group, flop,
                    lambda st, bound=bound: [tma.launch_sm90(*bound[i % sets], st) for i in range(REPS)],
                    err, nan, (pads, d_pad))
            # one padded workspace, as a 'pad' launch before the GEMM would use; sources rotated (cold in L2)
            ws_a, ws_b = padded(m, k, ld), padded(k, n, ld)
            add(f"pad copy A,B -> ld{ld} (copy only)", "copy", 0.0,
                lambda st, ws_a=ws_a, ws_b=ws_b: [(ws_a.copy_(bufs[i % sets][0]), ws_b.copy_(bufs[i % sets][1]))
                                                  for i in range(REPS)], None, None, (ws_a, ws_b))
            for label, runner in runners.items():
                bound = [bind(runner, m, n, k, ws_a, ws_b, d, ld, ld, n) for (_, _, d) in bufs]

                def body(st, bound=bound, ws_a=ws_a, ws_b=ws_b):
                    for i in range(REPS):
                        ws_a.copy_(bufs[i % sets][0])
                        ws_b.copy_(bufs[i % sets][1])
                        tma.launch_sm90(*bound[i % sets], st)
                for _, _, d in bufs:
                    d.fill_(float("nan"))
                body(torch.cuda.current_stream().cuda_stream)  # the last rep wrote set (REPS-1) % sets
                torch.cuda.synchronize()
                last = (REPS - 1) % sets
                ref_last = bufs[last][0].float() @ bufs[last][1].float()
                err, nan = verify(bufs[last][2], ref_last)
                add(f"{label} pad->ld{ld} + kernel", group, flop, body, err, nan, (ws_a, ws_b))

    try:
        setup()
    except Exception:
        import traceback
        traceback.print_exc()

    # ---- rounds, all cases interleaved
    def time_graph(g):
        g.replay()
        times = []
        for _ in range(3):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); g.replay(); e1.record(); e1.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3 / REPS)
        return sorted(times)[1]

    for _ in range(ROUNDS):
        for c in cases:
            c["t"].append(time_graph(c["graph"]))
    cub = {c["group"]: c["t"] for c in cases if c["name"].startswith("cuBLAS") and c["name"].endswith(
        "ld" + c["group"].split("^")[0])}
    rows = []
    for c in cases:
        med = sorted(c["t"])[ROUNDS // 2]
        row = {"case": c["name"], "us": med * 1e6, "tflops": c["flop"] / med / 1e12 if c["flop"] else None,
               "err": c["err"], "nan": c["nan"], "rounds_us": [t * 1e6 for t in c["t"]]}
        if c["group"] in cub:
            ct = cub[c["group"]]
            row["cublas_us"] = sorted(ct)[ROUNDS // 2] * 1e6
            row["ratio"] = row["cublas_us"] / row["us"]
            row["paired"] = sorted(a / b for a, b in zip(ct, c["t"]))[ROUNDS // 2]
        rows.append(row)
        print(json.dumps(row), flush=True)
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "odd_shapes_lab.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    print(f"\n=== odd shapes, bf16 rr, {header['device']}, {header['date']}, graphs of {REPS}, {ROUNDS} rounds ===")
    for r in rows:
        tf = f"{r['tflops']:6.1f} TF/s" if r["tflops"] else "          "
        rel = f" = {r['ratio']:.3f}x cuBLAS (paired {r['paired']:.3f})" if "ratio" in r else ""
        chk = f" err {r['err']:.1e} nan {r['nan']}" if r["err"] is not None or r["nan"] is not None else ""
        print(f"{r['case']:42s} {r['us']:8.1f} us {tf}{rel}{chk}")


def verify_cublas(torch, pad, out, ref, verify):
    """cuBLAS over the padded views, once with D poisoned: (err, nan)."""
    out.fill_(float("nan"))
    torch.matmul(pad[0], pad[1], out=out)
    torch.cuda.synchronize()
    return verify(out, ref)


def main() -> None:
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "build":
        build()
    elif cmd == "device":
        device()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
