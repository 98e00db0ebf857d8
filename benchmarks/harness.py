"""What the benchmarks share, on gemmgen's public APIs only: how a run ends, where its record goes, building a
kernel from a problem and a configuration, verifying it in the tuner's measuring process, and timing calls with
CUDA events."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing


def run_main(main: Callable[[], int], script: str) -> None:
    """Exit with main()'s status; an error the user can fix (no GPU, a bad argument) prints one line, exit 2."""
    from gemmgen.model.errors import UserError

    try:
        sys.exit(main())
    except UserError as exc:
        print(f"{Path(script).name}: {exc}", file=sys.stderr)
        sys.exit(2)


def detected_gpu():
    """The catalogue GPU the driver reports as device 0; without one (no driver, no GPU, a GPU gemmgen does not
    know) an InvalidInput naming why, which run_main prints as one line with exit status 2."""
    from gemmgen.model.errors import InvalidInput
    from gemmgen.runtime.detect import detect_gpu

    detected = detect_gpu()
    if detected.gpu is None:
        raise InvalidInput("this benchmark runs on a GPU in gemmgen's catalogue", detected.reason)
    return detected.gpu


def write_report(out_dir, filename: str, report: dict) -> Path:
    """The benchmark's JSON record under --out (created if missing); values JSON cannot hold are written as text."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / filename
    path.write_text(json.dumps(report, indent=1, default=str))
    return path


def kernel_for(problem, config, arch=None):
    """The Kernel `config` implements for `problem` on `arch` (default: sm_90a)."""
    from gemmgen import Arch, Kernel

    return Kernel(arch or Arch.SM90A, problem.operands, config)


def load_compiled(kernel, problem, compiled, prefix: str = "gemmgen-bench-"):
    """`compiled` exported as a bundle into a fresh temporary folder (unmeasured) and loaded with gemmgen.load:
    the path a user's kernel takes."""
    import tempfile

    import gemmgen
    from gemmgen.tune.export import export_bundle

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    export_bundle(folder, kernel, problem, compiled, measured=None, verification=None, environment={})
    return gemmgen.load(folder)


def product_shape(text: str, sep: str = "x") -> "tuple[int, int, int]":
    """(M, N, K) from a benchmark's 'MxNxK' (or, with `sep`, e.g. 'M,N,K'); an InvalidInput naming the text when it
    is not three positive integers."""
    from gemmgen.model.errors import InvalidInput

    parts = text.split(sep)
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise InvalidInput(f"a shape must be three positive integers M{sep}N{sep}K", text)
    return tuple(int(p) for p in parts)


def shape_problem(text: str, dtype: str = "bf16"):
    """The Problem a benchmark's --shape names: 'M,N,K,LAYOUTS' with LAYOUTS two of r (row-major) and c (column-major)
    for A and B, e.g. '16,4096,4096,rc'."""
    from gemmgen import Problem
    from gemmgen.model.errors import InvalidInput

    dims, _, lay = text.rpartition(",")
    major = {"r": "row", "c": "col"}
    if len(lay) != 2 or any(x not in major for x in lay):
        raise InvalidInput("a shape must be M,N,K,LAYOUTS with LAYOUTS two of r and c (A's, then B's)", text)
    return Problem.create(*product_shape(dims, ","), dtype, major[lay[0]], major[lay[1]]).k_major_rows()


def layout_operands(torch, problem, dtype):
    """A (M x K), B (K x N) in the problem's layouts (a column-major operand is a transposed view), random normal
    values cast to `dtype`, and an uninitialised D (M x N)."""
    m, n, k = problem.m, problem.n, problem.k

    def randn(rows, cols, col_major):
        x = torch.randn(cols, rows, device="cuda", dtype=torch.float32).t() if col_major else \
            torch.randn(rows, cols, device="cuda", dtype=torch.float32)
        return x.to(dtype)

    a = randn(m, k, problem.a_layout.value == "col")
    b = randn(k, n, problem.b_layout.value == "col")
    return a, b, torch.empty(m, n, device="cuda", dtype=dtype)


