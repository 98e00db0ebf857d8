"""Search failures without a GPU (one fault-injection test on it): quarantine, watchdog, interrupted and killed tunes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from gemmgen.model.problem import Problem
from test_search import (GPU, HERE, PROBLEM, RECORDED, ROOT, CountingCompiler, Recorded, engines, load_study, options,
                         ranking, synthetic_predict, synthetic_space)


# As in test_search.py: every tune of this module writes its records under tmp_path.
@pytest.fixture(autouse=True)
def _results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))


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
    from gemmgen.tune.naive import naive_cubin, naive_manifest
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
