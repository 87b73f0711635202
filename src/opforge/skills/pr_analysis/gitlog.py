"""Commits of a local clone, read with git itself.

One `git log` process streams every commit of the window with its raw file list (blob ids) and a zero-context
patch, so a window costs one process however long it is; blobs that need a full read (the operator yaml) come
from one long-lived `git cat-file --batch`.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from opforge.errors import InputError

NULL_SHA = "0" * 40
# Separators git will not find in a commit message: record start, header end, field.
_REC, _END, _FS = "\x1e", "\x1d", "\x1f"
# The row's date is the committer date: when the PR landed, the date --since/--until select on.
_FORMAT = f"{_REC}%H{_FS}%P{_FS}%an{_FS}%ae{_FS}%cI{_FS}%s{_FS}%b{_END}"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_PR_TRAILER = re.compile(r"^Pull Request resolved:\s*(https?://\S+/pull/(\d+))", re.M)
_REVERTED = re.compile(r"Reverted (https?://\S+/pull/(\d+))")
_MERGE_PR = re.compile(r"^Merge pull request #(\d+)")
# Lines kept per file: enough for evidence, bounded for generated or vendored files with huge diffs.
MAX_LINES_PER_FILE = 400


@dataclass
class FileChange:
    path: str
    old_path: str
    status: str  # A, M, D, R, C, T
    old_blob: str = NULL_SHA
    new_blob: str = NULL_SHA
    added: list[tuple[int, str]] = field(default_factory=list)  # (new line number, text)
    removed: list[tuple[int, str]] = field(default_factory=list)  # (old line number, text)
    n_added: int = 0
    n_removed: int = 0


@dataclass
class Commit:
    sha: str
    parents: list[str]
    author: str
    email: str
    date: str
    title: str
    body: str
    files: list[FileChange] = field(default_factory=list)

    @property
    def pr_url(self) -> str | None:
        m = _PR_TRAILER.search(self.body)
        return m.group(1) if m else None

    @property
    def pr_number(self) -> int | None:
        m = _PR_TRAILER.search(self.body)
        if m:
            return int(m.group(2))
        m = _MERGE_PR.match(self.title)
        return int(m.group(1)) if m else None

    @property
    def reverted_pr(self) -> tuple[int, str] | None:
        """The PR this commit reverts, from the merge bot's "Reverted <url>" line."""
        m = _REVERTED.search(self.body)
        return (int(m.group(2)), m.group(1)) if m else None


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          encoding="utf-8", errors="replace")


def check_repo(repo: Path) -> Path:
    """The top of the work tree (or the git dir of a bare clone); InputError when `repo` is not a git repository."""
    if not repo.exists():
        raise InputError("--repo", f"no such directory: {repo}")
    r = _git(repo, "rev-parse", "--show-toplevel")
    if r.returncode == 0 and r.stdout.strip():
        return Path(r.stdout.strip())
    r = _git(repo, "rev-parse", "--git-dir")
    if r.returncode != 0:
        raise InputError("--repo", f"not a git repository: {repo}")
    return repo.resolve()


def _check_date(flag: str, value: str, end_of_day: bool = False) -> str:
    """An explicit UTC timestamp for git: git reads a bare date as that day at the current time of day."""
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InputError(flag, f"not an ISO date (YYYY-MM-DD or YYYY-MM-DDTHH:MM): {value!r}") from None
    if len(value.strip()) == 10 and end_of_day:  # a bare --until date includes that whole day
        when = when.replace(hour=23, minute=59, second=59)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.isoformat()


def window_args(repo: Path, since: str | None, until: str | None, rev_range: str | None) -> list[str]:
    """git log arguments selecting the window; a range's ends must resolve to commits."""
    if rev_range and (since or until):
        raise InputError("--range", "give either --range or --since/--until, not both")
    if rev_range:
        ends = [e for e in re.split(r"\.\.\.?", rev_range) if e]
        if not ends:
            raise InputError("--range", f"expected A..B, got {rev_range!r}")
        for end in ends:
            r = _git(repo, "rev-parse", "--verify", "--quiet", f"{end}^{{commit}}")
            if r.returncode != 0:
                raise InputError("--range", f"unknown revision {end!r} in {repo}")
        return [rev_range]
    if not since:
        raise InputError("--since", "a window needs --since DATE (or --range A..B)")
    args = [f"--since={_check_date('--since', since)}"]
    if until:
        args.append(f"--until={_check_date('--until', until, end_of_day=True)}")
    head = _git(repo, "rev-parse", "--verify", "--quiet", "HEAD")
    if head.returncode != 0:
        raise InputError("--repo", f"the repository has no commits: {repo}")
    return args + ["HEAD"]


# First-parent history: pytorch's main is linear; in a fork that merges PRs, the merge commit is the PR.
_WALK = ["--first-parent", "--diff-merges=first-parent"]


def count_commits(repo: Path, win: list[str]) -> int:
    r = _git(repo, "rev-list", "--count", *_WALK[:1], *win)
    return int(r.stdout.strip() or 0) if r.returncode == 0 else 0


