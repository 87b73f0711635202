"""The git side of ci-fix: which files and lines a change touched, and the one commit `--commit` makes.

Reads the repository through `git` itself; writes only through `git add` and `git commit` of listed paths.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import InputError

HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
FALLBACK_IDENTITY = ["-c", "user.name=opforge ci-fix", "-c", "user.email=ci-fix@opforge.invalid"]


@dataclass
class Change:
    path: str                    # relative to the repository root, '/' separated
    lines: set[int] | None       # changed line numbers in the working tree; None: the whole file is new


class Git:
    """Runs git in one repository and records every command verbatim."""

    def __init__(self, repo: Path, log):
        self.repo = repo
        self.log = log

    def run(self, *args: str, check: bool = True, where: str = "--repo") -> str:
        argv = ["git", *args]
        proc = subprocess.run(argv, cwd=self.repo, capture_output=True, text=True)
        self.log(argv, proc.returncode)
        if check and proc.returncode != 0:
            msg = (proc.stderr.strip().splitlines() or ["failed"])[-1]
            raise InputError(where, f"git {args[0]}: {msg}")
        return proc.stdout


def open_repo(path: Path, log) -> Git:
    path = Path(path)
    if not path.is_dir():
        raise InputError("--repo", f"{path}: not a directory")
    proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True)
    log(["git", "rev-parse", "--show-toplevel"], proc.returncode)
    if proc.returncode != 0:
        raise InputError("--repo", f"{path}: not a git repository")
    return Git(Path(proc.stdout.strip()), log)


def fork_point(git: Git, base: str) -> str:
    """The commit the change is measured from: the merge base of `base` and HEAD (base itself when none)."""
    proc = git.run("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}", check=False)
    if not proc.strip():
        raise InputError("--base", f"{base!r} does not name a commit in this repository")
    sha = proc.strip()
    merge = git.run("merge-base", sha, "HEAD", check=False).strip()
    return merge or sha


def _split_z(out: str) -> list[str]:
    return [p for p in out.split("\0") if p]


def changed_files(git: Git, base_sha: str, with_lines: bool) -> list[Change]:
    """Files that differ between `base_sha` and the working tree (committed, staged, unstaged, untracked)."""
    tracked = _split_z(git.run("diff", "--name-only", "-z", "--no-renames", "--diff-filter=d", base_sha))
    untracked = _split_z(git.run("ls-files", "--others", "--exclude-standard", "-z"))
    added = set(_split_z(git.run("diff", "--name-only", "-z", "--no-renames", "--diff-filter=A", base_sha)))
    out = []
    for rel in sorted(set(tracked) | set(untracked)):
        p = git.repo / rel
        if p.is_symlink() or not p.is_file():
            continue
        new = rel in untracked or rel in added
        lines = None if (new or not with_lines) else changed_lines(git, base_sha, rel)
        out.append(Change(rel, lines))
    return out


def changed_lines(git: Git, base_sha: str, rel: str) -> set[int]:
    diff = git.run("diff", "-U0", "--no-color", "--no-ext-diff", base_sha, "--", rel)
    lines: set[int] = set()
    for row in diff.splitlines():
        m = HUNK.match(row)
        if m:
            start, count = int(m.group(1)), int(m.group(2) or 1)
            lines.update(range(start, start + count))
            if count == 0:           # a pure deletion: the line after it is where the change shows
                lines.add(max(start, 1))
                lines.add(start + 1)
    return lines


def commit(git: Git, paths: list[str], message: str) -> str:
    git.run("add", "--", *paths)
    ident = [] if git.run("config", "user.email", check=False).strip() else FALLBACK_IDENTITY
    git.run(*ident, "commit", "--quiet", "--no-verify", "-m", message, "--", *paths, where="--commit")
    return git.run("rev-parse", "HEAD").strip()
