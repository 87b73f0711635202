"""Commands: `opforge init`, `opforge skills validate`, `opforge hooks gate`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from opforge.errors import InputError, report_error
from opforge.hosts.layouts import HOSTS
from opforge.i18n import set_language

skills_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                         help="Agent Skills: check skill folders against the format's rules.")
hooks_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                        help="Commands that agent hosts' hooks call.")


def _fail(exc: InputError, as_json: bool = False) -> None:
    """Exit 2 with one line on stderr; with --json the same error as JSON on stdout too."""
    report_error(typer.echo, exc.where, exc.what, 2, as_json=as_json)
    raise typer.Exit(2)


def init_cmd(path: Path = typer.Argument(Path("."), help="project folder (ignored with --global)"),
             host: str = typer.Option(None, "--host", help=f"one of: {', '.join(HOSTS)}"),
             global_: bool = typer.Option(False, "--global", help="install for the user, under the home folder"),
             uninstall: bool = typer.Option(False, "--uninstall", help="remove what opforge installed"),
             force: bool = typer.Option(False, help="overwrite files opforge did not write"),
             lang: str = typer.Option(None, "--lang", help="the skills' language where a translation exists: en | zh "
                                      "(default: OPFORGE_LANG, else en)"),
             as_json: bool = typer.Option(False, "--json")):
    """Install opforge's skills, the four roles, the rules file and hooks into an agent host."""
    from opforge.hosts.install import install
    from opforge.hosts.install import uninstall as do_uninstall

    base = Path.home() if global_ else path
    try:
        lang = set_language(lang)
        if host is not None and host not in HOSTS:
            raise InputError("--host", f"unknown host {host!r}; expected one of {', '.join(HOSTS)}")
        if uninstall:
            results = do_uninstall(base, host)
            if not results:
                raise InputError(str(base), "nothing installed by opforge here")
        elif host is None:
            raise InputError("--host", f"missing; expected one of {', '.join(HOSTS)}")
        else:
            results = [install(host, base, global_=global_, force=force, lang=lang)]
    except InputError as exc:
        _fail(exc, as_json)
    for r in results:  # diagnostics: on stderr, with --json too
        for s in r.get("skipped_skills", []):
            typer.echo(f"warning: skipped invalid skill {s['folder']}: {'; '.join(s['problems'])}", err=True)
        hook = r.get("hook")
        if hook and not hook["runs"]:
            typer.echo(f"warning: the hook command does not run here ({hook['problem']}): {hook['command']}; "
                       f"{r['host']}'s hooks will fail until it does (reinstall opforge, then run init again)",
                       err=True)
    if as_json:
        typer.echo(json.dumps(results if uninstall else results[0], indent=2))
        return
    for r in results:
        changed = [k for k, v in r["changes"].items() if v not in ("unchanged",)]
        verb = "uninstalled" if uninstall else "installed"
        typer.echo(f"{verb} opforge for {r['host']} in {r['base']}: {len(changed)} change(s)")
        for k in changed:
            typer.echo(f"  {r['changes'][k]:<28} {k}")
        if r.get("hook"):
            typer.echo(f"  hooks call: {r['hook']['command']} "
                       f"({'checked: it runs' if r['hook']['runs'] else 'it does NOT run here'})")


def validate_cmd(path: Path = typer.Argument(..., help="a skill folder, or a folder of skill folders"),
                 as_json: bool = typer.Option(False, "--json")):
    """Check skills against the Agent Skills rules; exit 1 when one fails."""
    from opforge.hosts.validate import validate_tree

    if not path.exists():
        _fail(InputError(str(path), "does not exist"), as_json)
    reports = validate_tree(path)
    if not reports:
        _fail(InputError(str(path), "holds no SKILL.md (neither itself nor one level down)"), as_json)
    if as_json:
        typer.echo(json.dumps({"path": str(path), "ok": all(r.ok for r in reports),
                               "skills": [r.to_dict() for r in reports]}, indent=2))
    else:
        t = Table(title=f"skills in {path}")
        for col in ("folder", "name", "result", "problems"):
            t.add_column(col)
        for r in reports:
            t.add_row(r.folder.name, r.name or "?", "[green]ok[/]" if r.ok else "[red]FAIL[/]", "; ".join(r.problems))
        Console().print(t)
    raise typer.Exit(0 if all(r.ok for r in reports) else 1)


def gate_hook_cmd(host: str = typer.Option("claude", "--host"),
                  root: Path = typer.Option(None, "--root", help="folder to search for workspaces (else the "
                                                                  "event's cwd, else the current folder)")):
    """Run by host hooks: exit 2, with the failing rules on stderr, when a workspace's gates fail."""
    stdin = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    from opforge.hosts.gate_hook import run_hook

    code, lines = run_hook(stdin, root)
    for line in lines:
        typer.echo(line, err=True)
    if code:
        typer.echo(f"opforge ({host}): fix the failing gates above before moving the workflow on.", err=True)
    raise typer.Exit(code)


skills_app.command("validate")(validate_cmd)
hooks_app.command("gate")(gate_hook_cmd)