def poisoned_error(torch, gemm, a, b, d) -> float:
    """gemm(a, b, d) once with D poisoned (NaN) first: its relative error against the fp32 product of a and b in
    float64, NaN where any element is not finite (an unwritten one keeps the poison)."""
    d.fill_(float("nan"))
    gemm(a, b, d)
    torch.cuda.synchronize()
    if not bool(torch.isfinite(d).all()):
        return float("nan")
    ref = (a.float() @ b.float()).double()
    return float((d.double() - ref).norm() / ref.norm())


def checked_load(torch, kernel, problem, compiled, operands, prefix: str):
    """`compiled` loaded as a user would (load_compiled) and run once on `operands` (A, B, D) with D poisoned:
    (the callable, its relative error), or (None, None) after a printed line where the compile failed or the
    result is wrong (NaN included)."""
    if isinstance(compiled, Exception):
        print(f"  {kernel.config.tag}: compile failed", flush=True)
        return None, None
    gemm = load_compiled(kernel, problem, compiled, prefix)
    err = poisoned_error(torch, gemm, *operands)
    if not err < 1e-2:
        print(f"  {kernel.config.tag}: wrong result ({err})", flush=True)
        return None, None
    return gemm, err


def ranked_space(problem, gpu, params) -> list:
    """Every family's valid configurations for `problem` on `gpu`, ranked by the model with `params` (ties broken by
    the heuristic, then the name): the dry run's ranking, through the public rank APIs."""
    from gemmgen.rank.predict import predict
    from gemmgen.rank.ranking import rank_configs
    from gemmgen.rank.space import enumerate_space, families_for, heuristic_time

    space = [c for family in families_for(gpu.arch) for c in enumerate_space(family, gpu, problem=problem)]
    return rank_configs(space, problem, gpu, lambda p, c, g: predict(p, c, g, params), heuristic_time)


def configs_for_shape(path: "str | None", problem, gpu, have) -> list:
    """The configurations a --configs FILE gives for `problem`'s shape (a JSON object mapping 'MxNxK' to a list of
    configuration dicts, e.g. another tree's picks, so both are timed in one process), as unpredicted Ranked
    entries: those not among `have` (Ranked) and valid for the problem on `gpu`."""
    from gemmgen.families.rules import check
    from gemmgen.model.tiles import TileConfig
    from gemmgen.rank.ranking import Ranked

    if not path:
        return []
    given = json.loads(Path(path).read_text()).get(f"{problem.m}x{problem.n}x{problem.k}", [])
    known = {r.config for r in have}
    configs = [TileConfig.from_dict(c) for c in given]
    return [Ranked(c, None, None, "", 0) for c in configs if c not in known and not check(c, gpu, gpu.arch, problem)]


def ranked_shapes(texts) -> tuple:
    """(the detected GPU, [(Problem, its ranked space)]) for --shape texts ('M,N,K,LAYOUTS'), each ranked by the
    model with the GPU's calibration (ranked_space)."""
    from gemmgen.rank.calibration import params_for

    gpu = detected_gpu()
    params, _ = params_for(gpu)
    return gpu, [(p, ranked_space(p, gpu, params)) for p in map(shape_problem, texts)]


def compile_plans(plans, arch) -> list:
    """[(problem, [(ranked entry, Kernel, Compiled or the compile's exception)])] for plans [(problem, [ranked
    entry])]: every kernel compiled in one batch (NVRTC processes side by side)."""
    from gemmgen.codegen.nvrtc import compile_many

    kernels = [kernel_for(p, r.config, arch) for p, rs in plans for r in rs]
    built = iter(zip(kernels, compile_many(kernels, None)))
    return [(p, [(r, *next(built)) for r in rs]) for p, rs in plans]


