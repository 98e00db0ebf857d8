"""Search logic without a GPU: recorded timings replayed through an injectable benchmark.

tests/data/recorded_timings.json is SYNTHETIC: `python tests/test_search.py --regenerate` writes it
from synthetic_predict (below) times seeded noise, with a few kernels marked as failing. The space
is a small sm80 space built here (not search_spaces/), so these tests pin the search, not the model.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from gemmgen.model.arch import lookup_gpu  # noqa: E402
from gemmgen.families.rules import check  # noqa: E402
from gemmgen.model.errors import CompileError  # noqa: E402
from gemmgen.model.problem import Problem  # noqa: E402
from gemmgen.model.tiles import TileConfig  # noqa: E402

RECORDED = HERE / "data" / "recorded_timings.json"
GPU = lookup_gpu("h100")
PROBLEM = Problem.create(4096, 4096, 4096, "bf16")


# --- the synthetic space, model, compiler and manifest ------------------------------------------

def synthetic_space(problem, gpu, arch):
    out = []
    for cta in ("64x64x32", "64x128x32", "128x64x32", "128x128x32", "128x256x32", "256x128x32", "128x128x64"):
        m, n, k = (int(v) for v in cta.split("x"))
        for warps in ("1x2", "2x1", "2x2", "2x4", "4x2"):
            wm, wn = (int(v) for v in warps.split("x"))
            for stages in (2, 3, 4, 5):
                for smem in ("swizzle", "pad"):
                    for group in (1, 8):
                        c = TileConfig.from_dict({"family": "sm80_mma", "cta": cta, "warp": f"{m // wm}x{n // wn}x{k}",
                                                  "mma": "16x8x16", "stages": stages, "smem_layout": smem,
                                                  "raster": {"order": "row", "group": group}})
                        if not check(c, gpu, arch, problem):
                            out.append(c)
    return out


def synthetic_predict(problem, config, gpu):
    """A stand-in model: bigger tiles, deeper pipelines and the swizzle are faster."""
    eff = min(0.9, config.cta.m * config.cta.n / (256 * 128)) * (0.8 + 0.05 * config.stages)
    eff *= 1.0 if config.smem_layout.value == "swizzle" else 0.95
    eff *= 1.0 if config.raster.group > 1 else 0.97
    t = problem.flops / (gpu.tensor_peak(problem.a_dtype) * eff)
    return SimpleNamespace(time_s=t, tflops=problem.flops / t / 1e12, bound="compute")


class CountingCompiler:
    """Compiles nothing: counts what it was asked, fails the tags it is told to."""

    def __init__(self, fail_tags=()):
        self.fail_tags = set(fail_tags)
        self.compiled: "list[str]" = []
        self.jobs = 2

    def submit(self, kernel):
        from concurrent.futures import Future

        self.compiled.append(kernel.config.tag)
        f = Future()
        if kernel.config.tag in self.fail_tags:
            f.set_result(CompileError(kernel.name, ("-arch=sm_90a",), "error: synthetic failure"))
        else:
            f.set_result(SimpleNamespace(name=kernel.name, cubin=b"\0cubin", source="// src", log="",
                                         resources=SimpleNamespace(registers=128, spill_bytes=0)))
        return f

    def close(self):
        pass


def fake_manifest(kernel, problem, compiled):
    return {"name": kernel.name, "config": kernel.config.to_dict(), "problem": problem.to_dict()}


def engines(fail_compile=()):
    from gemmgen.tune.search import Engines

    return Engines(synthetic_space, synthetic_predict, CountingCompiler(fail_compile), fake_manifest,
                   lambda: "13.5-fake")


class Recorded:
    """In-process replay of the recorded timings that counts measure() calls per tag."""

    def __init__(self, path=RECORDED, overrides=None, delay_s=0.0):
        from gemmgen.tune.worker import ReplayBenchmark

        self.replay = ReplayBenchmark(path)
        self.replay.timings = dict(self.replay.timings, **(overrides or {}))
        self.calls: "list[str]" = []
        self.cublas_calls: "list[bool]" = []
        self.delay_s = delay_s

    def measure(self, manifest, cubin, problem):
        self.calls.append(TileConfig.from_dict(manifest["config"]).tag)
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.replay.measure(manifest, cubin, problem)

    def cublas_time(self, problem, fresh=False):
        self.cublas_calls.append(fresh)
        return self.replay.cublas_time(problem)

    def close(self):
        pass


def ranking():
    from gemmgen.tune.search import rank_configs

    return rank_configs(synthetic_space(PROBLEM, GPU, GPU.arch), PROBLEM, GPU, synthetic_predict)


def options(tmp_path, **kw):
    from gemmgen.tune.search import TuneOptions

    base = dict(trials=12, patience=None, top_k=6, sampler="random", seed=7, finalists=2, rounds=3,
                storage=f"sqlite:///{tmp_path / 'studies.db'}")
    base.update(kw)
    return TuneOptions(**base)


@pytest.fixture(autouse=True)
def _results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))


def load_study(tmp_path, result):
    import optuna

    return optuna.load_study(study_name=result.study_name, storage=f"sqlite:///{tmp_path / 'studies.db'}")


# --- the space encoding ----------------------------------------------------------------------

def test_every_valid_config_round_trips_through_its_parameters():
    from gemmgen.tune.search import SearchSpace

    configs = synthetic_space(PROBLEM, GPU, GPU.arch)
    space = SearchSpace(configs, lambda c: check(c, GPU, GPU.arch, PROBLEM))
    assert len(space) == len(configs) > 50
    assert all(space.decode(space.params(c)) == c for c in configs)
    # Axes with one value (mma, cluster, decomposition here) are fixed, not sampled.
    assert set(space.param_names()) == {"sm80_mma.cta", "sm80_mma.warps", "sm80_mma.stages",
                                        "sm80_mma.smem_layout", "sm80_mma.raster_group"}


def test_infeasible_point_is_explained_by_the_rule_it_breaks():
    import optuna

    from gemmgen.tune.search import SearchSpace

    configs = synthetic_space(PROBLEM, GPU, GPU.arch)
    space = SearchSpace(configs[:-1], lambda c: check(c, GPU, GPU.arch, PROBLEM))
    # 256x128 tiles over 1x2 warps need 256x64 warp tiles: far too many registers.
    point = {"sm80_mma.cta": "256x128x32", "sm80_mma.warps": "1x2", "sm80_mma.stages": 2,
             "sm80_mma.smem_layout": "swizzle", "sm80_mma.raster_group": 1}
    config, rule = space.suggest(optuna.trial.FixedTrial(point))
    assert config is None and "registers" in rule
    # A feasible configuration that the space file does not list is outside the space, and says so.
    config, rule = space.suggest(optuna.trial.FixedTrial(space.params(configs[-1])))
    assert config is None and "not in the sm80_mma search space" in rule


# --- ranking and enqueueing ------------------------------------------------------------------

def test_model_top_k_is_measured_first_in_model_order(tmp_path):
    from gemmgen.tune.search import model_top, tune

    bench = Recorded()
    result = tune(PROBLEM, GPU, bench, options(tmp_path, trials=8, top_k=6), engines=engines())
    expected = [r.config.tag for r in model_top(ranking(), 6)]
    assert bench.calls[:6] == expected
    study = load_study(tmp_path, result)
    first = sorted(study.trials, key=lambda t: t.number)[:6]
    assert [t.user_attrs["config_tag"] for t in first] == expected
    assert all(t.user_attrs["source"] == "model top-6" for t in first)


def test_top_k_takes_at_most_a_quarter_per_tile_so_the_tile_choice_is_tested():
    from gemmgen.tune.search import model_top

    top = model_top(ranking(), 8)
    tiles = [(r.config.cta, r.config.warp) for r in top]
    assert len(top) == 8 and max(tiles.count(t) for t in tiles) <= 2
    assert [r.rank for r in top] == sorted(r.rank for r in top)  # still in model order
    assert top[0].rank == 0


def test_infeasible_samples_are_pruned_uncompiled_and_do_not_count_as_trials(tmp_path):
    from gemmgen.tune.search import tune

    eng = engines()
    result = tune(PROBLEM, GPU, Recorded(), options(tmp_path, trials=15, top_k=0), engines=eng)
    study = load_study(tmp_path, result)
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert pruned, "a random sampler over per-axis choices must hit infeasible points"
    assert all(t.user_attrs["violation"].startswith(("infeasible:", "quarantined:", "duplicate"))
               for t in pruned)
    measured = [t for t in study.trials if t.user_attrs.get("measured")]
    assert len(measured) == 15
    assert len(eng.compiler.compiled) == 15  # nothing infeasible reached the compiler


def test_a_sampler_that_repeats_itself_gives_way_to_the_models_next_pick(tmp_path, monkeypatch):
    import optuna

    from gemmgen.tune import search
    from gemmgen.tune.search import SearchSpace, tune

    configs = synthetic_space(PROBLEM, GPU, GPU.arch)
    stuck = ranking()[-1].config  # the model's last choice, proposed over and over
    params = SearchSpace(configs, lambda c: []).params(stuck)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    monkeypatch.setattr(search.study, "make_sampler", lambda name, seed: optuna.samplers.PartialFixedSampler(
        params, optuna.samplers.RandomSampler(seed=seed)))
    bench = Recorded()
    result = tune(PROBLEM, GPU, bench, options(tmp_path, trials=4, top_k=0, rounds=1), engines=engines())
    models_order = [r.config.tag for r in ranking() if r.config.tag != stuck.tag]
    assert bench.calls[:4] == [stuck.tag] + models_order[:3]
    assert result.counts["duplicates"] == 3 * search.FALLBACK_AFTER


# --- stop rules ------------------------------------------------------------------------------

def test_stops_at_the_trial_budget(tmp_path):
    from gemmgen.tune.search import tune

    bench = Recorded()
    result = tune(PROBLEM, GPU, bench, options(tmp_path, trials=10, rounds=2), engines=engines())
    assert "--trials 10" in result.stop_reason
    assert len(bench.calls) == 10 + 2 * 2  # the search, then 2 finalists x 2 interleaved rounds
    # cuBLAS is timed afresh beside each round, not once: the card's clocks drift between rounds.
    assert bench.cublas_calls.count(True) == 2
    record = json.loads(result.record_path.read_text())
    assert len(record["cublas"]["times_s"]) == 2 and "vs_cublas_paired" in record["winner"]


def test_a_rerun_measures_model_picks_that_earlier_runs_never_tried_even_with_the_budget_spent(tmp_path):
    # e.g. configurations added to the search space: trials carried from earlier runs fill --trials, yet the
    # model's new picks must still be measured, or a grown space is never explored.
    from gemmgen.tune.search import model_top, tune

    first = Recorded()
    tune(PROBLEM, GPU, first, options(tmp_path, trials=4, top_k=4, rounds=2, finalists=1), engines=engines())
    assert len(first.calls) == 4 + 2
    second = Recorded()
    result = tune(PROBLEM, GPU, second, options(tmp_path, trials=4, top_k=8, rounds=2, finalists=1),
                  engines=engines())
    new_picks = [r.config.tag for r in model_top(ranking(), 8) if r.config.tag not in first.calls[:4]]
    assert second.calls[:len(new_picks)] == new_picks[:4] and len(second.calls) == min(4, len(new_picks)) + 2
    assert result.counts["measured"] == min(4, len(new_picks))
    # A third run with nothing new to measure stops at the budget at once, and the finalist round published by
    # the second stands (finalists are chosen once per set of measurements, not again by every run).
    third = Recorded()
    again = tune(PROBLEM, GPU, third, options(tmp_path, trials=4, top_k=4, rounds=2, finalists=1), engines=engines())
    assert len(third.calls) == 0
    assert again.winner is not None and again.winner.config.tag == result.winner.config.tag


def test_stops_after_patience_trials_without_improvement(tmp_path):
    from gemmgen.tune.search import tune

    # Every kernel but the model's first is slow: the first trial is the best, and stays it.
    best = ranking()[0].config.tag
    slow = {r.config.tag: 1.0 for r in ranking() if r.config.tag != best}
    bench = Recorded(overrides=slow)
    result = tune(PROBLEM, GPU, bench, options(tmp_path, trials=60, patience=5, top_k=3), engines=engines())
    assert "patience" in result.stop_reason
    study = load_study(tmp_path, result)
    measured = [t for t in study.trials if t.user_attrs.get("measured")]
    assert len(measured) == 6  # the best, then 5 without improvement
    assert result.winner.config.tag == best


def test_stops_at_the_timeout(tmp_path):
    from gemmgen.tune.search import tune

    bench = Recorded(delay_s=0.15)
    t0 = time.monotonic()
    result = tune(PROBLEM, GPU, bench, options(tmp_path, trials=200, timeout_s=1.5, rounds=1), engines=engines())
    assert "timeout" in result.stop_reason
    assert 1 <= result.counts["measured"] <= 1.5 / 0.15 + 1
    assert time.monotonic() - t0 < 15  # stopped long before 200 trials (30 s of simulated GPU time)


# --- failures and quarantine -----------------------------------------------------------------

def test_failed_trials_keep_their_reason_and_are_quarantined_for_good(tmp_path):
    from gemmgen.tune.search import model_top, tune

    picks = [r.config.tag for r in model_top(ranking(), 6)]
    overrides = {picks[1]: {"error": "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered"},
                 picks[2]: {"rel_error": 0.5}}
    eng = engines(fail_compile={picks[3]})
    bench = Recorded(overrides=overrides)
    result = tune(PROBLEM, GPU, bench, options(tmp_path, trials=8, top_k=6), engines=eng)
    study = load_study(tmp_path, result)
    by_tag = {t.user_attrs.get("config_tag"): t for t in study.trials if t.user_attrs.get("measured")}
    assert by_tag[picks[1]].state.name == "FAIL" and "ILLEGAL_ADDRESS" in by_tag[picks[1]].user_attrs["fail_reason"]
    assert by_tag[picks[2]].state.name == "FAIL" and "wrong result" in by_tag[picks[2]].user_attrs["fail_reason"]
    assert by_tag[picks[3]].state.name == "FAIL" and "compile error" in by_tag[picks[3]].user_attrs["fail_reason"]
    assert picks[3] not in bench.calls  # a kernel that did not compile is never measured
    assert result.winner is not None and result.winner.config.tag not in picks[1:4]

    # Another problem, same GPU and storage: the three quarantined kernels are never tried again.
    other = Problem.create(4096, 4096, 4096, "bf16", beta=1.0)  # a different study, same kernels
    bench2 = Recorded()
    tune(other, GPU, bench2, options(tmp_path, trials=40, top_k=6, sampler="grid"), engines=engines())
    assert len(bench2.calls) > 40 and not set(bench2.calls) & set(picks[1:4])


def test_hung_kernel_is_killed_by_the_watchdog_and_the_search_continues(tmp_path):
    from gemmgen.tune.search import model_top, tune
    from gemmgen.tune.worker import HANG, WorkerBenchmark, replay_factory

    picks = [r.config.tag for r in model_top(ranking(), 4)]
    data = json.loads(RECORDED.read_text())
    data["timings"][picks[1]] = {"hang": True}
    data["timings"][picks[2]] = {"crash": True}
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(data))
    with WorkerBenchmark(replay_factory(replay), watchdog_s=2.0, start_timeout_s=60) as worker:
        result = tune(PROBLEM, GPU, worker, options(tmp_path, trials=4, top_k=4, finalists=1, rounds=1),
                      engines=engines())
        assert worker.restarts == 2
    study = load_study(tmp_path, result)
    by_tag = {t.user_attrs.get("config_tag"): t for t in study.trials if t.user_attrs.get("measured")}
    assert by_tag[picks[1]].state.name == "FAIL" and by_tag[picks[1]].user_attrs["fail_kind"] == HANG
    assert "watchdog" in by_tag[picks[1]].user_attrs["fail_reason"]
    assert by_tag[picks[2]].state.name == "FAIL" and "died" in by_tag[picks[2]].user_attrs["fail_reason"]
    assert by_tag[picks[3]].state.name == "COMPLETE"  # the search went on with a fresh worker
    assert result.winner is not None


def test_failures_outside_the_kernel_are_not_quarantined_and_five_in_a_row_stop_the_tune(tmp_path):
    from gemmgen.tune.search import Quarantine, open_storage, tune

    class OutOfMemory(Recorded):  # every measurement fails the same way, and not because of the kernel
        def measure(self, manifest, cubin, problem):
            from gemmgen.tune.worker import as_outcome

            self.calls.append(manifest["name"])
            return as_outcome(SimpleNamespace(ok=False, reason="CudaError: cuMemAlloc failed with "
                                              "CUDA_ERROR_OUT_OF_MEMORY (2)", time_s=None))

    result = tune(PROBLEM, GPU, OutOfMemory(), options(tmp_path, trials=20), engines=engines())
    assert "5 measurements in a row failed" in result.stop_reason and "OUT_OF_MEMORY" in result.stop_reason
    assert result.counts["measured"] == 5 and result.winner is None
    assert Quarantine(open_storage(f"sqlite:///{tmp_path / 'studies.db'}"), GPU).entries == {}


def test_an_interrupted_tune_requeues_the_trials_in_flight(tmp_path):
    from gemmgen.tune.search import model_top, tune

    class Interrupting(Recorded):
        def measure(self, manifest, cubin, problem):
            if len(self.calls) == 2:
                raise KeyboardInterrupt
            return super().measure(manifest, cubin, problem)

    with pytest.raises(KeyboardInterrupt):
        tune(PROBLEM, GPU, Interrupting(), options(tmp_path, trials=10, top_k=6), engines=engines())
    import optuna

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    [name] = [s.study_name for s in optuna.get_all_study_summaries(storage) if "quarantine" not in s.study_name]
    trials = optuna.load_study(study_name=name, storage=storage).trials
    assert not [t for t in trials if t.state.name == "RUNNING"]
    waiting = [t for t in trials if t.state.name == "WAITING"]
    third = model_top(ranking(), 6)[2].config.tag
    assert waiting and any(t.system_attrs["fixed_params"] ==
                           next(u.params for u in trials if u.user_attrs.get("config_tag") == third) for t in waiting)

    bench = Recorded()  # the next run measures the interrupted trial first, and the two done never again
    tune(PROBLEM, GPU, bench, options(tmp_path, trials=10, top_k=6), engines=engines())
    assert bench.calls[0] == third
    assert not set(bench.calls[:8]) & {r.config.tag for r in model_top(ranking(), 2)}


def test_bench_reasons_map_to_failure_kinds_so_only_kernel_faults_are_quarantined():
    """Pins the contract between bench.py's reason texts and worker.classify."""
    bench = pytest.importorskip("gemmgen.tune.bench")
    from gemmgen.model.errors import CudaError
    from gemmgen.tune.worker import CUDA_ERROR, OTHER, WRONG, as_outcome

    ok = as_outcome(bench.Measurement(ok=True, time_s=2e-3, times_s=(2e-3, 2.1e-3), rel_error=1e-3, flops=4 * 10**12))
    assert ok.ok and ok.kind == "ok" and ok.tflops == pytest.approx(2000.0)
    wrong = bench.verdict(0.5, 0, 1e-2, PROBLEM)
    assert as_outcome(bench.failed(wrong, PROBLEM)).kind == WRONG
    assert as_outcome(bench.failed(bench.verdict(0.0, 7, 1e-2, PROBLEM), PROBLEM)).kind == WRONG  # NaN poison left
    illegal = bench.describe(CudaError("cuStreamSynchronize", 700, "CUDA_ERROR_ILLEGAL_ADDRESS"))
    assert as_outcome(bench.failed(illegal, PROBLEM)).kind == CUDA_ERROR
    oom = bench.describe(CudaError("cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY"))
    assert as_outcome(bench.failed(oom, PROBLEM)).kind == OTHER


