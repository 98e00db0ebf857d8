"""Interrupted tunes and suites, then resumed: what was stored survives, the resumed run finishes, and no trial
or record is left half-written (a measured-looking trial that was never told, a configuration blocked for good)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

optuna = pytest.importorskip("optuna")


@pytest.fixture(autouse=True)
def _results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))


def _study(tmp_path):
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    [name] = [n for n in names if "quarantine" not in n and "/finalists-" not in n]
    return optuna.load_study(study_name=name, storage=storage)


def test_ctrl_c_while_a_measured_trial_is_told_does_not_block_its_configuration(tmp_path, monkeypatch):
    """Regression: Ctrl-C landing in the few storage writes between a measurement and Optuna's tell (its time_s and
    measured attributes already written) left a FAIL trial 'interrupted before it was measured' that still said
    measured, so the re-run counted it as a failure and pruned its requeued twin as 'taken by another worker':
    that configuration was never measured again. An interrupted trial is now unmeasured and measured on resume."""
    import test_search as ts

    from gemmgen.tune.search import tune

    real_tell = optuna.study.Study.tell
    told = {"n": 0}

    def tell(self, trial, values=None, state=None, **kw):
        if values is not None:
            told["n"] += 1
            if told["n"] == 3:  # the third measured trial: its attributes are in, the tell never happens
                raise KeyboardInterrupt
        return real_tell(self, trial, values, state=state, **kw)

    monkeypatch.setattr(optuna.study.Study, "tell", tell)
    bench = ts.Recorded()
    with pytest.raises(KeyboardInterrupt):
        tune(ts.PROBLEM, ts.GPU, bench, ts.options(tmp_path, trials=6, top_k=4), engines=ts.engines())
    interrupted_tag = bench.calls[-1]
    [cut] = [t for t in _study(tmp_path).trials if t.user_attrs.get("fail_reason") ==
             "interrupted before it was measured" and t.user_attrs.get("config_tag") == interrupted_tag]
    assert not cut.user_attrs.get("measured") and cut.user_attrs.get("time_s") is None
    record = json.loads(next((tmp_path / "results").rglob("*.json")).read_text())
    assert record["status"] == "interrupted"
    assert all(t["state"] != "FAIL" for t in record["trials"] if t["measured"])

    monkeypatch.setattr(optuna.study.Study, "tell", real_tell)
    again = ts.Recorded()
    result = tune(ts.PROBLEM, ts.GPU, again, ts.options(tmp_path, trials=6, top_k=4), engines=ts.engines())
    assert interrupted_tag in again.calls  # the requeued configuration is measured, not pruned as taken
    assert result.counts["failed"] == 0 and result.winner is not None
    assert not any(f"duplicate of trial {cut.number}," in (t.user_attrs.get("violation") or "")
                   for t in _study(tmp_path).trials)
