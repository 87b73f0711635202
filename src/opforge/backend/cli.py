"""`opforge backend build | info | test`: the reference PrivateUse1 backend, built and checked here."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from opforge.backend import build as backend_build
from opforge.errors import InputError, report_error

backend_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                          help="the reference out-of-tree backend (PrivateUse1, named opdev)")
ROOT_HELP = "an opdev source tree (default: the one shipped with opforge)"
TESTS = Path(__file__).parent / "tests"


def _root(root: Path | None) -> Path:
    root = (root or backend_build.NATIVE).resolve()
    if not (root / backend_build.BACKEND_YAML).is_file():
        raise InputError(str(root), f"not an opdev source tree (no {backend_build.BACKEND_YAML})")
    return root


@contextlib.contextmanager
def build_progress():
    """A progress bar on stderr for a build; yields the callback that `build.build` reports ninja's steps to."""
    with Progress(TextColumn("building opdev"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("generating registrations", total=None)

        def step(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=what)

        yield step


def build_with_progress(root: Path, force: bool = False) -> backend_build.Build:
    if not force and (found := backend_build.cached(root)):
        return found
    with build_progress() as step:
        return backend_build.build(root, force=force, progress=step)


@backend_app.command("build")
def build_cmd(root: Path = typer.Option(None, "--root", help=ROOT_HELP),
              force: bool = typer.Option(False, "--force", help="build even when this tree is built already"),
              as_json: bool = typer.Option(False, "--json")):
    """Generate the registrations with torchgen and compile the backend (cached by content)."""
    try:
        found = build_with_progress(_root(root), force)
    except InputError as exc:
        report_error(typer.echo, exc.where, exc.what, as_json=as_json)
        raise typer.Exit(2) from None
    except backend_build.BuildError as exc:
        report_error(typer.echo, "opforge backend build", f"{exc} (full log: {exc.log})", 1, as_json=as_json)
        raise typer.Exit(1) from None
    result = {"library": str(found.library), "build_dir": str(found.dir), "digest": found.digest,
              "cached": found.cached, "seconds": found.seconds}
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    elif found.cached:
        typer.echo(f"opdev is up to date: {found.library}")
    else:
        typer.echo(f"opdev built in {found.seconds:.1f} s: {found.library}")


@backend_app.command("clean")
def clean_cmd(as_json: bool = typer.Option(False, "--json")):
    """Remove every cached build but the shipped tree's current one (each adaptation's tree has its own)."""
    import shutil

    keep = backend_build.build_dir(backend_build.NATIVE)
    root = backend_build.cache_root()
    removed = [p for p in sorted(root.glob("opdev-*")) if p.is_dir() and p != keep]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
        Path(str(p) + ".lock").unlink(missing_ok=True)
    if as_json:
        typer.echo(json.dumps({"removed": [str(p) for p in removed], "kept": str(keep)}, indent=2))
    else:
        typer.echo(f"removed {len(removed)} cached build(s) from {root}")


@backend_app.command("info")
def info_cmd(root: Path = typer.Option(None, "--root", help=ROOT_HELP),
             as_json: bool = typer.Option(False, "--json")):
    """The device, the module to import, its operators and the vendor kernels they may call."""
    from opforge.backend.info import describe

    try:
        info = describe(_root(root))
    except InputError as exc:
        report_error(typer.echo, exc.where, exc.what, as_json=as_json)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    console = Console()
    console.print(f"device [bold]{info['device']}[/bold]: import {info['import']}  "
                  f"({'built: ' + info['library'] if info['built'] else 'not built yet: opforge backend build'})")
    console.print(f"operators ({len(info['operators'])}): {', '.join(info['operators'])}")
    if info["autograd"]:
        console.print(f"autograd kernels: {', '.join(info['autograd'])}")
    if info["custom_operators"]:
        console.print(f"custom operators: {', '.join(info['custom_operators'])}")
    table = Table("vendor kernel", "ATen overload", "dtypes", title="vendor kernel library")
    for k in info["vendor_kernels"]:
        table.add_row(k["name"], k["aten"], ", ".join(k["dtypes"]))
    console.print(table)


@backend_app.command("test", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def test_cmd(ctx: typer.Context, root: Path = typer.Option(None, "--root", help=ROOT_HELP)):
    """Build if needed, then run the backend's own tests with pytest (extra arguments go to pytest)."""
    try:
        tree = _root(root)
        build_with_progress(tree)
    except InputError as exc:
        report_error(typer.echo, exc.where, exc.what)
        raise typer.Exit(2) from None
    except backend_build.BuildError as exc:
        report_error(typer.echo, "opforge backend test", f"{exc} (full log: {exc.log})", 1)
        raise typer.Exit(1) from None
    env = {**os.environ, "OPDEV_ROOT": str(tree)}
    # the runtime's own tests, then the tests of every operator adapted into the tree
    suites = [str(TESTS)] + ([str(tree / "tests")] if (tree / "tests").is_dir() else [])
    cmd = [sys.executable, "-m", "pytest", *suites, "-q", "-p", "no:cacheprovider", *ctx.args]
    raise typer.Exit(subprocess.run(cmd, env=env).returncode)
