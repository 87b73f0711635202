"""`opforge graph diagnose SCRIPT [-- ARGS...] --out DIR`: the script run as it is, without compiling, and up the
backend ladder, each in a child process; one conclusion of five, its layer, the evidence and the next action.
Exit 0 when the script runs clean, 1 with a finding, 2 for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from opforge.errors import InputError, report_error
from opforge.i18n import _, set_language, shown
from opforge.workspace import check_out_folder, os_error

graph_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                        help="torch.compile problems: where and why a graph fails, layer by layer")
progress_console = Console(stderr=True)
LANG_HELP = "language of analysis.md, profile.md, summary.xlsx and the summary: en or zh (default: OPFORGE_LANG, " \
            "else en); JSON stays English"


def _fail(where: str, what: str, as_json: bool) -> None:
    report_error(typer.echo, where, what, 2, as_json=as_json)
    raise typer.Exit(2)


def _finish(out: Path, result: dict, as_json: bool) -> None:
    """Write the result, print it (its summary line and next action, or result.json), exit 0 clean or 1."""
    from opforge.skills.graph_diagnose.report import summary_line, write_result

    write_result(out, result)
    if as_json:
        typer.echo(json.dumps(json.loads((out / "result.json").read_text()), indent=2))
    else:
        typer.echo(summary_line(result))
        typer.echo(_("next: {action}").format(action=shown(result["next_action"])))
        typer.echo(_("wrote {path}").format(path=out / "analysis.md"))
    raise typer.Exit(0 if result["conclusion"] == "clean" else 1)


def _check_script(script: Path) -> None:
    if not script.is_file():
        raise InputError(str(script), "no such script" if not script.exists() else "is not a file")
    if script.suffix != ".py":
        raise InputError(str(script), "is not a Python script (.py)")


def _make_out(out: Path, names: str) -> None:
    check_out_folder(out, names)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(out, exc) from None


@graph_app.command("diagnose", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def graph_diagnose(
    ctx: typer.Context,
    script: Path = typer.Argument(..., help="the Python script that uses torch.compile (its arguments after --), "
                                            "or a folder of scripts (each diagnosed, one summary.xlsx)"),
    out: Path = typer.Option(..., "--out", help="folder for analysis.md, result.json, repro.py and steps/"),
    backend: str = typer.Option(None, "--backend", help="the backend under diagnosis (default: the script's own)"),
    timeout: float = typer.Option(300.0, "--timeout", min=1.0, help="seconds each step may run"),
    memory_gb: float = typer.Option(None, "--memory-gb", min=0.1, help="address-space limit for each step"),
    check: bool = typer.Option(False, "--check", help="compare each compiled call's outputs with eager's"),
    as_json: bool = typer.Option(False, "--json", help="print result.json"),
    lang: str = typer.Option(None, "--lang", help=LANG_HELP),
):
    """Find where and why torch.compile fails in a script: user code, framework bug, operator, runtime or
    environment, with the layer, the evidence and the next action."""
    from opforge.skills.graph_diagnose.diagnose import diagnose

    try:
        set_language(lang)
        scripts = sorted(script.glob("*.py")) if script.is_dir() else [script]
        if script.is_dir() and not scripts:
            raise InputError(str(script), "holds no Python script (*.py)")
        for s in scripts:
            _check_script(s)
        _make_out(out, "the folder to write the diagnosis in")
    except InputError as exc:
        _fail(exc.where, exc.what, as_json)
    if script.is_dir():
        _diagnose_batch(scripts, out, list(ctx.args), backend=backend, timeout=timeout, memory_gb=memory_gb,
                        check=check, as_json=as_json)
    with progress_console.status("as-is") as status:
        result = diagnose(script.resolve(), list(ctx.args), backend=backend, timeout=timeout, memory_gb=memory_gb,
                          check=check, progress=lambda step: status.update(f"{script.name}: step {step}"))
    _finish(out, result, as_json)


def _diagnose_batch(scripts: list[Path], out: Path, args: list[str], *, as_json: bool, **options) -> None:
    """Each script diagnosed on its own (one failing to be diagnosed does not cost the others), each in its own
    folder, then summary.xlsx and summary.json over all. Exit 0 all clean, 1 some finding."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from opforge.skills.graph_diagnose.diagnose import diagnose
    from opforge.skills.graph_diagnose.report import summary_line, summary_row, write_result, write_summary

    rows = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=progress_console, disable=as_json) as bar:
        task = bar.add_task("scripts", total=len(scripts))
        for s in scripts:
            bar.update(task, description=s.name)
            folder = out / s.stem
            try:
                result = diagnose(s.resolve(), args, progress=lambda step, s=s: bar.update(
                    task, description=f"{s.name}: {step}"), **options)
                write_result(folder, result)
                rows.append(summary_row(result, s.stem))
                line = summary_line(result)
            except Exception as exc:  # noqa: BLE001 - reported in its row, the batch goes on
                rows.append({"script": s.name, "conclusion": "not diagnosed", "layer": None,
                             "next action": f"opforge failed on this script: {type(exc).__name__}: {exc}"})
                line = _("{name}: not diagnosed ({error})").format(name=s.name, error=f"{type(exc).__name__}: {exc}")
            if not as_json:
                bar.console.print(line, markup=False, highlight=False)
            bar.advance(task)
    write_summary(out, rows)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        typer.echo(_("wrote {path}").format(path=out / "summary.xlsx"))
    raise typer.Exit(0 if all(r["conclusion"] == "clean" for r in rows) else 1)


