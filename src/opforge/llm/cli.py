"""`opforge op draft`: a request in words -> a request folder, through the configured model."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from opforge.errors import InputError


def draft_cmd(text: str = typer.Argument(..., help="the operator, in words"),
              out: Path = typer.Option(..., "--out", help="request folder to write"),
              interactive: bool = typer.Option(False, "--interactive", help="let the model ask questions first"),
              llm_config: Path = typer.Option(None, "--llm-config", help="model endpoint configuration (YAML)"),
              force: bool = typer.Option(False, help="replace a non-empty --out folder"),
              as_json: bool = typer.Option(False, "--json")):
    """Turn a request in words into request.yaml + reference.py + the model's assumptions."""
    from opforge.llm.config import load_config
    from opforge.llm.providers import LlmError
    from opforge.llm.request_draft import draft_request

    try:
        cfg = load_config(llm_config)
        ask = (lambda q: typer.prompt(q, default="", show_default=False)) if interactive else None
        result = draft_request(text, out, cfg, ask=ask, force=force)
    except InputError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    except LlmError as exc:
        typer.echo(f"error: model: {exc}", err=True)
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    typer.echo(f"wrote {result['request_dir']} ({result['name']}); assumptions:")
    for a in result["assumptions"]:
        typer.echo(f"  - {a}")
    typer.echo(f"next: opforge op run {result['request_dir']} --out WS")
