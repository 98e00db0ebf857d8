#!/usr/bin/env python3
"""Hopper (sm90_wgmma) lab: build cubins here, check and time them on the H100 in one device call.

    python scripts/hopper_lab.py build [--set NAME]     # render + NVRTC -> lab_build/*.cubin, *.json
    python scripts/hopper_lab.py device [--set NAME]    # on the GPU: each variant in a subprocess with a
                                                        # timeout; verify vs torch fp32, time vs cuBLAS
    python scripts/hopper_lab.py one VARIANT.json       # (internal) run one variant, print a JSON line
    python scripts/hopper_lab.py build --set splitk     # split-K / small-tile variants for the suite shapes
    python scripts/hopper_lab.py suite-check            # on the GPU: split-K correctness (NaN-poisoned D and
                                                        # workspace, odd shapes, K not a multiple of S*BK)
    python scripts/hopper_lab.py suite-perf             # on the GPU: suite shapes (row-major A and B), CUDA
                                                        # graphs of rotated launches, interleaved with cuBLAS

Verification: fresh random inputs per shape, D poisoned with NaN before each launch, relative Frobenius
error against torch.matmul in fp32 on the same 16-bit inputs. Timing: CUDA events, warm-up, median of
repeats, inputs rotated over several buffer sets so L2 does not serve them, cuBLAS timed in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmgen.runtime.manifest import operands_dict
from gemmgen.model.arch import Arch  # noqa: E402
from gemmgen.model.problem import Operands, Layout, Problem  # noqa: E402
from gemmgen.model.arch import DType  # noqa: E402
from gemmgen.model.tiles import (Cluster, Family, Kernel, Raster, RasterOrder, Shape3, TileConfig)  # noqa: E402
from gemmgen.families.sm90_wgmma import launch as sm90  # noqa: E402

BUILD = ROOT / "lab_build"
NVRTC_OPTIONS = ("--gpu-architecture=sm_90a", "-std=c++17", "--ptxas-options=-v")


# ------------------------------------------------------------------------------- render and compile
def render(kernel: Kernel) -> str:
    """render.render when the shared renderer exists, else the same one-environment StrictUndefined render."""
    try:
        from gemmgen.codegen.render import render as shared_render
        return shared_render(kernel)
    except ImportError:
        import jinja2
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "templates")),
                                 undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                                 keep_trailing_newline=True)
        return env.get_template(kernel.config.family.template).render(**sm90.template_params(kernel))


def compile_cubin(kernel: Kernel, source: str) -> "tuple[bytes, str]":
    """NVRTC -> (SASS cubin for sm_90a, log): gemmgen.codegen.nvrtc when present. Raises CompileError with the log."""
    try:
        from gemmgen.codegen.nvrtc import compile_kernel
        compiled = compile_kernel(kernel)
        return compiled.cubin, compiled.log
    except ImportError:
        pass
    from cuda.bindings import nvrtc
    from gemmgen.model.errors import CompileError

    def ok(res):
        err, *rest = res
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC call failed: {err}")
        return rest[0] if len(rest) == 1 else rest

    prog = ok(nvrtc.nvrtcCreateProgram(source.encode(), f"{kernel.name}.cu".encode(), 0, [], []))
    opts = [o.encode() for o in NVRTC_OPTIONS]
    err, = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    size = ok(nvrtc.nvrtcGetProgramLogSize(prog))
    log = b" " * size
    ok(nvrtc.nvrtcGetProgramLog(prog, log))
    log = log.decode(errors="replace").rstrip("\x00")
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(kernel.name, NVRTC_OPTIONS, log)
    size = ok(nvrtc.nvrtcGetCUBINSize(prog))
    cubin = b" " * size
    ok(nvrtc.nvrtcGetCUBIN(prog, cubin))
    nvrtc.nvrtcDestroyProgram(prog)
    return bytes(cubin), log


# ------------------------------------------------------------------------------- variants
def config(cta="128x256x64", warp="64x256x64", stages=4, cluster=(1, 1), persistent=True,
           raster=("row", 1), splits=1) -> TileConfig:
    from gemmgen.model.tiles import DecompKind, Decomposition
    w = Shape3.parse(warp)
    decomp = Decomposition(DecompKind.SPLIT_K, splits) if splits > 1 else Decomposition()
    return TileConfig(family=Family.SM90_WGMMA, cta=Shape3.parse(cta), warp=w, mma=Shape3(64, w.n, 16),
                      stages=stages, raster=Raster(RasterOrder(raster[0]), raster[1]),
                      cluster=Cluster(*cluster), warp_specialized=True, persistent=persistent,
                      decomposition=decomp)


def operands(dtype="bf16", a="row", b="col", bias=False, activation="none") -> Operands:
    from gemmgen.model.problem import Activation
    dt = DType.parse(dtype)
    return Operands(dt, dt, dt, DType.F32, Layout.parse(a), Layout.parse(b), 8, 8, 8, bias, Activation(activation))


def variant_sets() -> "dict[str, list[tuple[str, Kernel, str]]]":
    """name -> [(label, kernel, role)], role 'check' (correctness shapes) or 'perf' (also timed)."""
    k = lambda ops, cfg: Kernel(Arch.SM90A, ops, cfg)  # noqa: E731
    sets = {}
    base = config()
    sets["step1"] = [
        ("base_rc_bf16", k(operands(), base), "perf"),
        ("base_rr_bf16", k(operands(b="row"), base), "check"),
        ("base_cc_f16", k(operands("f16", a="col", b="col"), base), "check"),
        ("base_cr_bf16_bias_gelu", k(operands(a="col", b="row", bias=True, activation="gelu"), base), "check"),
        ("c128_rc", k(operands(), config("128x128x64", "64x128x64", stages=5)), "perf"),
        ("nonpers_rc", k(operands(), config(persistent=False)), "perf"),
        ("cl2x1_rc", k(operands(), config(cluster=(2, 1))), "perf"),
        ("cl1x2_cr", k(operands(a="col", b="row"), config(cluster=(1, 2))), "check"),
        ("s3_rc", k(operands(), config(stages=3)), "perf"),
        ("g8_rc", k(operands(), config(raster=("row", 8))), "perf"),
    ]
    sets["step2"] = [
        ("base_rc_bf16", k(operands(), base), "perf"),
        ("base_cr_f16_bias_relu", k(operands("f16", a="col", b="row", bias=True, activation="relu"), base), "check"),
        ("base_rr_bf16_odd", k(Operands(a_layout=Layout.ROW, b_layout=Layout.ROW, align_c=2), base), "check"),
        ("g8_rc", k(operands(), config(raster=("row", 8))), "perf"),
        ("g4c_rc", k(operands(), config(raster=("col", 4))), "perf"),
        ("s3g8_rc", k(operands(), config(stages=3, raster=("row", 8))), "perf"),
        ("cl2x1_rc", k(operands(), config(cluster=(2, 1))), "perf"),
        ("cl2x1g8_rc", k(operands(), config(cluster=(2, 1), raster=("row", 8))), "perf"),
        ("cl1x2g8_rc", k(operands(), config(cluster=(1, 2), raster=("row", 8))), "perf"),
        ("c256x128_rc", k(operands(), config("256x128x64", "128x128x64", raster=("row", 8))), "perf"),
        ("n128x2_rc", k(operands(), config("128x256x64", "128x128x64", raster=("row", 8))), "perf"),
        ("cl2x1g8_cc", k(operands(a="col", b="col"), config(cluster=(2, 1), raster=("row", 8))), "check"),
        ("cl1x2_rr", k(operands(a="row", b="row"), config(cluster=(1, 2))), "check"),
    ]
    sets["step3"] = [
        ("c256x128g8_rc", k(operands(), config("256x128x64", "128x128x64", raster=("row", 8))), "perf"),
        ("c256x128s3g8_rc", k(operands(), config("256x128x64", "128x128x64", stages=3, raster=("row", 8))), "perf"),
        ("cl2x1g8_rc", k(operands(), config(cluster=(2, 1), raster=("row", 8))), "perf"),
        ("cl1x2g8_rc", k(operands(), config(cluster=(1, 2), raster=("row", 8))), "perf"),
        ("cl2x1s3g8_rc", k(operands(), config(cluster=(2, 1), stages=3, raster=("row", 8))), "perf"),
        ("c256cl1x2g8_rc", k(operands(), config("256x128x64", "128x128x64", cluster=(1, 2), raster=("row", 8))), "perf"),
        ("c256cl2x1g8_rc", k(operands(), config("256x128x64", "128x128x64", cluster=(2, 1), raster=("row", 8))), "perf"),
        ("c256cl1x2g8_f16_cc", k(operands("f16", a="col", b="col"),
                                 config("256x128x64", "128x128x64", cluster=(1, 2), raster=("row", 8))), "check"),
        ("cl2x1_cr_bias_gelu", k(operands(a="col", b="row", bias=True, activation="gelu"), config(cluster=(2, 1))), "check"),
    ]
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.rank.space import enumerate_space
    layouts = [("row", "col"), ("row", "row"), ("col", "col"), ("col", "row")]
    sweep = []
    for i, cfg in enumerate(enumerate_space(Family.SM90_WGMMA, lookup_gpu("h100"), Arch.SM90A, operands=operands())):
        a, b = layouts[i % 4]
        sweep.append((f"space{i:02d}", k(operands("bf16" if i % 3 else "f16", a=a, b=b), cfg), "sweep"))
    sets["space"] = sweep
    sets["final"] = [
        ("g8_rc", k(operands(), config(raster=("row", 8))), "perf"),
        ("c256x128g8_rc", k(operands(), config("256x128x64", "128x128x64", raster=("row", 8))), "perf"),
        ("cl2x1g8_rc", k(operands(), config(cluster=(2, 1), raster=("row", 8))), "perf"),
        ("c256cl2x1g8_rc", k(operands(), config("256x128x64", "128x128x64", cluster=(2, 1), raster=("row", 8))), "perf"),
    ]
    g8 = ("row", 8)
    sets["splitk"] = [
        # correctness of split-K and one-warpgroup tiles, layouts/dtypes/epilogues rotated
        ("sk4_256_rr", k(operands(b="row"), config(raster=g8, splits=4)), "check"),
        ("sk2_128_f16_cc", k(operands("f16", a="col", b="col"), config("128x128x64", "64x128x64", 6, raster=g8, splits=2)), "check"),
        ("sk8_64_cr_gelu", k(operands(a="col", b="row", bias=True, activation="gelu"),
                             config("64x128x64", "64x128x64", 6, raster=g8, splits=8)), "check"),
        ("sk2_64x256_rc_relu", k(operands(bias=True, activation="relu"), config("64x256x64", "64x256x64", 4, raster=g8, splits=2)), "check"),
        ("sk3_cl2x1_rr", k(operands(b="row"), config(cluster=(2, 1), raster=g8, splits=3)), "check"),
        ("dp_64_rr_odd", k(Operands(a_layout=Layout.ROW, b_layout=Layout.ROW, align_c=2), config("64x128x64", "64x128x64", 6, raster=g8)), "check"),
        ("sk4_256_rr_odd", k(Operands(a_layout=Layout.ROW, b_layout=Layout.ROW, align_c=2), config(raster=g8, splits=4)), "check"),
        # suite candidates (row-major A and B, bf16)
        ("dp256", k(operands(b="row"), config(raster=g8)), "perf"),
        ("dp128", k(operands(b="row"), config("128x128x64", "64x128x64", 6, raster=g8)), "perf"),
        ("dp64", k(operands(b="row"), config("64x128x64", "64x128x64", 6, raster=g8)), "perf"),
        ("sk2_256", k(operands(b="row"), config(raster=g8, splits=2)), "perf"),
        ("sk4_256", k(operands(b="row"), config(raster=g8, splits=4)), "perf"),
        ("sk2_128", k(operands(b="row"), config("128x128x64", "64x128x64", 6, raster=g8, splits=2)), "perf"),
        ("sk4_128", k(operands(b="row"), config("128x128x64", "64x128x64", 6, raster=g8, splits=4)), "perf"),
        ("sk4_64", k(operands(b="row"), config("64x128x64", "64x128x64", 6, raster=g8, splits=4)), "perf"),
        ("sk8_64x256", k(operands(b="row"), config("64x256x64", "64x256x64", 4, raster=g8, splits=8)), "perf"),
        ("dp64s4", k(operands(b="row"), config("64x128x64", "64x128x64", 4, raster=g8)), "perf"),
        ("dp64x256", k(operands(b="row"), config("64x256x64", "64x256x64", 4, raster=g8)), "perf"),
        ("dp256x128", k(operands(b="row"), config("256x128x64", "128x128x64", 4, raster=g8)), "perf"),
    ]
    return sets


def build(set_name: str) -> None:
    BUILD.mkdir(exist_ok=True)
    for label, kernel, role in variant_sets()[set_name]:
        t0 = time.time()
        src = render(kernel)
        (BUILD / f"{label}.cu").write_text(src)
        cubin, log = compile_cubin(kernel, src)
        (BUILD / f"{label}.cubin").write_bytes(cubin)
        meta = {"label": label, "name": kernel.name, "role": role, "config": kernel.config.to_dict(),
                "operands": operands_dict(kernel.operands), "log": log}
        (BUILD / f"{label}.json").write_text(json.dumps(meta, indent=1))
        regs = [l for l in log.splitlines() if "registers" in l or "spill" in l or "arning" in l]
        print(f"{label:28s} {time.time() - t0:5.1f}s  " + " | ".join(x.strip() for x in regs)[:300])


# ------------------------------------------------------------------------------- device side
CHECK_SHAPES = [(128, 256, 64), (4096, 4096, 4096), (3000, 1000, 2056), (1000, 3000, 4104), (1100, 1000, 200),
                (65, 72, 8), (1, 8, 8)]
PERF_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
ROUNDS = int(os.environ.get("LAB_ROUNDS", "3"))


def _kernel_from_meta(meta: dict) -> Kernel:
    from gemmgen.model.problem import Activation
    o = meta["operands"]
    ops = Operands(DType(o["a_dtype"]), DType(o["b_dtype"]), DType(o["c_dtype"]), DType(o["acc_dtype"]),
                   Layout(o["a_layout"]), Layout(o["b_layout"]), o["align_a"], o["align_b"], o["align_c"],
                   o["bias"], Activation(o["activation"]))
    return Kernel(Arch.SM90A, ops, TileConfig.from_dict(meta["config"]))


def tensormaps(tma, specs: dict, a_store, b_store, d) -> dict:
    """The launch's tensor maps over the given tensors: A's and B's, and D's when the kernel stores through TMA
    (every kernel with 16-byte aligned D rows since 2026-11-22; before, this lab encoded only tmA and tmB)."""
    values = {"tmA": tma.encode(specs["tmA"], a_store.data_ptr()), "tmB": tma.encode(specs["tmB"], b_store.data_ptr())}
    if "tmD" in specs:
        values["tmD"] = tma.encode(specs["tmD"], d.data_ptr())
    return values


def run_one(meta_path: str, perf: bool, sets: int = 3) -> dict:
    import torch
    from cuda.bindings import driver
    from gemmgen.runtime import tma

    meta = json.loads(Path(meta_path).read_text())
    kernel = _kernel_from_meta(meta)
    ops = kernel.operands
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    tma.check("cuInit", driver.cuInit(0))
    dev = tma.check("cuDeviceGet", driver.cuDeviceGet(0))
    ctx = tma.check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(dev))
    tma.check("cuCtxSetCurrent", driver.cuCtxSetCurrent(ctx))
    sm_count = tma.check("cuDeviceGetAttribute", driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    module = tma.check("cuModuleLoadData", driver.cuModuleLoadData(Path(meta_path).with_suffix(".cubin").read_bytes()))
    func = tma.check("cuModuleGetFunction", driver.cuModuleGetFunction(module, meta["name"].encode()))
    tdt = torch.bfloat16 if ops.a_dtype is DType.BF16 else torch.float16
    stream = torch.cuda.current_stream().cuda_stream
    out = {"label": meta["label"], "checks": [], "perf": []}

    def make_inputs(m, n, k, beta):
        # A (M x K) and B (K x N) in their storage layouts; logical views for the reference.
        a_store = torch.randn(m, k, device="cuda", dtype=tdt) if ops.a_layout is Layout.ROW else \
            torch.randn(k, m, device="cuda", dtype=tdt)
        b_store = torch.randn(k, n, device="cuda", dtype=tdt) if ops.b_layout is Layout.ROW else \
            torch.randn(n, k, device="cuda", dtype=tdt)
        a = a_store if ops.a_layout is Layout.ROW else a_store.t()
        b = b_store if ops.b_layout is Layout.ROW else b_store.t()
        c = torch.randn(m, n, device="cuda", dtype=tdt) if beta else None
        bias = torch.randn(n, device="cuda", dtype=tdt) if ops.bias else None
        return a_store, b_store, a, b, c, bias

    def prepare(problem, a_store, b_store, c, bias, d):
        launch = sm90.launch(kernel, problem, sm_count, max_clusters)
        specs = {p["name"]: p for p in launch["params"] if p["kind"] == "tensormap"}
        values = {**tensormaps(tma, specs, a_store, b_store, d),
                  "C": c.data_ptr() if c is not None else 0, "D": d.data_ptr(),
                  "bias": bias.data_ptr() if bias is not None else 0, "workspace": 0}
        return launch, values

    probe = sm90.launch(kernel, Problem(128, 128, 64), sm_count)
    tma.prepare_function(func, probe["dynamic_smem"])
    max_clusters = tma.max_active_clusters(func, probe)
    out["max_clusters"] = max_clusters

    def reference(a, b, c, bias, alpha, beta):
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

    shapes = CHECK_SHAPES if not perf else CHECK_SHAPES[:4]
    for (m, n, k) in shapes:
        lay = (ops.a_layout.value, ops.b_layout.value)
        if (ops.a_layout is Layout.ROW and k % 8) or (ops.b_layout is Layout.COL and k % 8) or \
           (ops.a_layout is Layout.COL and m % 8) or (ops.b_layout is Layout.ROW and n % 8):
            continue  # leading dimension not a 16-byte multiple: constraints route these to sm80
        alpha, beta = (0.5, 0.25) if (m * n) % 3 == 0 else (1.0, 0.0)
        problem = Problem.create(m, n, k, ops.a_dtype.value, *lay, alpha=alpha, beta=beta, bias=ops.bias,
                                 activation=ops.activation.value)
        a_store, b_store, a, b, c, bias = make_inputs(m, n, k, beta)
        d = torch.full((m, n), float("nan"), device="cuda", dtype=tdt)
        launch, values = prepare(problem, a_store, b_store, c, bias, d)
        tma.launch_sm90(func, launch, values, stream)
        torch.cuda.synchronize()
        ref = reference(a, b, c, bias, alpha, beta)
        dd = d.float()
        nan = int(torch.isnan(dd).sum())
        err = float((dd - ref).norm() / ref.norm()) if nan == 0 else float("nan")
        ok = nan == 0 and err < (1e-2 if ops.a_dtype is DType.BF16 else 3e-3)
        out["checks"].append({"shape": [m, n, k], "err": err, "nan": nan, "ok": ok, "grid": launch["grid"][0]})

    if perf:
        for (m, n, k) in PERF_SHAPES:
            problem = Problem.create(m, n, k, ops.a_dtype.value, ops.a_layout.value, ops.b_layout.value)
            bufs = []
            for _ in range(sets):
                a_store, b_store, a, b, c, bias = make_inputs(m, n, k, 0.0)
                d = torch.empty(m, n, device="cuda", dtype=tdt)
                bufs.append((a_store, b_store, a, b, d) + prepare(problem, a_store, b_store, None, bias, d))
            # correctness on the timed buffers too
            bufs[0][4].fill_(float("nan"))
            tma.launch_sm90(func, bufs[0][5], bufs[0][6], stream)
            torch.cuda.synchronize()
            ref = bufs[0][2].float() @ bufs[0][3].float()
            err = float((bufs[0][4].float() - ref).norm() / ref.norm())
            del ref

            def time_it(fn, reps):
                for i in range(5):
                    fn(i)
                torch.cuda.synchronize()
                times = []
                for i in range(reps):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    fn(i)
                    e1.record()
                    e1.synchronize()
                    times.append(e0.elapsed_time(e1) / 1e3)
                times.sort()
                return times[len(times) // 2], times[0], times[-1]

            reps = 30 if m <= 4096 else 10
            ours_fn = lambda i: tma.launch_sm90(func, bufs[i % sets][5], bufs[i % sets][6], stream)  # noqa: E731
            cub_fn = lambda i: torch.matmul(bufs[i % sets][2], bufs[i % sets][3], out=bufs[i % sets][4])  # noqa: E731
            # Interleaved rounds, so clock and thermal drift hit both alike; median of the round medians.
            ours_r, cub_r = [], []
            for _ in range(ROUNDS):
                ours_r.append(time_it(ours_fn, reps)[0])
                cub_r.append(time_it(cub_fn, reps)[0])
            ours_t, cub_t = sorted(ours_r)[ROUNDS // 2], sorted(cub_r)[ROUNDS // 2]
            paired = sorted(c / o for o, c in zip(ours_r, cub_r))[ROUNDS // 2]
            fl = 2 * m * n * k
            out["perf"].append({"shape": [m, n, k], "err": err, "ours_rounds_s": ours_r, "cublas_rounds_s": cub_r,
                                "tflops": fl / ours_t / 1e12, "cublas_tflops": fl / cub_t / 1e12,
                                "ratio": cub_t / ours_t, "paired_ratio": paired})
            del bufs
            torch.cuda.empty_cache()
    return out


SWEEP_SHAPES = [(1096, 1000, 200), (640, 2304, 1544)]


def run_sweep(paths: "list[str]") -> None:
    """Correctness of many variants in one process (the space's hang check); one JSON line each."""
    global CHECK_SHAPES
    CHECK_SHAPES = SWEEP_SHAPES
    for path in paths:
        print(json.dumps({"start": Path(path).stem}), flush=True)
        print(json.dumps(run_one(path, perf=False)), flush=True)


def sweep(set_name: str, timeout: float, chunk: int = 16) -> None:
    paths = [str(BUILD / f"{label}.json") for label, _, _ in variant_sets()[set_name]]
    results, hung = [], []
    for i in range(0, len(paths), chunk):
        part = paths[i:i + chunk]
        try:
            proc = subprocess.run([sys.executable, __file__, "sweep-part"] + part, capture_output=True, text=True,
                                  timeout=timeout)
            text, err = proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            text, err = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), "TIMEOUT"
        lines = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
        started = [l["start"] for l in lines if "start" in l]
        done = [l for l in lines if "checks" in l]
        results += done
        if len(done) < len(part):
            hung.append({"after": [d["label"] for d in done][-1:], "started": started[-1:], "error": err[-800:]})
    bad = [(r["label"], c) for r in results for c in r["checks"] if not c["ok"]]
    print(f"sweep {set_name}: {len(results)}/{len(paths)} variants ran, {sum(len(r['checks']) for r in results)} "
          f"checks, {len(bad)} failed, incomplete chunks: {hung}")
    for label, c in bad[:10]:
        print("   FAIL", label, c)


