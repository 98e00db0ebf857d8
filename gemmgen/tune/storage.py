"""Optuna storage for studies: URL checks, one-line errors for bad/corrupt/locked databases, retries with backoff
while a database is unreachable, heartbeats, and the quarantine of kernels that crashed or hung (same storage).

Two kinds of storage, both Optuna's own:
  - RDB (any SQLAlchemy URL: sqlite:///file.db, postgresql://user@host/db, mysql+pymysql://...): many hosts
    share one server. Optuna's heartbeat (heartbeat_interval/grace_period) lets any worker fail the trials of
    a worker that stopped beating (optuna.storages.fail_stale_trials).
  - Journal (journal:///path/to/study.log): an append-only file with a file lock, no server; for the workers of
    one host (or a shared filesystem). Optuna 4/5 has no heartbeat for it, so the worker writes a timestamp in
    a system attribute of each trial it runs (tune/liveness.py) and the same reaping applies.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..model.arch import Gpu
from ..model.errors import UserError
from ..model.problem import Problem
from ..model import paths
from .results import now

class StorageError(UserError):
    """The study storage cannot be used: bad URL, missing driver, corrupt or locked database."""

    def __init__(self, rule: str, url: str, hint: str = ""):
        self.rule, self.url, self.hint = rule, url, hint
        super().__init__(rule, url, hint)

    def __str__(self) -> str:
        return f"{self.rule}: {self.url}" + (f" ({self.hint})" if self.hint else "")


# --- the search space as per-axis categorical parameters ----------------------------------------


def default_storage_url(gpu: Gpu, simulated: bool = False) -> str:
    """<studies dir>/<gpu>/studies.db (model/paths.studies_dir: the per-user data directory, never the repository);
    replayed (simulated) tunes get their own file, so their trials never count as measurements of the GPU."""
    name = "replay-studies.db" if simulated else "studies.db"
    return f"sqlite:///{(paths.studies_dir() / gpu.key / name).resolve()}"


def _lock_timeout() -> float:
    """Seconds to wait for a locked database: $GEMMGEN_DB_TIMEOUT (empty or unset: 30), a number 0..3600."""
    from ..model import parse

    return parse.real("GEMMGEN_DB_TIMEOUT", os.environ.get("GEMMGEN_DB_TIMEOUT") or "30", 0.0, 3600.0)


JOURNAL = "journal:"


def is_journal(url: str) -> bool:
    return url.startswith(JOURNAL)


def journal_path(url: str) -> Path:
    """journal:///abs/path.log or journal:relative/path.log -> the file."""
    rest = url[len(JOURNAL):]
    if rest.startswith("///"):
        rest = "/" + rest[3:]
    elif rest.startswith("//"):
        raise StorageError("a journal storage is a file: journal:///absolute/path.log or journal:relative.log", url)
    if not rest:
        raise StorageError("a journal storage is a file: journal:///absolute/path.log or journal:relative.log", url)
    return Path(rest)


def _retry_s() -> float:
    """Seconds to retry an unreachable database: $GEMMGEN_DB_RETRY_S (empty or unset: 60), a number 0..86400."""
    from ..model import parse

    return parse.real("GEMMGEN_DB_RETRY_S", os.environ.get("GEMMGEN_DB_RETRY_S") or "60", 0.0, 86400.0)


def safe_url(url: str) -> str:
    """The URL with any password hidden, for printing and records."""
    if is_journal(url):
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def _translate(exc: Exception, url: str) -> StorageError:
    text = str(getattr(exc, "orig", None) or exc).splitlines()[0]
    if "locked" in text.lower() or "busy" in text.lower():
        return StorageError("the study database is locked by another process", safe_url(url),
                            "wait for the other tune to finish, or pass --storage with another URL")
    if "readonly database" in text.lower() or "read-only" in text.lower():
        return StorageError("the study database is read-only, and a tune writes every trial to it", safe_url(url),
                            "pass --storage with a database this user can write")
    if "not a database" in text.lower() or "malformed" in text.lower() or "corrupt" in text.lower():
        return StorageError("the study database is corrupt or not an SQLite file", safe_url(url),
                            "move it aside; a new one is created on the next run")
    return StorageError(f"cannot use the study storage ({text})", safe_url(url))