# --- resume ----------------------------------------------------------------------------------

RESUME_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import test_search as t
from gemmgen.tune.search import tune
from gemmgen.tune.worker import WorkerBenchmark, replay_factory
with WorkerBenchmark(replay_factory({replay!r}, {log!r}), watchdog_s=30) as w:
    r = tune(t.PROBLEM, t.GPU, w, t.options(__import__('pathlib').Path({tmp!r}), trials=14, top_k=4, rounds=2,
             finalists=2), engines=t.engines())
print("WINNER", r.winner.config.tag)
"""


def test_a_tune_killed_midway_resumes_without_remeasuring_finished_trials(tmp_path):
    import optuna

    data = json.loads(RECORDED.read_text())
    data["delay_s"] = 0.15  # simulated GPU time per measurement, so the kill lands mid-search
    replay, log = tmp_path / "replay.json", tmp_path / "measured.log"
    replay.write_text(json.dumps(data))
    script = RESUME_SCRIPT.format(tests=str(HERE), replay=str(replay), log=str(log), tmp=str(tmp_path))
    env = dict(os.environ, PYTHONPATH=str(ROOT), GEMMGEN_RESULTS=str(tmp_path / "results"))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().split()) < 5):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first_run = log.read_text().split()
    assert 5 <= len(first_run) < 14, "the kill must land mid-search"

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    [name] = [s.study_name for s in optuna.get_all_study_summaries(storage) if "quarantine" not in s.study_name]
    done = [t for t in optuna.load_study(study_name=name, storage=storage).trials
            if t.state.name == "COMPLETE" and t.user_attrs.get("measured")]
    assert done and any(t.state.name == "RUNNING" for t in optuna.load_study(study_name=name, storage=storage).trials)

    log.write_text("")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    second_run = log.read_text().split()
    # The search measures only what was missing; then 2 finalists x 2 rounds.
    assert len(second_run) == (14 - len(done)) + 2 * 2
    search_part = second_run[: 14 - len(done)]
    assert not set(search_part) & {t.user_attrs["config_tag"] for t in done}

    trials = optuna.load_study(study_name=name, storage=storage).trials
    assert not any(t.state.name == "RUNNING" for t in trials)
    interrupted = [t for t in trials if "interrupted" in str(t.user_attrs.get("fail_reason", ""))]
    assert interrupted  # the trial in flight at the kill was failed, and re-queued
    measured = [t for t in trials if t.user_attrs.get("measured")]
    assert len(measured) == 14
    assert len({t.user_attrs["config_tag"] for t in measured}) == 14  # nothing measured twice


# --- on the GPU ------------------------------------------------------------------------------

@pytest.mark.gpu
def test_on_the_gpu_an_oob_and_a_hung_kernel_fail_their_trials_while_the_tune_completes(tmp_path):
    """Fault injection through the real GpuBenchmark in the worker: every trial runs gemmgen's naive
    kernel; two trials get its variants that write to an unmapped address and that never finish."""
    from concurrent.futures import Future

    from gemmgen.runtime.detect import detect_gpu
    from gemmgen.tune.reference import naive_cubin, naive_manifest
    from gemmgen.tune.search import Engines, model_top, rank_configs, tune
    from gemmgen.tune.worker import CUDA_ERROR, HANG, WorkerBenchmark, gpu_benchmark

    props = detect_gpu().props
    cc = (props.get("cc_major", 9), props.get("cc_minor", 0))
    problem = Problem.create(512, 512, 512, "bf16")
    picks = [r.config.tag for r in model_top(rank_configs(synthetic_space(problem, GPU, GPU.arch), problem, GPU,
                                                          synthetic_predict), 5)]
    faults = {picks[1]: "oob", picks[2]: "hang"}
    cubins = {f: naive_cubin(problem, cc, f) for f in ("none", "oob", "hang")}

    class NaiveCompiler(CountingCompiler):
        def submit(self, kernel):
            f = Future()
            f.set_result(SimpleNamespace(name=kernel.name, cubin=cubins[faults.get(kernel.config.tag, "none")],
                                         source="// naive", log="", resources=None))
            return f

    eng = Engines(synthetic_space, synthetic_predict, NaiveCompiler(),
                  lambda kernel, prob, compiled: naive_manifest(prob, faults.get(kernel.config.tag, "none"),
                                                                arch=f"sm_{cc[0]}{cc[1]}"))
    with WorkerBenchmark(gpu_benchmark, watchdog_s=20.0) as worker:
        result = tune(problem, GPU, worker, options(tmp_path, trials=5, top_k=5, finalists=2, rounds=2),
                      engines=eng)
    study = load_study(tmp_path, result)
    by_tag = {t.user_attrs.get("config_tag"): t for t in study.trials if t.user_attrs.get("measured")}
    oob, hang = by_tag[picks[1]], by_tag[picks[2]]
    assert oob.state.name == "FAIL" and oob.user_attrs["fail_kind"] == CUDA_ERROR, oob.user_attrs
    assert hang.state.name == "FAIL" and hang.user_attrs["fail_kind"] == HANG, hang.user_attrs
    assert all(by_tag[t].state.name == "COMPLETE" for t in (picks[0], picks[3], picks[4]))
    assert result.winner is not None and result.winner.config.tag not in faults
    assert result.cublas_time_s is None or result.cublas_time_s > 0


def test_measurements_survive_a_change_of_the_search_space(tmp_path):
    from gemmgen.tune.search import tune

    first = Recorded()
    smaller = engines()
    smaller.enumerate = lambda p, g, a: synthetic_space(p, g, a)[::2]  # the space as it was
    r1 = tune(PROBLEM, GPU, first, options(tmp_path, trials=6, top_k=6, rounds=1), engines=smaller)
    searched = set(first.calls[:6])

    second = Recorded()
    r2 = tune(PROBLEM, GPU, second, options(tmp_path, trials=10, top_k=6, rounds=1), engines=engines())
    assert r2.study_name != r1.study_name  # a new space is a new study...
    assert r2.counts["carried"] == 6  # ...that starts from the measurements still valid in it
    assert len(second.calls) == 4 + 2 * 1 and not set(second.calls[:4]) & searched


# --- the recorded timings --------------------------------------------------------------------

def generate_recorded_timings() -> dict:
    """The synthetic recordings: the stand-in model's time x (1.2..2.0) seeded noise, per config tag."""
    rng = random.Random(20261122)
    timings = {}
    for c in synthetic_space(PROBLEM, GPU, GPU.arch):
        t = synthetic_predict(PROBLEM, c, GPU).time_s
        timings[c.tag] = [round(t * rng.uniform(1.2, 2.0) * f, 9) for f in (1.0, 1.01, 0.995)]
    return {"synthetic": "generated by `python tests/test_search.py --regenerate` from synthetic_predict "
                         "times seeded noise; not measured on any GPU",
            "gpu": GPU.key, "problem": PROBLEM.to_dict(), "cublas_time_s": 0.000205, "timings": timings}


