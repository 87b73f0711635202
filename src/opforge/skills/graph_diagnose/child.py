"""Runs the user's script in this (child) process with one step of the backend ladder, and records how it ended.

    python -m opforge.skills.graph_diagnose.child STEP RECORD SCRIPT [ARGS...]

STEP is `as-is` (the script untouched), `no-compile` (torch.compile calls run eagerly: the stance
`force_eager`), or a backend name that replaces every backend the script passes to torch.compile. RECORD is the
JSON file the outcome is written to: the exception's type, message and frames, or none. The script's own
output goes to stdout and stderr as it would.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback

BACKENDS: list[str] = []  # the backends the script asked torch.compile for, in call order


def _patch_compile(step: str) -> None:
    import torch

    if step == "no-compile":
        torch.compiler.set_stance("force_eager")
        return
    original = torch.compile

    def compile_with(model=None, **kwargs):
        asked = kwargs.get("backend", "inductor")
        BACKENDS.append(asked if isinstance(asked, str) else getattr(asked, "__name__", type(asked).__name__))
        if step != "as-is":
            kwargs["backend"] = step
            kwargs.pop("mode", None)  # a mode and options are Inductor's: the other backends refuse them
            kwargs.pop("options", None)
        return original(model, **kwargs) if model is not None else original(**kwargs)

    torch.compile = compile_with


def _frames(exc: BaseException) -> list[dict]:
    return [{"file": f.filename, "line": f.lineno, "function": f.name, "code": (f.line or "").strip()}
            for f in traceback.extract_tb(exc.__traceback__)]


def main(argv: list[str]) -> int:
    step, record, script, *args = argv
    outcome: dict = {"step": step, "exception": None}
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    try:
        _patch_compile(step)
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:  # the script's own exit status is its verdict
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        outcome["exit_code"] = code
    except BaseException as exc:  # noqa: BLE001 - whatever the script raised is the finding
        traceback.print_exc()
        cause = exc
        while cause.__cause__ is not None and type(cause).__module__.startswith("torch._dynamo"):
            cause = cause.__cause__  # Dynamo wraps a backend's error: keep the wrapped one's type too
        outcome["exception"] = {"type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                                "message": str(exc), "frames": _frames(exc),
                                "cause": f"{type(cause).__module__}.{type(cause).__qualname__}"
                                if cause is not exc else None}
        code = 1
    outcome["backends"] = BACKENDS
    with open(record, "w") as f:
        json.dump(outcome, f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
