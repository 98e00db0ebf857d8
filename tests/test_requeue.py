"""A trial whose worker died: queued again clean, or, when its measurement was already in, recorded as measured.

These pin, on an in-memory study, the two ways tests/test_distributed.py measured one configuration twice:
Optuna's retry callback copied the dead trial's user attributes (`measured` among them) into the trial queued
again, and a trial being told after its measurement (phase 'done') was not seen as holding its configuration.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

optuna = pytest.importorskip("optuna")

from gemmgen.model.problem import Problem  # noqa: E402
from gemmgen.tune.liveness import HEARTBEAT_ATTR, fail_trial, retry_callback, retry_copy  # noqa: E402
from gemmgen.tune.search.study import StudyHistory, holds_claim  # noqa: E402

DIST = {"tile": optuna.distributions.CategoricalDistribution(["a", "b"])}


def running_trial(study, **attrs):
    trial = study.ask(DIST)
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    study._storage.set_trial_system_attr(trial._trial_id, HEARTBEAT_ATTR, 1.0)
    return study._storage.get_trial(trial._trial_id)


def test_a_trial_queued_again_carries_its_parameters_not_the_dead_trials_claim_or_measurement():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    dead = running_trial(study, config_tag="a", owner="host:1", phase="measuring", measured=True, worker="gpu0")
    assert fail_trial(study, dead._trial_id)
    retry_callback()(study, retry_copy(study._storage.get_trial(dead._trial_id)))
    [again] = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert again.params == dead.params
    assert set(again.user_attrs) == {"source"} and f"trial {dead.number}" in again.user_attrs["source"]
    assert again.system_attrs["retry_history"] == [dead.number] and HEARTBEAT_ATTR not in again.system_attrs
    # Optuna's callback alone copies every user attribute: the queued trial would pass for a measurement.
    retry_callback()(study, study._storage.get_trial(dead._trial_id))
    copied = study.get_trials(states=(optuna.trial.TrialState.WAITING,))[-1]
    assert copied.user_attrs.get("measured") is True  # (why retry_copy exists; fails once Optuna stops copying)


def test_a_trial_being_told_after_its_measurement_holds_its_configuration_and_one_that_gave_way_does_not():
    told = SimpleNamespace(user_attrs={"config_tag": "a", "phase": "done", "measured": True})
    gave_way = SimpleNamespace(user_attrs={"config_tag": "a", "phase": "done"})
    compiling = SimpleNamespace(user_attrs={"config_tag": "a", "phase": "compiling"})
    assert holds_claim(told) and holds_claim(compiling) and not holds_claim(gave_way)


def test_an_orphan_killed_while_telling_its_measurement_is_recorded_with_it_not_failed():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    problem = Problem.create(4096, 4096, 4096, "bf16")
    history = SimpleNamespace(study=study, problem=problem)
    ok = running_trial(study, config_tag="a", measured=True, time_s=1e-3, tflops=137.4, phase="done")
    no_tflops = running_trial(study, config_tag="b", measured=True, time_s=2e-3)
    failed = running_trial(study, config_tag="c", measured=True, fail_reason="wrong result")
    for t in (ok, no_tflops, failed):
        assert StudyHistory.settle_measured(history, t)
    assert not StudyHistory.settle_measured(history, ok)  # settled once: the second worker to try gives way
    by_tag = {t.user_attrs["config_tag"]: t for t in study.get_trials()}
    assert by_tag["a"].state.name == "COMPLETE" and by_tag["a"].value == 137.4
    assert by_tag["b"].state.name == "COMPLETE" and by_tag["b"].value == pytest.approx(problem.flops / 2e-3 / 1e12)
    assert by_tag["c"].state.name == "FAIL"
