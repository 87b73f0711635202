"""The `opforge` command. One sub-command group per skill family; `op` is the operator factory.

Exit codes, the same vocabulary for every command (README.md has the table per command):
0 success: the run succeeded, the gates hold, every case is consistent, nothing is left to fix;
1 the command ran and its verdict is negative: a run that ended BLOCKED for a reason other than its input,
  a failing gate or skill, a case with a finding, residual lint issues, a kernel that does not compile,
  a model that gave no usable answer;
2 bad input (one line naming the field or file), including requests the engine cannot build (BLOCKED_SPEC,
  BLOCKED_API) and usage errors. `opforge-hook gate` / `opforge hooks gate` follow the agent hosts' own
  convention instead: 2 means "blocked, a gate fails".

Streams: results (tables, summaries, JSON) go to stdout, progress and diagnostics to stderr, so that
`opforge op status WS | less` and `opforge ... --json | jq` both work. A non-zero exit says why in one line on
stderr; with --json an error is also JSON on stdout: {"error": {"where": ..., "what": ..., "exit_code": 2}}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from opforge.backend.cli import backend_app
from opforge.bench.cli import bench_app
from opforge.errors import InputError, json_error, report_error
from opforge.hosts.cli import hooks_app, init_cmd, skills_app
from opforge.llm.cli import draft_cmd
from opforge.skills.api_consistency.command import api_consistency
from opforge.skills.ci_fix.command import ci_fix_command
from opforge.skills.graph_diagnose.command import graph_app
from opforge.skills.helper.command import helper_app
from opforge.skills.op_adapt.command import op_adapt_command
from opforge.skills.op_test.command import op_test_app
from opforge.skills.pr_analysis.command import pr_analysis_command
from opforge.skills.test_triage.command import test_triage_app

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Verified, fused Triton operators for PyTorch.")
op_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                     help="The operator factory: request -> seven gated stages -> kernel.")
app.add_typer(op_app, name="op")
op_app.command("draft")(draft_cmd)
app.command("ci-fix")(ci_fix_command)
app.command("api-consistency")(api_consistency)
app.command("pr-analysis")(pr_analysis_command)
app.command("op-adapt")(op_adapt_command)
app.add_typer(op_test_app, name="op-test")
app.add_typer(skills_app, name="skills")
app.add_typer(hooks_app, name="hooks")
app.add_typer(bench_app, name="bench")
app.add_typer(backend_app, name="backend")
app.add_typer(graph_app, name="graph")
app.add_typer(test_triage_app, name="test-triage")
app.add_typer(helper_app, name="helper")
app.command("init")(init_cmd)

out_console = Console()  # results: status and gate tables
err_console = Console(stderr=True)  # progress: the spinner and each stage's mark while a run goes on
INPUT_TERMINALS = ("BLOCKED_SPEC", "BLOCKED_API")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _fail_input(exc: InputError, as_json: bool = False) -> None:
    """Exit 2 with one line on stderr; with --json the same error as JSON on stdout too."""
    report_error(typer.echo, exc.where, exc.what, 2, as_json=as_json)
    raise typer.Exit(2)


def _status_table(state) -> Table:
    from opforge.orchestrator.state import STAGES

    t = Table(title=f"{state.op_name}", show_lines=False)
    for col in ("stage", "name", "status", "attempts", "reason"):
        t.add_column(col)
    colour = {"completed": "green", "skipped": "cyan", "failed": "red", "in_progress": "yellow",
              "pending": "dim"}
    for k, name in STAGES.items():
        r = state.stages[k]
        t.add_row(str(k), name, f"[{colour[r.status]}]{r.status}[/]", str(r.attempts), (r.reason or "")[:90])
    return t


def _finish(state, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(state.to_dict(), indent=2))
    else:
        out_console.print(_status_table(state))
    term = (state.terminal or {}).get("status")
    if term and term != "SUCCESS":  # the state above says it too; this is the non-zero exit's one line
        typer.echo(f"{term}: {state.terminal['reason']}", err=True)
        raise typer.Exit(2 if term in INPUT_TERMINALS else 1)
    if not term:
        raise typer.Exit(0)


def _run(ws_dir: Path, only: int | None, as_json: bool, **engine):
    from functools import partial

    from opforge.orchestrator.runner import run_stages

    run_stages = partial(run_stages, **engine)  # engine=, llm_config= when given

    if as_json or not sys.stderr.isatty():
        def progress(event, stage, text):
            if not as_json:
                typer.echo(f"stage {stage} {event}: {text}", err=True)
        return run_stages(ws_dir, only=only, progress=progress)
    with err_console.status("starting") as status:
        def progress(event, stage, text):
            if event == "start":
                status.update(f"stage {stage}: {text} …")
            else:
                mark = {"completed": "[green]✓[/]", "skipped": "[cyan]↷[/]"}.get(event, "[red]✗[/]")
                err_console.print(f"{mark} stage {stage}: {text}")
        return run_stages(ws_dir, only=only, progress=progress)


@op_app.command("run")
def op_run(request_dir: Path = typer.Argument(..., help="folder with request.yaml and the reference"),
           out: Path = typer.Option(..., "--out", help="workspace folder to create"),
           force: bool = typer.Option(False, help="replace a non-empty --out folder"),
           engine: str = typer.Option("deterministic", "--engine", help="deterministic | llm | auto | host"),
           llm_config: Path = typer.Option(None, "--llm-config", help="model endpoint configuration (YAML)"),
           quick: bool = typer.Option(False, "--quick", help="a first run: Level 0 at the p0 shapes scaled down "
                                      "(at most 65,536 elements), CPU timings at one shape and dtype"),
           lang: str = typer.Option(None, "--lang", help="the reports' language: en | zh (default: OPFORGE_LANG, "
                                    "else en); the workspace keeps it for resumes"),
           as_json: bool = typer.Option(False, "--json", help="print the final state as JSON")):
    """Build an operator through all seven stages."""
    from opforge.llm.engines import make_engine
    from opforge.orchestrator.runner import create_workspace

    try:
        make_engine(engine, llm_config)  # a bad engine or model configuration stops before anything is written
        ws = create_workspace(request_dir, out, force=force, quick=quick, lang=lang)
        state = _run(ws.root, None, as_json, engine=engine, llm_config=llm_config)
    except InputError as exc:
        _fail_input(exc, as_json)
    _finish(state, as_json)


def _print_plan(out: dict, alone: bool, as_json: bool) -> None:
    """One request's verdict; alone, its kernels and cost model too (under --json on stderr, beside the JSON)."""
    if "error" in out:
        typer.echo(f"{out['request']}: error: {out['error']}", err=as_json)
        return
    if not as_json and alone:
        for name, kernels in out["kernels"].items():
            layouts = ", ".join(f"{k['kernel']} ({k['layout']})" for k in kernels)
            typer.echo(f"{name}: {len(kernels)} kernel(s): {layouts}")
        for c in out["cost"]:
            for p in ("forward", "backward"):
                if p in c:
                    x = c[p]
                    typer.echo(f"{c['binding']} {c['dtype']} {p}: {x['fused_kernels']} launch(es) instead of "
                               f"eager's {x['eager_kernels']}, {x['fused_bytes']:,} bytes instead of "
                               f"{x['eager_bytes']:,}, {x['roofline']['bound']}-bound")
    if not out["buildable"]:  # alone, the last line is `op run`'s
        blocked = f"BLOCKED_API: {out['reason']}: {', '.join(out['unsupported'])}"
        typer.echo(blocked if alone else f"{out['op']}: {blocked} ({out['seconds']} s)", err=True)
        return
    kernels = " + ".join(str(len(k)) for k in out["kernels"].values())
    typer.echo(f"{out['op']}: builds it, {kernels} kernel(s) ({out['seconds']} s)", err=as_json)


