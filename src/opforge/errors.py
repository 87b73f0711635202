"""Errors that the CLI turns into exit codes.

`InputError` is the user's fault (a bad request, a missing file, a broken state file): exit 2 with one line.
`json_error` and `report_error` say any failure the way every command does: one line on stderr, and with --json
the same error as JSON on stdout. A leaf: no opforge import, no typer (the caller passes its echo and exits).
"""

from __future__ import annotations

import json
from typing import Callable


class OpforgeError(Exception):
    """Base class for opforge's own failures."""


class InputError(OpforgeError):
    """Bad input from the user: the CLI prints one line naming the field or file, and exits 2."""

    def __init__(self, where: str, what: str):
        self.where = where
        self.what = what
        super().__init__(f"{where}: {what}")


def json_error(where: str, what: str, exit_code: int = 2) -> str:
    """The error as a command asked for JSON prints it on stdout."""
    return json.dumps({"error": {"where": where, "what": what, "exit_code": exit_code}})


def report_error(echo: Callable[..., None], where: str, what: str, exit_code: int = 2, *,
                 as_json: bool = False) -> None:
    """One line on stderr, `error: WHERE: WHAT`; with `as_json` the same error as JSON on stdout first. `echo` is
    typer.echo (or click.echo): echo(text) writes stdout, echo(text, err=True) stderr. The caller then exits
    with `exit_code`."""
    if as_json:
        echo(json_error(where, what, exit_code))
    echo(f"error: {where}: {what}" if what else f"error: {where}", err=True)