def device(set_name: str, timeout: float, only: "list[str] | None") -> None:
    metas = sorted(BUILD.glob("*.json"))
    results = []
    wanted = [label for label, _, _ in variant_sets()[set_name]]
    for label in wanted:
        if only and label not in only:
            continue
        path = BUILD / f"{label}.json"
        if not path.exists():
            print(f"{label}: not built")
            continue
        role = json.loads(path.read_text())["role"]
        if role == "sweep":
            continue
        t0 = time.time()
        try:
            proc = subprocess.run([sys.executable, __file__, "one", str(path)] + (["--perf"] if role == "perf" else []),
                                  capture_output=True, text=True, timeout=timeout)
            lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
            res = json.loads(lines[-1]) if lines else {"label": label, "error": (proc.stderr or proc.stdout)[-1500:]}
        except subprocess.TimeoutExpired:
            res = {"label": label, "error": f"TIMEOUT after {timeout}s (hang?)"}
        res["wall_s"] = round(time.time() - t0, 1)
        results.append(res)
        print(json.dumps(res), flush=True)
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, f"lab_{set_name}.json").write_text(json.dumps(results, indent=1))
    print("\n=== summary ===")
    for r in results:
        if "error" in r:
            print(f"{r['label']:28s} ERROR {r['error'][-600:]}")
            continue
        bad = [c for c in r["checks"] if not c["ok"]]
        worst = max((c["err"] for c in r["checks"]), default=0.0)
        line = f"{r['label']:22s} mc={r.get('max_clusters')} checks {len(r['checks']) - len(bad)}/{len(r['checks'])} worst_err {worst:.2e}"
        for p in r["perf"]:
            line += (f" | {p['shape'][0]}^3 {p['tflops']:.0f} TF/s vs cuBLAS {p['cublas_tflops']:.0f}"
                     f" = {p['ratio']:.3f}x paired {p.get('paired_ratio', 0):.3f}x (err {p['err']:.1e})")
        print(line)
        for c in bad:
            print(f"    FAIL {c}")


