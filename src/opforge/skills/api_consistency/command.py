"""`opforge api-consistency`: one case or a batch, each diagnosed on its own, one summary for all."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from opforge.errors import InputError

console = Console(stderr=True)


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


def run_batch(specs: list[str], target: str, out: Path, *, fn: str | None = None, seed: int = 0, runs: int = 3,
              progress=None) -> tuple[list[dict], list[str]]:
    """Diagnose every case; returns the summary rows and the one-line errors of cases that were bad input."""
    from opforge.skills.api_consistency.case import load_case
    from opforge.skills.api_consistency.report import summary_row, write_case, write_summary
    from opforge.skills.api_consistency.targets import parse_target
    from opforge.skills.api_consistency.triage import diagnose

    if not target.startswith("custom:"):
        parse_target(target)  # an unavailable device is one error for the whole batch
    out.mkdir(parents=True, exist_ok=True)
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
                         "conclusion": f"bad input: {exc}"})
        except Exception as exc:  # one case's failure must not cost the batch the others
            if len(specs) == 1:
                raise
            rows.append({"case": spec, "target": target, "exit": None, "rule": "", "check": "error",
                         "conclusion": f"opforge failed on this case: {type(exc).__name__}: {exc}"})
    write_summary(out, rows)
    return rows, errors


def api_consistency(
    cases: list[str] = typer.Argument(..., help="CASE: file.py, file.py::function, a pytest node id, or a folder"),
    target: str = typer.Option(..., "--target", "-t", help="cuda|npu|compile|half|bf16|custom:module:function"),
    out: Path = typer.Option(..., "--out", help="folder for analysis.md, repro.md, repro.py and summary.xlsx"),
    fn: str = typer.Option(None, "--fn", help="the entry function, when the case file does not name it"),
    seed: int = typer.Option(0, help="seed for the input builder and every run"),
    runs: int = typer.Option(3, min=2, help="runs compared bit for bit for determinism"),
    as_json: bool = typer.Option(False, "--json", help="print the summary rows as JSON"),
):
    """Compare an API or program on a device under test against the CPU; triage into three exits."""
    try:
        specs = expand(cases)
        if len(specs) == 1 or as_json or not sys.stderr.isatty():
            rows, errors = run_batch(specs, target, out, fn=fn, seed=seed, runs=runs)
        else:
            with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                          TimeElapsedColumn(), console=console) as bar:
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
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    if len(specs) == 1 and errors:
        typer.echo(f"error: {errors[0]}", err=True)
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps({"out": str(out), "cases": rows, "errors": errors}, indent=2, default=str))
    else:
        for r in rows:
            colour = {1: "green", 2: "yellow", 3: "red"}.get(r["exit"], "red")
            op = f" — {r['operator']} at {r['call site']}" if r.get("operator") else ""
            console.print(f"[{colour}]exit {r['exit']}[/] {r['case']} on {r['target']}: {r['conclusion']}{op}")
        for e in errors:
            typer.echo(f"error: {e}", err=True)
        console.print(f"summary: {out / 'summary.xlsx'}")
    if errors:
        raise typer.Exit(2)
    raise typer.Exit(1 if any(r["exit"] in (2, 3, None) for r in rows) else 0)