@contextmanager
def storage_errors(url: str):
    """Turn database failures met at any point of a tune into one-line StorageErrors."""
    import sqlalchemy.exc as sa_exc
    from optuna.exceptions import StorageInternalError

    try:
        yield
    except sa_exc.SQLAlchemyError as exc:
        raise _translate(exc, url) from None
    except StorageInternalError as exc:  # Optuna wraps what failed in a commit
        raise _translate(exc.__cause__ or exc, url) from None


def _file_rules(path: Path, shown: str, create_folder: bool, what: str = "an SQLite storage") -> None:
    """A storage file's path must be usable: not a folder, and in a folder that exists. gemmgen creates the file,
    but folders only for its own default location: a typo must not build /deep/path under /."""
    try:
        if path.is_dir():
            raise StorageError(f"{what} must be a file, not a directory", shown)
        if create_folder:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif path.parent.exists() and not path.parent.is_dir():
            raise StorageError(f"{what}'s folder must be a folder, but {path.parent} is a file", shown)
        elif not path.parent.is_dir():
            raise StorageError(f"{what} must be in a folder that exists (gemmgen creates the file, not its folders)",
                               shown)
    except OSError as exc:
        # Only gemmgen's default location has its folders made: that path comes from the environment.
        where = " (the default location: GEMMGEN_RESULTS, else GEMMGEN_DATA, must name folders)" if create_folder else ""
        raise StorageError(f"cannot use the storage path ({exc.strerror or type(exc).__name__}){where}",
                           shown if len(shown) <= 80 else shown[:60] + f"... ({len(shown)} characters)") from None


def _sqlite_file(db: "str | None", url: str, create_folder: bool) -> None:
    """The rules an SQLite database path keeps. In memory (sqlite://, :memory:) is refused: each connection gets
    its own empty database and a tune uses several (its trial loop and its compile thread), so the study vanished
    mid-tune with an Optuna StorageInternalError."""
    if not db or db == ":memory:" or (db.startswith("file:") and "memory" in db):
        raise StorageError("--storage must be a database file or server, not an in-memory SQLite database "
                           "(each connection of a tune would see another, empty one)", url,
                           "e.g. sqlite:///studies.db")
    if db.startswith("file:"):
        return  # an SQLite URI: sqlite3 itself reports what it cannot open
    path = Path(db)
    _file_rules(path, db, create_folder)
    try:
        if path.exists() and path.stat().st_size > 0:
            with open(path, "rb") as f:
                if f.read(16) != b"SQLite format 3\x00":
                    raise StorageError("the study database is corrupt or not an SQLite file", db,
                                       "move it aside; a new one is created on the next run")
    except OSError as exc:
        raise StorageError(f"cannot read the study database ({exc.strerror or type(exc).__name__})", db) from None


def _journal_file(path: Path, url: str) -> None:
    """An existing journal must end in a whole journal entry. Optuna takes a bad last line for one still being
    written: it opened such a file, appended the quarantine's study to it and then failed with a
    JSONDecodeError traceback (a text file given as --storage journal:notes.txt)."""
    import json

    try:
        if not path.is_file() or path.stat().st_size == 0:
            return
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            tail = b""
            while end > 0 and tail.count(b"\n") < 2:
                start = max(0, end - 65536)
                f.seek(start)
                tail = f.read(end - start) + tail
                end = start
    except OSError as exc:
        raise StorageError(f"cannot read the journal file ({exc.strerror or type(exc).__name__})", url) from None
    last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    try:
        entry = json.loads(last) if tail.endswith(b"\n") else None
    except ValueError:
        entry = None
    if not isinstance(entry, dict) or "op_code" not in entry:
        raise StorageError("the journal file does not end in a journal entry (not an Optuna journal, or its last "
                           "write was cut off)", url, "move it aside; a new one is created on the next run")


