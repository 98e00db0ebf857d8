#!/usr/bin/env python3
"""Random products through the user's path, checked against float64 (GPU): what no suite or issue lists.

    PYTHONPATH=$PWD python3 benchmarks/fuzz.py [--count 48] [--seed 1] [--jobs 12] [--out DIR]

Each case draws a product at random: dtype (bf16, f16, f32 as tf32, e4m3, e4m3 x e5m2), layouts of A and B (any
of the four), M, N and K from 1 to a few thousand (often odd, often below a tile), an epilogue (alpha, beta with C,
bias, ReLU or GELU, fp32 D for 16-bit inputs), fp8 scaling (per tensor, per row/column, 128-blocks), 3xTF32 for
some fp32 draws (--math 3xtf32, held to fp32's tolerance), fp32 accumulation for some fp8 draws (--accumulate fp32)
and, for a column-major 16-bit A, the row sums of A; about a third of the draws run on views wider than their
operands (leading dimensions a few of the kernel's alignment steps past packed; D's columns outside its view must
be left as they were; a seed draws other products than it did before views were drawn, 2026-11-26). The model ranks every family's space for it (the dry run's choice), the
top configuration is compiled, exported and loaded with gemmgen.load, and run on fresh random inputs with D (and
the row sums) poisoned with NaN, at the drawn shape and at a second one it should serve (M one smaller). The output
is compared with a float64 product of the same inputs (scales and epilogue applied) against the tuner's own
tolerance (tune.bench.policy.threshold). A product no family takes must be refused with a named rule, which is
counted, not failed. Prints one row per case and the failures last; exit status 1 if any case failed.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import load_compiled, run_main, write_report  # noqa: E402

DTYPES = (("bf16", None), ("f16", None), ("f32", None), ("e4m3", None), ("e4m3", "e5m2"))


def dim(rng: random.Random) -> int:
    """Sizes users have: tiny, below a tile, odd, aligned and not."""
    kind = rng.random()
    if kind < 0.15:
        return rng.randint(1, 16)
    if kind < 0.4:
        return rng.randint(17, 300)
    value = rng.randint(300, 3000)
    return value - value % 8 if rng.random() < 0.5 else value


def draw(rng: random.Random) -> dict:
    dtype, b_dtype = rng.choice(DTYPES)
    spec = {"m": dim(rng), "n": dim(rng), "k": dim(rng), "dtype": dtype, "b_dtype": b_dtype,
            "a": rng.choice(("row", "col")), "b": rng.choice(("row", "col"))}
    if rng.random() < 0.25:
        spec["alpha"] = rng.choice((0.5, 2.0, -1.0))
    if rng.random() < 0.2:
        spec["beta"] = rng.choice((1.0, 0.5, -2.0))
    if rng.random() < 0.35:
        spec["bias"] = True
    if rng.random() < 0.3:
        spec["activation"] = rng.choice(("relu", "gelu", "silu"))
    if dtype in ("bf16", "f16") and rng.random() < 0.15:
        spec["c_dtype"] = "f32"
    if dtype == "e4m3" and rng.random() < 0.5:
        spec["scaling"] = rng.choice(("rowcol", "block"))
    if dtype in ("bf16", "f16") and spec["a"] == "col" and rng.random() < 0.3:
        spec["row_sums"] = True
    if dtype == "f32" and rng.random() < 0.3:
        spec["fp32_math"] = "3xtf32"
    if dtype in ("e4m3", "e5m2") and rng.random() < 0.3:
        spec["fp8_accum"] = "fp32"
    if rng.random() < 0.35:
        # Views wider than their operands: each leading dimension this many alignment steps of the kernel past
        # the packed one (0: packed); C and D share theirs.
        spec["views"] = [rng.choice((0, 1, 2, 5)) for _ in range(3)]
    return spec


def problem_of(spec: dict):
    from gemmgen import Problem

    keys = ("c_dtype", "alpha", "beta", "bias", "activation", "b_dtype", "scaling", "row_sums", "fp32_math",
            "fp8_accum")
    return Problem.create(spec["m"], spec["n"], spec["k"], spec["dtype"], spec["a"], spec["b"],
                          **{key: spec[key] for key in keys if spec.get(key) is not None})


def rank_one(spec: dict, gpu_key: str = "h100"):
    """The model's top configuration over every family for the drawn product (a dict) on `gpu_key`, or the
    refusal (check_target's, up front, or the families' rules)."""
    from gemmgen import lookup_gpu
    from gemmgen.model.errors import UserError
    from gemmgen.rank.predict import predict
    from gemmgen.rank.ranking import model_top, rank_configs
    from gemmgen.rank.space import check_target, enumerate_space, excluded_families, families_for, heuristic_time

    gpu = lookup_gpu(gpu_key)
    try:
        problem = problem_of(spec)
        check_target(gpu, gpu.arch, problem.a_dtype, problem.b_dtype)
        picks = []
        for family in families_for(gpu.arch):
            configs = enumerate_space(family, gpu, problem=problem)
            picks += model_top(rank_configs(configs, problem, gpu, predict, heuristic_time), 1)
        if not picks:   # the rule that rules each family out, as `gemmgen tune` names it
            why = "; ".join(f"{family}: {rule}" for family, rule in excluded_families(problem, gpu))
            return {"refused": f"no kernel family can run this problem ({why or 'no configuration'})"}
        return {"config": min(picks, key=lambda r: r.time_s).config.to_dict()}
    except UserError as exc:
        return {"refused": str(exc)}


def operand(torch, rows, cols, layout, dtype, extra: int = 0):
    """A rows x cols operand in `layout`, cut from an array `extra` elements wider along its contiguous axis."""
    if layout == "row":
        return torch.randn(rows, cols + extra, device="cuda").to(dtype)[:, :cols]
    return torch.randn(cols, rows + extra, device="cuda").to(dtype)[:, :rows].t()


def check(torch, gemm, problem, m: int, views=None) -> "tuple[float, float]":
    """(relative error against float64, the tolerance) of the loaded kernel at M = m on fresh inputs; with
    `views`, the operands are views whose leading dimensions are that many of the kernel's alignment steps wider,
    and D's columns outside its view must keep what they held."""
    from gemmgen.tune.bench.policy import threshold

    names = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "e4m3": torch.float8_e4m3fn,
             "e5m2": torch.float8_e5m2}
    n, k, ep = problem.n, problem.k, problem.epilogue
    ops = problem.operands
    ea, eb, ec = ((s * a for s, a in zip(views, (ops.align_a, ops.align_b, ops.align_c))) if views else (0, 0, 0))
    A = operand(torch, m, k, problem.a_layout.value, names[problem.a_dtype.value], ea)
    B = operand(torch, k, n, problem.b_layout.value, names[problem.b_dtype.value], eb)
    out = names[problem.c_dtype.value]
    D_full = torch.full((m, n + ec), float("nan"), device="cuda", dtype=out)
    D_full[:, n:] = 3.0
    D = D_full[:, :n]
    C = operand(torch, m, n, "row", out, ec) if ep.beta != 0 else None
    bias = torch.randn(n, device="cuda").to(out) if ep.bias else None
    row_sums = torch.full((m,), float("nan"), device="cuda", dtype=out) if ep.row_sums else None
    scales = {}
    a64, b64 = A.double(), B.double()
    if problem.a_dtype.bytes == 1:
        from dataclasses import replace

        shape_a, shape_b = replace(problem, m=m).scale_shapes
        scales = {"scale_a": torch.rand(shape_a, device="cuda") + 0.5, "scale_b": torch.rand(shape_b, device="cuda") + 0.5}
        if problem.scaling.value == "block":
            sa = scales["scale_a"].double().repeat_interleave(128, 1)[:, :k]
            sb = scales["scale_b"].double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
            a64, b64 = a64 * sa, b64 * sb.t()
    ref = a64 @ b64
    if problem.a_dtype.bytes == 1 and problem.scaling.value == "rowcol":
        ref = ref * scales["scale_a"].double()[:, None] * scales["scale_b"].double()[None, :]
    elif problem.a_dtype.bytes == 1 and problem.scaling.value == "tensor":
        ref = ref * scales["scale_a"].double() * scales["scale_b"].double()
    ref = ref * ep.alpha
    if C is not None:
        ref = ref + ep.beta * C.double()
    if bias is not None:
        ref = ref + bias.double()
    if ep.activation.value == "relu":
        ref = torch.relu(ref)
    elif ep.activation.value == "gelu":
        ref = torch.nn.functional.gelu(ref, approximate="tanh")
    elif ep.activation.value == "silu":
        ref = torch.nn.functional.silu(ref)
    gemm(A, B, D, C=C, bias=bias, row_sums=row_sums, **scales)
    torch.cuda.synchronize()
    if ec and not bool((D_full[:, n:] == 3.0).all()):
        return math.inf, 0.0   # written outside D's view
    errors = []
    for got, want in ((D, ref),) + (((row_sums, A.double().sum(1)),) if row_sums is not None else ()):
        got = got.double()
        if not bool(torch.isfinite(got).all()):
            return math.inf, 0.0
        errors.append(float((got - want).norm() / max(float(want.norm()), 1e-30)))
    inputs = problem.b_dtype if problem.b_dtype.bytes == 1 else problem.a_dtype
    if problem.fp32_math.value == "3xtf32":   # asked for fp32-class accuracy: no tf32 input floor
        return max(errors), threshold(problem.c_dtype, k)
    return max(errors), threshold(problem.c_dtype, k, inputs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock (printed)")
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch

    from gemmgen import Kernel, lookup_gpu
    from gemmgen.codegen.nvrtc import compile_many
    from gemmgen.model.errors import UserError
    from gemmgen.model.tiles import TileConfig

    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    specs = [draw(rng) for _ in range(args.count)]
    t0 = time.time()
    with ProcessPoolExecutor(args.jobs) as pool:
        ranked = list(pool.map(rank_one, specs))
    gpu = lookup_gpu("h100")
    todo = [(i, problem_of(s), TileConfig.from_dict(r["config"])) for i, (s, r) in enumerate(zip(specs, ranked))
            if "config" in r]
    kernels = [Kernel(gpu.arch, p.operands, c) for _, p, c in todo]
    built = compile_many(kernels, jobs=args.jobs) if kernels else []
    print(f"seed {seed}: {len(specs)} products ranked and {len(kernels)} kernels compiled in "
          f"{time.time() - t0:.0f} s", flush=True)
    rows = [{"case": i, "spec": s, "refused": r["refused"]} for i, (s, r) in enumerate(zip(specs, ranked))
            if "refused" in r]
    for (i, problem, config), kernel, result in zip(todo, kernels, built):
        row = {"case": i, "spec": specs[i], "config": config.tag}
        rows.append(row)
        if isinstance(result, Exception):
            row["failure"] = f"compile: {str(result)[:300]}"
            continue
        if result.spill_bytes:
            row["spills"] = result.spill_bytes
        try:
            gemm = load_compiled(kernel, problem, result, "gemmgen-fuzz-")
        except UserError as exc:
            row["failure"] = f"load: {exc}"
            continue
        try:
            for m in dict.fromkeys((problem.m, max(1, problem.m - 1))):
                try:
                    err, limit = check(torch, gemm, problem, m, specs[i].get("views"))
                except UserError as exc:
                    if m == problem.m:
                        row["failure"] = f"refused its own shape: {exc}"
                    else:
                        row["other"] = f"refused M={m}: {str(exc)[:120]}"
                    continue
                row.setdefault("errors", []).append(err)
                if not err <= limit:
                    row["failure"] = f"M={m}: error {err:.2e} over {limit:.2e}"
        except Exception as exc:  # noqa: BLE001 -- a crash of one case is that case's failure
            row["failure"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            torch.cuda.synchronize()
        finally:
            gemm.close()
    rows.sort(key=lambda r: r["case"])
    device = torch.cuda.get_device_name()
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seed": seed,
              "rows": rows}
    if args.out:
        write_report(args.out, "fuzz.json", report)
    print(f"\n{device}, {report['date']}, seed {seed}")
    for r in rows:
        s = r["spec"]
        what = (f"{s['m']}x{s['n']}x{s['k']} {s['dtype']}{'x' + s['b_dtype'] if s.get('b_dtype') else ''} "
                f"{s['a'][0]}{s['b'][0]} " + " ".join(f"{k}={s[k]}" for k in ("alpha", "beta", "bias", "activation",
                                                                              "c_dtype", "scaling", "row_sums",
                                                                              "fp32_math", "fp8_accum", "views")
                                                   if s.get(k) is not None))
        status = ("REFUSED " + r["refused"][:80] if "refused" in r else "FAIL " + r["failure"][:200]
                  if "failure" in r else "ok " + " ".join(f"{e:.1e}" for e in r.get("errors", [])))
        print(f"{r['case']:3} {what:60} {r.get('config', '')[:44]:44} {status}")
    failed = [r for r in rows if "failure" in r]
    ok = sum(1 for r in rows if "errors" in r and "failure" not in r)
    print(f"\n{ok} ok, {len(failed)} failed, {sum(1 for r in rows if 'refused' in r)} refused with a rule")
    return 1 if failed else 0


if __name__ == "__main__":
    run_main(main, __file__)