def suite_problems(paths, only: "str | None" = None, dtype: str = "bf16") -> "list[tuple[str, object]]":
    """(name, Problem) of every shape of the suite files at `paths` (or of those named in `only`, comma-separated),
    read and checked as `gemmgen suite` reads them (a bad file or name is a SuiteFileError naming the rule)."""
    from gemmgen.tune.suite_file import load_suites, select

    shapes = select(load_suites(list(paths)), only, ", ".join(map(str, paths)))
    return [(s.name, s.problem(dtype)) for s in shapes]


def time_contenders(torch, gpu, plans, prefix: str, sets: int = 3, calls: int = 20, replays: int = 5,
                    passes: int = 5) -> "list[dict]":
    """For each (name, problem, [(label, ranked entry)]) of `plans`: every entry's kernel compiled (all at once),
    loaded and checked with D poisoned (checked_load), then CUDA-graph timed (`calls` calls over `sets` rotating
    bf16 input sets, median of `replays`) in `passes` interleaved passes beside cuBLAS (torch.matmul). One row per
    kernel that ran: its label, tag, predicted and measured µs (median over the passes), cuBLAS's and the ratio."""
    import statistics

    from gemmgen.codegen.nvrtc import compile_many

    kernels = [kernel_for(p, r.config, gpu.arch) for _, p, cs in plans for _, r in cs]
    print(f"compiling {len(kernels)} kernels", flush=True)
    built, kernels = iter(compile_many(kernels, None)), iter(kernels)
    rows = []
    for name, problem, chosen in plans:
        inputs = [layout_operands(torch, problem, torch.bfloat16) for _ in range(sets)]
        fns = {"cuBLAS": lambda s: torch.matmul(s[0], s[1], out=s[2])}
        meta = {}
        for label, r in chosen:
            gemm, err = checked_load(torch, next(kernels), problem, next(built), inputs[0], prefix)
            if gemm is not None:
                fns[r.config.tag] = lambda s, g=gemm: g(*s)
                meta[r.config.tag] = (label, r.time_s, err)
        times = interleaved_times(torch, fns, inputs, lambda t, fn, ss: graph_timed(t, fn, ss, calls, replays), passes)
        cublas = statistics.median(times["cuBLAS"])
        for tag, (label, predicted, err) in meta.items():
            us = statistics.median(times[tag]) * 1e6
            rows.append({"shape": name, "problem": problem.label, "label": label, "config": tag,
                         "predicted_us": predicted * 1e6, "us": us, "cublas_us": cublas * 1e6,
                         "vs_cublas": cublas * 1e6 / us, "rel_error": err})
            print(f"{name:12s} {label:20s} {tag.replace('sm90_wgmma_', '')[:64]:64s} {us:8.1f} us "
                  f"(pred {predicted * 1e6:7.1f})  {cublas * 1e6 / us:5.2f}x cuBLAS", flush=True)
        del inputs
    return rows


def by_shape(rows: "list[dict]") -> "dict[str, list[dict]]":
    """time_contenders' rows grouped by shape name, in the order the shapes ran."""
    out: "dict[str, list[dict]]" = {}
    for r in rows:
        out.setdefault(r["shape"], []).append(r)
    return out


def verify_shapes(torch, gemm, shapes, a_layout: str, b_layout: str, operand, rel_error, tolerance: float = 1e-2):
    """Run a loaded bf16 kernel at each (M, N, K) of `shapes` on fresh random operands in the given layouts, D
    poisoned with NaN first, against an fp32 product (the caller sets TF32 off). Returns (all within tolerance,
    the errors, or the refusal text where the bundle does not serve a shape). NaN never passes."""
    import gemmgen

    errors = []
    for mm, nn, kk in shapes:
        A, B = operand(torch, mm, kk, a_layout, torch.bfloat16), operand(torch, kk, nn, b_layout, torch.bfloat16)
        D = torch.full((mm, nn), float("nan"), device="cuda", dtype=torch.bfloat16)
        try:
            gemm(A, B, D)
            torch.cuda.synchronize()
            errors.append(rel_error(torch, D, A.float() @ B.float()))
        except gemmgen.UserError as exc:
            errors.append(f"refused: {exc}")
    return all(isinstance(e, float) and e < tolerance for e in errors), errors


