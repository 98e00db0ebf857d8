#!/usr/bin/env python3
"""odd3000 follow-up: does the tensor maps' L2 promotion, or which operand has unaligned rows, make 3000^3 slow?

    python scripts/odd_promotion_lab.py build     # here: render + NVRTC -> lab_build/odd_promo/*.cubin, *.json
    python scripts/odd_promotion_lab.py device    # on the H100 (carry lab_build/odd_promo): verify and time

bf16, A and B row-major (A K-major, B MN-major), as the suite's odd3000. For each kernel and each
CU_TENSOR_MAP_L2_PROMOTION_{NONE, L2_64B, L2_128B, L2_256B} (the tensor maps of A and B both), 3000^3 with
A and B at ld 3000 (6000-byte rows), A only copied to ld 3008 (6016-byte rows), B only at ld 3008, both at
3008; and 4096^3 (aligned control). D stays at ld N. The tensor maps are encoded here with the promotion as a
parameter (otherwise as gemmgen.runtime.tma.encode); lda/ldb kernel scalars follow the padded strides.

Timing as scripts/odd_shapes_lab.py: each case a CUDA graph of REPS launches over rotated input sets (more
bytes than the 50 MB L2), median of 3 replays per round, every case (cuBLAS included) interleaved in each
round, the order reversed every other round, median over ROUNDS; 'paired' is the median per-round ratio to the
same shape's cuBLAS (torch.matmul at ld N, TF32 off). Verification: every case's D NaN-poisoned before one
launch, relative Frobenius error against fp32 torch.matmul.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import hopper_lab as lab  # noqa: E402
from gemmgen.model.arch import Arch  # noqa: E402
from gemmgen.families.sm90_wgmma import launch as sm90  # noqa: E402
from gemmgen.runtime.manifest import operands_dict  # noqa: E402
from gemmgen.model.problem import Problem  # noqa: E402
from gemmgen.model.tiles import Kernel, Schedule  # noqa: E402

BUILD = ROOT / "lab_build" / "odd_promo"
REPS, ROUNDS = 10, int(os.environ.get("ODD_ROUNDS", "9"))
PROMOTIONS = ("NONE", "64B", "128B", "256B")
PAD = 3008


def variants() -> "dict[str, Kernel]":
    """odd3000's two best sm90 configs and 4096^3's best (ping-pong 128x128 s6)."""
    ops = lab.operands(b="row")
    g8 = ("row", 8)
    return {"dp256": Kernel(Arch.SM90A, ops, lab.config(raster=g8)),                                   # 128x256x64 s4
            "dp128s4": Kernel(Arch.SM90A, ops, lab.config("128x128x64", "64x128x64", 4, raster=g8)),  # 128x128x64 s4
            "pp128s6": Kernel(Arch.SM90A, ops, replace(lab.config("128x128x64", "128x128x64", 6, raster=g8),
                                                       schedule=Schedule.PINGPONG))}


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


def encode(spec: dict, base_ptr: int, promotion: str) -> bytes:
    """gemmgen.runtime.tma.encode's cuTensorMapEncodeTiled call with the L2 promotion as a parameter."""
    from cuda.bindings import driver
    from gemmgen.runtime import tma
    tma.validate_spec(spec)
    promo = {"NONE": driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
             "64B": driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
             "128B": driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
             "256B": driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B}[promotion]
    tensor_map = tma.check("cuTensorMapEncodeTiled", driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base_ptr,
        [driver.cuuint64_t(int(d)) for d in spec["dims"]],
        [driver.cuuint64_t(int(s)) for s in spec["strides_bytes"]],
        [driver.cuuint32_t(int(b)) for b in spec["box"]],
        [driver.cuuint32_t(1), driver.cuuint32_t(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        promo,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    return b"".join(int(word).to_bytes(8, "little") for word in tensor_map.opaque)


def bind(runner, m, n, k, a_store, b_store, d, lda, ldb, promotion, sm_count=132):
    problem = Problem.create(m, n, k, "bf16", "row", "row")
    runs, _ = sm90.launches(runner.kernel, problem, sm_count, runner.max_clusters)
    launch = runs[0]
    specs = {p["name"]: dict(p) for p in launch["params"] if p["kind"] == "tensormap"}
    specs["tmA"]["strides_bytes"] = [lda * 2]
    specs["tmB"]["strides_bytes"] = [ldb * 2]
    values = {"tmA": encode(specs["tmA"], a_store.data_ptr(), promotion),
              "tmB": encode(specs["tmB"], b_store.data_ptr(), promotion),
              "C": 0, "D": d.data_ptr(), "bias": 0, "workspace": 0,
              "lda": lda, "ldb": ldb, "ldc": n, "ldd": n}
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
    bf, dev = torch.bfloat16, "cuda"

    def graph_of(body):
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            body(s.cuda_stream)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            body(torch.cuda.current_stream().cuda_stream)
        return g

    def verify(d, ref):
        dd = d.float()
        nan = int(torch.isnan(dd).sum())
        return (float((dd - ref).norm() / ref.norm()) if nan == 0 else float("nan")), nan

    cases = []

    def add(name, group, flop, body, err, nan, keep):
        try:
            graph = graph_of(body)
        except Exception as exc:
            print(json.dumps({"case": name, "error": repr(exc)[-400:]}), flush=True)
            return
        cases.append({"name": name, "group": group, "flop": flop, "graph": graph, "err": err, "nan": nan,
                      "keep": keep, "t": []})

    def setup():
        for size in (3000, 4096):
            m = n = k = size
            sets = max(2, min(8, -(-150_000_000 // ((m * k + k * n + m * n) * 2))))
            bufs = [(torch.randn(m, k, device=dev, dtype=bf), torch.randn(k, n, device=dev, dtype=bf),
                     torch.empty(m, n, device=dev, dtype=bf)) for _ in range(sets)]
            ref = bufs[0][0].float() @ bufs[0][1].float()
            flop, group = 2.0 * m * n * k, f"{size}^3"
            bufs[0][2].fill_(float("nan"))
            torch.matmul(bufs[0][0], bufs[0][1], out=bufs[0][2])
            torch.cuda.synchronize()
            add(f"cuBLAS {group}", group, flop,
                lambda st, bufs=bufs, sets=sets: [torch.matmul(bufs[i % sets][0], bufs[i % sets][1],
                                                               out=bufs[i % sets][2]) for i in range(REPS)],
                *verify(bufs[0][2], ref), bufs)
            layouts = {"ld3000": (False, False)}
            if size == 3000:
                layouts.update({f"A@{PAD}": (True, False), f"B@{PAD}": (False, True), f"AB@{PAD}": (True, True)})
            for lay, (pad_a, pad_b) in layouts.items():
                ops = []
                for a, b, d in bufs:
                    ap = torch.empty(m, PAD, device=dev, dtype=bf)[:, :k] if pad_a else a
                    bp = torch.empty(k, PAD, device=dev, dtype=bf)[:, :n] if pad_b else b
                    if pad_a:
                        ap.copy_(a)
                    if pad_b:
                        bp.copy_(b)
                    ops.append((ap, bp, d, PAD if pad_a else k, PAD if pad_b else n))
                for label, runner in runners.items():
                    if size == 3000 and label == "pp128s6":
                        continue
                    for promo in PROMOTIONS:
                        bound = [bind(runner, m, n, k, ap, bp, d, la, lb, promo) for ap, bp, d, la, lb in ops]
                        bufs[0][2].fill_(float("nan"))
                        tma.launch_sm90(*bound[0], torch.cuda.current_stream().cuda_stream)
                        torch.cuda.synchronize()
                        err, nan = verify(bufs[0][2], ref)
                        name = f"{label} {group} {lay if size == 3000 else 'ld4096'} L2_{promo}"
                        add(name, group, flop,
                            lambda st, bound=bound, sets=sets: [tma.launch_sm90(*bound[i % sets], st)
                                                                for i in range(REPS)], err, nan, ops)

    try:
        setup()
    except Exception:
        import traceback
        traceback.print_exc()

    def time_graph(g):
        g.replay()
        times = []
        for _ in range(3):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); g.replay(); e1.record(); e1.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3 / REPS)
        return sorted(times)[1]

    t0 = time.time()
    for r in range(ROUNDS):
        for c in (cases if r % 2 == 0 else cases[::-1]):
            c["t"].append(time_graph(c["graph"]))
    print(json.dumps({"timing_s": round(time.time() - t0, 1), "cases": len(cases)}), flush=True)
    cub = {c["group"]: c["t"] for c in cases if c["name"].startswith("cuBLAS")}
    rows = []
    for c in cases:
        med = sorted(c["t"])[ROUNDS // 2]
        row = {"case": c["name"], "us": med * 1e6, "tflops": c["flop"] / med / 1e12, "err": c["err"],
               "nan": c["nan"], "rounds_us": [t * 1e6 for t in c["t"]]}
        ct = cub.get(c["group"])
        if ct:
            row["cublas_us"] = sorted(ct)[ROUNDS // 2] * 1e6
            row["ratio"] = row["cublas_us"] / row["us"]
            row["paired"] = sorted(a / b for a, b in zip(ct, c["t"]))[ROUNDS // 2]
        rows.append(row)
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "odd_promotion_lab.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    print(f"\n=== L2 promotion x row alignment, bf16 rr, {header['device']}, {header['date']}, "
          f"graphs of {REPS}, {ROUNDS} rounds ===")
    for r in rows:
        rel = f" = {r['ratio']:.3f}x cuBLAS (paired {r['paired']:.3f})" if "ratio" in r else ""
        print(f"{r['case']:36s} {r['us']:8.1f} us {r['tflops']:6.1f} TF/s{rel} err {r['err']:.1e} nan {r['nan']}")


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