def test_recorded_timings_match_their_generator():
    assert json.loads(RECORDED.read_text()) == json.loads(json.dumps(generate_recorded_timings()))


if __name__ == "__main__" and "--regenerate" in sys.argv:
    RECORDED.parent.mkdir(parents=True, exist_ok=True)
    RECORDED.write_text(json.dumps(generate_recorded_timings(), indent=1) + "\n")
    print(f"wrote {RECORDED}")


def test_the_top_table_lists_remeasured_finalists_before_single_search_measurements(tmp_path):
    """Regression (H100, 2026-11-22): finalists regress on re-measurement (they were chosen on one
    optimistic draw), so sorting them together with other configs' single draws put unconfirmed figures
    above the winner. Here every second measurement of a config is 20% slower."""
    from dataclasses import replace

    from gemmgen.tune.search import tune

    class Regressing(Recorded):
        def measure(self, manifest, cubin, problem):
            out = super().measure(manifest, cubin, problem)
            tag = self.calls[-1]
            if out.ok and self.calls.count(tag) > 1:
                out = replace(out, time_s=out.time_s * 1.2, times_s=tuple(t * 1.2 for t in out.times_s))
            return out

    result = tune(PROBLEM, GPU, Regressing(), options(tmp_path, trials=10, finalists=2, rounds=2), engines=engines())
    flags = [row.remeasured for row in result.top]
    assert flags[:2] == [True, True] and not any(flags[2:])
    assert result.top[0].tag == result.winner.config.tag


