"""An append-only event log, one JSON object per line.

Each line goes out in one write on an O_APPEND descriptor and is fsynced, so a killed process can at worst
leave a torn last line. Readers skip such lines rather than fail: the log is a record, not the state.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


def utc_now(timespec: str = "microseconds") -> str:
    return datetime.now(timezone.utc).isoformat(timespec=timespec).replace("+00:00", "Z")


class Events(list):
    """The parsed events, oldest first; `skipped` counts lines that were not a JSON object (torn writes)."""

    skipped: int = 0


def log_event(ws_dir: str | os.PathLike, kind: str, **fields: Any) -> None:
    if "ts" in fields:
        raise ValueError("'ts' is set by log_event")
    record = {"ts": utc_now("milliseconds"), "kind": kind, **fields}
    line = (json.dumps(record, default=str) + "\n").encode("utf-8")
    fd = os.open(Path(ws_dir) / EVENTS_FILE, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        # After a torn write, start on a fresh line so the torn bytes do not swallow this event too.
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        view = memoryview(line)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_events(ws_dir: str | os.PathLike) -> Events:
    """All complete events; a missing log is an empty one. Unparseable lines are counted in `.skipped`."""
    out = Events()
    try:
        raw = (Path(ws_dir) / EVENTS_FILE).read_bytes()
    except FileNotFoundError:
        return out
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            out.skipped += 1
            continue
        if isinstance(obj, dict):
            out.append(obj)
        else:
            out.skipped += 1
    return out
