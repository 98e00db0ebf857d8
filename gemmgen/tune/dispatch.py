"""Tuning a shape set into one dispatch folder: every bucket tuned at its upper bound, each seeded with the
finalists of the bucket tuned before it (the next M down at the same N x K), then the distinct winners exported
once each beside a dispatch.json that runtime/dispatch.py reads (its docstring has the format).

Buckets of one N x K are tuned in ascending M, so a bucket's study measures first the finalists of its neighbour
below and then the model's own picks (TuneOptions.seeds): near shapes usually share their best tiles, and under
`--buckets auto` those measurements are also what decides whether the lower bucket's kernel can serve this one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from ..model.arch import Arch, Gpu
from ..model.errors import InvalidInput
from ..model.problem import Problem
from ..model.tiles import Kernel
from .buckets import Bucket, BucketOutcome, refine_buckets, table_entries
from .results import fingerprint, now, write_json_atomic

DISPATCH_FORMAT = "gemmgen-dispatch/1"  # runtime/dispatch.py reads it (and checks it is this)


@dataclass(frozen=True)
class BucketRun:
    """One bucket's tune: the bucket, its TuneResult, the seeds it started from, what its study measured."""

    bucket: Bucket
    result: object  # TuneResult
    seeds: "tuple[str, ...]"
    outcome: BucketOutcome


@dataclass(frozen=True)
class DispatchResult:
    base: Problem
    gpu: Gpu
    runs: "tuple[BucketRun, ...]"
    tables: "tuple[dict, ...]"  # dispatch.json's `tables`
    kernels: "tuple[str, ...]"  # the distinct kernels the tables name
    folder: "Path | None"


def measured_times(record_path: "Path | None") -> "dict[str, float]":
    """Kernel name -> its time in a tune's record: the finalist median where re-measured, else the best trial."""
    if record_path is None:
        return {}
    try:
        record = json.loads(Path(record_path).read_text())
    except (OSError, ValueError):
        return {}
    times: "dict[str, float]" = {}
    for trial in record.get("trials", []):
        if trial.get("state") == "COMPLETE" and trial.get("time_s") and trial.get("kernel"):
            name = trial["kernel"]
            times[name] = min(times.get(name, float("inf")), float(trial["time_s"]))
    for finalist in record.get("finalists", []):
        if finalist.get("median_time_s") and not finalist.get("failed"):
            times[finalist["kernel"]] = float(finalist["median_time_s"])
    return times


def model_ranking(base: Problem, gpu: Gpu, arch: Arch, engines):
    """(m, n, k) -> {config tag: predicted seconds}, best first, over the configurations the rules allow at that
    shape (base's dtypes, layouts and epilogue); cached per shape. What `auto` splits buckets by."""
    cache: "dict[tuple[int, int, int], dict[str, float]]" = {}

    def ranked_at(m: int, n: int, k: int) -> "dict[str, float]":
        key = (m, n, k)
        if key not in cache:
            _, ranking = engines.ranked_space(replace(base, m=m, n=n, k=k), gpu, arch)
            cache[key] = {r.config.tag: r.time_s for r in ranking}
        return cache[key]

    return ranked_at


def plan_buckets(base: Problem, buckets: "list[Bucket]", gpu: Gpu, arch: Arch, engines, bucketing: str,
                 emit=None) -> "list[Bucket]":
    """The buckets a shape set tunes: as given, or under `auto` split where the model says one kernel would not
    serve a bucket's lower part (tune/buckets.refine_buckets). `emit("split", {...})` names each split."""
    if bucketing != "auto":
        return list(buckets)
    refined = refine_buckets(buckets, model_ranking(base, gpu, arch, engines))
    if emit is not None and len(refined) != len(buckets):
        emit("split", {"before": len(buckets), "after": len(refined), "buckets": tuple(refined)})
    return refined