# ------------------------------------------------------------------------------- split-K and the suite
SUITE_CHECK_SHAPES = [(1000, 3000, 4104), (1100, 1000, 200), (65, 72, 8), (3000, 1000, 2056), (129, 8200, 5000),
                      (16, 4096, 4096)]
SUITE_PERF = {  # shape -> candidate labels of the "splitk" set
    "sq4096": ((4096, 4096, 4096), ["dp256"]),
    "sq8192": ((8192, 8192, 8192), ["dp256"]),
    "largek": ((1024, 1024, 65536), ["dp256", "sk4_256", "sk2_128", "sk4_128"]),
    "skinny_m128": ((128, 8192, 8192), ["dp256", "dp128", "dp64", "sk4_256", "sk2_128", "sk4_128"]),
    "sq1024": ((1024, 1024, 1024), ["dp128", "dp64", "sk2_128", "sk4_128", "sk4_64"]),
    "sq2048": ((2048, 2048, 2048), ["dp256", "dp128", "dp64", "sk2_128"]),
    "skinny_m16": ((16, 4096, 4096), ["dp64", "sk4_64", "sk8_64x256"]),
}
SUITE_PERF_2 = {  # second pass: the rest of the suite, and 64-row tiles at two CTAs per SM
    "sq1024": ((1024, 1024, 1024), ["dp64", "dp64s4", "dp64x256"]),
    "sq2048": ((2048, 2048, 2048), ["dp128", "dp64s4", "dp64x256", "dp256x128"]),
    "llm_qkv": ((4096, 6144, 4096), ["dp256", "dp256x128"]),
    "llm_o": ((4096, 4096, 4096), ["dp256", "dp256x128"]),
    "llm_up": ((4096, 28672, 4096), ["dp256"]),
    "llm_down": ((4096, 4096, 14336), ["dp256", "dp256x128"]),
    "odd3000": ((3000, 3000, 3000), ["dp256", "dp128", "dp256x128"]),
    "skinny_m128": ((128, 8192, 8192), ["dp64", "dp64s4"]),
}


