"""`opforge ci-fix`: the CLI face of fix.ci_fix. Exit 0 nothing left, 1 residual issues remain, 2 bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from opforge.errors import InputError, report_error
from opforge.i18n import _, set_language


def ci_fix_command(
    repo: Path = typer.Option(Path("."), "--repo", help="the git repository (any folder inside it)"),
    base: str = typer.Option("HEAD", "--base", help="the change is measured from the merge base of this and HEAD"),
    changed_lines: bool = typer.Option(False, "--changed-lines", help="fix and report only the changed lines"),
    dry_run: bool = typer.Option(False, "--dry-run", help="report what would be fixed; write nothing"),
    config: Path = typer.Option(None, "--config", help="YAML whose keys replace the default whitelist's"),
    report: Path = typer.Option(None, "--report", help="folder for ci-fix.md and ci-fix.json"),
    commit: bool = typer.Option(False, "--commit", help="commit the fixed files, one commit listing the fixes"),
    as_json: bool = typer.Option(False, "--json", help="print the JSON report on stdout"),
    lang: str = typer.Option(None, "--lang", help="language of the Markdown report and summary: en or zh "
                                                  "(default: OPFORGE_LANG, else en); JSON stays English"),
):
    """Fix what the linters flag on a change, with whitelisted fixes only, and prove behaviour did not change."""
    from opforge.skills.ci_fix.fix import ci_fix
    from opforge.skills.ci_fix.report import to_markdown, write_report

    console = Console(stderr=True)
    try:
        set_language(lang)
        if sys.stderr.isatty() and not as_json:
            with Progress(TextColumn("ci-fix"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                          console=console, transient=True) as bar:
                task = bar.add_task("", total=None)
                rep = ci_fix(repo, base, changed_lines, dry_run, config, commit, report,
                             progress=lambda name, i, n: bar.update(task, completed=i, total=n, description=name))
        else:
            rep = ci_fix(repo, base, changed_lines, dry_run, config, commit, report)
        if report is not None:
            try:
                write_report(rep, report)
            except OSError as exc:
                raise InputError("--report", f"{report}: cannot write: {exc.strerror or exc}") from None
    except InputError as exc:
        report_error(typer.echo, exc.where, exc.what, 2, as_json=as_json)  # with --json, JSON on stdout too
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps(rep, indent=2))
    else:
        s = rep["summary"]
        typer.echo(to_markdown(rep) if report is None else
                   _("{fixes} fix(es) in {files} file(s), {residual} residual; report in {folder}").format(
                       fixes=s["fixes"], files=s["files_edited"], residual=s["residual"], folder=report))
    raise typer.Exit(rep["exit_code"])
