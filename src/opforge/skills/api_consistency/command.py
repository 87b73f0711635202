"""`opforge api-consistency`: one case or a batch, each diagnosed on its own, one summary for all.

Two numbers, kept apart in what is printed: each case's triage class (1 consistent, 2 framework problem,
3 operator defect; the `exit` field of result.json and the summary, the "class N" of analysis.md), and the
process's exit code, opforge's vocabulary: 0 every case consistent, 1 some case has a finding (class 2 or 3)
or could not be diagnosed, 2 bad input. The printed lines name the class in words and end with the exit code.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from opforge.errors import InputError, report_error
from opforge.i18n import N_, Msg, _, set_language, shown
from opforge.skills.api_consistency.text import join
from opforge.workspace import check_out_folder, os_error

progress_console = Console(stderr=True)  # the batch's progress bar
out_console = Console()  # the verdicts: one line per case, then the process's exit code in words
VERDICT = {1: N_("consistent"), 2: N_("framework problem"), 3: N_("operator defect")}


def expand(specs: list[str]) -> list[str]:
    """Files and node ids as given; a folder contributes its .py files that define an input builder."""
    out = []
    for s in specs:
        p = Path(s.split("::")[0])
        if "::" not in s and p.is_dir():
            found = [str(f) for f in sorted(p.glob("*.py"))
                     if "def inputs(" in f.read_text() or "def make_inputs(" in f.read_text()]
            if not found:
                raise InputError(s, "folder holds no case (a .py file defining inputs())")
            out += found
        else:
            out.append(s)
    return out


def check_out(out: Path) -> None:
    """Refuse, in one line naming `out`, a folder for the reports that cannot be used: a file in its place or
    above it, a folder that cannot be written, a parent that cannot be made. Checked before any case runs."""
    try:
        if out.is_dir() and not os.access(out, os.W_OK | os.X_OK):
            raise InputError(str(out), "is a folder this user cannot write")
    except OSError as exc:  # a folder above that cannot even be looked into
        raise os_error(out, exc) from None
    check_out_folder(out, "the folder to write the reports in")


def run_batch(specs: list[str], target: str, out: Path, *, fn: str | None = None, seed: int = 0, runs: int = 3,
              progress=None) -> tuple[list[dict], list[str]]:
    """Diagnose every case; returns the summary rows and the one-line errors of cases that were bad input."""
    from opforge.skills.api_consistency.case import load_case
    from opforge.skills.api_consistency.report import summary_row, write_case, write_summary
    from opforge.skills.api_consistency.targets import parse_target
    from opforge.skills.api_consistency.triage import diagnose

    check_out(out)
    if not target.startswith("custom:"):
        parse_target(target)  # an unavailable device is one error for the whole batch
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(out, exc) from None
    rows, errors = [], []
    for spec in specs:
        if progress:
            progress(spec)
        try:
            case = load_case(spec, fn)
            tgt = parse_target(target, case.path.parent)
            dg = diagnose(case, tgt, seed=seed, runs=runs)
            folder = write_case(out, dg, case, tgt)
            rows.append(summary_row(dg, folder.name))
        except InputError as exc:
            errors.append(str(exc))
            rows.append({"case": spec, "target": target, "exit": None, "rule": "", "check": "input",
                         "conclusion": Msg(N_("bad input: {error}"), error=str(exc))})
        except Exception as exc:  # one case's failure must not cost the batch the others
            if len(specs) == 1:
                raise
            rows.append({"case": spec, "target": target, "exit": None, "rule": "", "check": "error",
                         "conclusion": Msg(N_("opforge failed on this case: {error}"),
                                           error=f"{type(exc).__name__}: {exc}")})
    write_summary(out, rows)
    return rows, errors


def _verdict(row: dict) -> Msg:
    """A case's triage class in words (English as a `str`, the reader's language with `shown()`)."""
    if row["exit"] in VERDICT:
        return Msg(VERDICT[row["exit"]])
    return Msg(N_("bad input")) if row.get("check") == "input" else Msg(N_("not diagnosed (opforge failed)"))


def _fail(where: str, what: str, as_json: bool) -> None:
    """Exit 2 with one line on stderr; with --json the same error as JSON on stdout too."""
    report_error(typer.echo, where, what, 2, as_json=as_json)
    raise typer.Exit(2)


def api_consistency(
    cases: list[str] = typer.Argument(..., help="CASE: file.py, file.py::function, a pytest node id, or a folder"),
    target: str = typer.Option(..., "--target", "-t", help="cuda|npu|compile|half|bf16|custom:module:function"),
    out: Path = typer.Option(..., "--out", help="folder for analysis.md, repro.md, repro.py and summary.xlsx"),
    fn: str = typer.Option(None, "--fn", help="the entry function, when the case file does not name it"),
    seed: int = typer.Option(0, help="seed for the input builder and every run"),
    runs: int = typer.Option(3, min=2, help="runs compared bit for bit for determinism"),
    as_json: bool = typer.Option(False, "--json", help="print the summary rows as JSON"),
    lang: str = typer.Option(None, "--lang", help="language of analysis.md, repro.md and the printed verdicts: en "
                                                  "or zh (default: OPFORGE_LANG, else en); JSON stays English"),
):
    """Compare an API or program on a device under test against the CPU; triage each case into one of three
    classes: consistent, framework problem, operator defect. Exit 0 all consistent, 1 a finding, 2 bad input."""
    try:
        set_language(lang)
        specs = expand(cases)
        if len(specs) == 1 or as_json or not sys.stderr.isatty():
            rows, errors = run_batch(specs, target, out, fn=fn, seed=seed, runs=runs)
        else:
            with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                          TimeElapsedColumn(), console=progress_console) as bar:
                task = bar.add_task("cases", total=len(specs))
                seen = []

                def step(spec):
                    if seen:
                        bar.advance(task)
                    seen.append(spec)
                    bar.update(task, description=f"{Path(spec.split('::')[0]).name}")
                rows, errors = run_batch(specs, target, out, fn=fn, seed=seed, runs=runs, progress=step)
                bar.update(task, completed=len(specs))
    except InputError as exc:
        _fail(exc.where, exc.what, as_json)
    if len(specs) == 1 and errors:
        where, _sep, what = errors[0].partition(": ")
        _fail(where, what, as_json)
    code = 2 if errors else 1 if any(r["exit"] != 1 for r in rows) else 0
    tally = Counter(_verdict(r) for r in rows)
    why = Msg(N_("{n} case(s): {tally}"), n=len(rows),
              tally=join([Msg(N_("{n} {verdict}"), n=n, verdict=v) for v, n in tally.items()]))
    if as_json:
        for r in rows:
            r["verdict"] = str(_verdict(r))
        typer.echo(json.dumps({"out": str(out), "exit_code": code, "verdict": str(why), "cases": rows,
                               "errors": errors},
                              indent=2, default=str))
    else:
        for r in rows:
            colour = {1: "green", 2: "yellow", 3: "red"}.get(r["exit"], "red")
            verdict = (_("{verdict} (class {n})").format(verdict=shown(_verdict(r)), n=r["exit"])
                       if r["exit"] in VERDICT else shown(_verdict(r)))
            if r.get("operator"):
                line = _("{case} on {target}: {conclusion} — {operator} at {site}").format(
                    case=r["case"], target=r["target"], conclusion=shown(r["conclusion"]), operator=r["operator"],
                    site=r["call site"])
            else:
                line = _("{case} on {target}: {conclusion}").format(case=r["case"], target=r["target"],
                                                                    conclusion=shown(r["conclusion"]))
            out_console.print(f"[{colour}]{escape(verdict)}[/] {escape(line)}", highlight=False, soft_wrap=True)
        out_console.print(escape(_("summary: {path}").format(path=out / "summary.xlsx")), highlight=False,
                          soft_wrap=True)
        out_console.print(escape(_("exit {code}: {why}").format(code=code, why=shown(why))), highlight=False,
                          soft_wrap=True)
    for e in errors:
        typer.echo(f"error: {e}", err=True)
    raise typer.Exit(code)
