"""`opforge bench`: performance figures outside a workspace."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from opforge.errors import InputError, report_error

bench_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                        help="Benchmarks: the catalog against eager and torch.compile on the current device.")
console = Console(stderr=True)
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PATHS = ("eager", "compile_default", "compile_max_autotune")


def _fail(exc: InputError, json_file: Path | None) -> None:
    """Exit 2 with one line on stderr; with `--json -` the same error as JSON on stdout too."""
    report_error(typer.echo, exc.where, exc.what, 2, as_json=str(json_file) == "-")
    raise typer.Exit(2)


def _check_outputs(json_file: Path | None, md_file: Path | None) -> None:
    """Bad report paths are refused before the benchmark runs, not in a traceback after it."""
    from opforge.workspace.atomic import check_out_file

    for flag, path in (("--json", json_file), ("--md", md_file)):
        if path is not None and not (flag == "--json" and str(path) == "-"):  # `--json -` is stdout
            check_out_file(path, flag)


def _write_reports(report: dict, md: str, json_file: Path | None, md_file: Path | None) -> None:
    from opforge.workspace.atomic import write_json_atomic, write_text_atomic

    for flag, path, write in (("--md", md_file, lambda p: write_text_atomic(p, md)),
                              ("--json", json_file, lambda p: write_json_atomic(p, report))):
        if path is not None and not (flag == "--json" and str(path) == "-"):
            try:
                write(path)
            except OSError as exc:  # the folder went away or turned read-only during the run
                _fail(InputError(flag, f"{path}: cannot write it: {exc.strerror or exc}"), json_file)


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
    from opforge.workspace.atomic import write_json_atomic

    try:
        _check_outputs(json_file, md_file)
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
        _fail(exc, json_file)
    md = to_markdown(report)
    _write_reports(report, md, json_file, md_file)
    if str(json_file) == "-":
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(md)
    if report["kernel_timing"]:
        typer.echo(f"note: {report['kernel_timing']}", err=True)


@bench_app.command("compile")
def compile_cmd(
    ops: str = typer.Option(None, "--ops", help="comma-separated catalog operators (default: the whole catalog)"),
    request: Path = typer.Option(None, "--request", help="an operator request folder instead of the catalog"),
    impl: Path = typer.Option(None, "--impl", help="compile this impl file (default: generate it from the request)"),
    arch: str = typer.Option("sm_90", "--arch", help="CUDA architecture to compile for (sm_80, sm_90, ...)"),
    dtypes: str = typer.Option(None, "--dtype", help="comma-separated dtypes, or 'all' (default: the op's first)"),
    elements: int = typer.Option(64 * 2**20, "--elements", min=0,
                                 help="also compile at the benchmark size, this many elements in the largest "
                                      "input (0: P0 shapes only)"),
    json_file: Path = typer.Option(None, "--json", help="write the report as JSON to FILE ('-' for stdout)"),
    md_file: Path = typer.Option(None, "--md", help="write the report as a Markdown table to FILE"),
    examples: Path = typer.Option(EXAMPLES, "--examples", help="folder of operator requests"),
):
    """Compile every kernel for a GPU architecture without a GPU: compile errors, registers, spills, occupancy.

    Exit 1 when a kernel fails to compile."""
    import datetime

    from opforge.bench.aot import compile_op, parse_arch, to_markdown, toolchain
    from opforge.bench.catalog import scaled_binding, select
    from opforge.request import load_request

    try:
        _check_outputs(json_file, md_file)
        if os.environ.get("TRITON_INTERPRET") == "1":  # Triton's own jit helpers (tl.cumsum's combine) are
            # interpreted functions then, and no kernel that calls them compiles
            raise InputError("TRITON_INTERPRET", "is 1: unset it (or set 0) to compile for a GPU")
        try:
            parse_arch(arch)
        except ValueError as exc:
            raise InputError("--arch", str(exc)) from None
        if impl is not None and request is None:
            raise InputError("--impl", "needs --request, the request the impl was built from")
        if impl is not None and not impl.is_file():
            raise InputError("--impl", f"{impl} is not a file")
        names = [] if request else select(examples, _split(ops))
        reqs = [load_request(request)] if request else [load_request(examples / n) for n in names]
        chosen = {}
        for req in reqs:
            chosen[req.name] = req.dtypes if dtypes == "all" else (_split(dtypes) or req.dtypes[:1])
            for dt in chosen[req.name]:
                if dt not in req.dtypes:
                    raise InputError("--dtype", f"{req.name} does not support {dt} (it takes {', '.join(req.dtypes)})")
    except InputError as exc:
        _fail(exc, json_file)
    report = {"arch": arch, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "toolchain": toolchain(), "ops": []}
    if report["toolchain"]["unavailable"]:  # nothing to compile with: the report says so, and nothing failed
        reqs = []
    quiet = str(json_file) == "-" or not sys.stderr.isatty()
    with Progress(TextColumn("compile"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=console, disable=quiet) as bar:
        task = bar.add_task("", total=len(reqs))
        for req in reqs:
            bindings = list(req.p0)
            if elements:
                big = scaled_binding(req, elements)
                bindings += [big] if big not in bindings else []
            report["ops"].append(compile_op(req, arch, impl_path=impl, bindings=bindings,
                                            dtypes=chosen[req.name]))
            bar.update(task, advance=1, description=req.name)
    report["failed"] = sum(op["failed"] for op in report["ops"])
    md = to_markdown(report)
    _write_reports(report, md, json_file, md_file)
    typer.echo(json.dumps(report, indent=2) if str(json_file) == "-" else md)
    if report["failed"]:
        typer.echo(f"error: {report['failed']} kernel(s) failed to compile for {arch}", err=True)
        raise typer.Exit(1)
