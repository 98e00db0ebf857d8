"""One worker re-measures the finalists: the leader, elected through the storage (part of the search; see
search/__init__.py).

Every worker that ends its search asks whether the study holds measured trials newer than the last finalist round
published in it. If so, it tries to create the study `<study>/finalists-<round>.<attempt>`: study names are unique
in every Optuna storage (a database constraint in RDB, the log's order in a journal), so exactly one worker
creates it, and that one leads. The leader keeps a lease in the lock study's user attributes (renewed by its
heartbeat thread), waits until no other worker holds a RUNNING trial (each finished or reaped), re-measures the
finalists interleaved on its own GPU and publishes the round as the study's user attribute `finalists/<round>`.
The others wait for that attribute and adopt it; if the leader's lease goes stale first (the leader was killed),
they elect again under the next attempt number. A re-run with nothing new measured adopts the last round.
"""
from __future__ import annotations

import time

from ...model.tiles import TileConfig
from ..results import now
from .options import Finalist
from .study import _owner

ROUND_PREFIX = "finalists/"
POLL_S = 0.25


class Leadership:
    """Electing the worker that re-measures the finalists, publishing its round, and adopting it elsewhere."""

    def rounds(self) -> "list[dict]":
        """The finalist rounds published in the study, oldest first."""
        attrs = self.study.user_attrs
        found = [attrs[k] for k in attrs if k.startswith(ROUND_PREFIX) and isinstance(attrs[k], dict)]
        return sorted(found, key=lambda r: r.get("round", 0))

    def finish(self) -> None:
        """After the search: lead the finalist round, or adopt the round another worker published."""
        self._sync()
        measured = [s.number for s in self.summaries.values() if s.measured and s.state == "COMPLETE"]
        rounds = self.rounds()
        last_seen = rounds[-1].get("last_trial", -1) if rounds else -1
        if measured and max(measured) > last_seen:
            k = len(rounds)
            lock = self._elect(k)
            if lock is not None:
                self._lead(k, lock)
                return
            round_ = self._await_round(k)
            if round_ is None:  # the leader stopped before publishing, and this worker leads now
                return
            rounds = self.rounds()
        if rounds:
            self._adopt(rounds[-1])

    # -- election ------------------------------------------------------------------------------
    def _elect(self, k: int):
        """The lock study if this worker won round k's election, else None (a live leader holds it)."""
        optuna = self.optuna
        attempt = 0
        while True:
            name = f"{self.name}/finalists-{k}.{attempt}"
            try:
                lock = optuna.create_study(storage=self.storage, study_name=name, load_if_exists=False)
            except optuna.exceptions.DuplicatedStudyError:
                held = optuna.load_study(study_name=name, storage=self.storage)
                lease = held.user_attrs.get("lease")
                # A leader of this host whose process has ended (killed outright) is gone now: the rerun of a tune
                # killed in its finalist round waited out --grace (60 s), silently, before leading the round.
                if not _process_ended(held.user_attrs.get("owner")) and \
                        (lease is None or time.time() - float(lease) <= self.options.grace_s):
                    return None
                attempt += 1  # its leader went silent: the next attempt's lock is free to take
                continue
            lock.set_user_attr("owner", _owner())
            lock.set_user_attr("worker", self.options.worker)
            lock.set_user_attr("lease", time.time())
            self.heartbeat.also = lambda: lock.set_user_attr("lease", time.time())
            return lock

    def _await_round(self, k: int) -> "dict | None":
        """Wait for round k to be published; if its leader's lease goes stale first, run the election again."""
        self.emit("awaiting_leader", {"round": k})
        key = f"{ROUND_PREFIX}{k}"
        while True:
            if key in self.study.user_attrs:
                return self.study.user_attrs[key]
            time.sleep(POLL_S * 4)
            if key in self.study.user_attrs:
                return self.study.user_attrs[key]
            self._recover_interrupted()
            lock = self._elect(k)
            if lock is not None:
                self._lead(k, lock)
                return None

    # -- the leader's round --------------------------------------------------------------------
    def _lead(self, k: int, lock) -> None:
        self.leading = True
        try:
            self._wait_quiet()
            self._sync()
            last_trial = max((s.number for s in self.summaries.values() if s.measured), default=-1)
            self.choose()
        except BaseException:
            # Stopped before publishing (Ctrl-C, SIGTERM): give the lease up, so a rerun of the same tune or another
            # worker leads round k at once rather than waiting out --grace for a leader that is gone.
            self.heartbeat.also = None
            try:
                lock.set_user_attr("lease", 0.0)
            except Exception:  # noqa: BLE001 - the storage may be what failed; the lease then expires on its own
                pass
            raise
        payload = {"round": k, "last_trial": last_trial, "owner": _owner(), "worker": self.options.worker,
                   "date": now(), "finalists": [f.to_dict() for f in self.finalists],
                   "winner": self.winner.config.tag if self.winner else None,
                   "cublas_times_s": list(self.cublas_times_s)}
        self.study.set_user_attr(f"{ROUND_PREFIX}{k}", payload)
        self.heartbeat.also = None
        lock.set_user_attr("done", True)

    def _wait_quiet(self) -> None:
        """Until no other worker holds a RUNNING trial: the finalists are chosen from the whole search. A worker
        that died is reaped on the way (heartbeat); the wait is bounded all the same."""
        deadline = time.monotonic() + 2 * self.options.grace_s + 120
        self._sync()
        if self.running_tags:
            self.emit("awaiting_workers", {"running": len(self.running_tags)})
        while self.running_tags and time.monotonic() < deadline:
            time.sleep(POLL_S)
            self._reap_due()
            self._sync()

    def _adopt(self, round_: dict) -> None:
        """Take another worker's (or an earlier run's) finalist round as this tune's result."""
        self.finalists = [finalist_from_dict(d, self.problem.flops) for d in round_.get("finalists", ())]
        self.winner = next((f for f in self.finalists if f.config.tag == round_.get("winner")), None)
        self.cublas_times_s = tuple(round_.get("cublas_times_s") or ())
        if self.cublas_times_s:
            import statistics

            self.cublas_time_s = statistics.median(self.cublas_times_s)
        self.adopted_from = round_.get("worker") or round_.get("owner")


def _process_ended(owner: "str | None") -> bool:
    """Whether `owner` ('host:pid', as _owner writes it) was a process of this host that has ended. Another
    host's process, or a live one, is judged by its lease instead."""
    import os
    import socket

    host, _, pid = str(owner or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def finalist_from_dict(d: dict, flops: int) -> Finalist:
    return Finalist(d["kernel"], TileConfig.from_dict(d["config"]), tuple(d.get("times_s") or ()),
                    float(d["predicted_time_s"]), flops, d.get("rel_error"), d.get("failed") or "")