def test_the_top_table_measures_against_the_hard_roofline_and_the_model_separately(tmp_path):
    from gemmgen.calc.intensity import roofline
    from gemmgen.tune.search import tune

    result = tune(PROBLEM, GPU, Recorded(), options(tmp_path, trials=6, finalists=2, rounds=1), engines=engines())
    hard = roofline(PROBLEM, GPU).attainable_flops / 1e12
    for row in result.top:
        assert row.pct_of_roofline == pytest.approx(100 * row.tflops / hard)
        assert row.pct_of_prediction == pytest.approx(100 * row.tflops / row.predicted_tflops)


def engines_building(identity: str):
    """The test engines, with every configuration building to kernel identity `identity`."""
    from dataclasses import replace

    return replace(engines(), identity=lambda kernel: identity)


def test_trials_that_timed_another_kernel_identity_are_remeasured_first_never_served(tmp_path):
    """Regression for the code digest that missed files: a stored time is trusted only for the kernel identity
    (rendered source, NVRTC options, toolkit) it was measured as."""
    from gemmgen.tune import search

    first = Recorded()
    r1 = search.tune(PROBLEM, GPU, first, options(tmp_path, trials=6, top_k=6, rounds=1),
                     engines=engines_building("v1"))
    old = load_study(tmp_path, r1)
    old_best = sorted((t for t in old.trials if t.state.name == "COMPLETE"), key=lambda t: -t.value)
    assert {t.user_attrs["kernel_id"] for t in old_best} == {"v1"}

    # The same command after a change that renders every kernel differently: the same study, whose v1 times are
    # not served; the best of them are measured again before anything else, best first.
    second = Recorded()
    r2 = search.tune(PROBLEM, GPU, second, options(tmp_path, trials=14, top_k=6, rounds=1),
                     engines=engines_building("v2"))
    assert r2.study_name == r1.study_name
    study = load_study(tmp_path, r2)
    fresh = [t for t in study.trials if t.user_attrs.get("kernel_id") == "v2" and t.user_attrs.get("measured")]
    again = [t.user_attrs["config_tag"] for t in fresh[:len(old_best)]]
    assert again == [t.user_attrs["config_tag"] for t in old_best]
    assert all(t.user_attrs.get("source", "").startswith("re-measure") for t in fresh[:len(old_best)])
    assert second.calls[:len(old_best)] == again
    # The winner is chosen among this identity's times only.
    assert r2.winner.config.tag in {t.user_attrs["config_tag"] for t in fresh}

    # Resumed again with the same code: nothing is stale any more, nothing is re-measured.
    third = Recorded()
    r3 = search.tune(PROBLEM, GPU, third, options(tmp_path, trials=14, top_k=6, rounds=1),
                     engines=engines_building("v2"))
    resumed = load_study(tmp_path, r3)
    assert not [t for t in resumed.trials[len(study.trials):] if t.user_attrs.get("source", "").startswith("re-measure")]


