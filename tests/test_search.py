"""Search logic without a GPU: recorded timings replayed through an injectable benchmark.

tests/data/recorded_timings.json is SYNTHETIC: `python tests/test_search.py --regenerate` writes it
from synthetic_predict (below) times seeded noise, with a few kernels marked as failing. The space
is a small sm80 space built here (not search_spaces/), so these tests pin the search, not the model.

The synthetic harness below (space, model, compiler, replayed timings) is shared: tests/test_search_failures.py,
tests/test_search_measurements.py and other tests import it from here.
"""
from __future__ import annotations

import json
import random
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
