"""`opforge helper eval QA.yaml`: how often the helper cites what a question's ground truth names.

A question lists the passages that answer it (`expect`: corpus, path, and optionally symbol); a citation matches
one when its path is the same and it names the same symbol (or the expectation names none), the class whose method
is expected, or a method of the expected class. A question with `expect: []` has no support in the corpora: it is
answered right when the helper says so.

  top-1, top-3   questions with support whose first / first three citations hold a match
  answer         every question: its answer's first citation matches, or, for one without support, the helper
                 refused
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import yaml

from opforge.errors import InputError
from opforge.skills.helper.ask import search


def load(path: Path) -> list[dict]:
    try:
        items = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputError(str(path), f"cannot read the question set: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise InputError(str(path), f"not YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(items, list) or not items:
        raise InputError(str(path), "a question set is a non-empty YAML list of {id, question, expect}")
    for n, q in enumerate(items):
        if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not isinstance(q.get("expect"), list):
            raise InputError(f"{path}: item {n + 1}", "needs `question` (text) and `expect` (a list, [] for none)")
    return items


def matches(citation: dict, expect: dict) -> bool:
    if citation["path"] != expect["path"]:
        return False
    if "corpus" in expect and expect["corpus"] not in (citation["corpus"], None):
        return False
    if "symbol" not in expect or citation["symbol"] == expect["symbol"]:
        return True
    # a class and its own methods point at the same lines: citing `Config` for `Config.__init__`, or the reverse,
    # sends the reader to the right place
    cited, expected = citation["symbol"], expect["symbol"]
    return (citation.get("kind") == "class" and expected.rpartition(".")[0] == cited
            or citation.get("kind") == "function" and cited.rpartition(".")[0] == expected)


def evaluate(db: sqlite3.Connection, items: list[dict], k: int = 3, progress=None) -> dict:
    rows, seconds = [], []
    for q in items:
        start = time.perf_counter()
        found = search(db, q["question"], k=k, corpora=q.get("corpora"))
        seconds.append(time.perf_counter() - start)
        cited = found["citations"]
        hit = next((i for i, c in enumerate(cited) if any(matches(c, e) for e in q["expect"])), None)
        right = (not found["supported"]) if not q["expect"] else hit == 0
        rows.append({"id": q.get("id"), "topic": q.get("topic"), "question": q["question"],
                     "supported": found["supported"], "coverage": found["coverage"],
                     "rank": None if hit is None else hit + 1, "answer_right": right,
                     "cited": [f"{c['path']}:{c['line']} {c['symbol']}" for c in cited[:k]]})
        if progress:
            progress()
    answerable = [r for r, q in zip(rows, items) if q["expect"]]
    by_topic: dict[str, dict] = {}
    for r in answerable:
        t = by_topic.setdefault(r["topic"] or "-", {"questions": 0, "top3": 0})
        t["questions"] += 1
        t["top3"] += r["rank"] is not None and r["rank"] <= 3
    seconds.sort()
    return {
        "questions": len(rows), "answerable": len(answerable),
        "top1": round(sum(r["rank"] == 1 for r in answerable) / max(len(answerable), 1), 3),
        "top3": round(sum(r["rank"] is not None and r["rank"] <= 3 for r in answerable) / max(len(answerable), 1), 3),
        "answer": round(sum(r["answer_right"] for r in rows) / len(rows), 3),
        "refused_right": sum(1 for r, q in zip(rows, items) if not q["expect"] and not r["supported"]),
        "unanswerable": len(rows) - len(answerable),
        "median_s": round(seconds[len(seconds) // 2], 3), "max_s": round(seconds[-1], 3),
        "by_topic": by_topic, "rows": rows,
    }
