"""A request in words becomes a request folder: request.yaml, the PyTorch reference, and the assumptions the
model made to fill the gaps. With `interactive`, the model may first ask the user clarifying questions.

The model's files are checked the way `opforge op run` checks a request (load, then trace the reference), in a
child process under a time limit because the reference is model-written code. An error goes back to the model;
the folder is only written once the request passes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import yaml

from opforge.errors import InputError
from opforge.llm.config import LlmConfig
from opforge.llm.loop import Bound, ToolInputError, run_loop
from opforge.llm.prompts import system_prompt
from opforge.llm.providers import LlmError, Tool, open_conversation
from opforge.llm.sandbox import run_python
from opforge.workspace import check_out_folder, os_error
from opforge.workspace.atomic import write_text_atomic

CHECK_TIMEOUT_S = 120
FORMAT = """\
request.yaml fields:
- name: snake_case identifier (the op and file names)
- description: one line
- category: elementwise | reduction | norm | activation | other
- inputs: ordered mapping; each {shape: [symbols or ints], dtype: [bfloat16, float16, float32] or 'like <input>',
  optional requires_grad: bool (with backward: true, default true for a floating input; write false for a
  constant such as a table or a target), optional range: [low, high]}
- attributes: mapping of keyword arguments {type: float|int|bool|str|ints|floats, default: value or null}
- outputs: optional mapping {name: {shape: [...], dtype: like <input>}}
- reference: reference.py:forward  (plain PyTorch, computes in the dtype it is given, no data-dependent branches)
- backward: true when gradients are wanted
- shapes: {p0: [ {SYMBOL: size, ...}, ... ]}  the shapes that matter most
- tolerance: optional {dtype: {atol, rtol}}; perf_target: optional {speedup_vs_eager: number}
The reference's signature is the inputs in order, then the attributes as keyword arguments with their defaults."""

_CHECK = """\
import sys
from opforge.errors import InputError
from opforge.request import load_request
try:
    req = load_request(sys.argv[1])  # the yaml first: it needs no torch, so a bad field is answered at once
    from opforge.codegen.trace import trace_request
    trace_request(req)
except InputError as exc:
    print(f"error: {exc}")
    sys.exit(2)
except Exception as exc:
    print(f"error: tracing the reference failed: {type(exc).__name__}: {exc}")
    sys.exit(2)
print("ok")
"""


def check_request(folder: Path, drop_env: tuple[str, ...] = ()) -> str | None:
    """None when the request loads and its reference traces; else one line saying why not."""
    res = run_python(["-c", _CHECK, str(folder)], folder, CHECK_TIMEOUT_S, drop_env=drop_env)
    if res.timed_out:
        return f"checking the request took over {CHECK_TIMEOUT_S} s"
    return None if res.returncode == 0 else (res.last_line or "the check failed")