def tune_buckets(base: Problem, buckets: "list[Bucket]", gpu: Gpu, measurer, options, *, engines=None,
                 arch: "Arch | None" = None, on_event=None, device: "dict | None" = None,
                 bucketing: str = "pow2", out: "str | None" = None) -> DispatchResult:
    """Tune every bucket (ascending M per N x K, each seeded with its lower neighbour's finalists), build the
    tables and, with `out`, export the folder. `on_event(kind, info)` also gets ("bucket", {...}) per bucket."""
    from .engines import default_engines
    from .search import tune

    if not buckets:
        raise InvalidInput("a shape set must hold at least one shape", 0)
    own = engines is None
    engines = engines or default_engines(options.jobs)
    arch = arch or gpu.arch
    emit = on_event or (lambda kind, info: None)
    runs: "list[BucketRun]" = []
    try:
        buckets = plan_buckets(base, buckets, gpu, arch, engines, bucketing, emit)
        previous: "dict[tuple[int, int], BucketRun]" = {}
        ordered = sorted(buckets, key=lambda b: (b.n, b.k, b.m_max))
        for i, bucket in enumerate(ordered):
            problem = replace(base, m=bucket.m_max, n=bucket.n, k=bucket.k)
            below = previous.get((bucket.n, bucket.k))
            seeds = below.outcome.finalist_tags if below is not None else ()
            emit("bucket", {"index": i + 1, "count": len(ordered), "bucket": bucket, "problem": problem,
                            "seeds": seeds})
            result = tune(problem, gpu, measurer, replace(options, seeds=tuple(seeds), out=None), engines=engines,
                          arch=arch, on_event=on_event, device=device)
            finalists = tuple(f.config.tag for f in result.finalists if f.times_s and not f.failed)
            winner = result.winner
            outcome = BucketOutcome(bucket, winner.kernel if winner else None,
                                    winner.config.tag if winner else None, measured_times(result.record_path),
                                    finalists)
            run = BucketRun(bucket, result, tuple(seeds), outcome)
            runs.append(run)
            previous[(bucket.n, bucket.k)] = run
        tables = _tables([r.outcome for r in runs], bucketing)
        kernels = tuple(dict.fromkeys(e["kernel"] for t in tables for e in t["buckets"]))
        cublas = {(r.bucket.n, r.bucket.k, r.bucket.m_max): r.result.cublas_time_s for r in runs}
        for t in tables:
            for entry in t["buckets"]:
                entry["cublas_time_s"] = cublas.get((t["n"], t["k"], entry["tuned_at"][0]))
        folder = None
        if out:
            exports = [_winner_export(next(r for r in runs if r.outcome.winner == name), arch, engines)
                       for name in kernels]
            env = fingerprint(gpu, device, engines.nvrtc_version())
            extra = {"simulated": True, "replay": options.replay} if options.replay else None
            folder = export_dispatch(out, runs[0].result.problem, gpu, arch, exports, tables, env, bucketing, extra)
        return DispatchResult(base, gpu, tuple(runs), tuple(tables), kernels, folder)
    finally:
        if own:
            engines.close()


@dataclass(frozen=True)
class Export:
    """One distinct kernel of a dispatch folder, as export_bundle takes it."""

    kernel: Kernel
    problem: Problem  # the bucket shape it was picked at (its manifest's problem)
    compiled: object
    measured: "dict | None"
    verification: "dict | None"
    note: "str | None" = None


def _winner_export(run: BucketRun, arch: Arch, engines) -> Export:
    w, problem = run.result.winner, run.result.problem
    kernel = Kernel(arch, problem.operands, w.config)
    compiled = engines.compiler.submit(kernel).result()  # the compile cache holds it: quick
    if isinstance(compiled, Exception):
        raise compiled
    d = w.to_dict()
    measured = {key: d[key] for key in ("median_time_s", "min_time_s", "max_time_s", "rounds", "times_s", "tflops")}
    measured["time_s"] = w.median_s
    if run.result.cublas_time_s:
        measured["cublas_time_s"] = run.result.cublas_time_s
        measured["vs_cublas"] = run.result.cublas_time_s / w.median_s
    verification = {"ok": True, "rel_error": w.rel_error, "rounds": len(w.times_s),
                    "reference": "checked by the benchmark on every measurement"}
    return Export(kernel, problem, compiled, measured, verification)


