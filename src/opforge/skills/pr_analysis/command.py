"""`opforge pr-analysis`: the CLI face of the window and release analyses. Exit 0 (an empty window too), 2 bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from opforge.errors import InputError, report_error
from opforge.i18n import _, set_language
from opforge.workspace.atomic import check_out_file

STYLE = {"High": "bold red", "Medium": "yellow", "Low": "green", "None": "dim"}


def _out_path(flag: str, path: Path | None) -> Path | None:
    """A report path, refused before the analysis runs when it cannot be written ('-' is stdout or none)."""
    if path is None or str(path) == "-":
        return path
    check_out_file(path, flag)
    return path


def _write_xlsx(report: dict, path: Path) -> None:
    try:  # openpyxl is only needed for the workbook; JSON and Markdown work without it
        from opforge.skills.pr_analysis.report_xlsx import write_xlsx
    except ImportError as exc:
        raise InputError("--out", f"writing xlsx needs openpyxl ({exc}); pip install openpyxl") from None
    write_xlsx(report, path)


def _print_summary(console: Console, report: dict, written: list[str]) -> None:
    s = report["summary"]
    if report["mode"] == "release":
        console.print(f"{escape(report['from']['label'])} -> {escape(report['to']['label'])}")
    t = Table(title="pr-analysis")
    t.add_column(_("impact"))
    t.add_column(_("count"), justify="right")
    for lv, n in s["by_impact"].items():
        t.add_row(f"[{STYLE[lv]}]{lv}[/]", str(n))
    console.print(t)
    if report["mode"] == "window":
        console.print(_("{commits} commits, {rows} rows in {seconds} s").format(
            commits=s["commits"], rows=s["rows"], seconds=s["elapsed_s"]))
        for r in [r for r in report["rows"] if r["impact"] == "High"][:10]:
            pr = f"#{r['pr']}" if r["pr"] else r["commits"][0][:10]
            subj = ", ".join(dict.fromkeys(e["subject"] for e in r["evidence"] if e["level"] == "High"))
            console.print(f"[bold red]High[/] {pr} {escape(r['title'][:70])} — {escape(subj)}")
        if "llm_review" in report:
            lr = report["llm_review"]
            console.print(_("LLM review ({model}): {reviewed} rows, {disagreements} disagreements (grades "
                            "unchanged)").format(model=escape(lr["model"]), reviewed=lr["reviewed"],
                                                 disagreements=lr["disagreements"]))
    else:
        console.print(_("{added} added, {removed} removed, {renamed} renamed, {changed} changed; {differ} schemas "
                        "differ").format(added=s["added"], removed=s["removed"], renamed=s["renamed"],
                                         changed=s["changed"], differ=s["schema_differs"]))
    for w in written:
        console.print(_("wrote {path}").format(path=w))


def pr_analysis_command(
    repo: Path = typer.Option(None, "--repo", help="a local clone of pytorch/pytorch or a fork"),
    since: str = typer.Option(None, "--since", help="window start, ISO date (commit date)"),
    until: str = typer.Option(None, "--until", help="window end, ISO date"),
    rev_range: str = typer.Option(None, "--range", help="a revision range A..B instead of dates"),
    from_torch: str = typer.Option(None, "--from-torch", help="release mode: native_functions.yaml, wheel, "
                                                            "install folder, git revision of --repo, or installed"),
    to_torch: str = typer.Option(None, "--to-torch", help="release mode: the newer release, same forms"),
    backend: str = typer.Option(None, "--backend", help="profile: op-plugin yaml, profile yaml, list of overloads, "
                                                        "or dispatch:KEY[@module]; default a generic PrivateUse1"),
    out: Path = typer.Option(Path("pr-analysis.xlsx"), "--out", help="the Excel report ('-' writes none)"),
    json_out: Path = typer.Option(None, "--json", help="the JSON report ('-' prints it on stdout)"),
    md_out: Path = typer.Option(None, "--md", help="the Markdown report"),
    web: str = typer.Option(None, "--web", help="base URL for links (default: origin on GitHub, else "
                                                "https://github.com/pytorch/pytorch)"),
    llm: str = typer.Option(None, "--llm", help="optional review of High and Medium rows by an OpenAI-compatible "
                                                "endpoint (its base URL, key from OPENAI_API_KEY); adds notes, "
                                                "never changes a grade"),
    llm_model: str = typer.Option("default", "--llm-model", help="the model name the endpoint serves"),
    llm_max: int = typer.Option(50, "--llm-max", min=1, help="review at most this many rows"),
    lang: str = typer.Option(None, "--lang", help="language of the reports and summary for people: en or zh "
                                                  "(default: OPFORGE_LANG, else en); JSON stays English"),
):
    """Grade upstream PyTorch PRs (or a release's operator changes) for what a backend must adapt to."""
    from opforge.skills.pr_analysis.analyze import analyze_window
    from opforge.skills.pr_analysis.profile import load_profile
    from opforge.skills.pr_analysis.release import release_diff
    from opforge.skills.pr_analysis.report_text import to_json, write_json, write_markdown

    console = Console(stderr=True)  # the progress bar; the summary goes to stdout
    to_stdout = json_out is not None and str(json_out) == "-"
    try:
        set_language(lang)
        out_p = _out_path("--out", out)
        json_p = _out_path("--json", json_out)
        md_p = _out_path("--md", md_out)
        release = from_torch is not None or to_torch is not None
        if release and not (from_torch and to_torch):
            raise InputError("--to-torch" if from_torch else "--from-torch", "release mode needs both --from-torch "
                                                                             "and --to-torch")
        if release and (since or until or rev_range):
            raise InputError("--from-torch", "release mode takes no --since/--until/--range")
        if not release and repo is None:
            raise InputError("--repo", "give --repo PATH with --since DATE or --range A..B "
                                       "(or --from-torch A --to-torch B)")
        profile = load_profile(backend)
        if release:
            report = release_diff(from_torch, to_torch, profile, repo=repo)
        elif sys.stderr.isatty() and not to_stdout:
            with Progress(TextColumn("commits"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                          console=console, transient=True) as bar:
                task = bar.add_task("", total=None)
                report = analyze_window(repo, profile, since=since, until=until, rev_range=rev_range, web_base=web,
                                        progress=lambda i, n: bar.update(task, completed=i, total=n))
        else:
            report = analyze_window(repo, profile, since=since, until=until, rev_range=rev_range, web_base=web)
        if llm and report["rows"]:
            from opforge.skills.pr_analysis.review import review_rows

            review_rows(report, llm, llm_model, limit=llm_max)
        written = []
        for path, write in ((out_p, _write_xlsx), (json_p, write_json), (md_p, write_markdown)):
            if path is not None and str(path) != "-":
                try:
                    write(report, path)
                except OSError as exc:
                    raise InputError(str(path), f"cannot write: {exc.strerror or exc}") from None
                written.append(str(path))
    except InputError as exc:
        report_error(typer.echo, exc.where, exc.what, 2, as_json=to_stdout)  # `--json -`: JSON on stdout too
        raise typer.Exit(2)
    if to_stdout:
        typer.echo(to_json(report), nl=False)
    else:
        _print_summary(Console(), report, written)