@graph_app.command("logs")
def graph_logs(
    log: Path = typer.Argument(..., help="a TORCH_LOGS text log, a TORCH_TRACE log, or a TORCH_TRACE folder"),
    out: Path = typer.Option(..., "--out", help="folder for analysis.md and result.json"),
    as_json: bool = typer.Option(False, "--json", help="print result.json"),
    lang: str = typer.Option(None, "--lang", help=LANG_HELP),
):
    """The same conclusion from a log alone, anchored on the first causal error; graph breaks, recompiles (with
    the guards that failed) and compilations as JSON events. Exit 0 nothing found, 1 a finding, 2 bad input."""
    import tempfile

    from opforge.skills.graph_diagnose.diagnose import conclude_log
    from opforge.skills.graph_diagnose.logs import events, is_trace_log, trace_events

    try:
        set_language(lang)
        if not log.exists():
            raise InputError(str(log), "no such log file or folder")
        traces = sorted(log.glob("*.log")) if log.is_dir() else ([log] if is_trace_log(log) else [])
        if log.is_dir() and not traces:
            raise InputError(str(log), "holds no TORCH_TRACE log (*.log)")
        _make_out(out, "the folder to write the analysis in")
        if traces:
            with tempfile.TemporaryDirectory(prefix="opforge-tlparse-") as tmp:
                try:
                    ev = trace_events(traces, tmp)
                except FileNotFoundError:
                    raise InputError(str(log), "a TORCH_TRACE log is read through tlparse, which is not installed "
                                               "(pip install tlparse)") from None
        else:
            try:
                ev = events(log.read_text(errors="replace"))
            except (OSError, UnicodeError) as exc:
                raise InputError(str(log), f"cannot read it: {exc}") from None
    except InputError as exc:
        _fail(exc.where, exc.what, as_json)
    result = conclude_log(ev, str(log))
    _finish(out, result, as_json)


@graph_app.command("profile", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def graph_profile(
    ctx: typer.Context,
    script: Path = typer.Argument(..., help="the Python script that uses torch.compile (its arguments after --)"),
    out: Path = typer.Option(..., "--out", help="folder for profile.md, profile.json and profile.png"),
    timeout: float = typer.Option(300.0, "--timeout", min=1.0, help="seconds each run may take"),
    memory_gb: float = typer.Option(None, "--memory-gb", min=0.1, help="address-space limit for each run"),
    as_json: bool = typer.Option(False, "--json", help="print profile.json"),
    lang: str = typer.Option(None, "--lang", help=LANG_HELP),
):
    """Graphs, graph breaks, recompiles with their guards, compile time by phase, eager against compiled time
    per compiled function, and the fixes in order of gain. Exit 0 (1 when the compiled run fails), 2 bad input."""
    from opforge.skills.graph_diagnose.profile import profile, write_profile

    try:
        set_language(lang)
        _check_script(script)
        _make_out(out, "the folder to write the profile in")
    except InputError as exc:
        _fail(exc.where, exc.what, as_json)
    with progress_console.status("compiled") as status:
        p = profile(script.resolve(), list(ctx.args), timeout=timeout, memory_gb=memory_gb,
                    progress=lambda run: status.update(f"{script.name}: {run} run"))
    write_profile(out, p)
    if as_json:
        typer.echo(json.dumps(json.loads((out / "profile.json").read_text()), indent=2))
    else:
        cs = p["compile_seconds"]
        typer.echo(_("{name}: {graphs} graph(s), {breaks} graph break(s), {recompiles} recompile(s); compile "
                     "{seconds:.2f} s").format(name=script.name, graphs=p["graphs"], breaks=len(p["graph_breaks"]),
                                               recompiles=len(p["recompiles"]),
                                               seconds=cs["dynamo"] + cs["backend"]))
        for f in p["fixes"][:3]:
            typer.echo(_("fix: {fix} ({seconds:.2f} s)").format(fix=shown(f["fix"]), seconds=f["seconds"]))
        typer.echo(_("wrote {path}").format(path=out / "profile.md"))
    raise typer.Exit(1 if p["status"]["compiled"] != "ok" else 0)


@graph_app.command("learn-npu")
def graph_learn_npu(
    wheel: Path = typer.Argument(..., help="a torch-npu wheel (pip download --no-deps torch-npu==VERSION)"),
    out: Path = typer.Option(None, "--out", help="where the profile goes (default: the user's cache, where "
                                                 "graph diagnose and graph logs look)"),
    as_json: bool = typer.Option(False, "--json", help="print the profile's counts as JSON"),
):
    """Learn torch_npu's graph-mode profile from its wheel, read as data (never imported): the ops its GE
    converters do not implement, the converter layer's error messages, the environment variables it reads."""
    import zipfile

    from opforge.skills.graph_diagnose.npu_profile import default_path, learn
    from opforge.workspace.atomic import write_json_atomic

    target = out or default_path()
    try:
        if not wheel.is_file():
            raise InputError(str(wheel), "no such wheel")
        try:
            profile = learn(wheel)
        except zipfile.BadZipFile:
            raise InputError(str(wheel), "is not a wheel (not a zip archive)") from None
        if not (profile["converters_not_implemented"] or profile["messages"]):
            raise InputError(str(wheel), "holds no torchair or npugraph_ex sources: not a torch-npu wheel")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise os_error(target.parent, exc) from None
    except InputError as exc:
        _fail(exc.where, exc.what, as_json)
    write_json_atomic(target, profile)
    counts = {"version": profile["version"], "converters_not_implemented": len(profile["converters_not_implemented"]),
              "messages": len(profile["messages"]), "environment": list(profile["environment"]), "profile": str(target)}
    if as_json:
        typer.echo(json.dumps(counts, indent=2))
    else:
        typer.echo(f"torch_npu {counts['version']}: {counts['converters_not_implemented']} ops without a GE converter, "
                   f"{counts['messages']} converter error messages, {len(counts['environment'])} environment variables")
        typer.echo(f"wrote {target}")
