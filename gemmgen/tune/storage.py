"""Optuna RDB storage for studies: URL checks, one-line errors for bad/corrupt/locked databases, and the
quarantine of kernels that crashed or hung (kept in the same storage)."""
from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
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
    try:
        return float(os.environ.get("GEMMGEN_DB_TIMEOUT", "30"))
    except ValueError:
        return 30.0


def safe_url(url: str) -> str:
    """The URL with any password hidden, for printing and records."""
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
    if "not a database" in text.lower() or "malformed" in text.lower() or "corrupt" in text.lower():
        return StorageError("the study database is corrupt or not an SQLite file", safe_url(url),
                            "move it aside; a new one is created on the next run")
    return StorageError(f"cannot use the study storage ({text})", safe_url(url))


@contextmanager
def storage_errors(url: str):
    """Turn database failures met at any point of a tune into one-line StorageErrors."""
    import sqlalchemy.exc as sa_exc

    try:
        yield
    except sa_exc.SQLAlchemyError as exc:
        raise _translate(exc, url) from None


def check_url(url: str) -> None:
    """Raise StorageError unless `url` is an SQLAlchemy URL naming a database SQLAlchemy knows (no I/O)."""
    import sqlalchemy.exc as sa_exc
    from sqlalchemy.engine import make_url

    try:
        make_url(url).get_dialect()
    except (sa_exc.ArgumentError, ValueError):
        raise StorageError("--storage must be an SQLAlchemy URL such as sqlite:///studies.db or "
                           "postgresql://user@host/db", url) from None
    except sa_exc.NoSuchModuleError:
        raise StorageError("--storage must name a database SQLAlchemy knows (sqlite, postgresql, mysql, ...)",
                           safe_url(url)) from None
    except ImportError:
        pass  # a known dialect whose driver is missing: open_storage says so when a tune needs it


def open_storage(url: str):
    """Optuna RDB storage for `url`, or a StorageError that says what is wrong with it."""
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
        db = parsed.database
        if db and db != ":memory:" and not db.startswith("file:"):
            path = Path(db)
            if path.is_dir():
                raise StorageError("an SQLite storage must be a file, not a directory", db)
            if path.exists() and path.stat().st_size > 0:
                with open(path, "rb") as f:
                    if f.read(16) != b"SQLite format 3\x00":
                        raise StorageError("the study database is corrupt or not an SQLite file", db,
                                           "move it aside; a new one is created on the next run")
            else:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise StorageError(f"cannot create the storage folder ({exc.strerror})", db) from None
        engine_kwargs["connect_args"] = {"timeout": _lock_timeout()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
        if parsed.get_backend_name() == "sqlite":
            _fast_sqlite(storage)
        return storage
    except ImportError:
        raise StorageError("the storage URL needs a database driver that is not installed", safe_url(url),
                           "install the one SQLAlchemy uses for it, e.g. psycopg2-binary for postgresql://, "
                           "pymysql for mysql+pymysql://") from None
    except sa_exc.NoSuchModuleError:
        raise StorageError("--storage must name a database SQLAlchemy knows (sqlite, postgresql, mysql, ...)",
                           safe_url(url)) from None
    except sa_exc.SQLAlchemyError as exc:
        raise _translate(exc, url) from None
    except RuntimeError as exc:  # Optuna's schema-version check
        raise StorageError(f"the study database cannot be used by this Optuna ({str(exc).splitlines()[0]})",
                           safe_url(url), "run `optuna storage upgrade --storage URL`") from None


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