class Runner:
    """One compiled variant on the device: its functions and a launcher for (problem, tensors)."""

    def __init__(self, meta_path: Path):
        from cuda.bindings import driver
        from gemmgen.runtime import tma
        self.tma, self.meta = tma, json.loads(meta_path.read_text())
        self.kernel = _kernel_from_meta(self.meta)
        module = tma.check("cuModuleLoadData", driver.cuModuleLoadData(meta_path.with_suffix(".cubin").read_bytes()))
        name = self.meta["name"]
        self.funcs = {name: tma.check("cuModuleGetFunction", driver.cuModuleGetFunction(module, name.encode()))}
        if sm90.splits(self.kernel) > 1:
            self.funcs[name + "_reduce"] = tma.check("cuModuleGetFunction",
                                                     driver.cuModuleGetFunction(module, (name + "_reduce").encode()))
        probe = sm90.launch(self.kernel, Problem(128, 128, 64), 132)
        tma.prepare_function(self.funcs[name], probe["dynamic_smem"])
        self.max_clusters = tma.max_active_clusters(self.funcs[name], probe)

    def bind(self, problem, a_store, b_store, c, bias, d, workspace, sm_count=132):
        """[(function, launch, values)] for one GEMM: the kernel, and the reduction for split-K."""
        runs, ws_bytes = sm90.launches(self.kernel, problem, sm_count, self.max_clusters)
        specs = {p["name"]: p for p in runs[0]["params"] if p["kind"] == "tensormap"}
        values = {**tensormaps(self.tma, specs, a_store, b_store, d),
                  "C": c.data_ptr() if c is not None else 0, "D": d.data_ptr(),
                  "bias": bias.data_ptr() if bias is not None else 0,
                  "workspace": workspace.data_ptr() if ws_bytes else 0}
        assert ws_bytes <= (workspace.numel() * 4 if workspace is not None else 0)
        return [(self.funcs[r["entry"]], r, values) for r in runs], runs

    def go(self, bound, stream):
        for func, launch, values in bound:
            self.tma.launch_sm90(func, launch, values, stream)