def check_url(url: str, create_folder: bool = False) -> None:
    """Raise StorageError unless `url` is an SQLAlchemy URL naming a database SQLAlchemy knows, or a journal file;
    a file (SQLite, journal) must be one gemmgen may create or open (no database is opened)."""
    import sqlalchemy.exc as sa_exc
    from sqlalchemy.engine import make_url

    if is_journal(url):
        _file_rules(journal_path(url), url, create_folder, "a journal storage")
        _journal_file(journal_path(url), url)
        return
    try:
        parsed = make_url(url)
        parsed.get_dialect()
    except sa_exc.NoSuchModuleError:  # an ArgumentError too: caught first
        raise StorageError("--storage must name a database SQLAlchemy knows (sqlite, postgresql, mysql, ...)",
                           safe_url(url)) from None
    except (sa_exc.ArgumentError, ValueError):
        raise StorageError("--storage must be an SQLAlchemy URL such as sqlite:///studies.db or "
                           "postgresql://user@host/db", url) from None
    except ImportError:
        return  # a known dialect whose driver is missing: open_storage says so when a tune needs it
    if parsed.get_backend_name() == "sqlite":
        _sqlite_file(parsed.database, url, create_folder)


@dataclass(frozen=True)
class Heartbeat:
    """How often a worker says it is alive, and how long a silent worker's RUNNING trials are left alone."""

    interval_s: int = 10
    grace_s: int = 60


def open_storage(url: str, heartbeat: "Heartbeat | None" = None, on_stale=None, create_folder: bool = True):
    """Optuna storage for `url` (RDB, or journal:PATH), or a StorageError that says what is wrong with it.

    Database calls that fail because the server is unreachable are retried with backoff for GEMMGEN_DB_RETRY_S
    seconds (default 60). With `heartbeat`, RDB storage runs Optuna's heartbeat; `on_stale(study, trial)` is
    called for each trial that fail_stale_trials failed. `create_folder`: a file storage's folders may be made
    (gemmgen's own default location); a user's --storage is checked with check_url first, which refuses that."""
    if is_journal(url):
        return _open_journal(url, create_folder)
    import optuna
    import sqlalchemy.exc as sa_exc
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except (sa_exc.ArgumentError, ValueError):
        raise StorageError("--storage must be an SQLAlchemy URL such as sqlite:///studies.db or "
                           "postgresql://user@host/db", url) from None
    engine_kwargs: dict = {}
    if parsed.get_backend_name() == "sqlite":
        _sqlite_file(parsed.database, url, create_folder)
        engine_kwargs["connect_args"] = {"timeout": _lock_timeout()}
    else:
        # A server restarted under us leaves dead connections in the pool: test each before use.
        engine_kwargs["pool_pre_ping"] = True
    beat = {}
    if heartbeat is not None:
        beat = dict(heartbeat_interval=heartbeat.interval_s, grace_period=heartbeat.grace_s)
        if on_stale is not None:
            beat["heartbeat_stale_trial_callback" if _has_stale_callback_arg() else "failed_trial_callback"] = on_stale
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            storage = _create_rdb(lambda: _with_retries(
                lambda: _RetryingRDB(url, engine_kwargs=engine_kwargs, **beat), url))
        if parsed.get_backend_name() == "sqlite":
            _fast_sqlite(storage)
        return storage
    except ImportError as exc:
        raise _missing_driver(exc, parsed, url) from None
    except sa_exc.NoSuchModuleError:
        raise StorageError("--storage must name a database SQLAlchemy knows (sqlite, postgresql, mysql, ...)",
                           safe_url(url)) from None
    except sa_exc.SQLAlchemyError as exc:
        raise _translate(exc, url) from None
    except RuntimeError as exc:  # Optuna's schema-version check
        raise StorageError(f"the study database cannot be used by this Optuna ({str(exc).splitlines()[0]})",
                           safe_url(url), "run `optuna storage upgrade --storage URL`") from None


def _missing_driver(exc: ImportError, parsed, url: str) -> StorageError:
    """The driver a URL needs, named. SQLAlchemy 2.1 runs a plain postgresql:// on psycopg (3), not psycopg2, so
    a host set up as docs/distributed.md said (pip install psycopg2-binary) was told to install psycopg2-binary,
    which it had: the module missing is in the ImportError's cause, and an installed driver can be named in the
    URL instead."""
    import importlib.util

    cause = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
    module = getattr(cause, "name", None)
    rule = "the storage URL needs a database driver that is not installed" + \
        (f" (Python module '{module}')" if module else "")
    hint = "install it, e.g. psycopg or psycopg2-binary for postgresql://, pymysql for mysql+pymysql://"
    if parsed.get_backend_name() == "postgresql" and module != "psycopg2" and importlib.util.find_spec("psycopg2"):
        instead = parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=True)
        hint = f"install it, or name the installed psycopg2 in the URL: {instead}"
    return StorageError(rule, safe_url(url), hint)


