"""The same facts as the workbook, as JSON (for machines) and Markdown (for people)."""

from __future__ import annotations

import json
from pathlib import Path

from opforge.skills.pr_analysis.review import note_text
from opforge.workspace.atomic import write_text_atomic


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, default=str) + "\n"


def _cell(v) -> str:
    if isinstance(v, (list, tuple)):
        v = ", ".join(str(x) for x in v)
    return str(v if v is not None else "").replace("|", "\\|").replace("\n", "<br>")


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return out


def to_markdown(report: dict) -> str:
    s, p = report["summary"], report["profile"]
    out: list[str] = []
    if report["mode"] == "window":
        w = report["window"]
        out += ["# Upstream PR analysis", "",
                f"Window: {w['range'] or (w['since'] + ' .. ' + (w['until'] or 'HEAD'))} — {w['commits']} commits, "
                f"{s['rows']} rows. Profile: {p['name']} ({p['operators']} operators)."]
    else:
        out += ["# Operator changes between releases", "",
                f"{report['from']['label']} -> {report['to']['label']}: {s['added']} added, {s['removed']} removed, "
                f"{s['renamed']} renamed, {s['changed']} changed ({s['schema_differs']} with a different schema). "
                f"Profile: {p['name']} ({p['operators']} operators)."]
    out += ["", "## Impact", ""] + _table(["impact", "count"], [[k, v] for k, v in s["by_impact"].items()])
    if report["mode"] == "window":
        out += ["", "## Areas", ""] + _table(["area", "rows"], list(s["by_area"].items()))
        out += ["", "## PRs", ""]
        rows = []
        for r in report["rows"]:
            pr = f"[#{r['pr']}]({r['pr_url']})" if r["pr"] else "—"
            if r["kind"] == "revert":
                pr += " (revert)"
            elif r["reverted"]:
                pr += " (reverted)"
            ev = "<br>".join(f"{e['subject']}: `{e['file']}{':' + e['lines'] if e['lines'] else ''}` {e['why']}"
                             for e in r["evidence"][:4])
            rows.append([pr, f"[{r['commits'][0][:10]}]({r['commit_url']})", r["title"], r["author"],
                         r["date"][:10], r["areas"], r["operator_names"], f"**{r['impact']}**", ev, r["suggestion"]])
            if "llm_review" in report:
                rows[-1].append(note_text(r))
        out += _table(["PR", "commit", "title", "author", "date", "areas", "operators", "impact", "evidence",
                       "suggestion"] + (["LLM note"] if "llm_review" in report else []), rows)
    out += ["", "## Operators", ""]
    out += _table(["operator", "change", "details", "implemented", "impact"] + (["PR"] if report["mode"] == "window"
                                                                               else []),
                  [[o["op"], o["change"], "; ".join(o["details"]), "yes" if o["implemented"] else "no", o["impact"]]
                   + ([f"#{o['pr']}" if o.get("pr") else o.get("commit", "")[:10]] if report["mode"] == "window"
                      else [])
                   for o in report["operators"]])
    return "\n".join(out) + "\n"


def write_json(report: dict, path: Path) -> None:
    write_text_atomic(path, to_json(report))


def write_markdown(report: dict, path: Path) -> None:
    write_text_atomic(path, to_markdown(report))