def _tensors(ops, m, n, k, beta, torch, tdt):
    a_store = torch.randn(m, k, device="cuda", dtype=tdt) if ops.a_layout is Layout.ROW else \
        torch.randn(k, m, device="cuda", dtype=tdt)
    b_store = torch.randn(k, n, device="cuda", dtype=tdt) if ops.b_layout is Layout.ROW else \
        torch.randn(n, k, device="cuda", dtype=tdt)
    a = a_store if ops.a_layout is Layout.ROW else a_store.t()
    b = b_store if ops.b_layout is Layout.ROW else b_store.t()
    c = torch.randn(m, n, device="cuda", dtype=tdt) if beta else None
    bias = torch.randn(n, device="cuda", dtype=tdt) if ops.bias else None
    return a_store, b_store, a, b, c, bias


def _init_torch():
    import torch
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    from cuda.bindings import driver
    from gemmgen.runtime import tma
    tma.check("cuInit", driver.cuInit(0))
    dev = tma.check("cuDeviceGet", driver.cuDeviceGet(0))
    ctx = tma.check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(dev))
    tma.check("cuCtxSetCurrent", driver.cuCtxSetCurrent(ctx))
    return torch


def suite_check(labels: "list[str]") -> None:
    """Split-K correctness: fresh inputs, NaN-poisoned D and workspace, odd shapes, K % (S*BK) != 0."""
    torch = _init_torch()
    stream = torch.cuda.current_stream().cuda_stream
    for label in labels:
        runner = Runner(BUILD / f"{label}.json")
        ops = runner.kernel.operands
        tdt = torch.bfloat16 if ops.a_dtype is DType.BF16 else torch.float16
        for (m, n, k) in SUITE_CHECK_SHAPES:
            if (ops.a_layout is Layout.ROW and k % 8) or (ops.b_layout is Layout.COL and k % 8) or \
               (ops.a_layout is Layout.COL and m % 8) or (ops.b_layout is Layout.ROW and n % 8):
                continue
            alpha, beta = (0.5, 0.25) if (m + n) % 3 == 0 else (1.0, 0.0)
            problem = Problem.create(m, n, k, ops.a_dtype.value, ops.a_layout.value, ops.b_layout.value, alpha=alpha,
                                     beta=beta, bias=ops.bias, activation=ops.activation.value)
            a_store, b_store, a, b, c, bias = _tensors(ops, m, n, k, beta, torch, tdt)
            d = torch.full((m, n), float("nan"), device="cuda", dtype=tdt)
            ws = torch.full((sm90.splits(runner.kernel) * m * n + 4,), float("nan"), device="cuda", dtype=torch.float32)
            bound, runs = runner.bind(problem, a_store, b_store, c, bias, d, ws)
            runner.go(bound, stream)
            torch.cuda.synchronize()
            ref = alpha * (a.float() @ b.float())
            if c is not None:
                ref += beta * c.float()
            if bias is not None:
                ref += bias.float()
            if ops.activation.value == "relu":
                ref = torch.relu(ref)
            elif ops.activation.value == "gelu":
                ref = torch.nn.functional.gelu(ref, approximate="tanh")
            nan = int(torch.isnan(d.float()).sum())
            err = float((d.float() - ref).norm() / ref.norm()) if nan == 0 else float("nan")
            ok = nan == 0 and err < (1e-2 if ops.a_dtype is DType.BF16 else 3e-3)
            k_tiles = -(-k // 64)
            print(json.dumps({"label": label, "shape": [m, n, k], "splits": sm90.splits(runner.kernel),
                              "k_tiles": k_tiles, "grid": runs[0]["grid"][0], "launches": len(runs),
                              "err": err, "nan": nan, "ok": ok}), flush=True)


def suite_perf(names: "list[str]", table: "dict | None" = None, rounds: int = 5, reps: int = 10) -> None:
    """Suite shapes in bf16, A and B row-major: every candidate against torch.matmul in the same run.

    Each timing replays a CUDA graph of `reps` GEMMs over rotated input sets (enough sets to overflow the
    50 MB L2), so small shapes measure the GPU rather than Python's launch overhead; cuBLAS is timed the
    same way, rounds interleaved, median of rounds; 'paired' is the median of per-round ratios.
    """
    torch = _init_torch()
    runners = {}
    results = []
    for name in names:
        (m, n, k), labels = (table or SUITE_PERF)[name]
        tdt = torch.bfloat16
        per_set = (m * k + k * n + m * n) * 2
        sets = max(2, min(8, -(-150_000_000 // per_set)))
        bufs = [_tensors(operands(b="row"), m, n, k, 0.0, torch, tdt) + (torch.empty(m, n, device="cuda", dtype=tdt),)
                for _ in range(sets)]
        ref = bufs[0][2].float() @ bufs[0][3].float()
        fl = 2.0 * m * n * k

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

        def time_graph(g):
            g.replay()
            times = []
            for _ in range(3):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record(); g.replay(); e1.record(); e1.synchronize()
                times.append(e0.elapsed_time(e1) / 1e3 / reps)
            return sorted(times)[1]

        cub = graph_of(lambda st: [torch.matmul(bufs[i % sets][2], bufs[i % sets][3], out=bufs[i % sets][6])
                                   for i in range(reps)])
        ours = {}
        for label in labels:
            try:
                runner = runners.get(label) or runners.setdefault(label, Runner(BUILD / f"{label}.json"))
                problem = Problem.create(m, n, k, "bf16", "row", "row")
                s_ = sm90.splits(runner.kernel)
                ws = torch.full((max(1, s_ * m * n),), float("nan"), device="cuda", dtype=torch.float32) if s_ > 1 else None
                bound = [runner.bind(problem, b[0], b[1], None, None, b[6], ws)[0] for b in bufs]
                bufs[0][6].fill_(float("nan"))
                runner.go(bound[0], torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                d = bufs[0][6].float()
                nan = int(torch.isnan(d).sum())
                err = float((d - ref).norm() / ref.norm())
                g = graph_of(lambda st, runner=runner, bound=bound: [runner.go(bound[i % sets], st) for i in range(reps)])
                # The graph holds raw pointers: keep the workspace alive (torch.cuda.graph empties the
                # allocator's cache, so a freed workspace is unmapped and a replay faults).
                ours[label] = {"graph": g, "err": err, "nan": nan, "grid": bound[0][0][1]["grid"][0], "t": [],
                               "workspace": ws}
            except Exception as exc:  # report and go on with the other candidates
                print(json.dumps({"shape": name, "label": label, "error": repr(exc)[-400:]}), flush=True)
        cub_t = []
        for _ in range(rounds):
            cub_t.append(time_graph(cub))
            for label, o in ours.items():
                o["t"].append(time_graph(o["graph"]))
        cub_med = sorted(cub_t)[rounds // 2]
        for label, o in ours.items():
            med = sorted(o["t"])[rounds // 2]
            paired = sorted(c / t for c, t in zip(cub_t, o["t"]))[rounds // 2]
            row = {"shape": name, "mnk": [m, n, k], "label": label, "grid": o["grid"], "err": o["err"], "nan": o["nan"],
                   "us": med * 1e6, "tflops": fl / med / 1e12, "cublas_us": cub_med * 1e6,
                   "cublas_tflops": fl / cub_med / 1e12, "ratio": cub_med / med, "paired": paired,
                   "ours_rounds_us": [t * 1e6 for t in o["t"]], "cublas_rounds_us": [t * 1e6 for t in cub_t]}
            results.append(row)
            print(json.dumps(row), flush=True)
        del bufs, ref, ours, cub
        torch.cuda.empty_cache()
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, f"suite_perf_{len(names)}.json").write_text(json.dumps(results, indent=1))
    print("\n=== suite (bf16, A and B row-major, CUDA graphs, same-run cuBLAS) ===")
    for r in results:
        print(f"{r['shape']:12s} {r['label']:11s} grid {r['grid']:4d} {r['tflops']:6.1f} TF/s vs cuBLAS "
              f"{r['cublas_tflops']:6.1f} = {r['ratio']:.3f}x (paired {r['paired']:.3f}) err {r['err']:.1e} nan {r['nan']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["build", "device", "one", "sweep", "sweep-part", "suite-check", "suite-perf"])
    ap.add_argument("path", nargs="*")
    ap.add_argument("--set", default="step1")
    ap.add_argument("--perf", action="store_true")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    if args.cmd == "build":
        build(args.set)
    elif args.cmd == "device":
        device(args.set, args.timeout, args.only)
    elif args.cmd == "sweep":
        sweep(args.set, args.timeout)
    elif args.cmd == "sweep-part":
        run_sweep(args.path)
    elif args.cmd == "suite-check":
        suite_check(args.path or [l for l, _, r in variant_sets()["splitk"] if r == "check"])
    elif args.cmd == "suite-perf":
        table = SUITE_PERF_2 if args.set == "pass2" else SUITE_PERF
        suite_perf(args.path or list(table), table)
    else:
        print(json.dumps(run_one(args.path[0], args.perf)))


if __name__ == "__main__":
    main()
