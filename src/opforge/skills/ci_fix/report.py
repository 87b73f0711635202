"""The ci-fix report as Markdown and JSON (the same facts), written atomically into a folder."""

from __future__ import annotations

from pathlib import Path

from opforge.i18n import _, shown
from opforge.workspace.atomic import write_json_atomic, write_text_atomic

JSON_NAME = "ci-fix.json"
MD_NAME = "ci-fix.md"


def _code(text: str) -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}\n{text.rstrip(chr(10))}\n{fence}"


def _cell(text) -> str:
    return str(shown(text)).replace("|", "\\|").replace("\n", " ")


def to_markdown(rep: dict) -> str:
    s = rep["summary"]
    where = dict(repo=rep["repo"], base=rep["base"], fork=rep["base_commit"][:12])
    if rep["changed_lines_only"] and rep["dry_run"]:
        intro = _("Repository `{repo}`, change against `{base}` (fork point `{fork}`), changed lines only, dry run: "
                  "nothing written.")
    elif rep["changed_lines_only"]:
        intro = _("Repository `{repo}`, change against `{base}` (fork point `{fork}`), changed lines only.")
    elif rep["dry_run"]:
        intro = _("Repository `{repo}`, change against `{base}` (fork point `{fork}`), dry run: nothing written.")
    else:
        intro = _("Repository `{repo}`, change against `{base}` (fork point `{fork}`).")
    out = ["# " + _("ci-fix report"), "", intro.format(**where),
           "", "## " + _("Summary"), "",
           "- " + _("files checked: {checked}, edited: {edited}, skipped: {skipped}").format(
               checked=s["files_checked"], edited=s["files_edited"], skipped=s["files_skipped"]),
           "- " + _("fixes applied: {n}").format(n=s["fixes"]),
           "- " + _("residual issues: {n}").format(n=s["residual"]),
           "- " + _("exit code: {code}").format(code=rep["exit_code"])]
    if rep.get("commit"):
        out.append("- " + _("commit: `{sha}`").format(sha=rep["commit"]))
    for title, counts in ((_("fixes by rule: {counts}"), s["fixes_by_rule"]),
                          (_("residual by rule: {counts}"), s["residual_by_rule"])):
        if counts:
            out.append("- " + title.format(counts=", ".join(f"{k} {v}" for k, v in sorted(counts.items()))))
    out += ["", "## " + _("Residual issues"), ""]
    if rep["residual"]:
        out += ["| " + " | ".join([_("file"), _("line"), _("tool"), _("rule"), _("message"), _("why it was left")])
                + " |", "|---|---|---|---|---|---|"]
        out += [f"| {_cell(r['file'])} | {r['line']} | {r['tool']} | {_cell(r['rule'])} | {_cell(r['message'])} | "
                f"{_cell(r['why'])} |" for r in rep["residual"]]
    else:
        out.append(_("None."))
    out += ["", "## " + _("Fixes"), ""]
    if not rep["fixes"]:
        out.append(_("None."))
    for f in rep["fixes"]:
        out += [f"### {f['file']}:{f['line']}-{f['end_line']} · {f['tool']} · {f['rule']}", "",
                _("{message}. Why it is safe: {reason}. (step {step}, block {block}; lines are those of the step's "
                  "input)").format(message=shown(f["message"]), reason=shown(f["reason"]), step=f["step"],
                                   block=f["block"]),
                "", _("Before:"), "", _code(f["before"] or _("(nothing)")), "", _("After:"), "",
                _code(f["after"] or _("(removed)")), ""]
    if rep["skipped"]:
        out += ["", "## " + _("Files not checked"), ""] + [f"- `{k['file']}`: {shown(k['why'])}"
                                                           for k in rep["skipped"]]
    out += ["", "## " + _("Commands run"), "", _("In the repository root; `stdin` is the file's text at that point."),
            ""]
    out += [f"- `{c['command']}` → {c['exit_code']}"
            + (" " + _("(stdin: {stdin})").format(stdin=shown(c["stdin"])) if c.get("stdin") else "")
            for c in rep["commands"]]
    return "\n".join(out) + "\n"


def write_report(rep: dict, folder: Path) -> tuple[Path, Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / JSON_NAME, rep)
    write_text_atomic(folder / MD_NAME, to_markdown(rep))
    return folder / MD_NAME, folder / JSON_NAME
