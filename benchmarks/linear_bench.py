"""gemmgen.nn.Linear against torch.nn.Linear (GPU): forward and forward+backward TFLOP/s, and host time per op call.

    PYTHONPATH=$PWD python3 benchmarks/linear_bench.py [--kernels dry|tune|store] [--trials 20] [--out out/linear]
    PYTHONPATH=$PWD python3 benchmarks/linear_bench.py --host-only      # the 256^3 host-overhead table alone

Cases (bf16, with bias): tokens x in -> out = 4096x4096->14336, 8192x4096->4096, 16x4096->4096 (--case T,IN,OUT
to choose others). Each case gets its own kernel store, since two cases share the kernel classes of 4096->4096 and
a class folder holds one kernel tuned at one token count (until dispatch tables land):
  --kernels dry    the model's pick of each product, compiled, unmeasured (gemmgen.tune.linear, dry run): ~1 min
  --kernels tune   `gemmgen tune-linear IN OUT --tokens T --bias --trials N` per case (records and studies go to
                   the case folder, not the checkout)
  --kernels store  whatever `gemmgen tune-linear` stored in the per-user kernel store
Forward: captured in a CUDA graph (20 calls per replay, no autograd), median of replays. Forward+backward: eager
autograd (y = layer(x); y.backward(g), x requiring grad: 3 products), timed with CUDA events. FLOPs: 2·T·IN·OUT per
product. gemmgen.stats() is printed per case: a case whose products fell back to torch says so in the table.
Host overhead: host wall time per call of back-to-back calls at 256³ (gemmgen.mm vs torch.matmul, the Linear layers),
the queue never running dry only if the host is slower than the GPU (GPU time per call printed beside it).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import ROOT, run_main, write_report

CASES = ((4096, 4096, 14336), (8192, 4096, 4096), (16, 4096, 4096))


def graph_time_s(fn, calls: int = 20, replays: int = 10) -> float:
    """Seconds per fn() with `calls` of them captured in one CUDA graph: median over `replays` replays."""
    import torch

    from harness import graph_timed

    return graph_timed(torch, lambda _: fn(), [None], calls, replays)


def eager_time_s(fn, calls: int = 20, repeats: int = 7) -> float:
    """Seconds per fn() run eagerly, `calls` back to back between two events: median over `repeats`."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / calls)
    return statistics.median(times)


def host_us(fn, calls: int = 3000, repeats: int = 5) -> float:
    """Host microseconds per call of `calls` back-to-back calls (no synchronisation inside), after a warm-up:
    benchmarks/host_overhead.py's measure."""
    from host_overhead import per_call_us

    for _ in range(50):
        fn()
    return per_call_us(fn, calls, repeats)


