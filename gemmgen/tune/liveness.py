"""Which RUNNING trials still have a live worker: heartbeats while a worker holds trials, and the reaping of
trials whose worker stopped (SIGKILL, a lost host, a pulled cable) so that another worker measures them.

RDB storage uses Optuna's own heartbeat: `storage.record_heartbeat(trial_id)` from a thread here (Optuna starts
its thread only inside Study.optimize, and gemmgen asks and tells), and `optuna.storages.fail_stale_trials`, which
fails silent trials and calls the storage's stale-trial callback. Optuna 4/5 has no heartbeat for JournalStorage,
so there the thread writes the time into a system attribute of each trial and `fail_silent_journal_trials` does
what fail_stale_trials does, calling the same callback. The callback (`requeue_stale`) is Optuna's
RetryHeartbeatStaleTrialCallback (RetryFailedTrialCallback before Optuna 4.9), with one retry: a kernel whose
measurement took its worker down twice is quarantined instead. The trial queued again is a clean copy
(`retry_copy`): Optuna's callback copies every user attribute, and an inherited `measured`, `owner`, `phase` or
heartbeat would make the copy pass for a measurement, for a trial of the dead worker, or for a stale one.
"""
from __future__ import annotations

import threading
import time
import warnings

HEARTBEAT_ATTR = "gemmgen_heartbeat"  # journal storage: time.time() of the last beat


class HeartbeatThread:
    """Beats for every trial a worker holds (asked, compiling or measuring) until it is told."""

    def __init__(self, storage, interval_s: float, journal: bool):
        self.storage, self.interval_s, self.journal = storage, interval_s, journal
        self.trial_ids: "set[int]" = set()
        self.also = None  # another lease to renew on every beat (the finalist leader's lock)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gemmgen-heartbeat", daemon=True)
        self._thread.start()

    def add(self, trial_id: int) -> None:
        with self._lock:
            self.trial_ids.add(trial_id)
        self._beat(trial_id)  # at once: a trial without any beat is never judged stale by Optuna

    def discard(self, trial_id: int) -> None:
        with self._lock:
            self.trial_ids.discard(trial_id)

    def _beat(self, trial_id: int) -> None:
        try:
            if self.journal:
                self.storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
            else:
                self.storage.record_heartbeat(trial_id)
        except Exception:  # noqa: BLE001 - told already (finished), or the storage is down: the next beat retries
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                ids = sorted(self.trial_ids)
            for trial_id in ids:
                self._beat(trial_id)
            also = self.also
            if also is not None:
                try:
                    also()
                except Exception:  # noqa: BLE001 - the storage is down: the next beat retries
                    pass

    def close(self) -> None:
        self._stop.set()


def retry_callback():
    """Optuna's retry-on-stale callback: the stale trial's parameters queued again (WAITING), once."""
    import optuna

    cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(max_retry=1)


def retry_copy(trial):
    """The stale trial as the retry callback should see it: its parameters and Optuna's retry bookkeeping only.
    RetryHeartbeatStaleTrialCallback gives the new WAITING trial all of the failed trial's user attributes; the
    worker that asks it would then hold a trial already marked `measured` (counted as a second measurement of its
    configuration even when it gives way), owned by the dead process (reaped again at once by another worker),
    and in phase `measuring` (its kernel quarantined if that happened). Only where it came from is kept."""
    import copy

    clean = copy.deepcopy(trial)
    clean.user_attrs = {"source": f"queued again: trial {trial.number}'s worker stopped before it was measured"}
    clean.system_attrs = {k: v for k, v in trial.system_attrs.items() if k != HEARTBEAT_ATTR}
    return clean


def fail_stale(study, journal: bool, grace_s: float, on_stale) -> None:
    """Fail the RUNNING trials whose worker stopped beating for `grace_s`; `on_stale(study, trial)` for each."""
    import optuna

    if journal:
        fail_silent_journal_trials(study, grace_s, on_stale)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)  # calls the storage's callback, i.e. on_stale


def fail_silent_journal_trials(study, grace_s: float, on_stale) -> None:
    """fail_stale_trials for JournalStorage: the last beat is the HEARTBEAT_ATTR system attribute."""
    import optuna

    TrialState = optuna.trial.TrialState
    now = time.time()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        beat = t.system_attrs.get(HEARTBEAT_ATTR)
        if beat is None:
            beat = t.datetime_start.timestamp() if t.datetime_start else now
        if now - float(beat) <= grace_s:
            continue
        if fail_trial(study, t._trial_id):
            on_stale(study, study._storage.get_trial(t._trial_id))


def settle_trial(study, trial_id: int, value: "float | None") -> bool:
    """COMPLETE a RUNNING trial with `value` (FAIL it if None); False when another worker finished it first."""
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError

    state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
    try:
        return bool(study._storage.set_trial_state_values(trial_id, state=state,
                                                          values=[value] if value is not None else None))
    except (UpdateFinishedTrialError, RuntimeError, ValueError):
        return False


def fail_trial(study, trial_id: int) -> bool:
    """FAIL a RUNNING trial; False when another worker finished or failed it first (only one caller wins)."""
    return settle_trial(study, trial_id, None)
