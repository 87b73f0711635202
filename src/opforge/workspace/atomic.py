"""Crash-safe file writes and the workspace lock.

A reader of a target path sees either the old bytes or the new ones, never a mix: the new bytes go to a
temporary file in the same directory (so the rename stays on one filesystem) and replace the target in one
`os.replace`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import filelock

from opforge.errors import InputError

LOCK_FILE = ".orchestrator.lock"

# Read once: os.umask can only be queried by setting it, which is not thread-safe at call time.
_UMASK = os.umask(0)
os.umask(_UMASK)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; platforms that cannot open a directory have nothing to sync.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    target = Path(path)
    directory = target.parent
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_UMASK
    tmp = tempfile.NamedTemporaryFile(delete=False, dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        # NamedTemporaryFile creates 0600; keep the mode a plain write would have given.
        os.chmod(tmp.name, mode)
        os.replace(tmp.name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp.name)
        raise
    _fsync_dir(directory)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def check_out_file(path: str | os.PathLike, flag: str) -> None:
    """Refuse, before any work is done, a file that cannot be written: a folder in its place, or a folder for it
    that is missing or not writable. One InputError naming the option and the path."""
    target = Path(path)
    try:
        if target.is_dir():
            raise InputError(flag, f"{target}: is a folder; {flag} names a file to write")
        parent = target.absolute().parent
        if not parent.is_dir():
            why = "is a file, not a folder" if parent.exists() else "does not exist"
            raise InputError(flag, f"{target}: {parent} {why}")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise InputError(flag, f"{target}: folder {parent} is not writable")
    except OSError as exc:  # a folder above that cannot even be looked into
        raise InputError(flag, f"{target}: cannot write it: {exc.strerror or exc}") from None


@contextlib.contextmanager
def workspace_lock(ws_dir: str | os.PathLike, timeout: float = 0) -> Iterator[filelock.BaseFileLock]:
    """Hold the workspace exclusively; a second opforge process on the same workspace gets an InputError."""
    lockpath = Path(ws_dir) / LOCK_FILE
    lock = filelock.FileLock(str(lockpath), timeout=timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise InputError(str(lockpath), "another opforge process holds this workspace") from None
    try:
        yield lock
    finally:
        lock.release()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
