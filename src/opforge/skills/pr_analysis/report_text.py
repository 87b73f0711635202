"""The same facts as the workbook, as JSON (for machines) and Markdown (for people)."""

from __future__ import annotations

import json
from pathlib import Path

from opforge.i18n import _, shown
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
        window = w["range"] or (w["since"] + " .. " + (w["until"] or "HEAD"))
        out += ["# " + _("Upstream PR analysis"), "",
                _("Window: {window} — {commits} commits, {rows} rows. Profile: {profile} ({operators} operators).")
                .format(window=window, commits=w["commits"], rows=s["rows"], profile=shown(p["name"]),
                        operators=p["operators"])]
    else:
        out += ["# " + _("Operator changes between releases"), "",
                _("{old} -> {new}: {added} added, {removed} removed, {renamed} renamed, {changed} changed "
                  "({differ} with a different schema). Profile: {profile} ({operators} operators).")
                .format(old=report["from"]["label"], new=report["to"]["label"], added=s["added"],
                        removed=s["removed"], renamed=s["renamed"], changed=s["changed"],
                        differ=s["schema_differs"], profile=shown(p["name"]), operators=p["operators"])]
    out += ["", "## " + _("Impact"), ""] + _table([_("impact"), _("count")],
                                                 [[k, v] for k, v in s["by_impact"].items()])
    if report["mode"] == "window":
        out += ["", "## " + _("Areas"), ""] + _table([_("area"), _("rows")], list(s["by_area"].items()))
        out += ["", "## " + _("PRs"), ""]
        rows = []
        for r in report["rows"]:
            pr = f"[#{r['pr']}]({r['pr_url']})" if r["pr"] else "—"
            if r["kind"] == "revert":
                pr = _("{pr} (revert)").format(pr=pr)
            elif r["reverted"]:
                pr = _("{pr} (reverted)").format(pr=pr)
            ev = "<br>".join(f"{e['subject']}: `{e['file']}{':' + shown(e['lines']) if e['lines'] else ''}` "
                             f"{shown(e['why'])}" for e in r["evidence"][:4])
            rows.append([pr, f"[{r['commits'][0][:10]}]({r['commit_url']})", r["title"], r["author"],
                         r["date"][:10], r["areas"], r["operator_names"], f"**{r['impact']}**", ev,
                         shown(r["suggestion"])])
            if "llm_review" in report:
                rows[-1].append(note_text(r))
        out += _table([_("PR"), _("commit"), _("title"), _("author"), _("date"), _("areas"), _("operators"),
                       _("impact"), _("evidence"), _("suggestion")]
                      + ([_("LLM note")] if "llm_review" in report else []), rows)
    out += ["", "## " + _("Operators"), ""]
    out += _table([_("operator"), _("change"), _("details"), _("implemented"), _("impact")]
                  + ([_("PR")] if report["mode"] == "window" else []),
                  [[o["op"], o["change"], "; ".join(shown(o["details"])), _("yes") if o["implemented"] else _("no"),
                    o["impact"]]
                   + ([f"#{o['pr']}" if o.get("pr") else o.get("commit", "")[:10]] if report["mode"] == "window"
                      else [])
                   for o in report["operators"]])
    return "\n".join(out) + "\n"


def write_json(report: dict, path: Path) -> None:
    write_text_atomic(path, to_json(report))


def write_markdown(report: dict, path: Path) -> None:
    write_text_atomic(path, to_markdown(report))
