"""The ci-fix report as Markdown and JSON (the same facts), written atomically into a folder."""

from __future__ import annotations

from pathlib import Path

from opforge.workspace.atomic import write_json_atomic, write_text_atomic

JSON_NAME = "ci-fix.json"
MD_NAME = "ci-fix.md"


def _code(text: str) -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}\n{text.rstrip(chr(10))}\n{fence}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(rep: dict) -> str:
    s = rep["summary"]
    mode = (", changed lines only" if rep["changed_lines_only"] else "") + \
        (", dry run: nothing written" if rep["dry_run"] else "")
    out = ["# ci-fix report", "",
           f"Repository `{rep['repo']}`, change against `{rep['base']}` (fork point `{rep['base_commit'][:12]}`)"
           f"{mode}.",
           "", "## Summary", "",
           f"- files checked: {s['files_checked']}, edited: {s['files_edited']}, skipped: {s['files_skipped']}",
           f"- fixes applied: {s['fixes']}", f"- residual issues: {s['residual']}",
           f"- exit code: {rep['exit_code']}"]
    if rep.get("commit"):
        out.append(f"- commit: `{rep['commit']}`")
    for title, counts in (("fixes by rule", s["fixes_by_rule"]), ("residual by rule", s["residual_by_rule"])):
        if counts:
            out.append(f"- {title}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    out += ["", "## Residual issues", ""]
    if rep["residual"]:
        out += ["| file | line | tool | rule | message | why it was left |", "|---|---|---|---|---|---|"]
        out += [f"| {_cell(r['file'])} | {r['line']} | {r['tool']} | {_cell(r['rule'])} | {_cell(r['message'])} | "
                f"{_cell(r['why'])} |" for r in rep["residual"]]
    else:
        out.append("None.")
    out += ["", "## Fixes", ""]
    if not rep["fixes"]:
        out.append("None.")
    for f in rep["fixes"]:
        out += [f"### {f['file']}:{f['line']}-{f['end_line']} · {f['tool']} · {f['rule']}", "",
                f"{f['message']}. Why it is safe: {f['reason']}. (step {f['step']}, block {f['block']}; lines are "
                "those of the step's input)", "", "Before:", "", _code(f["before"] or "(nothing)"), "", "After:", "",
                _code(f["after"] or "(removed)"), ""]
    if rep["skipped"]:
        out += ["", "## Files not checked", ""] + [f"- `{k['file']}`: {k['why']}" for k in rep["skipped"]]
    out += ["", "## Commands run", "", "In the repository root; `stdin` is the file's text at that point.", ""]
    out += [f"- `{c['command']}` → {c['exit_code']}" + (f" (stdin: {c['stdin']})" if c.get("stdin") else "")
            for c in rep["commands"]]
    return "\n".join(out) + "\n"


def write_report(rep: dict, folder: Path) -> tuple[Path, Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / JSON_NAME, rep)
    write_text_atomic(folder / MD_NAME, to_markdown(rep))
    return folder / MD_NAME, folder / JSON_NAME