def _create_rdb(build, tries: int = 5):
    """build() (an RDBStorage, which creates its tables and schema version on a fresh database), tried again when
    another process created them at the same moment: two tunes started together on a new database (two
    terminals, several workers) met "UNIQUE constraint failed: alembic_version.version_num" (SQLite) or a
    duplicate pg_type row (PostgreSQL). The second try finds the tables made and uses them."""
    import sqlalchemy.exc as sa_exc

    for attempt in range(tries):
        try:
            return build()
        except (sa_exc.IntegrityError, sa_exc.ProgrammingError, sa_exc.OperationalError) as exc:
            text = str(exc).lower()
            racing = isinstance(exc, sa_exc.IntegrityError) or "already exists" in text or "duplicate" in text
            if not racing or attempt == tries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def _has_stale_callback_arg() -> bool:
    import inspect

    import optuna

    return "heartbeat_stale_trial_callback" in inspect.signature(optuna.storages.RDBStorage.__init__).parameters


def _open_journal(url: str, create_folder: bool = True):
    import optuna

    path = journal_path(url)
    _file_rules(path, str(path), create_folder, "a journal storage")
    _journal_file(path, url)
    journal = optuna.storages.journal if hasattr(optuna.storages, "journal") else None
    backend_type = getattr(journal, "JournalFileBackend", None) or optuna.storages.JournalFileStorage
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _with_retries(lambda: _RetryingJournal(backend_type(str(path))), url)
    except (ValueError, KeyError) as exc:
        raise StorageError(f"the journal file cannot be read ({str(exc).splitlines()[0][:120]})", str(path),
                           "move it aside; a new one is created on the next run") from None


# --- retries: a database that goes away for some seconds ------------------------------------------

_depth = threading.local()


# OperationalErrors that waiting does not cure: a locked, damaged or read-only SQLite file, and a server that
# answered but refused the login or has no such database or role. PostgreSQL and MySQL report those as
# OperationalErrors too, so a wrong password (a read-only file) was retried for GEMMGEN_DB_RETRY_S (60 s) and then
# called "unreachable".
_LASTING = ("locked", "no such table", "not a database", "readonly database",
            "authentication failed", "no pg_hba.conf entry", "does not exist",  # PostgreSQL
            "access denied", "unknown database")  # MySQL (1045, 1044, 1049)


def _transient(exc: BaseException) -> bool:
    """Whether `exc` says the storage is unreachable for now (not that the request is wrong)."""
    import sqlalchemy.exc as sa_exc
    from optuna.exceptions import StorageInternalError

    if isinstance(exc, StorageInternalError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, sa_exc.PendingRollbackError):
        # A session whose connection died mid-transaction (its rollback failed too): _with_retries' reset
        # replaces the session, so the next try runs on a fresh connection.
        return True
    if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError)):
        text = str(exc).lower()
        return not any(words in text for words in _LASTING)
    if isinstance(exc, sa_exc.DBAPIError):
        return bool(exc.connection_invalidated)
    return isinstance(exc, (ConnectionError, TimeoutError, BlockingIOError))


