"""Optional second opinion on High and Medium rows from an OpenAI-compatible endpoint.

The model sees a row's title, areas, grade and evidence and answers whether it agrees, with a short note. The
note is added beside the row; the rule-based grade is never changed, and a disagreement is shown as such.
"""

from __future__ import annotations

import json
import os
from typing import Callable

from opforge.errors import InputError
from opforge.i18n import _

SYSTEM = (
    "You review how an upstream PyTorch change affects an out-of-tree PyTorch backend (a PrivateUse1 device such "
    "as torch_npu). You get one change with the grade a rule engine gave it and the evidence. Reply with a JSON "
    'object only: {"agree": true|false, "note": "<one or two sentences for the backend maintainer>"}.'
)
REVIEWED = ("High", "Medium")


def note_text(row: dict) -> str:
    """The reviewer's verdict and note for a report cell; empty when the row was not reviewed."""
    rev = row.get("llm")
    if not rev:
        return ""
    verdict = {True: _("agrees"), False: _("DISAGREES"), None: _("no verdict")}[rev["agree"]]
    return _("{verdict}: {note}").format(verdict=verdict, note=rev["note"])


def _prompt(row: dict) -> str:
    ev = "\n".join(f"- [{e['level']}] {e['subject']}: {e['file']} {e['lines']} — {e['why']}" for e in row["evidence"])
    return (f"Change: {row['title']}\nPR: {row.get('pr_url') or row['commit_url']}\nAreas: {', '.join(row['areas'])}\n"
            f"Operators: {', '.join(row['operator_names']) or '-'}\nGrade: {row['impact']}\nEvidence:\n{ev}\n"
            f"Suggestion: {row['suggestion']}")


def _parse(text: str) -> tuple[bool | None, str]:
    start, end = text.find("{"), text.rfind("}")
    try:
        doc = json.loads(text[start:end + 1]) if start >= 0 else None
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return None, text.strip()[:500]
    agree = doc.get("agree")
    return (agree if isinstance(agree, bool) else None), str(doc.get("note", "")).strip()[:500]


def review_rows(report: dict, base_url: str, model: str, *, limit: int = 50, timeout_s: float = 60.0,
                progress: Callable[[int, int], None] | None = None) -> dict:
    """Adds `llm` ({agree, note}) to up to `limit` High and Medium rows; returns what was reviewed."""
    from openai import OpenAI, OpenAIError

    client = OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY") or "none", timeout=timeout_s,
                    max_retries=1)
    rows = [r for r in report["rows"] if r["impact"] in REVIEWED][:limit]
    disagree = 0
    for i, row in enumerate(rows, 1):
        try:
            resp = client.chat.completions.create(model=model, temperature=0, max_tokens=300, messages=[
                {"role": "system", "content": SYSTEM}, {"role": "user", "content": _prompt(row)}])
        except OpenAIError as exc:
            raise InputError("--llm", f"the endpoint {base_url} failed: {type(exc).__name__}: {exc}") from None
        agree, note = _parse((resp.choices[0].message.content or "") if resp.choices else "")
        row["llm"] = {"agree": agree, "note": note}
        disagree += agree is False
        if progress:
            progress(i, len(rows))
    summary = {"model": model, "reviewed": len(rows), "disagreements": disagree,
               "skipped": sum(r["impact"] in REVIEWED for r in report["rows"]) - len(rows)}
    report["llm_review"] = summary
    return summary
