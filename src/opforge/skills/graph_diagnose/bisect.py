"""Runs torch's CompilerBisector on the user's script in this (child) process: the script is run again and
again with torch.compile's backend and subsystems as the bisector sets them (each compiled call compared with
eager), until it names the backend, the subsystem and the application of it that makes the results differ.

    python -m opforge.skills.graph_diagnose.bisect RECORD SCRIPT [ARGS...]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys


def main(argv: list[str]) -> int:
    record, script, *args = argv
    import torch
    from torch._inductor.compiler_bisector import CompilerBisector

    from opforge.skills.graph_diagnose import child

    original = torch.compile

    def compile_with(model=None, **kwargs):
        if model is None:
            return lambda fn: compile_with(fn, **kwargs)
        kwargs["backend"] = CompilerBisector.get_backend() or "inductor"
        if kwargs["backend"] != "inductor":
            kwargs.pop("mode", None)
            kwargs.pop("options", None)
        return child._checked(original(model, **kwargs), model)

    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runs = []

    def good() -> bool:
        torch._dynamo.reset()
        torch.compile = compile_with
        sys.argv = [script, *args]
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                runpy.run_path(script, run_name="__main__")
            ok = True
        except Exception:  # noqa: BLE001 - any failure is a bad run
            ok = False
        finally:
            torch.compile = original
        runs.append({"backend": CompilerBisector.get_backend(), "subsystem": CompilerBisector.get_subsystem(),
                     "good": ok})
        return ok

    result = CompilerBisector.do_bisect(good)
    with open(record, "w") as f:
        json.dump({"result": None if result is None else {
            "backend": result.backend, "subsystem": result.subsystem, "bisect_number": result.bisect_number,
            "debug_info": result.debug_info}, "runs": len(runs)}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