def remote_web_base(repo: Path) -> str | None:
    """https://github.com/OWNER/NAME of the origin remote, when it is on GitHub."""
    r = _git(repo, "remote", "get-url", "origin")
    m = re.search(r"github\.com[:/]([^/\s]+)/([^/\s]+?)(?:\.git)?/?$", r.stdout.strip()) if r.returncode == 0 else None
    return f"https://github.com/{m.group(1)}/{m.group(2)}" if m else None


def _parse_header(text: str) -> Commit:
    sha, parents, author, email, date, title, body = text.split(_FS, 6)
    return Commit(sha=sha, parents=parents.split(), author=author, email=email, date=date, title=title,
                  body=body.strip())


def _raw_line(line: str) -> FileChange:
    # ":100644 100644 <old> <new> M\tpath" or, for renames, "... R087\told\tnew"
    meta, *paths = line[1:].split("\t")
    parts = meta.split()
    status = parts[4][0]
    old_path = paths[0]
    path = paths[-1]
    return FileChange(path=path, old_path=old_path, status=status, old_blob=parts[2], new_blob=parts[3])


def iter_commits(repo: Path, win: list[str]) -> Iterator[Commit]:
    """Commits newest first, each with its files and changed lines."""
    cmd = ["git", "-C", str(repo), "-c", "core.quotePath=false", "log", *_WALK, "--no-color", "--no-ext-diff",
           "--no-textconv", "--raw", "--no-abbrev", "-M", "-p", "-U0", f"--format={_FORMAT}", *win, "--"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
                            errors="replace", bufsize=1 << 20)
    assert proc.stdout is not None
    commit: Commit | None = None
    header: list[str] | None = None
    by_path: dict[str, FileChange] = {}
    cur: FileChange | None = None
    old_ln = new_ln = rem_old = rem_new = 0
    try:
        for line in proc.stdout:
            c0 = line[:1]
            # Inside a hunk the header's counts say how many lines follow, so a removed "-- x" is not a header.
            if (rem_old or rem_new) and c0 in "+-":
                if c0 == "+":
                    rem_new -= 1
                    cur.n_added += 1
                    if len(cur.added) < MAX_LINES_PER_FILE:
                        cur.added.append((new_ln, line[1:].rstrip("\n")))
                    new_ln += 1
                else:
                    rem_old -= 1
                    cur.n_removed += 1
                    if len(cur.removed) < MAX_LINES_PER_FILE:
                        cur.removed.append((old_ln, line[1:].rstrip("\n")))
                    old_ln += 1
                continue
            if line.startswith(_REC):
                if commit is not None:
                    yield commit
                commit, cur, by_path = None, None, {}
                rem_old = rem_new = 0
                header = [line[1:]]
                if _END in line:
                    commit, header = _parse_header("".join(header).split(_END)[0]), None
                continue
            if header is not None:
                header.append(line)
                if _END in line:
                    commit, header = _parse_header("".join(header).split(_END)[0]), None
                continue
            if commit is None:
                continue
            if c0 == ":":
                fc = _raw_line(line.rstrip("\n"))
                commit.files.append(fc)
                by_path[fc.path] = fc
            elif line.startswith("diff --git "):
                cur, rem_old, rem_new = None, 0, 0
            elif line.startswith("+++ "):
                p = line[4:].rstrip("\n")
                if p.startswith("b/"):
                    cur = by_path.get(p[2:])
            elif line.startswith("--- "):
                p = line[4:].rstrip("\n")
                # A deleted file has no +++ b/ line; its name comes from here.
                cand = by_path.get(p[2:]) if p.startswith("a/") else None
                if cand is not None and cand.status == "D":
                    cur = cand
            elif c0 == "@" and cur is not None:
                m = _HUNK.match(line)
                if m:
                    old_ln, new_ln = int(m.group(1)), int(m.group(3))
                    rem_old = int(m.group(2)) if m.group(2) is not None else 1
                    rem_new = int(m.group(4)) if m.group(4) is not None else 1
        if commit is not None:
            yield commit
    finally:
        proc.stdout.close()
        err = proc.stderr.read() if proc.stderr else ""
        rc = proc.wait()
        if proc.stderr:
            proc.stderr.close()
    if rc != 0:
        raise InputError("--repo", f"git log failed: {err.strip().splitlines()[-1] if err.strip() else rc}")


class BlobReader:
    """Whole files by blob id through one `git cat-file --batch` process."""

    def __init__(self, repo: Path):
        self._proc = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def read(self, blob: str) -> str:
        if blob == NULL_SHA:
            return ""
        p = self._proc
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(blob.encode() + b"\n")
        p.stdin.flush()
        head = p.stdout.readline().split()
        if len(head) < 3 or head[1] == b"missing":
            return ""
        data = p.stdout.read(int(head[2]) + 1)[:-1]
        return data.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()

    def __enter__(self) -> "BlobReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