def draft_request(text: str, out: Path, cfg: LlmConfig, *, ask: Callable[[str], str] | None = None,
                  force: bool = False) -> dict:
    """Write the request folder `out` from `text`; `ask` (interactive) answers the model's questions."""
    out = Path(out)
    check_out(out, force)
    if not text.strip():
        raise InputError("request", "the description is empty")
    drop = (cfg.api_key_env,) if cfg.api_key_env else ()
    stage = Path(tempfile.mkdtemp(prefix=".opforge-draft-"))
    done: dict = {}
    asked: list[dict] = []

    def write_request(request_yaml: str, reference_py: str, assumptions: list) -> str:
        try:
            doc = yaml.safe_load(request_yaml)
        except yaml.YAMLError as exc:
            raise ToolInputError(f"request_yaml is not valid YAML: {getattr(exc, 'problem', exc)}") from None
        if not isinstance(doc, dict):
            raise ToolInputError("request_yaml must be a mapping")
        ref = str(doc.get("reference", "reference.py:forward")).split(":")[0]
        if "/" in ref or not ref.endswith(".py"):
            raise ToolInputError("reference must name a .py file beside request.yaml")
        if not isinstance(assumptions, list) or not all(isinstance(a, str) for a in assumptions):
            raise ToolInputError("assumptions must be a list of strings")
        for f in stage.iterdir():
            f.unlink()
        (stage / "request.yaml").write_text(request_yaml)
        (stage / ref).write_text(reference_py)
        problem = check_request(stage, drop)
        if problem:
            raise ToolInputError(f"the request does not pass `opforge op run`'s checks: {problem}")
        done.update(assumptions=list(assumptions), reference=ref, name=doc.get("name"))
        return "accepted"

    def ask_user(questions: list) -> str:
        if not isinstance(questions, list) or not questions:
            raise ToolInputError("questions must be a non-empty list of strings")
        answers = []
        for q in questions[:5]:
            a = ask(str(q)) if ask else ""
            asked.append({"question": str(q), "answer": a})
            answers.append(f"Q: {q}\nA: {a or '(no answer: decide and list it as an assumption)'}")
        return "\n\n".join(answers)

    tools = [Bound(Tool("write_request", "Write request.yaml, the reference module and your assumptions; opforge "
                        "checks them and answers 'accepted' or the error to fix.",
                        {"type": "object", "properties": {
                            "request_yaml": {"type": "string"}, "reference_py": {"type": "string"},
                            "assumptions": {"type": "array", "items": {"type": "string"}}},
                         "required": ["request_yaml", "reference_py", "assumptions"]}), write_request, finishes=True)]
    if ask is not None:
        tools.insert(0, Bound(Tool("ask_user", "Ask the user up to 5 clarifying questions, before writing.",
                                   {"type": "object", "properties": {"questions": {"type": "array",
                                                                                   "items": {"type": "string"}}},
                                    "required": ["questions"]}), ask_user))
    message = ("Turn this operator request into an opforge request folder.\n\n" + FORMAT + "\n\nRequest:\n" + text +
               "\n\nList every assumption you make (shapes, dtypes, attributes, edge cases) in `assumptions`." +
               (" You may ask the user first with ask_user." if ask else ""))
    try:
        try:
            conv = open_conversation(cfg, system_prompt("analyst"))
            result = run_loop(conv, tools, message, cfg.max_turns)
        except LlmError:
            raise
        if not done:
            raise LlmError(f"no valid request after {result.turns} replies ({result.stopped}); "
                                      f"last reply: {result.final_text[:200]!r}")
        try:
            _place(stage, out, force)
        except OSError as exc:  # the folder or its parent changed under us while the model worked
            raise os_error(out, exc) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    lines = [f"# Assumptions for {done['name']}", "", f"Request: {text.strip()}", ""]
    lines += [f"- {a}" for a in done["assumptions"]] or ["- none"]
    if asked:
        lines += ["", "## Questions asked", ""] + [f"- {q['question']} — {q['answer'] or '(no answer)'}" for q in asked]
    write_text_atomic(out / "ASSUMPTIONS.md", "\n".join(lines) + "\n")
    write_text_atomic(out / "assumptions.json", json.dumps({"request": text, "assumptions": done["assumptions"],
                                                           "questions": asked}, indent=2) + "\n")
    return {"request_dir": str(out), "name": done["name"], "assumptions": done["assumptions"], "questions": asked,
            "turns": result.turns}


def check_out(out: Path, force: bool = False) -> None:
    """Refuse, in one line naming `out`, a request folder that cannot be written, before the model is asked: a
    file in its place or above it, a parent that cannot be made, a non-empty folder without `force`."""
    try:
        if out.is_dir() and any(out.iterdir()) and not force:
            raise InputError(str(out), "folder exists and is not empty (or --force to replace it)")
    except OSError as exc:  # a folder that cannot be looked into
        raise os_error(out, exc) from None
    check_out_folder(out, "the request folder to write")


def _place(stage: Path, out: Path, force: bool) -> None:
    """Move the checked files into `out` all at once (a temporary sibling renamed into place)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    for f in stage.iterdir():
        shutil.copy2(f, tmp / f.name)
    if out.exists():
        if force or not any(out.iterdir()):
            shutil.rmtree(out)
    os.replace(tmp, out)