def test_sustained_timing_covers_the_finalist_rounds_and_cublas_only_and_is_recorded(tmp_path):
    """--timing sustained: the search screens in bursts; the finalists and cuBLAS beside them are timed
    sustained (the measurer is switched before the first round and back after the last) after one settling round
    whose times are dropped, and the record says so."""
    import json as _json

    from gemmgen.tune.results import record_path
    from gemmgen.tune.search import tune

    class Timed(Recorded):
        def __init__(self):
            super().__init__()
            self.timing = None
            self.log: "list[tuple]" = []

        def set_timing(self, name):
            self.timing = name
            self.log.append(("timing", name))

        def measure(self, manifest, cubin, problem):
            self.log.append(("measure", self.timing))
            return super().measure(manifest, cubin, problem)

        def cublas_time(self, problem, fresh=False):
            self.log.append(("cublas", self.timing))
            return super().cublas_time(problem, fresh)

    m = Timed()
    result = tune(PROBLEM, GPU, m, options(tmp_path, trials=8, finalists=2, rounds=3, timing="sustained"),
                  engines=engines())
    first = m.log.index(("timing", "sustained"))
    assert m.log[-1] == ("timing", None) and m.log.count(("timing", "sustained")) == 1
    assert all(t is None for kind, t in m.log[:first] if kind == "measure")          # the search: bursts
    rounds = m.log[first + 1:-1]
    assert rounds.count(("measure", "sustained")) == 2 * (1 + 3) and rounds.count(("cublas", "sustained")) == 1 + 3
    assert result.winner is not None and all(len(f.times_s) == 3 for f in result.finalists)
    record = _json.loads(record_path(GPU, PROBLEM).read_text())
    assert record["search"]["finalist_timing"] == "sustained" and len(record["cublas"]["times_s"]) == 3