def _plan_one(request_dir: Path, cost: bool) -> dict:
    """Stages 1-2 of one request in memory: its kernel plan and cost model, or what the engine cannot lower.
    Raises InputError for a bad request."""
    import time

    from opforge.codegen.build import kernels_of
    from opforge.codegen.trace import trace_request
    from opforge.request import load_request
    from opforge.skills.op_api.stage import explore
    from opforge.skills.op_design.stage import plan_summary

    start = time.perf_counter()
    req = load_request(request_dir)
    traced = trace_request(req)  # stage 1's trace, without the spec's probes a plan does not read
    report, build = explore(req, traced, with_cost=cost, with_ops=False)
    passes = {name: [plan_summary(k) for k in kernels_of(plan)]
              for name, plan in (("forward", build and build.forward), ("backward", build and build.backward)) if plan}
    return {"op": req.name, "request": str(request_dir), "buildable": build is not None,
            "unsupported": report["unsupported"], "reason": report["unsupported_reason"], "kernels": passes,
            "cost": report["cost"], "seconds": round(time.perf_counter() - start, 2)}


@op_app.command("plan")
def op_plan(request_dirs: list[Path] = typer.Argument(..., help="folders with request.yaml and the reference"),
            cost: bool = typer.Option(True, "--cost/--no-cost", help="the cost model at the P0 shapes (runs the "
                                      "reference eagerly; --no-cost answers faster)"),
            as_json: bool = typer.Option(False, "--json")):
    """Whether the engine can build references: stages 1-2 in memory, no workspace. Exit 0 with each kernel
    plan and cost model; exit 2 naming every op it cannot lower (or, for several requests, when any fails)."""
    results = []
    for d in request_dirs:  # each verdict is printed as it comes: a sweep over hundreds shows its progress
        try:
            out = _plan_one(d, cost)
        except InputError as exc:
            if len(request_dirs) == 1:
                _fail_input(exc, as_json)
            out = {"request": str(d), "buildable": False, "error": f"{exc.where}: {exc.what}"}
        except Exception as exc:  # an engine defect on one reference of many must not cost the others' answers
            if len(request_dirs) == 1:
                raise
            why = (str(exc).strip().splitlines() or [""])[0]
            out = {"request": str(d), "buildable": False, "error": f"the engine failed: {type(exc).__name__}: {why}"}
        results.append(out)
        _print_plan(out, len(request_dirs) == 1, as_json)
    if as_json:
        typer.echo(json.dumps(results[0] if len(results) == 1 else results, indent=2, default=str))
    failed = [r.get("op", r["request"]) for r in results if not r["buildable"]]
    if failed:
        if len(results) > 1:
            typer.echo(f"{len(results) - len(failed)} of {len(results)} build; not: {', '.join(failed)}", err=True)
        raise typer.Exit(2)


