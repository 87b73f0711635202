"""Snapshots of stage artifacts, for rolling a workspace back.

A snapshot is `history_version/stage<N>_<timestamp>/` holding copies of the files and a `manifest.json`
written last; a folder without a manifest is an interrupted snapshot and is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from opforge.errors import InputError
from opforge.workspace.atomic import write_bytes_atomic, write_json_atomic

HISTORY_DIR = "history_version"
MANIFEST = "manifest.json"
_NAME = re.compile(r"^stage([1-7])_(\d{8}T\d{12})$")


def _safe_rel(rel: str, where: str) -> PurePosixPath:
    # Manifests and callers name files inside the workspace only; anything else could write outside it.
    p = PurePosixPath(rel)
    if p.is_absolute() or not p.parts or ".." in p.parts or "\\" in rel:
        raise InputError(where, f"{rel!r} is not a relative path inside the workspace")
    return p


def snapshot(ws_dir: str | os.PathLike, stage: int, files: list[str]) -> str:
    """Copy the existing ones of `files` into a new snapshot; returns its workspace-relative folder."""
    ws = Path(ws_dir)
    hist = ws / HISTORY_DIR
    hist.mkdir(exist_ok=True)
    while True:
        now = datetime.now(timezone.utc)
        name = f"stage{stage}_{now.strftime('%Y%m%dT%H%M%S%f')}"
        try:
            (hist / name).mkdir()
            break
        except FileExistsError:  # two snapshots in one microsecond: take the next tick
            continue
    snap = hist / name
    digests: dict[str, str] = {}
    for rel in files:
        p = _safe_rel(rel, str(ws / rel))
        src = ws.joinpath(*p.parts)
        if not src.is_file():
            continue
        data = src.read_bytes()
        dst = snap.joinpath(*p.parts)
        dst.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(dst, data)
        digests[p.as_posix()] = hashlib.sha256(data).hexdigest()
    created = now.isoformat(timespec="microseconds").replace("+00:00", "Z")
    write_json_atomic(snap / MANIFEST, {"stage": stage, "created_at": created, "files": digests})
    return f"{HISTORY_DIR}/{name}"


def set_aside(ws_dir: str | os.PathLike, files: list[str], label: str) -> tuple[str | None, list[str]]:
    """Move the existing ones of `files` out of the workspace into `history_version/<label>_<timestamp>/`,
    kept rather than deleted (the user may have edited them since). Returns that folder (None when nothing
    was there) and the files moved."""
    ws = Path(ws_dir)
    present = [p for p in (_safe_rel(rel, str(ws / rel)) for rel in files) if ws.joinpath(*p.parts).is_file()]
    if not present:
        return None, []
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    aside = ws / HISTORY_DIR / f"{label}_{stamp}"  # not a stageN_ name: never listed as a snapshot
    for p in present:
        dst = aside.joinpath(*p.parts)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(ws.joinpath(*p.parts), dst)  # a rename: the file is in one place or the other, never lost
    return f"{HISTORY_DIR}/{aside.name}", [p.as_posix() for p in present]


def _read_manifest(snap: Path) -> dict[str, Any]:
    where = str(snap / MANIFEST)
    try:
        m = json.loads((snap / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(snap), "incomplete snapshot (no manifest.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(where, f"unreadable snapshot manifest: {e}") from None
    if not (isinstance(m, dict) and isinstance(m.get("stage"), int) and isinstance(m.get("created_at"), str)
            and isinstance(m.get("files"), dict) and all(isinstance(v, str) for v in m["files"].values())):
        raise InputError(where, "snapshot manifest lacks stage, created_at or files")
    return m


def list_snapshots(ws_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Complete snapshots, oldest first: {"dir", "stage", "created_at", "files"}."""
    hist = Path(ws_dir) / HISTORY_DIR
    if not hist.is_dir():
        return []
    found = []
    for d in hist.iterdir():
        m = _NAME.match(d.name)
        if not m or not d.is_dir() or not (d / MANIFEST).is_file():
            continue
        try:
            manifest = _read_manifest(d)
        except InputError:
            continue
        found.append((m.group(2), d.name, {"dir": f"{HISTORY_DIR}/{d.name}", "stage": manifest["stage"],
                                           "created_at": manifest["created_at"], "files": manifest["files"]}))
    found.sort(key=lambda t: (t[0], t[1]))
    return [t[2] for t in found]


def latest_snapshot(ws_dir: str | os.PathLike, stage: int) -> dict[str, Any] | None:
    matching = [s for s in list_snapshots(ws_dir) if s["stage"] == stage]
    return matching[-1] if matching else None


def restore(ws_dir: str | os.PathLike, snapshot_rel: str) -> list[str]:
    """Put a snapshot's files back; every copy is checked against the manifest before anything is written."""
    ws = Path(ws_dir)
    rel = _safe_rel(snapshot_rel, str(ws / snapshot_rel))
    if len(rel.parts) != 2 or rel.parts[0] != HISTORY_DIR or not _NAME.match(rel.parts[1]):
        raise InputError(str(ws / snapshot_rel), f"not a snapshot folder under {HISTORY_DIR}/")
    snap = ws.joinpath(*rel.parts)
    if not snap.is_dir():
        raise InputError(str(snap), "no such snapshot")
    manifest = _read_manifest(snap)
    plan = []
    for name, digest in manifest["files"].items():
        p = _safe_rel(name, str(snap / MANIFEST))
        copy = snap.joinpath(*p.parts)
        if not copy.is_file():
            raise InputError(str(copy), "file listed in the snapshot manifest is missing")
        data = copy.read_bytes()  # the bytes checked are the bytes written back
        if hashlib.sha256(data).hexdigest() != digest:
            raise InputError(str(copy), "sha256 does not match the snapshot manifest")
        plan.append((p, data))
    restored = []
    for p, data in plan:
        dst = ws.joinpath(*p.parts)
        dst.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(dst, data)
        restored.append(p.as_posix())
    return restored
