"""`opforge test-triage run --device NAME --out DIR`: torch's device-generic tests on a backend, in shards, the
failures clustered and classified (triage.py; report.py says what it writes). Exit 0 when every test passed,
1 with failures triaged, 2 for bad input."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from opforge.errors import InputError, report_error
from opforge.i18n import _, set_language
from opforge.workspace import check_out_folder, os_error

test_triage_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                              help="test-triage: upstream device-generic tests on a backend, failures clustered")


@contextlib.contextmanager
def _bars(as_json: bool):
    """A progress(advance, total, what) that keeps one bar for each `what` (a phase) on stderr."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True, disable=as_json) as bar:
        tasks: dict[str, int] = {}

        def progress(advance, total, what):
            if what not in tasks:
                tasks[what] = bar.add_task(what, total=total)
            bar.update(tasks[what], advance=advance)

        yield progress


@test_triage_app.command("run")
def run_command(
    device: str = typer.Option(..., "--device", help="the device under test: the PrivateUse1 backend's name, "
                                                      "or cpu"),
    imports: list[str] = typer.Option([], "--import", help="a module that registers the device (repeatable), "
                                                           "e.g. opforge.backend.device for opdev"),
    ops: str = typer.Option("", "--ops", help="OpInfo names, comma-separated; `all` for op_db whole (default: "
                                              "those whose ATen op the device registers); with --suite modules "
                                              "ModuleInfo names (nn.Linear; default all), with collectives "
                                              "collective names (all_reduce_sum, broadcast)"),
    dtypes: str = typer.Option("", "--dtypes", help="dtypes, comma-separated (default: each OpInfo's own)"),
    suite: str = typer.Option("ops", "--suite", help="`ops` (OpInfo tests against the CPU), `modules` (ModuleInfo "
                                                     "tests against the CPU), `collectives` (torch.distributed on "
                                                     "the device's process group) or a test file"),
    out: Path = typer.Option(..., "--out", help="folder for triage.md, triage.json, summary.xlsx, junit/"),
    executor: str = typer.Option("local", "--executor", help="local (processes here) or ray (Ray tasks)"),
    workers: int = typer.Option(2, "--workers", help="shards run at once"),
    address: str = typer.Option(None, "--address", help="a Ray cluster's address (default: a local Ray)"),
    reruns: int = typer.Option(2, "--reruns", min=0, help="reruns of each cluster's representatives"),
    timeout: float = typer.Option(120.0, "--timeout", min=1.0, help="seconds a test may go without progress"),
    shard_size: int = typer.Option(None, "--shard-size", min=1, help="tests a shard (default: two shards a "
                                                                     "worker)"),
    as_json: bool = typer.Option(False, "--json", help="print triage.json"),
    lang: str = typer.Option(None, "--lang", help="language of triage.md, summary.xlsx and the summary line: en or "
                                                  "zh (default: OPFORGE_LANG, else en); JSON stays English"),
):
    """Run the device-generic tests on a device, cluster the failures and give each cluster its root cause."""
    from opforge.skills.test_triage import report
    from opforge.skills.test_triage.triage import run

    try:
        set_language(lang)
        check_out_folder(out, "the folder to write the triage in")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise os_error(out, exc) from None
        with _bars(as_json) as progress:
            result = run(device=device, imports=list(imports), suite=suite, ops=ops, dtypes=dtypes,
                         executor=executor, workers=workers, address=address, reruns=reruns, timeout=timeout,
                         shard_size=shard_size, progress=progress)
    except InputError as exc:
        report_error(typer.echo, exc.where, exc.what, 2, as_json=as_json)
        raise typer.Exit(2)
    report.write(out, result)
    if as_json:
        typer.echo(json.dumps(json.loads((out / "triage.json").read_text()), indent=1))
    else:
        typer.echo(report.summary_line(result))
        typer.echo(_("wrote {path}").format(path=out / "triage.md"))
    raise typer.Exit(0 if result["failed"] == 0 else 1)


@test_triage_app.command("fix")
def fix_command(
    triage_dir: Path = typer.Argument(..., help="the folder `test-triage run --out` wrote"),
    tree: Path = typer.Option(..., "--tree", help="the backend's source tree (opdev layout), in a git repository"),
    reruns: int = typer.Option(3, "--reruns", min=1, help="verification reruns of each cluster and its neighbours"),
    workers: int = typer.Option(2, "--workers", min=1, help="shards run at once"),
    timeout: float = typer.Option(120.0, "--timeout", min=1.0, help="seconds a test may go without progress"),
    as_json: bool = typer.Option(False, "--json", help="print fix.json"),
):
    """For each cluster: a fix (a kernel by op-adapt) or a declarative skip with its reason, one commit
    each on a new branch, verified by rerunning the cluster and its neighbours on that branch."""
    from opforge.backend.build import BuildError
    from opforge.skills.test_triage.fix import fix

    try:
        with _bars(as_json) as progress:
            result = fix(triage_dir, tree, reruns=reruns, workers=workers, timeout=timeout, progress=progress)
    except InputError as exc:
        report_error(typer.echo, exc.where, exc.what, 2, as_json=as_json)
        raise typer.Exit(2)
    except BuildError as exc:
        report_error(typer.echo, "--tree", f"the fixed tree does not build: {exc}", 1, as_json=as_json)
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(result, indent=1))
    else:
        typer.echo(f"{result['verified']} of {len(result['fixes'])} clusters verified on branch {result['branch']} "
                   f"({result['worktree']})")
        typer.echo(f"wrote {triage_dir / 'PR.md'}")
    raise typer.Exit(0 if result["verified"] == len(result["fixes"]) else 1)