def verify_all(todo, watchdog_s: float = 60.0, jobs: "int | None" = None) -> "list[dict]":
    """Compile every (label, problem, kernel) of `todo` over a process pool, then run each once in the tuner's
    measuring worker (fresh random inputs, NaN-poisoned outputs, cuBLAS fp32-accumulate reference, a watchdog that
    kills a hung kernel). One row per case: ok, kind (compile, hang, crash, wrong, ...), rel_error, reason."""
    from gemmgen.codegen.nvrtc import compile_many
    from gemmgen.model.errors import CompileError
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.tune.worker import WorkerBenchmark

    built = compile_many([kernel for _, _, kernel in todo], jobs)
    worker = WorkerBenchmark(watchdog_s=watchdog_s)
    worker.start()
    rows = []
    try:
        for (label, problem, kernel), result in zip(todo, built):
            row = {"case": label, "name": kernel.name, "family": kernel.config.family,
                   "problem": f"{problem.m}x{problem.n}x{problem.k}", "epilogue": str(problem.epilogue)}
            if isinstance(result, CompileError):
                row.update(ok=False, kind="compile", rel_error=None, reason=str(result)[:300])
            else:
                outcome = worker.measure(make_manifest(kernel, problem, result), result.cubin, problem)
                row.update(ok=outcome.ok, kind=outcome.kind, rel_error=outcome.rel_error, reason=outcome.reason[:300])
            rows.append(row)
            if not row["ok"]:
                print(f"  FAIL {label} {kernel.config.tag} {row['problem']}: {row['kind']} {row['reason'][:160]}",
                      flush=True)
    finally:
        worker.close()
    return rows


def event_time(torch, fn, sets, calls: int) -> float:
    """Seconds per call of `calls` back-to-back calls of fn, cycling through the input sets, between two CUDA
    events (host time is not counted unless the calls are host-bound)."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for j in range(calls):
        fn(sets[j % len(sets)])
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / calls


def graph_timed(torch, fn, sets, calls: int = 40, replays: int = 9) -> float:
    """Seconds per call of fn over the input sets, `calls` calls captured in one CUDA graph (no host time between
    them, where a Python launch path of 20-30 us would otherwise be what is timed): median over `replays`. Every
    set is run once first, on a side stream, so that kernels load and bind before the capture."""
    import statistics

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for s in sets:
            fn(s)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(calls):
            fn(sets[j % len(sets)])
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def timed(torch, fn, sets, rounds: int, calls: int) -> float:
    """Median over `rounds` of event_time."""
    import statistics

    return statistics.median(event_time(torch, fn, sets, calls) for _ in range(rounds))


def interleaved_times(torch, contenders: dict, sets, time_one, passes: int = 3,
                      alternate: bool = False) -> "dict[object, list[float]]":
    """Each contender called once on every input set (warm-up), then `passes` passes over all of them in turn, each
    timed by time_one(torch, fn, sets): per contender, its seconds per call in each pass. `alternate` runs every other
    pass in reverse order, so no contender always follows the same one (a power-limited card's clock carries over)."""
    for fn in contenders.values():
        for s in sets:
            fn(s)
    torch.cuda.synchronize()
    times = {key: [] for key in contenders}
    order = list(contenders.items())
    for i in range(passes):
        for key, fn in order if not (alternate and i % 2) else order[::-1]:
            times[key].append(time_one(torch, fn, sets))
    return times


__all__ = ["ROOT", "by_shape", "checked_load", "compile_plans", "event_time", "interleaved_times", "kernel_for",
           "layout_operands", "load_compiled", "poisoned_error", "product_shape", "ranked_shapes", "ranked_space",
           "run_main", "shape_problem", "suite_problems", "time_contenders", "timed", "verify_all", "verify_shapes",
           "write_report"]
