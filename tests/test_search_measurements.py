"""Search measurements without a GPU: carried across space and code changes, the top table, finalist timing."""
from __future__ import annotations

import pytest

from test_search import GPU, PROBLEM, Recorded, engines, load_study, options, synthetic_space


# As in test_search.py: every tune of this module writes its records under tmp_path.
@pytest.fixture(autouse=True)
def _results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))


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
