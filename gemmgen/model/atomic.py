"""Atomic file writes: readers see the old file or the new one, never a torn one (crash, Ctrl-C, kill, full disk)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def _fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX: the directory entry lives in the directory's own blocks)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # a platform or file system without directory handles: the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes, durable: bool, fd: "int | None" = None) -> None:
    """Write `data` to `path` (a fresh temporary name; or to `fd`, already open on it) and, if `durable`, fsync
    it; os.write is looped because it may write less than asked."""
    fresh = fd is None
    if fresh:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any file
    try:
        if not fresh:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; the file is as readable as any other
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, durable: bool = False) -> Path:
    """Write `data` to a temporary file beside `path`, then rename it over `path`.

    `durable` also fsyncs the file before the rename and the folder after it, for records, bundles and reports
    that must survive a power loss or SIGKILL. On any failure (ENOSPC included) `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        _write_file(tmp, data, durable, fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(path.parent)
    return path


def atomic_write_files(folder: Path, files: "dict[str, bytes]", last: "str | None" = None) -> "list[Path]":
    """Write several files that belong together (a bundle: cubin, source, manifest) into `folder`, so a failure
    while writing (a full disk, Ctrl-C) leaves every earlier file as it was.

    All of them are first written and fsynced in a temporary folder inside `folder`; only then are they renamed
    into place, which needs no space, `last` (the manifest, whose checksum vouches for the cubin) last of all.
    A crash in the microseconds between two renames leaves a new cubin beside the old manifest, which the
    loader's sha256 check refuses rather than runs."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder, prefix=".gemmgen-staging-"))
    order = sorted(files, key=lambda name: name == last)
    try:
        for name in order:
            _write_file(staging / name, files[name], durable=True)
        _fsync_dir(staging)
        for name in order:
            os.replace(staging / name, folder / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _fsync_dir(folder)
    return [folder / name for name in files]
