"""`opforge init`: write skills, roles, the rules block and hooks into a host's folders, and take them out again.

Every install keeps a manifest (`.opforge/hosts/<host>.json` under the project or home folder) of the files it
wrote with their hashes, the rules block and the hook entries it merged, and the folders it created. A second
install writes nothing when nothing changed (no timestamps, content compared first); uninstall removes exactly
what the manifest lists and keeps a file the user has edited since.

Hooks call the gate by absolute path (`render.hook_argv`: the `opforge-hook` next to this interpreter), so a host
whose PATH lacks this environment still runs it; install runs that command once and says whether it works.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

from opforge.errors import InputError
from opforge.hosts import render
from opforge.hosts.catalog import package_skills, skill_files
from opforge.hosts.layouts import HOSTS, layout
from opforge.hosts.validate import validate_tree
from opforge.workspace.atomic import write_bytes_atomic, write_text_atomic

MANIFEST_DIR = ".opforge/hosts"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_path(base: Path, host: str) -> Path:
    return base / MANIFEST_DIR / f"{host}.json"


def _load_manifest(path: Path) -> dict:
    if not path.exists():
        return {"files": {}, "dirs": [], "rules": None, "settings": None}
    try:
        m = json.loads(path.read_text())
        assert isinstance(m, dict) and isinstance(m.get("files"), dict)
    except (json.JSONDecodeError, AssertionError, UnicodeDecodeError):
        raise InputError(str(path), "the install manifest is not valid JSON from opforge; it was not modified") \
            from None
    return m


def _mkdirs(base: Path, rel_dir: Path, created: list[str]) -> None:
    for p in [*reversed(rel_dir.parents), rel_dir]:
        if p == Path("."):
            continue
        if not (base / p).exists():
            (base / p).mkdir()
            created.append(p.as_posix())


def _write_if_changed(base: Path, rel: str, data: bytes, created_dirs: list[str]) -> str:
    path = base / rel
    if path.exists():
        if path.read_bytes() == data:
            return "unchanged"
        action = "updated"
    else:
        action = "created"
    _mkdirs(base, Path(rel).parent, created_dirs)
    write_bytes_atomic(path, data)
    return action


def check_hook(argv: list[str]) -> dict:
    """Run the hook command once, on an empty folder and without PATH, as a host would: does it resolve?"""
    env = {k: v for k, v in os.environ.items() if k != "PATH"}
    with tempfile.TemporaryDirectory(prefix="opforge-hook-check-") as empty:
        try:
            proc = subprocess.run([*argv, "gate", "--root", empty], input="{}", capture_output=True, text=True,
                                  cwd=empty, env=env, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"runs": False, "problem": f"{type(exc).__name__}: {exc}"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        return {"runs": False, "problem": f"exit {proc.returncode}: {tail}"}
    return {"runs": True, "problem": None}


def _planned_files(host: str, lay, skills, hook_argv: list[str], lang: str) -> dict[str, bytes]:
    names = [r.name for r in skills]
    files: dict[str, bytes] = {}
    for r in skills:
        for rel, data in skill_files(r, lang).items():
            files[f"{lay.skills_dir}/{r.name}/{rel}"] = data
    if lay.agents_dir:
        prefix = "opforge-" if host in ("cursor", "trae") else ""  # a rules folder the user shares with us
        for fname, text in render.all_role_files(host, names, lay.agent_ext).items():
            files[f"{lay.agents_dir}/{prefix}{fname}"] = text.encode()
    if lay.hooks == "opencode-plugin":
        files[lay.hooks_path] = render.opencode_plugin(hook_argv).encode()
    return files


def install(host: str, base: Path, *, global_: bool = False, force: bool = False, lang: str = "en") -> dict:
    if host not in HOSTS:
        raise InputError("--host", f"unknown host {host!r}; expected one of {', '.join(HOSTS)}")
    base = Path(base)
    if not base.is_dir():
        raise InputError(str(base), "not a folder")
    lay = layout(host, global_)
    if lay is None:
        raise InputError("--global", f"{host} reads skills and rules per project only: install into a project")
    skills, invalid = package_skills()
    mpath = manifest_path(base, host)
    old = _load_manifest(mpath)
    hook_argv = render.hook_argv()
    planned = _planned_files(host, lay, skills, hook_argv, lang)
    for rel, data in planned.items():
        p = base / rel
        if p.is_file() and rel not in old["files"] and p.read_bytes() != data and not force:
            raise InputError(str(p), "exists and was not written by opforge (move it away, or pass --force)")
    dirs: list[str] = list(old.get("dirs") or [])
    changes: dict[str, str] = {}
    for rel, data in planned.items():
        changes[rel] = _write_if_changed(base, rel, data, dirs)
    for rel, digest in old["files"].items():  # a skill that left the package leaves the host too
        p = base / rel
        if rel not in planned and p.is_file() and _sha(p.read_bytes()) == digest:
            p.unlink()
            changes[rel] = "removed"
    needed = {q.as_posix() for rel in planned for q in Path(rel).parents}
    for rel in _remove_dirs(base, [d for d in dirs if d not in needed]):
        dirs.remove(rel)
    rules = old.get("rules")
    if lay.rules_file:
        path = base / lay.rules_file
        existing = path.read_text() if path.exists() else None
        block = render.rules_block(host, [r.name for r in skills], roles_inline=lay.agents_dir is None)
        new = render.merge_block(existing, block, host)
        created = rules["created"] if rules else existing is None
        changes[lay.rules_file] = "unchanged" if new == existing else \
            _write_if_changed(base, lay.rules_file, new.encode(), dirs)
        rules = {"path": lay.rules_file, "created": created}
    settings = old.get("settings")
    if lay.hooks == "claude-settings":
        path = base / lay.hooks_path
        try:
            existing = json.loads(path.read_text()) if path.exists() else {}
        except json.JSONDecodeError as exc:
            raise InputError(str(path), f"not valid JSON (line {exc.lineno}): fix it before installing hooks") \
                from None
        if not isinstance(existing, dict):
            raise InputError(str(path), "not a JSON object")
        entries = render.claude_hook_entries(host, render.hook_command(host, hook_argv))
        # entries an earlier install wrote (another interpreter's path, or the bare command) give way to these
        kept = existing
        for e in _installed_hook_entries(settings, host):
            if e != entries:
                kept = render.strip_claude_settings(kept, e)
        merged = render.merge_claude_settings(kept, entries)
        created = settings["created"] if settings else not path.exists()
        # the user's own bytes, so that uninstall can put the file back exactly as it was
        original = settings.get("original") if settings else (path.read_text() if path.exists() else None)
        changes[lay.hooks_path] = "unchanged" if merged == existing else \
            _write_if_changed(base, lay.hooks_path, (json.dumps(merged, indent=2) + "\n").encode(), dirs)
        settings = {"path": lay.hooks_path, "created": created, "original": original, "hooks": entries}
    manifest = {"host": host, "global": global_, "files": {rel: _sha(d) for rel, d in sorted(planned.items())},
                "rules": rules, "settings": settings, "dirs": sorted(set(dirs))}
    mdirs: list[str] = manifest["dirs"]
    data = (json.dumps(manifest, indent=2) + "\n").encode()
    if not mpath.exists() or mpath.read_bytes() != data:
        _mkdirs(base, Path(MANIFEST_DIR), [])
        write_bytes_atomic(mpath, data)
    hook = None
    if lay.hooks:
        hook = {"command": render.hook_command(host, hook_argv), **check_hook(hook_argv)}
    ours = {r.name for r in skills}
    problems = [f"{r.name}: {q}" for r in validate_tree(base / lay.skills_dir) if r.name in ours for q in r.problems]
    return {"host": host, "base": str(base), "global": global_, "manifest": str(mpath),
            "skills": [r.name for r in skills], "skipped_skills": [r.to_dict() for r in invalid],
            "roles": [Path(k).stem for k in planned if lay.agents_dir and k.startswith(lay.agents_dir)],
            "hooks": lay.hooks, "hook": hook, "changes": changes,
            "changed": sorted(k for k, v in changes.items() if v != "unchanged"),
            "dirs_created": mdirs, "exported_problems": problems}


def _installed_hook_entries(settings: dict | None, host: str) -> list[dict]:
    """The hook entries an install recorded in its manifest; before they were recorded, the bare command."""
    if not settings:
        return []
    return [settings["hooks"]] if settings.get("hooks") else \
        [render.claude_hook_entries(host, render.LEGACY_HOOK_COMMAND.format(host=host))]


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _remove_dirs(base: Path, dirs: list[str]) -> list[str]:
    removed = []
    for rel in sorted(dirs, key=lambda d: d.count("/"), reverse=True):
        p = base / rel
        if p.is_dir() and not any(p.iterdir()):
            p.rmdir()
            removed.append(rel)
    return removed


def uninstall(base: Path, host: str | None = None) -> list[dict]:
    """Take out what the manifests under `base` list (one host, or every installed host)."""
    base = Path(base)
    hosts = [host] if host else [h for h in HOSTS if manifest_path(base, h).exists()]
    results = []
    for h in hosts:
        mpath = manifest_path(base, h)
        if not mpath.exists():
            raise InputError(str(mpath), f"no opforge install for {h} here")
        m = _load_manifest(mpath)
        changes: dict[str, str] = {}
        for rel, digest in m["files"].items():
            p = base / rel
            if not p.is_file():
                changes[rel] = "already gone"
            elif _sha(p.read_bytes()) == digest:
                p.unlink()
                changes[rel] = "removed"
            else:
                changes[rel] = "kept (edited since install)"
        if m.get("rules"):
            rel = m["rules"]["path"]
            p = base / rel
            if p.is_file():
                text = render.strip_block(p.read_text(), h)
                if not text.strip() and m["rules"]["created"]:
                    p.unlink()
                    changes[rel] = "removed"
                else:
                    write_text_atomic(p, text)
                    changes[rel] = "opforge block removed"
        if m.get("settings"):
            rel = m["settings"]["path"]
            p = base / rel
            if p.is_file():
                try:
                    cur = json.loads(p.read_text())
                except json.JSONDecodeError:
                    cur = None
                if isinstance(cur, dict):
                    out = cur
                    for entries in _installed_hook_entries(m["settings"], h):
                        out = render.strip_claude_settings(out, entries)
                    if not out and m["settings"]["created"]:
                        p.unlink()
                        changes[rel] = "removed"
                    elif out != cur:
                        orig = m["settings"].get("original")
                        same = orig is not None and _json_or_none(orig) == out
                        write_text_atomic(p, orig if same else json.dumps(out, indent=2) + "\n")
                        changes[rel] = "opforge hooks removed"
                else:
                    changes[rel] = "kept (not valid JSON any more)"
        mpath.unlink()
        removed_dirs = _remove_dirs(base, list(m.get("dirs") or []) + [MANIFEST_DIR, MANIFEST_DIR.split("/")[0]])
        results.append({"host": h, "base": str(base), "changes": changes, "dirs_removed": removed_dirs})
    return results
