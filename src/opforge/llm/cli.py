"""`opforge op draft`: a request in words -> a request folder, through the configured model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from opforge.errors import InputError, report_error


def _ask(question: str) -> str:
    """The model's question on stderr and the answer from stdin, so that stdout holds only the result (the JSON
    with --json; click's prompt writes a space to stdout). An empty line or end of input answers ''."""
    typer.echo(f"{question} ", err=True, nl=False)
    return sys.stdin.readline().rstrip("\n")


def _fail(where: str, what: str, code: int, as_json: bool) -> None:
    """One line on stderr; with --json the same error as JSON on stdout too."""
    report_error(typer.echo, where, what, code, as_json=as_json)
    raise typer.Exit(code)


def draft_cmd(text: str = typer.Argument(..., help="the operator, in words"),
              out: Path = typer.Option(..., "--out", help="request folder to write"),
              interactive: bool = typer.Option(False, "--interactive", help="let the model ask questions first"),
              llm_config: Path = typer.Option(None, "--llm-config", help="model endpoint configuration (YAML)"),
              force: bool = typer.Option(False, help="replace a non-empty --out folder"),
              as_json: bool = typer.Option(False, "--json")):
    """Turn a request in words into request.yaml + reference.py + the model's assumptions."""
    from opforge.llm.config import load_config
    from opforge.llm.providers import LlmError
    from opforge.llm.request_draft import check_out, draft_request

    try:
        check_out(out, force)  # before the configuration: a bad --out is said whatever the model setup
        cfg = load_config(llm_config)
        ask = _ask if interactive else None
        result = draft_request(text, out, cfg, ask=ask, force=force)
    except InputError as exc:
        _fail(exc.where, exc.what, 2, as_json)
    except LlmError as exc:
        _fail("model", str(exc), 1, as_json)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    typer.echo(f"wrote {result['request_dir']} ({result['name']}); assumptions:")
    for a in result["assumptions"]:
        typer.echo(f"  - {a}")
    typer.echo(f"next: opforge op run {result['request_dir']} --out WS")
