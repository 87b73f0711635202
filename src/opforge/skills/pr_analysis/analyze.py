"""A window of upstream commits -> one graded row per merged PR (or per plain commit), and the report's facts."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Callable

from opforge.skills.pr_analysis.areas import LEVELS, RANK
from opforge.skills.pr_analysis.gitlog import (
    BlobReader,
    check_repo,
    count_commits,
    iter_commits,
    remote_web_base,
    window_args,
)
from opforge.skills.pr_analysis.grade import CommitGrader, summarise
from opforge.skills.pr_analysis.profile import Profile

DEFAULT_WEB = "https://github.com/pytorch/pytorch"


def _row_key(commit) -> tuple[str, str]:
    if commit.pr_number is not None:
        return ("pr", str(commit.pr_number))
    rev = commit.reverted_pr
    if rev:
        return ("revert", str(rev[0]))
    return ("commit", commit.sha)


def analyze_window(repo: Path, profile: Profile, *, since: str | None = None, until: str | None = None,
                   rev_range: str | None = None, web_base: str | None = None,
                   progress: Callable[[int, int], None] | None = None) -> dict:
    """Grade every commit of the window; `progress(done, total)` is called after each commit."""
    t0 = time.perf_counter()
    top = check_repo(Path(repo))
    win = window_args(top, since, until, rev_range)
    total = count_commits(top, win)
    web = (web_base or remote_web_base(top) or DEFAULT_WEB).rstrip("/")
    rows: dict[tuple[str, str], dict] = {}
    signals: dict[tuple[str, str], list] = {}
    n = 0
    with BlobReader(top) as blobs:
        grader = CommitGrader(profile, blobs)
        for commit in iter_commits(top, win):
            n += 1
            g = grader.grade(commit)
            key = _row_key(commit)
            row = rows.get(key)
            if row is None:
                pr = int(key[1]) if key[0] != "commit" else None
                pr_url = commit.pr_url or (commit.reverted_pr[1] if key[0] == "revert" else None)
                if pr is not None and not pr_url:
                    pr_url = f"{web}/pull/{pr}"
                row = rows[key] = {
                    "pr": pr, "kind": key[0], "pr_url": pr_url, "commits": [],
                    "commit_url": f"{web}/commit/{commit.sha}",
                    "title": commit.title, "author": commit.author, "date": commit.date, "areas": [],
                    "operators": [], "points": [], "files": 0, "lines_added": 0, "lines_removed": 0,
                    "reverted": False,
                }
                signals[key] = []
            row["commits"].append(commit.sha)
            row["files"] += len(commit.files)
            row["lines_added"] += sum(f.n_added for f in commit.files)
            row["lines_removed"] += sum(f.n_removed for f in commit.files)
            row["areas"] += [a for a in g["areas"] if a not in row["areas"]]
            row["points"] += [p for p in g["points"] if p not in row["points"]]
            for op in g["operators"]:
                op.update(pr=row["pr"], commit=commit.sha, pr_url=row["pr_url"], commit_url=row["commit_url"])
                row["operators"].append(op)
            signals[key] += g["signals"]
            if progress:
                progress(n, total)
    for kind, pr in rows:
        if kind == "revert" and ("pr", pr) in rows:
            rows[("pr", pr)]["reverted"] = True
    out_rows = []
    for key, row in rows.items():
        sig = sorted(signals[key], key=lambda s: -RANK[s.level])
        impact = sig[0].level if sig else "None"
        row["impact"] = impact
        row["evidence"], row["suggestion"] = summarise(sig, impact)
        row["operator_names"] = sorted({o["op"] for o in row["operators"]})
        out_rows.append(row)
    elapsed = time.perf_counter() - t0
    return build_report(out_rows, profile, window={
        "repo": str(top), "since": since, "until": until, "range": rev_range, "web": web, "commits": n,
        "newest": out_rows[0]["date"] if out_rows else None, "oldest": out_rows[-1]["date"] if out_rows else None,
    }, elapsed=elapsed)


def build_report(rows: list[dict], profile: Profile, *, window: dict, elapsed: float) -> dict:
    by_impact = Counter(r["impact"] for r in rows)
    by_area: Counter = Counter()
    for r in rows:
        by_area.update(r["areas"])
    operators = [o for r in rows for o in r["operators"]]
    n = window["commits"]
    return {
        "mode": "window",
        "window": window,
        "profile": profile.to_dict(),
        "summary": {
            "rows": len(rows), "commits": window["commits"],
            "by_impact": {lv: by_impact.get(lv, 0) for lv in reversed(LEVELS)},
            "by_area": dict(by_area.most_common()),
            "operator_changes": len(operators),
            "elapsed_s": round(elapsed, 3),
            "commits_per_minute": round(n / elapsed * 60) if elapsed > 0 and n else None,
        },
        "rows": rows,
        "operators": operators,
    }