def test_burst_timing_leaves_the_measurer_alone_and_a_bad_timing_is_one_rule(tmp_path):
    from gemmgen.model.errors import InvalidInput
    from gemmgen.tune.search import tune

    class Strict(Recorded):
        def set_timing(self, name):  # pragma: no cover - must not be called
            raise AssertionError("burst timing must not switch the measurer")

    tune(PROBLEM, GPU, Strict(), options(tmp_path, trials=6, finalists=2, rounds=2), engines=engines())
    with pytest.raises(InvalidInput, match="--timing must be one of burst, sustained"):
        options(tmp_path, timing="fast").validate()


def test_a_space_no_larger_than_the_lookahead_is_measured_whole(tmp_path):
    """Every configuration in flight (compiled ahead) before any is measured: the search stops asking but still
    measures them. It used to cancel them all and export nothing (fp8 block scaling's 4 configurations on the
    H100, 2026-11-25: '0 measured, 4 cancelled')."""
    from gemmgen.tune.bench.policy import Measurement
    from gemmgen.tune.search import Engines, tune

    def tiny(problem, gpu, arch):
        return synthetic_space(problem, gpu, arch)[:4]

    class Timed:
        def __init__(self):
            self.calls = []

        def measure(self, manifest, cubin, problem):
            tag = TileConfig.from_dict(manifest["config"]).tag
            self.calls.append(tag)
            t = 1e-3 * (1 + len(tag) % 5)
            return Measurement(True, t, (t,), 1e-3, "", problem.flops, 1e-2, "fake")

        def cublas_time(self, problem, fresh=False):
            return 1e-3

        def close(self):
            pass

    bench = Timed()
    eng = Engines(tiny, synthetic_predict, CountingCompiler(), fake_manifest, lambda: "13.5-fake")
    result = tune(PROBLEM, GPU, bench, options(tmp_path, trials=20, top_k=4, rounds=1), engines=eng)
    assert result.stop_reason == "every configuration of the space was tried"
    assert result.winner is not None and result.counts["cancelled"] == 0
    assert sorted(set(bench.calls)) == sorted(c.tag for c in tiny(PROBLEM, GPU, GPU.arch))