@op_app.command("resume")
def op_resume(ws_dir: Path = typer.Argument(..., help="workspace folder"),
              engine: str = typer.Option(None, "--engine", help="switch engine: deterministic | llm | auto | host"),
              llm_config: Path = typer.Option(None, "--llm-config", help="model endpoint configuration (YAML)"),
              as_json: bool = typer.Option(False, "--json")):
    """Continue an interrupted run; completed stages are not redone. A run that ended BLOCKED_API goes on
    when --engine names one that writes kernels (llm, auto, host)."""
    try:
        state = _run(ws_dir, None, as_json, engine=engine, llm_config=llm_config)
    except InputError as exc:
        _fail_input(exc, as_json)
    _finish(state, as_json)


@op_app.command("status")
def op_status(ws_dir: Path = typer.Argument(...), as_json: bool = typer.Option(False, "--json")):
    """Where a workspace stands."""
    from opforge.orchestrator.state import load_state

    try:
        state = load_state(ws_dir)
    except InputError as exc:
        _fail_input(exc, as_json)
    if as_json:
        typer.echo(json.dumps(state.to_dict(), indent=2))
    else:
        out_console.print(_status_table(state))
        if state.terminal:
            typer.echo(f"terminal: {state.terminal['status']}: {state.terminal['reason']}")


@op_app.command("stage")
def op_stage(ws_dir: Path = typer.Argument(...), n: int = typer.Argument(..., min=1, max=7),
             as_json: bool = typer.Option(False, "--json")):
    """Run one stage alone (later stages go back to pending)."""
    try:
        state = _run(ws_dir, n, as_json)
    except InputError as exc:
        _fail_input(exc, as_json)
    _finish(state, as_json)


@op_app.command("gate")
def op_gate(ws_dir: Path = typer.Argument(...), stage: int = typer.Option(..., "--stage", min=1, max=7),
            as_json: bool = typer.Option(False, "--json")):
    """Check a stage's gates without running it; exit 1 when a blocking rule fails."""
    from opforge.orchestrator.gates import blocking_failures, run_gates
    from opforge.orchestrator.state import load_state
    from opforge.workspace import Workspace

    try:
        state = load_state(ws_dir)
    except InputError as exc:
        _fail_input(exc, as_json)
    results = run_gates(Workspace(Path(ws_dir), state.op_name), stage, state)
    if as_json:
        typer.echo(json.dumps({"stage": stage, "results": results,
                               "passed": not blocking_failures(results)}, indent=2))
    else:
        t = Table(title=f"gates of stage {stage}")
        for col in ("rule", "severity", "dimension", "result", "detail"):
            t.add_column(col)
        for r in results:
            t.add_row(r["id"], r["severity"], r["dimension"], "[green]pass[/]" if r["passed"] else "[red]FAIL[/]",
                      r["message"] or r["doc"])
        out_console.print(t)
    raise typer.Exit(1 if blocking_failures(results) else 0)


