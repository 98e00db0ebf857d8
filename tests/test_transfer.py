"""Transfer from stored records (tune/transfer.py, search/queue.py): the nearest shapes' winners and finalists are
measured early, in turn with the model's picks, and a short tune (--timeout) stops on time. Replayed timings
(tests/data/recorded_timings.json, synthetic) through test_search's synthetic space, model and compiler."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import test_search as ts
from gemmgen.model.problem import Problem
from gemmgen.tune.transfer import nearest_records, transfer_seeds


def _record(m, n, k, winner, finalists=(), dtype="bf16", simulated=False):
    problem = Problem.create(m, n, k, dtype)
    times = {tag: 1e-3 * (1 + i / 10) for i, tag in enumerate(finalists)}
    return {"format": "gemmgen-tune/1", "simulated": simulated, "problem": problem.to_dict(), "gpu": "h100-sxm",
            "winner": {"config_tag": winner, "median_time_s": 1e-3},
            "finalists": [{"config_tag": tag, "median_time_s": t} for tag, t in times.items()]
            + [{"config_tag": "failed-one", "median_time_s": None, "failed": "wrong result"}]}


def _held(*records):
    return [(Path(f"r{i}.json"), r) for i, r in enumerate(records)]


def test_the_nearest_shapes_of_the_same_operands_are_the_sources_never_the_problem_itself():
    problem = Problem.create(2048, 2048, 2048, "bf16")
    records = _held(_record(2048, 2048, 2048, "self"),                 # the problem's own record: resumed instead
                    _record(4096, 4096, 4096, "far"),                  # 2x each way: ln2 * sqrt(3) away
                    _record(2048, 2048, 4096, "near"),                 # ln2 away
                    _record(2048, 2048, 2048 + 1, "other-dtype", dtype="f16"),
                    _record(2048, 2048, 2000, "replayed", simulated=True))
    near = nearest_records(problem, "h100", 5, records=records)
    assert [r["winner"]["config_tag"] for _, _, r in near] == ["near", "far"]
    assert [d for d, _, _ in near] == sorted(d for d, _, _ in near)
    # In a replayed (simulated) tune the simulated records are sources too.
    assert nearest_records(problem, "h100", 1, simulated=True, records=records)[0][2]["winner"]["config_tag"] \
        == "replayed"
    assert nearest_records(problem, "h100", 0, records=records) == []


def test_seeds_take_every_records_winner_first_then_the_finalists_deduplicated():
    problem = Problem.create(2048, 2048, 2048, "bf16")
    records = _held(_record(2048, 2048, 4096, "a", finalists=("a", "b", "c")),
                    _record(4096, 2048, 4096, "d", finalists=("d", "b", "e")))
    seeds = transfer_seeds(problem, "h100", 2, records=records)
    assert [s.tag for s in seeds] == ["a", "d", "b", "c", "e"]  # a failed finalist is never a seed
    assert seeds[0].source == "transfer: the winner of 2048x2048x4096"
    assert seeds[2].source == "transfer: the finalist 2 of 2048x2048x4096"


def _store(tmp_path, problem, winner, finalists):
    folder = tmp_path / "results" / "h100-sxm" / "tunes"
    folder.mkdir(parents=True, exist_ok=True)
    record = _record(problem.m, problem.n, problem.k, winner, finalists)
    (folder / f"{problem.m}x{problem.n}x{problem.k}.json").write_text(json.dumps(record))


def test_a_tune_measures_the_nearest_records_picks_in_turn_with_the_models_top_k(tmp_path):
    from gemmgen.tune.search import model_top, tune

    ranked = ts.ranking()
    top = [r.config.tag for r in model_top(ranked, 4)]
    # The stored neighbours' picks are configurations the model ranks low: only transfer measures them early.
    low = [r.config.tag for r in ranked[-6:]]
    _store(tmp_path, Problem.create(4096, 4096, 8192, "bf16"), low[0], (low[0], low[1], top[0]))
    _store(tmp_path, Problem.create(8192, 8192, 8192, "bf16"), low[2], (low[2], low[3]))
    bench = ts.Recorded()
    result = tune(ts.PROBLEM, ts.GPU, bench, ts.options(tmp_path, trials=10, top_k=4, transfer=2),
                  engines=ts.engines())
    # top[0] is both a model pick and a finalist of the nearest record: measured once, as the model's pick.
    assert bench.calls[:8] == [top[0], low[0], top[1], low[2], top[2], low[1], top[3], low[3]]
    study = ts.load_study(tmp_path, result)
    sources = {t.user_attrs["config_tag"]: t.user_attrs["source"] for t in study.trials}
    assert sources[low[0]] == "transfer: the winner of 4096x4096x8192"
    assert sources[low[3]] == "transfer: the finalist 2 of 8192x8192x8192"
    assert sources[top[0]] == sources[top[1]] == "model top-4"
    assert json.loads(result.record_path.read_text())["search"]["transfer"] == 2


def test_without_transfer_the_stored_records_change_nothing(tmp_path):
    from gemmgen.tune.search import model_top, tune

    ranked = ts.ranking()
    _store(tmp_path, Problem.create(4096, 4096, 8192, "bf16"), ranked[-1].config.tag, ())
    bench = ts.Recorded()
    tune(ts.PROBLEM, ts.GPU, bench, ts.options(tmp_path, trials=6, top_k=4, transfer=0), engines=ts.engines())
    assert bench.calls[:4] == [r.config.tag for r in model_top(ranked, 4)]


def test_a_short_tune_with_transfer_stops_at_its_timeout_and_still_picks_a_winner(tmp_path):
    from gemmgen.tune.search import tune

    ranked = ts.ranking()
    _store(tmp_path, Problem.create(4096, 4096, 8192, "bf16"), ranked[-1].config.tag, ())
    bench = ts.Recorded(delay_s=0.02)
    result = tune(ts.PROBLEM, ts.GPU, bench, ts.options(tmp_path, trials=500, top_k=4, transfer=1, timeout_s=3.0,
                                                        rounds=1), engines=ts.engines())
    assert result.stop_reason == "timeout (3s)" and result.winner is not None
    assert 2 <= result.counts["measured"] < 500
    assert bench.calls[1] == ranked[-1].config.tag  # the nearest record's winner, second after the model's first


def test_transfer_is_validated_like_the_other_counts():
    from gemmgen.model.errors import InvalidInput
    from gemmgen.tune.search import TuneOptions

    with pytest.raises(InvalidInput, match="--transfer"):
        TuneOptions(transfer=-1).validate()


def test_gemmgen_tune_transfers_by_default_and_says_from_which_shapes(tmp_path, capsys):
    from test_cli_tune import replay_file

    from gemmgen.cli import main
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.tune.search import default_engines, rank_configs

    gpu, problem = lookup_gpu("h100"), Problem.create(256, 256, 256, "bf16")
    engines = default_engines(0)
    ranked = rank_configs(engines.enumerate(problem, gpu, gpu.arch), problem, gpu, engines.predict)
    far_down = ranked[len(ranked) // 2].config.tag  # a configuration the model alone would not measure early
    _store(tmp_path, Problem.create(256, 256, 512, "bf16"), far_down, (far_down,))
    argv = ["tune", "256", "256", "256", "--gpu", "h100", "--replay", str(replay_file(tmp_path)), "--trials", "2",
            "--top-k", "1", "--finalists", "1", "--rounds", "1", "--jobs", "2", "--no-progress",
            "--storage", f"sqlite:///{tmp_path / 'studies.db'}"]
    assert main(argv) == 0
    record = json.loads(next((tmp_path / "results" / "h100-sxm" / "tunes-replay").glob("256x256x256*.json"))
                        .read_text())
    assert [t["source"] for t in record["trials"] if t["measured"]] == ["model top-1", "transfer: the winner of "
                                                                       "256x256x512"]
    assert record["trials"][1]["config_tag"] == far_down and record["search"]["transfer"] == 3


@pytest.mark.parametrize("argv, words", [
    (["tune", "64", "64", "64", "--gpu", "h100", "--transfer", "-1", "--replay", "x"], "--transfer must be"),
    (["tune", "64", "64", "64", "--gpu", "h100", "--dry-run", "--transfer", "2"],
     "--dry-run and --transfer cannot be used together"),
])
def test_a_bad_transfer_flag_is_one_line(capsys, argv, words):
    from test_cli_tune import one_line_error

    assert words in one_line_error(capsys, argv)


@pytest.fixture(autouse=True)
def _results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "cache"))
