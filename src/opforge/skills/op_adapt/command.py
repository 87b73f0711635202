"""`opforge op-adapt OP` and `opforge op-adapt check PATH`: adapt an operator into a backend, or cross-check one
that is adapted already."""
from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from opforge.backend.build import BuildError
from opforge.errors import InputError, report_error
from opforge.i18n import _, set_language
from opforge.skills.op_adapt.adapt import PROFILES
from opforge.skills.op_adapt.texts import shown

out_console = Console()
err_console = Console(stderr=True)


def _confirm(conflict) -> bool:
    err_console.print(_("[yellow]conflict[/yellow] in {field}: {detail}").format(
        field=conflict.field, detail=shown(conflict.detail)))
    return typer.confirm("  " + _("resolution: {resolution}. Accept it?").format(
        resolution=shown(conflict.resolution)), default=True, err=True)


def op_adapt_command(
        op: str = typer.Argument(..., help="an ATen overload (aten::copysign.Tensor), a custom schema "
                                           "(\"ns::op(Tensor x, float a=1.0) -> Tensor\") with --reference, "
                                           "or `check` to cross-check PATH"),
        path: Path = typer.Argument(None, help="with `check`: the adaptation's tree to cross-check"),
        reference: str = typer.Option(None, "--reference", help="a custom operator's PyTorch reference, FILE:FN"),
        profile: str = typer.Option("reference", "--profile", help="reference (the opdev backend) or op-plugin"),
        repo: Path = typer.Option(None, "--repo", help="the tree to adapt into (reference: created as a copy of "
                                                       "the shipped opdev tree if absent)"),
        modify: str = typer.Option(None, "--modify", help="change an adapted operator: variant, bugfix, interface "
                                                          "or backward"),
        dry_run: bool = typer.Option(False, "--dry-run", help="print the patch; write nothing"),
        interactive: bool = typer.Option(False, "--interactive", help="ask about each conflict between sources"),
        as_json: bool = typer.Option(False, "--json"),
        lang: str = typer.Option(None, "--lang", help="language of CHECKLIST.md, the API page and the summary: en or "
                                                      "zh (default: OPFORGE_LANG, else en); JSON stays English")):
    """Adapt OP into a backend: CHECKLIST first, then every file it needs, built and documented."""
    try:
        set_language(lang)
    except InputError as exc:
        report_error(typer.echo, exc.where, exc.what, as_json=as_json)
        raise typer.Exit(2) from None
    if op == "check":
        from opforge.skills.op_adapt.check import check_command

        check_command(path, as_json)
        return
    if profile not in PROFILES:
        report_error(typer.echo, "--profile", f"must be one of {', '.join(PROFILES)}, not {profile!r}", as_json=as_json)
        raise typer.Exit(2)
    try:
        result = _run(op, reference, modify, profile, repo, dry_run, interactive)
    except InputError as exc:
        report_error(typer.echo, exc.where, exc.what, as_json=as_json)
        raise typer.Exit(2) from None
    except BuildError as exc:
        report_error(typer.echo, op, f"{exc} (full log: {exc.log}); nothing was kept", 1, as_json=as_json)
        raise typer.Exit(1) from None
    except Exception as exc:  # the API page's example failed on the device: the patch was taken back
        from opforge.skills.op_apidoc.page import ExampleFailed

        if not isinstance(exc, ExampleFailed):
            raise
        report_error(typer.echo, op, f"{exc}; nothing was kept", 1, as_json=as_json)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(result.to_json() | {"dry_run": dry_run}, indent=2))
    elif dry_run:
        typer.echo(result.diff, nl=False)
    else:
        _summary(result)


def _run(op: str, reference: str | None, modify: str | None, profile: str, repo: Path | None, dry_run: bool,
         interactive: bool):
    from opforge.skills.op_adapt import adapt

    confirm = _confirm if interactive else None
    if profile == "op-plugin":
        from opforge.skills.op_adapt import op_plugin

        return op_plugin.adapt(op, repo, dry_run=dry_run, confirm=confirm)
    root = adapt.reference_root(repo)
    if dry_run:
        return adapt.plan(op, root, reference=reference, modify=modify, confirm=confirm)[0]
    from opforge.backend.cli import build_progress

    with build_progress() as step:
        return adapt.adapt_reference(op, root, reference=reference, modify=modify, progress=step, confirm=confirm)


def _summary(result) -> None:
    c = result.checklist
    table = Table(_("file"), _("class"), _("action"), title=_("{op} adapted").format(op=c.op))
    for d in [*result.dependencies, c]:
        for f in d.files:
            if f["path"] in result.files or f["action"].startswith("none"):  # a modify touches fewer files
                table.add_row(f["path"], f["class"], f["action"])
    out_console.print(table)
    if result.dependencies:
        out_console.print(_("adapted alongside, for the backward: {ops}").format(
            ops=", ".join(d.op for d in result.dependencies)))
    for x in c.conflicts:
        out_console.print(_("conflict ({field}): {detail} -> {resolution}").format(
            field=x.field, detail=shown(x.detail), resolution=shown(x.resolution)))
    if result.build:
        if result.build["cached"]:
            line = _("backend cached: {library}").format(library=result.build["library"])
        else:
            line = _("backend built in {seconds} s: {library}").format(
                seconds=f"{result.build['seconds']:.1f}", library=result.build["library"])
        out_console.print(line)
