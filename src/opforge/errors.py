"""Errors that the CLI turns into exit codes.

`InputError` is the user's fault (a bad request, a missing file, a broken state file): exit 2 with one line.
"""


class OpforgeError(Exception):
    """Base class for opforge's own failures."""


class InputError(OpforgeError):
    """Bad input from the user: the CLI prints one line naming the field or file, and exits 2."""

    def __init__(self, where: str, what: str):
        self.where = where
        self.what = what
        super().__init__(f"{where}: {what}")
