"""`opforge op-test run`: an adaptation's tests, each failure with a verdict and its evidence."""
from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from opforge.errors import InputError, report_error
from opforge.i18n import _, set_language

op_test_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                          help="op-test: run an adaptation's tests and judge each failure")
out_console = Console()
err_console = Console(stderr=True)


@op_test_app.command("run")
def run_cmd(root: Path = typer.Argument(None, help="the backend tree (default: the shipped opdev tree)"),
            tests: list[str] = typer.Option(None, "--test", help="a test file or node id under the tree; repeatable"),
            reruns: int = typer.Option(2, "--reruns", min=0, help="reruns of a failure before it is not a flake"),
            as_json: bool = typer.Option(False, "--json"),
            lang: str = typer.Option(None, "--lang", help="language of the printed report: en or zh (default: "
                                                          "OPFORGE_LANG, else en); JSON stays English")):
    """Run the tests; exit 0 when all pass, 1 when some fail (each with a verdict), 2 on bad input."""
    from opforge.backend.build import NATIVE
    from opforge.skills.op_test.run import run

    def progress(i: int, n: int, nodeid: str) -> None:
        err_console.print(_("rerunning failure {i}/{n}: {test}").format(i=i + 1, n=n, test=nodeid))

    try:
        set_language(lang)
        report = run(root or NATIVE, tests or None, reruns=reruns, progress=progress)
    except InputError as exc:
        report_error(typer.echo, exc.where, exc.what, as_json=as_json)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        out_console.print(_("{tests} tests: {passed} passed, {failed} failed").format(
            tests=report["tests"], passed=report["passed"], failed=report["failed"]))
        if report["verdicts"]:
            table = Table(_("test"), _("verdict"), _("file"), _("evidence"))
            for v in report["verdicts"]:
                ev = v["evidence"]
                why = _(v["why"]) if v["why"] else ""
                table.add_row(v["test"].split("::")[-1], v["verdict"], v["file"] or "",
                              _("{exception}: {message} ({why})").format(
                                  exception=ev["exception"], message=ev["message"][:80], why=why))
            out_console.print(table)
    raise typer.Exit(1 if report["failed"] else 0)
