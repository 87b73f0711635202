"""The Excel report: summary, one row per PR (links, filters, frozen header, High rows filled), operators."""

from __future__ import annotations

import io
from pathlib import Path

from openpyxl import Workbook
from openpyxl.styles import Alignment, Font, PatternFill
from openpyxl.utils import get_column_letter

from opforge.i18n import N_, _, shown
from opforge.skills.pr_analysis.review import note_text
from opforge.workspace.atomic import write_bytes_atomic

FILL = {"High": PatternFill("solid", fgColor="F8CBAD"), "Medium": PatternFill("solid", fgColor="FFE699"),
        "Low": PatternFill("solid", fgColor="E2EFDA")}
BOLD = Font(bold=True)
LINK = Font(color="0563C1", underline="single")
WRAP = Alignment(wrap_text=True, vertical="top")
# Column headers; the hidden URL columns (pr_url, commit_url) are never written, so they keep their keys.
PR_HEADER = (N_("PR"), "pr_url", N_("Commit"), "commit_url", N_("Title"), N_("Author"), N_("Date"), N_("Areas"),
             N_("Operators"), N_("Integration points"), N_("Impact"), N_("Evidence"), N_("Suggestion"))
OPERATOR_HEADER = (N_("Operator"), N_("Change"), N_("Kinds"), N_("Details"), N_("Old schema"), N_("New schema"),
                   N_("Implemented"), N_("Impact"), N_("PR"), "pr_url", N_("Commit"), "commit_url")
# Excel refuses cells above 32767 characters.
MAX_CELL = 32000


def _cell_text(v) -> object:
    if isinstance(v, (list, tuple)):
        v = ", ".join(str(x) for x in v)
    if isinstance(v, str):
        # Control characters make an unreadable workbook; commit messages can hold them.
        v = "".join(ch for ch in v if ch >= " " or ch in "\n\t")[:MAX_CELL]
    return v


def _table(ws, header: list[str], rows: list[list], widths: list[int], links: dict[int, int] | None = None,
           impact_col: int | None = None) -> None:
    """rows of values; links maps a value column to the column holding its URL (that column is not written)."""
    links = links or {}
    hidden = set(links.values())
    cols = [i for i in range(len(header)) if i not in hidden]
    for j, i in enumerate(cols, 1):
        c = ws.cell(row=1, column=j, value=header[i])
        c.font = BOLD
        ws.column_dimensions[get_column_letter(j)].width = widths[i]
    for r, row in enumerate(rows, 2):
        fill = FILL.get(row[impact_col]) if impact_col is not None and row[impact_col] == "High" else None
        for j, i in enumerate(cols, 1):
            c = ws.cell(row=r, column=j, value=_cell_text(row[i]))
            c.alignment = WRAP
            if i in links and row[links[i]]:
                c.hyperlink = row[links[i]]
                c.font = LINK
            if fill is not None:
                c.fill = fill
    ws.freeze_panes = "A2"
    ws.auto_filter.ref = f"A1:{get_column_letter(len(cols))}{max(len(rows) + 1, 1)}"


def _summary(ws, report: dict) -> None:
    ws.column_dimensions["A"].width = 28
    ws.column_dimensions["B"].width = 90
    lines: list[tuple[str, object]] = []
    s = report["summary"]
    if report["mode"] == "window":
        w = report["window"]
        lines += [(_("Window"), w["range"] or f"{w['since']} .. {w['until'] or 'HEAD'}"), (_("Repository"), w["repo"]),
                  (_("Commits"), w["commits"]), (_("Rows (PRs and plain commits)"), s["rows"]),
                  (_("Newest"), w["newest"]), (_("Oldest"), w["oldest"])]
    else:
        lines += [(_("From"), report["from"]["label"]), (_("To"), report["to"]["label"]),
                  (_("Overloads (from / to)"), f"{s['overloads_from']} / {s['overloads_to']}"),
                  (_("Added"), s["added"]), (_("Removed"), s["removed"]), (_("Renamed"), s["renamed"]),
                  (_("Changed"), s["changed"]), (_("Schemas that differ"), s["schema_differs"])]
    p = report["profile"]
    lines += [(_("Backend profile"), f"{shown(p['name'])} ({shown(p['source'])})"),
              (_("Operators in profile"), p["operators"]),
              (_("Integration points"), ", ".join(p["integration_points"])), ("", "")]
    lines += [(_("Impact"), _("Count"))] + [(k, v) for k, v in s["by_impact"].items()]
    if report["mode"] == "window":
        lines += [("", ""), (_("Area"), _("PRs"))] + list(s["by_area"].items())
    else:
        lines += [("", ""), (_("Kind of change"), _("Overloads"))] + list(s["by_kind"].items())
    for r, (k, v) in enumerate(lines, 1):
        ws.cell(row=r, column=1, value=k).font = BOLD
        c = ws.cell(row=r, column=2, value=_cell_text(v))
        if k in FILL:
            c.fill = FILL[k]


def _evidence(row: dict) -> str:
    return "\n".join(f"[{e['level']}] {e['subject']}: {e['file']}{':' + shown(e['lines']) if e['lines'] else ''} — "
                     f"{shown(e['why'])}" for e in row["evidence"])


def _pr_label(row: dict) -> str:
    if not row["pr"]:
        return _("(no PR)")
    pr = f"#{row['pr']}"
    if row["kind"] == "revert":
        return _("{pr} (revert)").format(pr=pr)
    return _("{pr} (reverted)").format(pr=pr) if row["reverted"] else pr


def workbook_bytes(report: dict) -> bytes:
    wb = Workbook()
    _summary(wb.active, report)
    wb.active.title = _("Summary")
    if report["mode"] == "window":
        ws = wb.create_sheet(_("PRs"))
        header = [_(h) for h in PR_HEADER]
        widths = [10, 0, 12, 0, 60, 20, 20, 24, 30, 24, 9, 90, 60]
        rows = [[_pr_label(r),
                 r["pr_url"], r["commits"][0][:10], r["commit_url"], r["title"], r["author"], r["date"][:19],
                 r["areas"], r["operator_names"], r["points"], r["impact"], _evidence(r), shown(r["suggestion"])]
                for r in report["rows"]]
        if "llm_review" in report:
            header, widths = header + [_("LLM note")], widths + [60]
            rows = [row + [note_text(r)] for row, r in zip(rows, report["rows"])]
        _table(ws, header, rows, widths, links={0: 1, 2: 3}, impact_col=10)
    ws = wb.create_sheet(_("Operators"))
    header = [_(h) for h in OPERATOR_HEADER]
    widths = [30, 10, 30, 60, 60, 60, 12, 9, 10, 0, 12, 0]
    rows = [[o["op"], o["change"], o["kinds"], "; ".join(shown(o["details"])), o.get("old"), o.get("new"),
             _("yes") if o["implemented"] else _("no"), o["impact"],
             f"#{o['pr']}" if o.get("pr") else "", o.get("pr_url"), (o.get("commit") or "")[:10], o.get("commit_url")]
            for o in report["operators"]]
    if report["mode"] == "release":
        header, widths, rows = header[:8], widths[:8], [r[:8] for r in rows]
        _table(ws, header, rows, widths, impact_col=7)
    else:
        _table(ws, header, rows, widths, links={8: 9, 10: 11}, impact_col=7)
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


def write_xlsx(report: dict, path: Path) -> None:
    write_bytes_atomic(path, workbook_bytes(report))
