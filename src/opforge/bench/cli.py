"""`opforge bench`: performance figures outside a workspace."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from opforge.errors import InputError

bench_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                        help="Benchmarks: the catalog against eager and torch.compile on the current device.")
console = Console(stderr=True)
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PATHS = ("eager", "compile_default", "compile_max_autotune")


def _split(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


@bench_app.command("catalog")
def catalog_cmd(
    ops: str = typer.Option(None, "--ops", help="comma-separated operator names (default: the whole catalog)"),
    json_file: Path = typer.Option(None, "--json", help="write the report as JSON to FILE ('-' for stdout)"),
    md_file: Path = typer.Option(None, "--md", help="write the report as a Markdown table to FILE"),
    dtype: str = typer.Option(None, "--dtype", help="dtype of every operator (default: bfloat16)"),
    elements: int = typer.Option(None, "--elements", min=1,
                                 help="elements in each op's largest input (default: 64M on a GPU, P0 on a CPU)"),
    baselines: str = typer.Option(",".join(PATHS), "--baselines", help="reference paths timed on a GPU"),
    examples: Path = typer.Option(EXAMPLES, "--examples", help="folder of operator requests"),
):
    """Time the catalog: fused kernels against eager and torch.compile, forward and forward+backward."""
    from opforge.bench.catalog import run_catalog, to_markdown
    from opforge.orchestrator.atomic import write_json_atomic, write_text_atomic

    try:
        chosen = _split(baselines) or []
        for b in chosen:
            if b not in PATHS:
                raise InputError("--baselines", f"unknown path {b!r} (expected some of {', '.join(PATHS)})")
        if "eager" not in chosen:
            raise InputError("--baselines", "must include eager (speedups are reported against it)")
        if not examples.is_dir():
            raise InputError("--examples", f"{examples} is not a folder")
        names = _split(ops)
        quiet = str(json_file) == "-" or not sys.stderr.isatty()
        kw = dict(dtype=dtype, elements=elements, baselines=tuple(chosen))
        if json_file and str(json_file) != "-":
            kw["checkpoint"] = lambda rep: write_json_atomic(json_file, rep)
        if quiet:
            report = run_catalog(examples, names, **kw)
        else:
            from opforge.bench.catalog import select

            total = len(select(examples, names))
            with Progress(TextColumn("catalog"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                          TimeElapsedColumn(), console=console) as bar:
                task = bar.add_task("", total=total)
                report = run_catalog(examples, names, progress=lambda n: bar.update(task, advance=1, description=n),
                                     **kw)
    except InputError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    md = to_markdown(report)
    if md_file:
        write_text_atomic(md_file, md)
    if json_file and str(json_file) != "-":
        write_json_atomic(json_file, report)
    if str(json_file) == "-":
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(md)
    if report["kernel_timing"]:
        typer.echo(f"note: {report['kernel_timing']}", err=True)
