"""Runs the user's script in this (child) process with one step of the backend ladder, and records how it ended.

    python -m opforge.skills.graph_diagnose.child RECORD STEP SCRIPT [ARGS...]

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
CHECK_ENV = "OPFORGE_GRAPH_CHECK"  # "1": each compiled call is compared with the eager call on the same inputs
DROP_ENV = "OPFORGE_GRAPH_DROP_FOREIGN"  # "1": Inductor's tables lose the entries defined outside torch
TIME_ENV = "OPFORGE_GRAPH_TIME"  # "1": each call of a compiled function is timed (eagerly too, under no-compile)
TIMINGS: dict[str, dict] = {}  # "file:line name" of a compiled function -> its calls' seconds
OPCHECK_ENV = "OPFORGE_GRAPH_OPCHECK"  # "1": custom ops seen running eagerly are checked with opcheck at exit
BUILTIN_NAMESPACES = {"aten", "prim", "prims", "_c10d_functional", "c10d", "profiler", "debugprims"}
SEEN_OPS: dict = {}  # custom OpOverload -> the arguments of its first call (tensors cloned)


def _record_custom_ops():
    """A dispatch mode that keeps the first call of every op outside torch's own namespaces."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace not in BUILTIN_NAMESPACES and func not in SEEN_OPS:
                copy = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), (args, kwargs))
                SEEN_OPS[func] = copy
            return func(*args, **kwargs)

    mode = Record()
    mode.__enter__()
    return mode


def opcheck_seen() -> dict:
    """torch.library.opcheck on each custom op seen, with its first call's arguments: which of its tests
    (schema, autograd registration, fake tensor, AOT dispatch) fail, and how."""
    import torch

    out = {}
    for op, (args, kwargs) in SEEN_OPS.items():
        try:
            report = torch.library.opcheck(op, args, kwargs, raise_exception=False)
        except Exception as exc:  # noqa: BLE001 - opcheck itself refusing the op is its verdict
            report = {"opcheck": f"{type(exc).__name__}: {exc}"}
        out[str(op)] = {k: v if v == "SUCCESS" else str(v).strip().splitlines()[0][:400] for k, v in report.items()}
    return out


class CompiledMismatch(AssertionError):
    """A compiled call's outputs differ from the eager call's (--check)."""


def _checked(compiled, eager):
    import torch

    def call(*args, **kwargs):
        clone = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # in-place ops keep theirs
        want = eager(*clone, **kwargs)
        got = compiled(*args, **kwargs)
        try:
            torch.testing.assert_close(got, want, equal_nan=True)
        except AssertionError as exc:
            raise CompiledMismatch(f"compiled output differs from eager: {exc}") from None
        return got
    return call


def _timed(fn, model):
    """Each call's wall time, the device synchronised around it (a kernel launch returns before it runs)."""
    import time

    import torch

    code = getattr(getattr(model, "forward", model), "__code__", None)
    key = f"{code.co_filename}:{code.co_firstlineno} {code.co_name}" if code else repr(model)
    calls = TIMINGS.setdefault(key, {"seconds": []})["seconds"]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def call(*args, **kwargs):
        sync()
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        sync()
        calls.append(time.perf_counter() - start)
        return out
    return call


def _patch_compile(step: str) -> None:
    import torch

    timing = os.environ.get(TIME_ENV) == "1"
    if step == "no-compile":
        torch.compiler.set_stance("force_eager")
        if not timing:
            return
    original = torch.compile
    check = os.environ.get(CHECK_ENV) == "1"

    def compile_with(model=None, **kwargs):
        if model is None:  # @torch.compile(...) with options: the decorator comes back here with the function
            return lambda fn: compile_with(fn, **kwargs)
        asked = kwargs.get("backend", "inductor")
        BACKENDS.append(asked if isinstance(asked, str) else getattr(asked, "__name__", type(asked).__name__))
        if step not in ("as-is", "no-compile"):
            kwargs["backend"] = step
            kwargs.pop("mode", None)  # a mode and options are Inductor's: the other backends refuse them
            kwargs.pop("options", None)
        compiled = original(model, **kwargs)
        compiled = _checked(compiled, model) if check else compiled
        return _timed(compiled, model) if timing else compiled

    torch.compile = compile_with
    if os.environ.get(DROP_ENV) == "1":
        from torch._dynamo.callback import on_compile_start

        on_compile_start(lambda *_: _drop_foreign())


def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__))


def _tables() -> dict:
    """Inductor's tables a user or a backend can register into, where Inductor has been imported."""
    tables = {}
    if "torch._inductor.decomposition" in sys.modules:
        tables["decomposition"] = sys.modules["torch._inductor.decomposition"].decompositions
    if "torch._inductor.lowering" in sys.modules:
        tables["lowering"] = sys.modules["torch._inductor.lowering"].lowerings
    return tables


def foreign_entries() -> list[dict]:
    """Entries of Inductor's decomposition and lowering tables whose function is defined outside torch: what
    a script or a backend registered. Where torch's own entries make a wrong result, these are the suspects."""
    import inspect

    root, found = _torch_dir(), []
    for table, entries in _tables().items():
        for op, fn in list(entries.items()):
            code = getattr(inspect.unwrap(fn), "__code__", None)
            if code is not None and not os.path.abspath(code.co_filename).startswith(root):
                found.append({"table": table, "op": str(op), "file": code.co_filename,
                              "line": code.co_firstlineno, "function": code.co_name})
    return found


def _drop_foreign() -> None:
    wanted = {(e["table"], e["op"]) for e in foreign_entries()}
    for table, entries in _tables().items():
        for op in [op for op in entries if (table, str(op)) in wanted]:
            del entries[op]


def _frames(exc: BaseException) -> list[dict]:
    return [{"file": f.filename, "line": f.lineno, "function": f.name, "code": (f.line or "").strip()}
            for f in traceback.extract_tb(exc.__traceback__)]


def main(argv: list[str]) -> int:
    record, step, script, *args = argv
    outcome: dict = {"step": step, "exception": None}
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    mode = None
    try:
        _patch_compile(step)
        if os.environ.get(OPCHECK_ENV) == "1":
            mode = _record_custom_ops()
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
    if mode is not None:
        mode.__exit__(None, None, None)
        outcome["opcheck"] = opcheck_seen()
    outcome["backends"] = BACKENDS
    outcome["timings"] = TIMINGS
    outcome["foreign"] = foreign_entries() if "torch" in sys.modules else []
    with open(record, "w") as f:
        json.dump(outcome, f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
