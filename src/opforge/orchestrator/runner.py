"""The stage loop: create a workspace, run stages in order under the workspace lock, gate each one,
record every transition in the state file and events.jsonl, snapshot what each stage wrote.

Interrupting a run at any point is safe: the state file is only ever replaced atomically, a stage that
was in progress is simply run again by `resume`, and completed stages are never redone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from opforge.codegen.trace import trace_request
from opforge.errors import InputError
from opforge.i18n import check_language, language, using
from opforge.llm.engines import make_engine
from opforge.orchestrator import history
from opforge.orchestrator.gates import blocking_failures, run_gates
from opforge.orchestrator.state import (
    BLOCKED_BY_STAGE,
    STAGES,
    STATE_FILE,
    BudgetExceeded,
    State,
    load_state,
    save_state,
)
from opforge.request import load_request
from opforge.skills.op_api import stage as op_api
from opforge.skills.op_design import stage as op_design
from opforge.skills.op_develop import stage as op_develop
from opforge.skills.op_golden import stage as op_golden
from opforge.skills.op_perf import stage as op_perf
from opforge.skills.op_precision import stage as op_precision
from opforge.skills.op_requirement import stage as op_requirement
from opforge.workspace import (
    REQUEST_COPY,
    StageFn,
    StageOutcome,
    Workspace,
    check_out_folder,
    copy_request,
    events,
    os_error,
)
from opforge.workspace.atomic import sha256_file, workspace_lock

# The stage registry: which skill runs each stage, in order. A stage's name, retry budget and blocked status
# stay in state.py, which must load (for `op status`, the gate hook) without importing any skill.
STAGE_REGISTRY: dict[int, StageFn] = {
    1: op_requirement.run,
    2: op_api.run,
    3: op_golden.run,
    4: op_design.run,
    5: op_develop.run,
    6: op_precision.run,
    7: op_perf.run,
}

Progress = Callable[[str, int, str], None]  # (event, stage, text)


def create_workspace(request_dir: str | Path, out_dir: str | Path, *, force: bool = False,
                     quick: bool = False, lang: str | None = None) -> Workspace:
    """Validate the request (and trace its reference) before anything is written, then create the
    workspace in a temporary folder and rename it into place, so no half-made workspace can exist.
    An --out that cannot be a folder (a file, an unwritable place) is bad input, found before the trace.
    The workspace keeps `lang` (default: OPFORGE_LANG's, else English): its reports are written in it."""
    out = Path(out_dir)
    lang = check_language(lang) if lang else language()
    check_out_folder(out)
    req = load_request(request_dir)
    trace_request(req)
    try:
        if out.exists() and any(out.iterdir()):
            if not force:
                what = "already an opforge workspace: use `opforge op resume`" if (out / STATE_FILE).exists() \
                    else "folder exists and is not empty"
                raise InputError(str(out), f"{what} (or --force to replace it)")
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:  # what the checks above could not foresee (root on a read-only mount, /proc)
        raise os_error(out, exc) from None
    try:
        copy_request(Path(request_dir), tmp / REQUEST_COPY)
        state = State.new(req.name, str(Path(request_dir).resolve()), options={"deterministic": req.deterministic,
                                                                       "quick": quick, "lang": lang})
        save_state(tmp, state)
        events.log_event(tmp, "created", op=req.name, request=str(request_dir))
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Workspace(out, req.name)


def _hashes(ws: Workspace, rels: list[str]) -> dict[str, str]:
    return {r: sha256_file(ws.path(r)) for r in rels if ws.path(r).exists()}


def _run_one(ws: Workspace, state: State, stage: int, req, engine) -> StageOutcome:
    try:
        outcome = engine.stage_fn(stage, state, STAGE_REGISTRY[stage])(ws, req, state)
    except InputError as exc:  # the request or the reference is at fault: retrying cannot help
        return StageOutcome("blocked", str(exc))
    except Exception as exc:  # an environment failure (memory, a crashed subprocess): worth a retry
        return StageOutcome("failed", f"{type(exc).__name__}: {exc}", retryable=True)
    if outcome.status != "completed":
        return outcome
    if stage == 1:
        digest = sha256_file(ws.path("SPEC.md"))
        if state.spec_hash and state.spec_hash != digest:
            state.amend_spec(digest, reason="stage 1 re-run changed SPEC.md",
                             artifacts=_hashes(ws, outcome.artifacts))
        else:
            state.freeze_spec(digest)
    gates = run_gates(ws, stage, state)
    events.log_event(ws.root, "gates", stage=stage, results=[{k: g[k] for k in ("id", "passed", "message")}
                                                              for g in gates])
    bad = blocking_failures(gates)
    if bad:
        # a model may try again after a gate failure; a template would fail the same way
        return StageOutcome("failed", "gate " + "; ".join(f"{g['id']}: {g['message']}" for g in bad),
                            artifacts=outcome.artifacts, details={"gates": gates}, retryable=outcome.retryable)
    outcome.details["gates"] = gates
    return outcome


def run_stages(ws_dir: str | Path, *, only: int | None = None, progress: Progress | None = None,
               engine: str | None = None, llm_config: str | None = None) -> State:
    """Run the pending stages (or one stage) and return the final state. `engine` (kept in the state for
    later resumes) picks who writes what the templates cannot: see opforge.llm.engines."""
    root = Path(ws_dir).resolve()
    note = progress or (lambda *a: None)
    with workspace_lock(root):
        state = load_state(root)
        ws = Workspace(root, state.op_name)
        if llm_config:
            state.options["llm_config"] = str(Path(llm_config).resolve())
        eng = make_engine(engine or state.engine, state.options.get("llm_config"))
        state.engine = engine or state.engine
        if only is None and state.terminal and eng.reopens(state):
            state.reset_from(2, reason=f"the {eng.name} engine writes what the templates could not lower")
            events.log_event(root, "engine", engine=eng.name, reopened=True)
        if only is not None:
            for k in range(1, only):
                if state.stages[k].status not in ("completed", "skipped"):
                    raise InputError(f"stage {only}", f"needs stage {k} ({STAGES[k]}) completed first")
            if state.stages[only].status in ("completed", "skipped", "failed") or state.terminal:
                if only != 1:
                    state.reset_from(only, reason=f"stage {only} re-run alone")
                else:
                    state.stages[1].status = "pending"
                    state.terminal = None
        elif state.terminal:
            return state
        req = ws.request()
        events.log_event(root, "run", only=only)
        with using(state.options.get("lang", "en")):
            _run_pending(root, ws, state, req, eng, only, note)
    return state


def _run_pending(root: Path, ws: Workspace, state: State, req, eng, only: int | None, note: Progress) -> None:
    """Run stages until the state is terminal (or the one stage asked for is done), saving after each."""
    while True:
        stage = only if only is not None else state.next_stage()
        if stage is None:
            state.set_terminal("SUCCESS", "all seven stages completed or skipped")
            save_state(root, state)
            events.log_event(root, "terminal", status="SUCCESS")
            break
        try:
            state.begin(stage)
        except BudgetExceeded as exc:
            state.set_terminal(BLOCKED_BY_STAGE[stage], str(exc))
            save_state(root, state)
            events.log_event(root, "terminal", status=state.terminal["status"], reason=str(exc))
            break
        save_state(root, state)
        events.log_event(root, "stage_started", stage=stage, attempt=state.stages[stage].attempts)
        note("start", stage, STAGES[stage])
        outcome = _run_one(ws, state, stage, req, eng)
        if outcome.status == "completed":
            state.complete(stage, _hashes(ws, outcome.artifacts))
            snap = history.snapshot(root, stage, outcome.artifacts)
            events.log_event(root, "stage_completed", stage=stage, reason=outcome.reason, snapshot=snap)
        elif outcome.status == "skipped":
            state.skip(stage, outcome.reason)
            events.log_event(root, "stage_skipped", stage=stage, reason=outcome.reason)
        else:
            state.fail(stage, outcome.reason)
            events.log_event(root, "stage_failed", stage=stage, reason=outcome.reason,
                             retryable=outcome.retryable)
            if not (outcome.retryable and state.budget_left(stage) > 0):
                state.set_terminal(BLOCKED_BY_STAGE[stage], outcome.reason)
                events.log_event(root, "terminal", status=state.terminal["status"], reason=outcome.reason)
        save_state(root, state)
        note(outcome.status, stage, outcome.reason)
        if state.terminal or only is not None:
            break


def rollback(ws_dir: str | Path, to_stage: int) -> dict:
    """Send `to_stage` and later back to pending, move those stages' artifacts out of the workspace (into
    `history_version/rolled_back_to_stage<N>_<timestamp>/`: a file in the workspace is never one that status
    calls pending), and put earlier stages' artifacts back as they were when those stages completed. Returns
    {"restored": files, "moved_aside": files, "aside": folder or None}, as the event log records it."""
    root = Path(ws_dir)
    if to_stage not in STAGES:
        raise InputError("--to", f"stage {to_stage} does not exist (1..7)")
    with workspace_lock(root):
        state = load_state(root)
        later = sorted({rel for k in STAGES if k >= to_stage for rel in state.stages[k].artifacts})
        aside, moved = history.set_aside(root, later, f"rolled_back_to_stage{to_stage}")
        restored = []
        for k in range(1, to_stage):
            snap = history.latest_snapshot(root, k)
            if snap:
                restored += history.restore(root, snap["dir"])
        state.reset_from(to_stage, reason=f"rollback to stage {to_stage}")
        save_state(root, state)
        done = {"restored": restored, "moved_aside": moved, "aside": aside}
        events.log_event(root, "rollback", to_stage=to_stage, **done)
    return done
