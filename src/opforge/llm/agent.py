"""Stage 5 by a model: one attempt is one conversation with the developer role, whose tools are opforge's own
functions on the workspace. The attempt carries the stage, its index, the mode (first_impl, retry_impl,
precision_fix) and the last failure's summary; the state machine's budget decides whether another comes.

Whatever the model says, opforge then checks the impl itself (`develop.verify`) and the runner applies the
stage 5 gates; the model's own tool results count for nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from opforge.llm.config import LlmConfig
from opforge.llm.develop import compile_check, run_tests, static_check, verify, write_tests
from opforge.llm.engines import attempt_mode, last_failures
from opforge.llm.loop import Bound, ToolInputError, run_loop
from opforge.llm.prompts import system_prompt
from opforge.llm.providers import LlmError, Tool, open_conversation
from opforge.orchestrator.gates import run_gates
from opforge.orchestrator.state import RETRY_BUDGET
from opforge.workspace import REQUEST_COPY, StageOutcome, Workspace, events
from opforge.workspace.atomic import write_text_atomic

READ_LIMIT = 20000
HIDDEN = {".orchestrator.lock", ".precision_records.jsonl"}


def _schema(props: dict | None = None, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props or {}, "required": required or []}


def _inside(ws: Workspace, rel: str) -> Path:
    p = (ws.root / rel).resolve()
    if ws.root.resolve() not in (p, *p.parents) or p.name in HIDDEN:
        raise ToolInputError(f"{rel!r} is not a workspace file")
    return p


def developer_tools(ws: Workspace, state, cfg: LlmConfig, submitted: dict) -> list[Bound]:
    drop = (cfg.api_key_env,) if cfg.api_key_env else ()

    def list_artifacts() -> str:
        return "\n".join(sorted(str(p.relative_to(ws.root)) for p in ws.root.rglob("*") if p.is_file()
                                and "history_version" not in p.parts and p.name not in HIDDEN))

    def read_artifact(path: str) -> str:
        p = _inside(ws, path)
        if not p.is_file():
            raise ToolInputError(f"{path!r} does not exist; list_artifacts shows what does")
        text = p.read_text(errors="replace")
        return text if len(text) <= READ_LIMIT else text[:READ_LIMIT] + "\n…(cut)"

    def write_impl(source: str) -> str:
        if not isinstance(source, str) or not source.strip():
            raise ToolInputError("source must be the whole Python module as one string")
        try:
            compile(source, ws.impl, "exec")  # parse only: compiling runs nothing
        except SyntaxError as exc:
            raise ToolInputError(f"not valid Python, line {exc.lineno}: {exc.msg}; nothing was written") from None
        write_text_atomic(ws.path(ws.impl), source)
        return f"wrote {ws.impl} ({len(source.splitlines())} lines)"

    def check_gates() -> str:
        bad = static_check(ws, state)
        if bad is None:
            compile_check(ws, state, cfg.code_timeout_s, drop)  # refreshes compile.json for G5-IMPL-COMPILES
        gates = [{k: g[k] for k in ("id", "passed", "message")} for g in run_gates(ws, 5, state)
                 if g["id"].startswith("G5-IMPL")]
        return json.dumps({"passed": bad is None, "problem": bad.summary if bad else "", "gates": gates}, indent=1)

    def _tests(level0_only: bool) -> str:
        bad = static_check(ws, state)
        if bad:
            return f"not run: {bad.summary}"
        rc, line, records, errors = run_tests(ws, cfg.code_timeout_s, level0_only=level0_only, drop_env=drop)
        failing = [{"case": r["case"], "outputs": [{k: o.get(k) for k in ("name", "max_abs", "mismatches", "worst")}
                                                   for o in r["outputs"] if not o["passed"]]}
                   for r in records if not r["passed"]][:4]
        return json.dumps({"exit_code": rc, "pytest": line, "cases": len(records),
                           "failed_cases": failing, "errors": errors}, indent=1, default=str)

    def run_tests_tool(scope: str = "level0") -> str:
        if scope not in ("level0", "all"):
            raise ToolInputError("scope is 'level0' or 'all'")
        return _tests(scope == "level0")

    def run_precision() -> str:
        return _tests(True)

    def run_benchmark() -> str:
        return json.dumps({"timed": False, "reason": "kernels are timed at stage 7 on an accelerator; under "
                                                       "Triton's interpreter a time measures Python"})

    def submit(note: str = "") -> str:
        submitted["note"] = str(note)[:500]
        return "submitted; opforge now runs the gates and the full tests"

    s = _schema
    return [
        Bound(Tool("list_artifacts", "List the workspace files.", s()), list_artifacts),
        Bound(Tool("read_artifact", "Read a workspace file (SPEC.md, DESIGN.md, api_report.json, "
                   "request/reference.py, PRECISION.md, the impl...).",
                   s({"path": {"type": "string"}}, ["path"])), read_artifact),
        Bound(Tool("write_impl", f"Write the whole {ws.impl} module (replaces it).",
                   s({"source": {"type": "string"}}, ["source"])), write_impl),
        Bound(Tool("check_gates", "Run the stage 5 gates that read the impl's source.", s()), check_gates),
        Bound(Tool("run_tests", "Run the stage 5 tests in a child process (scope 'level0' or 'all').",
                   s({"scope": {"type": "string", "enum": ["level0", "all"]}})), run_tests_tool),
        Bound(Tool("run_precision", "Run the Level 0 precision cases; failing cases come with worst elements.",
                   s()), run_precision),
        Bound(Tool("run_benchmark", "Time the kernel (only on an accelerator).", s()), run_benchmark),
        Bound(Tool("submit", "Finish this attempt; opforge then verifies the impl.",
                   s({"note": {"type": "string"}})), submit, finishes=True),
    ]


def task_message(ws: Workspace, req, header: dict) -> str:
    spec = json.loads(ws.path("spec.json").read_text())
    api = json.loads(ws.path("api_report.json").read_text())
    ref = ws.path(REQUEST_COPY) / req.reference_file
    facts = {k: spec[k] for k in ("op_name", "supported_dtypes", "inputs", "outputs", "default_params",
                                  "runtime_params", "backward", "grad_inputs", "exact_outputs", "tolerance")
             if k in spec}
    lines = [f"Stage 5 (develop), attempt {header['attempt']} of {header['budget']}, mode {header['mode']}.", ""]
    if header["last_failure"]:
        lines += ["The last attempt failed:", header["last_failure"], ""]
    lines += [f"Write `{ws.impl}` for the operator below. Ops the templates could not lower: "
              f"{', '.join(api.get('model_lowered') or []) or 'none'}.", "",
              "SPEC facts:", "```yaml", yaml.safe_dump(facts, sort_keys=False, width=110).rstrip(), "```"]
    if ref.exists():
        lines += ["", f"The PyTorch reference ({ref.name}) defines what to compute (do not import it):",
                  "```python", ref.read_text().rstrip(), "```"]
    if header["mode"] != "first_impl" and ws.path(ws.impl).exists():
        lines += ["", "The impl of the last attempt:", "```python", ws.path(ws.impl).read_text().rstrip(), "```"]
    lines += ["", "Use write_impl, then check_gates and run_tests; call submit when they pass."]
    return "\n".join(lines)


def model_develop(ws: Workspace, req, state, cfg: LlmConfig, engine: str) -> StageOutcome:
    attempt = state.stages[5].attempts
    failures = last_failures(ws.root, 5)
    header = {"stage": 5, "attempt": attempt, "budget": RETRY_BUDGET[5], "mode": attempt_mode(attempt, failures),
              "last_failure": failures[-1] if failures and attempt > 1 else None}
    events.log_event(ws.root, "llm_attempt", engine=engine, **header, **cfg.public())
    write_tests(ws)
    arts = ws.stage_artifacts(5)
    submitted: dict = {}
    try:
        conv = open_conversation(cfg, system_prompt("developer"))
        result = run_loop(conv, developer_tools(ws, state, cfg, submitted), task_message(ws, req, header),
                          cfg.max_turns)
    except LlmError as exc:
        events.log_event(ws.root, "llm_error", stage=5, attempt=attempt, reason=str(exc))
        return StageOutcome("failed", f"model: {exc}", retryable=False)
    events.log_event(ws.root, "llm_reply", stage=5, attempt=attempt, turns=result.turns, stopped=result.stopped,
                     calls=[f"{c['tool']}:{'ok' if c['ok'] else 'error'}" for c in result.calls], usage=result.usage)
    verdict = verify(ws, req, state, cfg.code_timeout_s, drop_env=(cfg.api_key_env,) if cfg.api_key_env else ())
    if verdict.gates is not None:
        events.log_event(ws.root, "gates", stage=5, by=f"{engine} engine, before running the impl",
                         results=[{k: g[k] for k in ("id", "passed", "message")} for g in verdict.gates])
    present = [a for a in arts if ws.path(a).exists()]
    if verdict.passed:
        return StageOutcome("completed", verdict.summary, artifacts=present,
                            details={"precision_passed": True, "engine": engine}, retryable=True)
    prefix = {"precision": "precision failed: ", "tests": "tests failed: "}.get(verdict.kind, "")
    reason = prefix + verdict.summary
    if attempt >= RETRY_BUDGET[5]:
        history = failures[-(RETRY_BUDGET[5] - 1):] + [reason]
        reason = f"{len(history)} attempts, none passed: " + " | ".join(
            f"#{i + 1} {r[:240]}" for i, r in enumerate(history))
    events.log_event(ws.root, "llm_verdict", stage=5, attempt=attempt, verdict=verdict.kind, summary=verdict.summary)
    return StageOutcome("failed", reason, artifacts=present, retryable=True)