def export_dispatch(out: "str | Path", base: Problem, gpu: Gpu, arch: Arch, exports: "list[Export]",
                    tables: "list[dict]", environment: dict, bucketing: str, extra: "dict | None" = None) -> Path:
    """Each distinct kernel once, then dispatch.json, then the whole folder read back as gemmgen.load reads it."""
    from ..runtime.dispatch import read_dispatch
    from .export import export_bundle

    folder = Path(out)
    for item in exports:
        export_bundle(folder, item.kernel, item.problem, item.compiled, measured=item.measured,
                      verification=item.verification, environment=environment, note=item.note, extra=extra)
    payload = {"format": DISPATCH_FORMAT, "arch": arch.value, "gpu": gpu.key, "exported": now(),
               "bucketing": bucketing, "problem": base.to_dict(), "tables": tables, "environment": environment}
    if extra:
        payload.update(extra)
    write_json_atomic(folder / "dispatch.json", payload)
    read_dispatch(folder)  # what gemmgen.load checks: a table that does not load is not exported silently
    return folder


def model_buckets(base: Problem, buckets: "list[Bucket]", gpu: Gpu, *, jobs: int = 4, engines=None,
                  arch: "Arch | None" = None, bucketing: str = "pow2", out: "str | None" = None) -> DispatchResult:
    """The dry run of a shape set: per bucket the model's best-ranked configuration that compiles, exported
    unmeasured (`auto` merges only neighbours the model gives the same kernel: nothing was measured)."""
    from .dryrun import dry_run
    from .engines import default_engines

    own = engines is None
    engines = engines or default_engines(jobs)
    arch = arch or gpu.arch
    try:
        buckets = plan_buckets(base, buckets, gpu, arch, engines, bucketing)
        outcomes, picks = [], {}
        for bucket in sorted(buckets, key=lambda b: (b.n, b.k, b.m_max)):
            problem = replace(base, m=bucket.m_max, n=bucket.n, k=bucket.k)
            result = dry_run(problem, gpu, top_k=4, engines=engines, arch=arch)
            pick = result.pick
            outcomes.append(BucketOutcome(bucket, pick.kernel.name if pick else None,
                                          pick.ranked.config.tag if pick else None, {}))
            if pick is not None and pick.kernel.name not in picks:
                predicted = {"time_s": pick.ranked.time_s, "tflops": pick.ranked.tflops, "bound": pick.ranked.bound}
                picks[pick.kernel.name] = Export(pick.kernel, problem, pick.compiled, None, None,
                                                 f"not measured (dry run); the model predicts {predicted}")
        tables = _tables(outcomes, bucketing)
        kernels = tuple(dict.fromkeys(e["kernel"] for t in tables for e in t["buckets"]))
        folder = None
        if out:
            env = fingerprint(gpu, None, engines.nvrtc_version())
            first = min(buckets, key=lambda b: (b.n, b.k, b.m_max))
            folder = export_dispatch(out, replace(base, m=first.m_max, n=first.n, k=first.k), gpu, arch,
                                     [picks[name] for name in kernels], tables, env, bucketing)
        return DispatchResult(base, gpu, (), tuple(tables), kernels, folder)
    finally:
        if own:
            engines.close()


def _tables(outcomes: "list[BucketOutcome]", bucketing: str) -> "list[dict]":
    return [{"n": n, "k": k, "buckets": table_entries([o for o in outcomes if (o.bucket.n, o.bucket.k) == (n, k)],
                                                      bucketing)}
            for n, k in sorted({(o.bucket.n, o.bucket.k) for o in outcomes})]


__all__ = ["BucketRun", "DispatchResult", "Export", "export_dispatch", "measured_times", "model_buckets",
           "model_ranking", "plan_buckets", "tune_buckets"]