@op_app.command("rollback")
def op_rollback(ws_dir: Path = typer.Argument(...), to: int = typer.Option(..., "--to"),
                as_json: bool = typer.Option(False, "--json")):
    """Send stage N and later back to pending; earlier artifacts are restored from their snapshots."""
    from opforge.orchestrator.runner import rollback

    try:
        done = rollback(ws_dir, to)
    except InputError as exc:
        _fail_input(exc, as_json)
    if as_json:
        typer.echo(json.dumps({"to_stage": to, **done}))
    else:
        aside = f"; moved {len(done['moved_aside'])} later file(s) to {done['aside']}" if done["aside"] else ""
        typer.echo(f"rolled back to stage {to}; restored {len(done['restored'])} file(s){aside}. "
                   f"Run `opforge op resume {ws_dir}`.")


@op_app.command("ops")
def op_ops(as_json: bool = typer.Option(False, "--json"),
           markdown: bool = typer.Option(False, "--markdown", help="the table of docs/ops.md")):
    """The ATen operators the deterministic engine lowers to Triton."""
    from opforge.codegen.ops import OP_TABLE, markdown_table

    if markdown:
        typer.echo(markdown_table(), nl=False)
        return
    rows = [{"op": k, "kind": r.kind, "triton": r.primitive, "exact": r.exact} for k, r in sorted(OP_TABLE.items())]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    t = Table(title=f"{len(rows)} ATen ops lowered to Triton")
    for col in ("op", "kind", "triton", "exact"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["op"], r["kind"], r["triton"], "yes" if r["exact"] else "no")
    out_console.print(t)


@op_app.command("catalog")
def op_catalog(as_json: bool = typer.Option(False, "--json"),
               root: Path = typer.Option(EXAMPLES, help="folder of example requests")):
    """The example requests opforge builds."""
    from opforge.request import load_request

    rows = []
    for d in sorted(p for p in root.iterdir() if (p / "request.yaml").exists()) if root.is_dir() else []:
        try:
            r = load_request(d)
            rows.append({"name": r.name, "category": r.category, "dtypes": r.dtypes, "backward": r.backward,
                         "path": str(d), "description": r.description})
        except InputError as exc:
            rows.append({"name": d.name, "error": str(exc), "path": str(d)})
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    t = Table(title="opforge catalog")
    for col in ("name", "category", "dtypes", "backward", "description"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r.get("category", "?"), ", ".join(r.get("dtypes", [])), str(r.get("backward", "")),
                  r.get("description", r.get("error", "")))
    out_console.print(t)


# click's ClickException, or the copy of it that recent typer versions vendor
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _json_requested(args: list[str]) -> bool:
    """Whether the command line asks for JSON on stdout: a --json flag, or `--json -` where --json takes a file."""
    from typer.core import TyperGroup

    cmd, rest = typer.main.get_command(app), list(args)
    while isinstance(cmd, TyperGroup):
        names = [a for a in rest if not a.startswith("-")]
        if not names or names[0] not in cmd.commands:
            return False
        cmd, rest = cmd.commands[names[0]], rest[rest.index(names[0]) + 1:]
    param = next((p for p in cmd.params if "--json" in getattr(p, "opts", ())), None)
    if param is None:
        return False
    if getattr(param, "is_flag", False):
        return "--json" in rest
    i = rest.index("--json") if "--json" in rest else -1
    return "--json=-" in rest or (i >= 0 and rest[i + 1:i + 2] == ["-"])


def main() -> None:
    """The console script: app(), but a usage error (a missing argument, an unknown option) of a command asked
    for JSON is also JSON on stdout."""
    args = sys.argv[1:]
    try:
        code = app(args=args, standalone_mode=False)
    except _USAGE_ERROR as exc:
        if _json_requested(args):
            param = getattr(exc, "param", None)  # the option or argument at fault, when there is one
            where = ((getattr(param, "opts", None) or [getattr(param, "name", None)])[0] if param else None) or \
                getattr(exc, "option_name", None) or "usage"
            typer.echo(json_error(where, exc.format_message(), exc.exit_code))
        try:
            from typer import rich_utils

            rich_utils.rich_format_error(exc)
        except ImportError:  # typer without rich: click's plain message
            exc.show()
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
