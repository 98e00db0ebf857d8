#!/usr/bin/env python3
"""Ping-pong lab (sm90_wgmma `schedule: pingpong`): build here, check and time on the H100 in one call.

    python scripts/pingpong_lab.py build            # render + NVRTC -> lab_build_pp/*.cubin, *.json (+ SASS counts)
    python scripts/pingpong_lab.py device           # on the GPU: checks, then timing, each in a subprocess
                                                    # with a timeout (a hang is reported, not waited out)
    python scripts/pingpong_lab.py check|perf       # (internal) the two subprocesses

Checks: every 'check' variant on tile multiples and odd shapes, fresh random inputs, D poisoned with NaN,
relative Frobenius error against torch.matmul in fp32 on the same 16-bit inputs (alpha/beta/bias/activation
applied to the reference as in the kernel).
Timing: bf16, A row-major and B column-major (both K-major), 4096^3 and 8192^3. Each measurement replays a
CUDA graph of REPS GEMMs over rotated input sets (more bytes than the 50 MB L2), so host launch overhead is
not timed; cuBLAS (torch.matmul, TF32 off) is captured the same way; rounds interleave cuBLAS and every
variant; median of rounds, and 'paired' is the median of per-round ratios.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from gemmgen.runtime.manifest import operands_dict
from gemmgen.model.arch import Arch, DType  # noqa: E402
from gemmgen.model.problem import Layout, Problem  # noqa: E402
from gemmgen.model.tiles import Kernel, Schedule  # noqa: E402
from gemmgen.families.sm90_wgmma import launch as sm90  # noqa: E402
import hopper_lab as lab  # noqa: E402

BUILD = ROOT / "lab_build_pp"
CHECK_SHAPES = [(128, 128, 64), (4096, 4096, 4096), (1000, 3000, 4104), (3000, 1000, 2056), (1100, 1000, 200),
                (65, 72, 8), (1, 8, 8), (256, 384, 4096)]
PERF_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
ROUNDS, REPS = 5, {4096: 20, 8192: 6}


def pingpong(cta: str, stages: int):
    from dataclasses import replace
    return replace(lab.config(cta, cta, stages, raster=("row", 8)), schedule=Schedule.PINGPONG)


def variants() -> "list[tuple[str, Kernel, str]]":
    """(label, kernel, role): role 'check' is verified only, 'perf' is verified and timed."""
    k = lambda ops, cfg: Kernel(Arch.SM90A, ops, cfg)  # noqa: E731
    o = lab.operands
    out = [("coop256_rc", k(o(), lab.config(raster=("row", 8))), "perf"),
           ("pp128s6_rc", k(o(), pingpong("128x128x64", 6)), "perf"),
           ("pp128s4_rc", k(o(), pingpong("128x128x64", 4)), "perf"),
           ("pp64x256s5_rc", k(o(), pingpong("64x256x64", 5)), "perf")]
    for dtype in ("bf16", "f16"):
        for a, b in [("row", "row"), ("col", "col"), ("col", "row")]:
            extra = {"bias": True, "activation": "relu"} if (a, b) == ("col", "row") else {}
            out.append((f"pp128s6_{a[0]}{b[0]}_{dtype}", k(o(dtype, a, b, **extra), pingpong("128x128x64", 6)), "check"))
        out.append((f"pp128s6_rc_{dtype}", k(o(dtype), pingpong("128x128x64", 6)), "check"))
    out.append(("pp64x256s5_cr_f16_gelu", k(o("f16", "col", "row", True, "gelu"), pingpong("64x256x64", 5)), "check"))
    out.append(("pp64x256s5_rr_bf16", k(o("bf16", "row", "row"), pingpong("64x256x64", 5)), "check"))
    return out


def build() -> None:
    from gemmgen.codegen.sass import dump_sass, instruction_counts
    BUILD.mkdir(exist_ok=True)
    for label, kernel, role in variants():
        t0 = time.time()
        src = lab.render(kernel)
        (BUILD / f"{label}.cu").write_text(src)
        cubin, log = lab.compile_cubin(kernel, src)
        (BUILD / f"{label}.cubin").write_bytes(cubin)
        counts = instruction_counts(dump_sass(cubin))
        n = lambda p: sum(v for op, v in counts.items() if op == p or op.startswith(p + "."))  # noqa: E731
        sass = {p: n(p) for p in ("HGMMA", "UTMALDG", "LDL", "STL", "BAR")}
        meta = {"label": label, "name": kernel.name, "role": role, "config": kernel.config.to_dict(),
                "operands": operands_dict(kernel.operands), "log": log, "sass": sass}
        (BUILD / f"{label}.json").write_text(json.dumps(meta, indent=1))
        regs = [ln.strip() for ln in log.splitlines() if "registers" in ln or "spill" in ln]
        print(f"{label:26s} {time.time() - t0:4.1f}s {sass} {' | '.join(regs)[:160]}")


def _reference(torch, ops, a, b, c, bias, alpha, beta):
    ref = alpha * (a.float() @ b.float())
    if c is not None:
        ref = ref + beta * c.float()
    if bias is not None:
        ref = ref + bias.float()
    if ops.activation.value == "relu":
        ref = torch.relu(ref)
    elif ops.activation.value == "gelu":
        ref = torch.nn.functional.gelu(ref, approximate="tanh")
    return ref


def check() -> None:
    torch = lab._init_torch()
    stream = torch.cuda.current_stream().cuda_stream
    for path in sorted(BUILD.glob("*.json")):
        runner = lab.Runner(path)
        ops = runner.kernel.operands
        tdt = torch.bfloat16 if ops.a_dtype is DType.BF16 else torch.float16
        for (m, n, k) in CHECK_SHAPES:
            if (ops.a_layout is Layout.ROW and k % 8) or (ops.b_layout is Layout.COL and k % 8) or \
               (ops.a_layout is Layout.COL and m % 8) or (ops.b_layout is Layout.ROW and n % 8):
                continue  # leading dimension not a 16-byte multiple: constraints send these to sm80
            alpha, beta = (0.5, 0.25) if (m + n) % 3 == 0 else (1.0, 0.0)
            problem = Problem.create(m, n, k, ops.a_dtype.value, ops.a_layout.value, ops.b_layout.value, alpha=alpha,
                                     beta=beta, bias=ops.bias, activation=ops.activation.value)
            a_store, b_store, a, b, c, bias = lab._tensors(ops, m, n, k, beta, torch, tdt)
            d = torch.full((m, n), float("nan"), device="cuda", dtype=tdt)
            bound, runs = runner.bind(problem, a_store, b_store, c, bias, d, None)
            runner.go(bound, stream)
            torch.cuda.synchronize()
            ref = _reference(torch, ops, a, b, c, bias, alpha, beta)
            nan = int(torch.isnan(d.float()).sum())
            err = float((d.float() - ref).norm() / ref.norm()) if nan == 0 else float("nan")
            ok = nan == 0 and err < (1e-2 if ops.a_dtype is DType.BF16 else 3e-3)
            tiles = -(-m // runner.kernel.config.cta.m) * -(-n // runner.kernel.config.cta.n)
            print(json.dumps({"label": runner.meta["label"], "shape": [m, n, k], "alpha": alpha, "beta": beta,
                              "tiles": tiles, "grid": runs[0]["grid"][0], "err": err, "nan": nan, "ok": ok}),
                  flush=True)


def perf() -> None:
    torch = lab._init_torch()
    labels = [p.stem for p in sorted(BUILD.glob("*.json")) if json.loads(p.read_text())["role"] == "perf"]
    runners = {label: lab.Runner(BUILD / f"{label}.json") for label in labels}
    rows = []
    for (m, n, k) in PERF_SHAPES:
        reps = REPS[m]
        ops = lab.operands()
        per_set = (m * k + k * n + m * n) * 2
        sets = max(2, min(6, -(-150_000_000 // per_set)))
        bufs = [lab._tensors(ops, m, n, k, 0.0, torch, torch.bfloat16) +
                (torch.empty(m, n, device="cuda", dtype=torch.bfloat16),) for _ in range(sets)]
        ref = bufs[0][2].float() @ bufs[0][3].float()
        flop = 2.0 * m * n * k

        def graph_of(body):
            g = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                body(side.cuda_stream)  # warm-up outside capture
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                body(torch.cuda.current_stream().cuda_stream)
            return g

        def time_graph(g):
            g.replay()
            times = []
            for _ in range(3):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                g.replay()
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) / 1e3 / reps)
            return sorted(times)[1]

        graphs = {"cublas": graph_of(lambda st: [torch.matmul(bufs[i % sets][2], bufs[i % sets][3],
                                                              out=bufs[i % sets][6]) for i in range(reps)])}
        errs = {}
        for label, runner in runners.items():
            problem = Problem.create(m, n, k, "bf16", "row", "col")
            bound = [runner.bind(problem, b[0], b[1], None, None, b[6], None)[0] for b in bufs]
            bufs[0][6].fill_(float("nan"))
            runner.go(bound[0], torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
            d = bufs[0][6].float()
            errs[label] = (float((d - ref).norm() / ref.norm()), int(torch.isnan(d).sum()), bound[0][0][1]["grid"][0])
            graphs[label] = graph_of(lambda st, runner=runner, bound=bound:
                                     [runner.go(bound[i % sets], st) for i in range(reps)])
        times = {name: [] for name in graphs}
        for r in range(ROUNDS):
            order = list(graphs) if r % 2 == 0 else list(reversed(list(graphs)))  # alternate who goes first
            for name in order:
                times[name].append(time_graph(graphs[name]))
        cub = times.pop("cublas")
        cub_med = sorted(cub)[ROUNDS // 2]
        for label, ts in times.items():
            med = sorted(ts)[ROUNDS // 2]
            paired = sorted(c / t for c, t in zip(cub, ts))[ROUNDS // 2]
            err, nan, grid = errs[label]
            row = {"mnk": [m, n, k], "label": label, "grid": grid, "err": err, "nan": nan, "us": med * 1e6,
                   "tflops": flop / med / 1e12, "cublas_tflops": flop / cub_med / 1e12, "ratio": cub_med / med,
                   "paired": paired, "rounds_us": [t * 1e6 for t in ts], "cublas_rounds_us": [t * 1e6 for t in cub]}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del bufs, ref, graphs
        torch.cuda.empty_cache()
    print(json.dumps({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                      "torch": torch.__version__}))
    print("\n=== bf16, A row / B col, CUDA graphs, same-run cuBLAS ===")
    for r in rows:
        print(f"{r['mnk'][0]}^3 {r['label']:15s} grid {r['grid']:4d} {r['tflops']:6.1f} TF/s  cuBLAS "
              f"{r['cublas_tflops']:6.1f}  ratio {r['ratio']:.3f} (paired {r['paired']:.3f})  err {r['err']:.1e} nan {r['nan']}")


def device(check_timeout: float = 55, perf_timeout: float = 70) -> None:
    out_dir = Path(os.environ.get("OUT", "."))
    for step, timeout in (("check", check_timeout), ("perf", perf_timeout)):
        t0 = time.time()
        try:
            proc = subprocess.run([sys.executable, __file__, step], capture_output=True, text=True, timeout=timeout)
            text, status = proc.stdout + proc.stderr[-3000:], f"rc={proc.returncode}"
        except subprocess.TimeoutExpired as exc:
            text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            status = f"TIMEOUT after {timeout}s (hang?)"
        (out_dir / f"pp_{step}.log").write_text(text + f"\n{status}\n")
        lines = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
        print(f"=== {step}: {status}, {time.time() - t0:.1f}s", flush=True)
        if step == "check":
            bad = [ln for ln in lines if not ln.get("ok")]
            worst = {}
            for ln in lines:
                key = "bf16" if "bf16" in ln["label"] or ln["label"].endswith("_rc") else "f16"
                worst[key] = max(worst.get(key, 0.0), ln["err"] if ln["err"] == ln["err"] else 9.9)
            print(f"checks passed {len(lines) - len(bad)}/{len(lines)}, worst rel. Frobenius error {worst}")
            for ln in bad:
                print("FAIL", json.dumps(ln))
            if status != "rc=0":
                print(text[-2500:])
        else:
            print(text[-4000:])


def main() -> None:
    cmd = sys.argv[1] if len(sys.argv) > 1 else "build"
    {"build": build, "check": check, "perf": perf, "device": device}[cmd]()


if __name__ == "__main__":
    main()