def _with_retries(call, url: str, reset=None):
    """call(), retried with backoff (0.25 s doubling to 4 s) while the storage is unreachable; only the
    outermost call of a thread retries, so nested storage calls do not multiply the wait. `reset()` runs before
    each retry (an RDB storage drops this thread's session: one left mid-transaction by a dropped connection
    refuses every later statement with 'Can't reconnect until invalid transaction is rolled back')."""
    if getattr(_depth, "n", 0):
        return call()
    _depth.n = 1
    try:
        deadline, delay, told = time.monotonic() + _retry_s(), 0.25, False
        while True:
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - only transient failures are retried; others re-raised
                if not _transient(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    cause = exc.__cause__ if exc.__cause__ is not None else exc
                    text = str(getattr(cause, "orig", None) or cause).splitlines()[0][:160]
                    raise StorageError(f"the study storage stayed unreachable for {_retry_s():g}s ({text})",
                                       safe_url(url), "set GEMMGEN_DB_RETRY_S to wait longer") from None
                if not told:
                    print(f"note: the study storage {safe_url(url)} is unreachable; retrying for up to "
                          f"{_retry_s():g}s", file=sys.stderr)
                    told = True
                time.sleep(delay)
                if reset is not None:
                    try:
                        reset()
                    except Exception:  # noqa: BLE001 - the next try says whether the storage is back
                        pass
                delay = min(4.0, delay * 2)
    finally:
        _depth.n = 0


# Private storage methods Optuna calls from outside the storage: its _CachedStorage (which every Study wraps an
# RDBStorage in) asks and reads trials through these, and fail_stale_trials reads stale trials. Missing the first
# made a server restart fail a worker's ask (2026-11-25, tests/test_distributed.py's outage test).
_PRIVATE_CALLS = ("_create_new_trial", "_set_trial_param", "_get_best_trial_id", "_get_trials",
                  "_get_stale_trial_ids")


def _retrying(base: type, name: str) -> type:
    """A subclass of Optuna storage `base` whose every public method is retried by _with_retries."""
    import functools

    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            sessions = getattr(self, "scoped_session", None)  # RDB: this thread's session, replaced on a retry
            return _with_retries(lambda: method(self, *args, **kwargs), getattr(self, "url", name),
                                 sessions.remove if sessions is not None else None)
        return call

    members = {"__module__": __name__, "__doc__": f"{base.__name__} whose calls are retried while unreachable."}
    for attr in dir(base):
        method = getattr(base, attr)
        if callable(method) and (not attr.startswith("_") or attr in _PRIVATE_CALLS) and \
                attr not in ("with_lock",):
            members[attr] = wrap(method)
    return type(name, (base,), members)


def _lazy_retrying():
    import optuna

    global _RetryingRDB, _RetryingJournal
    _RetryingRDB = _retrying(optuna.storages.RDBStorage, "RetryingRDBStorage")
    _RetryingJournal = _retrying(optuna.storages.JournalStorage, "RetryingJournalStorage")


class _Lazy:
    """Builds the retrying classes on first use (importing this module must not import Optuna)."""

    def __init__(self, attr):
        self.attr = attr

    def __call__(self, *args, **kwargs):
        _lazy_retrying()
        return globals()[self.attr](*args, **kwargs)


_RetryingRDB = _Lazy("_RetryingRDB")
_RetryingJournal = _Lazy("_RetryingJournal")


def _fast_sqlite(storage) -> None:
    """synchronous=NORMAL: every trial commits a dozen small writes, and a full fsync each made the
    database, not the GPU, the bottleneck. A killed process loses nothing (the OS holds the pages);
    only a power cut can lose the last commits."""
    from sqlalchemy import event

    def _pragma(dbapi_connection, _record):
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")

    event.listen(storage.engine, "connect", _pragma)
    storage.engine.dispose()  # connections opened before the listener existed are dropped


class Quarantine:
    """Kernels that failed (hang, crash, CUDA error, wrong result, compile error), kept in storage.

    They live as user attributes of a study named 'gemmgen/quarantine/<gpu>' in the same storage,
    keyed by kernel name (which includes the arch, operands and configuration), so they survive
    resumes and apply to every problem tuned on that GPU.
    """

    def __init__(self, storage, gpu: Gpu):
        import optuna

        self.study = optuna.create_study(storage=storage, study_name=f"gemmgen/quarantine/{gpu.key}",
                                         load_if_exists=True)
        self.entries: "dict[str, dict]" = dict(self.study.user_attrs)

    def reason(self, kernel_name: str) -> "str | None":
        entry = self.entries.get(kernel_name)
        return None if entry is None else str(entry.get("reason", "quarantined"))

    def add(self, kernel_name: str, reason: str, kind: str, problem: Problem) -> None:
        entry = {"reason": reason, "kind": kind, "problem": problem.label, "date": now()}
        self.entries[kernel_name] = entry
        self.study.set_user_attr(kernel_name, entry)


# --- the tune itself -------------------------------------------------------------------------