def prepare_store(mode: str, tokens: int, in_f: int, out_f: int, case_dir: Path, gpu, trials: int) -> Path:
    """The kernel store root for one case (see the module docstring)."""
    from gemmgen.model import paths
    from gemmgen.model.linear import LinearLayer
    from gemmgen.tune.linear import tune_linear

    if mode == "store":
        return paths.kernels_dir()
    root = case_dir / "kernels"
    if mode == "dry":
        layer = LinearLayer.create(in_f, out_f, "bf16", True, "none", tokens)
        for product in tune_linear(layer, gpu, dry_run=True, top_k=4, jobs=max(1, (os.cpu_count() or 2) - 1),
                                   root=root):
            print(f"  {product.role}: {product.kernel or 'nothing compiled'}", flush=True)
        return root
    env = dict(os.environ, GEMMGEN_DATA=str(case_dir), GEMMGEN_RESULTS=str(case_dir / "results"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "gemmgen", "tune-linear", str(in_f), str(out_f), "--tokens", str(tokens),
               "--bias", "--trials", str(trials), "--patience", str(max(5, trials // 2)), "--no-progress"]
    print("  " + " ".join(command[1:]), flush=True)
    done = subprocess.run(command, env=env, cwd=ROOT, text=True, capture_output=True)
    print("  " + done.stdout.replace("\n", "\n  ").rstrip(), flush=True)
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
    return root


def profile_step(step, steps: int = 20) -> dict:
    """GPU time per step of each kernel (torch.profiler, CUDA activity), the GPU busy total and the wall time per
    step with the host waiting on each: where a forward+backward's time goes."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    wall_us = (time.perf_counter() - t0) / steps * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = {}
    for event in prof.key_averages():
        gpu_us = getattr(event, "device_time_total", 0.0) or getattr(event, "cuda_time_total", 0.0)
        if gpu_us and event.count >= steps and not event.key.startswith(("cuda", "Memcpy")):
            kernels[event.key[:90]] = gpu_us / steps
    return {"wall_us_per_step": wall_us, "gpu_us_per_step": sum(kernels.values()), "kernels_us": kernels}


def host_profile(step, steps: int = 300, top: int = 22) -> str:
    """cProfile of `steps` steps (the host's view: Python and the torch calls it makes), top functions by own time."""
    import cProfile
    import io
    import pstats

    import torch

    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def bench_case(tokens: int, in_f: int, out_f: int, store: Path, profile: bool = False) -> dict:
    import torch

    import gemmgen
    from gemmgen.torch.registry import REGISTRY

    REGISTRY.use_store(store)
    torch.manual_seed(0)
    ref = torch.nn.Linear(in_f, out_f, bias=True, device="cuda", dtype=torch.bfloat16)
    ours = gemmgen.nn.Linear.from_linear(ref)
    x = torch.randn(tokens, in_f, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(tokens, out_f, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        err = ((ours(x).float() - torch.nn.functional.linear(x.float(), ref.weight.float(), ref.bias.float()))
               .abs().max() / ref(x).float().abs().max()).item()
    flops = 2 * tokens * in_f * out_f
    row = {"case": f"{tokens}x{in_f}->{out_f}", "rel_error_vs_fp32": err}
    for name, layer in (("torch", ref), ("gemmgen", ours)):
        gemmgen.reset_stats()
        with torch.no_grad():
            try:
                fwd, timing = graph_time_s(lambda: layer(x)), "graph"
            except RuntimeError as exc:  # a capture the kernel path broke: say so, time eagerly instead
                torch.cuda.synchronize()
                fwd, timing = eager_time_s(lambda: layer(x)), f"eager (capture failed: {str(exc)[:120]})"
                print(f"  {name}: forward capture failed, timed eagerly: {exc}", flush=True)
        xg = x.clone().requires_grad_()

        def step():
            layer.weight.grad = layer.bias.grad = xg.grad = None
            layer(xg).backward(g)

        both = eager_time_s(step)
        row[name] = {"forward_timing": timing, "forward_s": fwd, "forward_tflops": flops / fwd / 1e12, "fwd_bwd_s": both,
                     "fwd_bwd_tflops": 3 * flops / both / 1e12, "stats": gemmgen.stats()}
        if profile:
            row[name]["profile"] = profile_step(step)
            row[name]["host_profile"] = host_profile(step)
    row["forward_speedup"] = row["torch"]["forward_s"] / row["gemmgen"]["forward_s"]
    row["fwd_bwd_speedup"] = row["torch"]["fwd_bwd_s"] / row["gemmgen"]["fwd_bwd_s"]
    row["floor_fwd_bwd_s"] = floor_step_s(ours, xg, g)
    return row


def floor_step_s(layer, xg, g) -> float:
    """Seconds per training step of a layer that computes nothing: a Python autograd.Function whose forward and
    backward only allocate their outputs (as gemmgen.nn.Linear's do before launching). What autograd and one Python
    Function cost a step on this host: no layer built that way steps faster, whatever its kernels."""
    import torch

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            ctx.save_for_backward(x, w, b)
            return x.new_empty((*x.shape[:-1], w.shape[0]))

        @staticmethod
        def backward(ctx, dy):
            x, w, b = ctx.saved_tensors
            return torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)

    def step():
        layer.weight.grad = layer.bias.grad = xg.grad = None
        Floor.apply(xg, layer.weight, layer.bias).backward(g)

    return eager_time_s(step)


def host_overhead(store: Path, size: int = 256) -> dict:
    """Host µs per call at size³: gemmgen.mm vs torch.matmul, gemmgen.nn.Linear vs torch.nn.Linear (no grad)."""
    import torch

    import gemmgen
    from gemmgen.torch.registry import REGISTRY

    REGISTRY.use_store(store)
    A = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.Linear(size, size, device="cuda", dtype=torch.bfloat16)
    ours = gemmgen.nn.Linear.from_linear(ref)
    out = {}
    gemmgen.reset_stats()
    with torch.no_grad():
        for name, fn in (("torch.matmul", lambda: torch.matmul(A, B)), ("gemmgen.mm", lambda: gemmgen.mm(A, B)),
                         ("torch.ops.gemmgen.mm", lambda: torch.ops.gemmgen.mm(A, B)),
                         ("torch.nn.Linear", lambda: ref(A)), ("gemmgen.nn.Linear", lambda: ours(A))):
            out[name] = {"host_us": host_us(fn), "gpu_us": eager_time_s(fn, calls=200) * 1e6}
    out["stats"] = gemmgen.stats()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="dry", choices=("dry", "tune", "store"),
                        help="where each case's kernels come from (default dry: the model's picks)")
    parser.add_argument("--trials", type=int, default=20, help="--kernels tune: measured trials per product")
    parser.add_argument("--case", action="append", default=None, metavar="T,IN,OUT", help="a case (repeatable)")
    parser.add_argument("--out", default="out/linear", help="folder for linear_bench.json (default out/linear)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one forward+backward step per layer: GPU µs per kernel, wall µs per step")
    parser.add_argument("--no-host", action="store_true", help="skip the 256^3 host-time table")
    parser.add_argument("--host-only", action="store_true",
                        help="only the host time per call at 256^3 (no throughput cases): about a minute")
    args = parser.parse_args(argv)
    import torch

    from gemmgen import lookup_gpu
    from gemmgen.torch.registry import gpu_key

    if not torch.cuda.is_available():
        print("linear_bench.py: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    key = gpu_key(0)
    if key is None:
        print(f"linear_bench.py: {torch.cuda.get_device_name(0)} is not in gemmgen's catalogue", file=sys.stderr)
        return 2
    gpu = lookup_gpu(key)
    cases = [tuple(int(v) for v in c.split(",")) for c in args.case] if args.case else list(CASES)
    if args.host_only:
        cases = []
    work = Path(tempfile.mkdtemp(prefix="gemmgen-linear-bench-"))
    rows = []
    for tokens, in_f, out_f in cases:
        print(f"case {tokens}x{in_f}->{out_f}: kernels ({args.kernels})", flush=True)
        store = prepare_store(args.kernels, tokens, in_f, out_f, work / f"{tokens}x{in_f}x{out_f}", gpu, args.trials)
        rows.append(bench_case(tokens, in_f, out_f, store, args.profile))
    overhead = {}
    if not args.no_host:
        print(f"case {256}^3 host overhead: kernels ({args.kernels})", flush=True)
        overhead = host_overhead(prepare_store(args.kernels, 256, 256, 256, work / "256", gpu, args.trials))

    print(f"\n{torch.cuda.get_device_name(0)}, torch {torch.__version__}, kernels: {args.kernels}")
    if rows:
        print("| tokens x in -> out | torch fwd | gemmgen fwd | x | torch fwd+bwd | gemmgen fwd+bwd | x | "
              "gemmgen kernel calls / fallbacks | rel err vs fp32 |")
        print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t, m = r["torch"], r["gemmgen"]
        print(f"| {r['case']} | {t['forward_tflops']:.0f} | {m['forward_tflops']:.0f} | {r['forward_speedup']:.2f} | "
              f"{t['fwd_bwd_tflops']:.0f} | {m['fwd_bwd_tflops']:.0f} | {r['fwd_bwd_speedup']:.2f} | "
              f"{m['stats']['kernel_calls']} / {m['stats']['fallbacks']} | {r['rel_error_vs_fp32']:.1e} |")
    for r in rows:
        print(f"{r['case']}: a step of a layer that computes nothing (autograd + one Python Function): "
              f"{r['floor_fwd_bwd_s'] * 1e6:.1f} us; torch.nn.Linear {r['torch']['fwd_bwd_s'] * 1e6:.1f}, "
              f"gemmgen {r['gemmgen']['fwd_bwd_s'] * 1e6:.1f}")
    for r in rows:
        for name in ("torch", "gemmgen"):
            prof = r[name].get("profile")
            if prof:
                print(f"\n{r['case']} {name}: wall {prof['wall_us_per_step']:.1f} µs/step, "
                      f"GPU busy {prof['gpu_us_per_step']:.1f} µs/step")
                for kernel, us in sorted(prof["kernels_us"].items(), key=lambda kv: -kv[1]):
                    print(f"  {us:8.1f}  {kernel}")
                print(r[name]["host_profile"])
    if overhead:
        print("\nhost time per call at 256^3 bf16 (µs; GPU time per call beside it)")
        for name, v in overhead.items():
            if name != "stats":
                print(f"  {name:22s} host {v['host_us']:7.1f}   gpu {v['gpu_us']:7.1f}")
        print(f"  gemmgen stats: {overhead['stats']}")
    fallbacks = {reason for r in rows for reason in r["gemmgen"]["stats"]["fallbacks_by_reason"]}
    if fallbacks:
        print("note: some gemmgen calls ran on torch: " + "; ".join(sorted(fallbacks)))
    path = write_report(args.out, "linear_bench.json", {"device": torch.cuda.get_device_name(0),
                                                         "torch": torch.__version__, "kernels": args.kernels,
                                                         "cases": rows, "host_overhead": overhead})
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
