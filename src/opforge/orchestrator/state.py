"""The orchestrator's resumable state: one JSON file per workspace.

The file is the only memory between runs, so loading is strict: anything the schema does not allow is an
InputError naming the key, and the file is never rewritten or repaired on the way.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opforge.errors import InputError
from opforge.workspace.atomic import write_json_atomic
from opforge.workspace.events import utc_now

STAGES = {1: "requirement", 2: "api", 3: "golden", 4: "design", 5: "develop", 6: "precision",
          7: "performance"}
# Attempts per stage; for stage 7 it is the number of optimisation rounds instead.
RETRY_BUDGET = {1: 3, 2: 3, 3: 3, 4: 3, 5: 5, 6: 5, 7: 10}
STAGE_STATUSES = ("pending", "in_progress", "completed", "failed", "skipped")
TERMINAL_STATUSES = ("SUCCESS", "BLOCKED_SPEC", "BLOCKED_API", "BLOCKED_GOLDEN", "BLOCKED_DESIGN",
                     "BLOCKED_IMPL", "BLOCKED_ACCURACY", "BLOCKED_ENVIRONMENT")
BLOCKED_BY_STAGE = {1: "BLOCKED_SPEC", 2: "BLOCKED_API", 3: "BLOCKED_GOLDEN", 4: "BLOCKED_DESIGN",
                    5: "BLOCKED_IMPL", 6: "BLOCKED_ACCURACY", 7: "BLOCKED_ENVIRONMENT"}
PERF_STAGE = 7

STATE_FILE = ".orchestrator_state.json"
SCHEMA_VERSION = 1


class BudgetExceeded(RuntimeError):
    """A stage was begun more often than its retry budget allows."""


def _new_perf() -> dict[str, Any]:
    return {"rounds": 0, "best": None, "last_improvement": None, "rounds_without_gain": 0, "history": []}


@dataclass
class StageRecord:
    status: str = "pending"
    attempts: int = 0
    started_at: str | None = None
    finished_at: str | None = None
    reason: str | None = None
    artifacts: dict[str, str] = field(default_factory=dict)  # relative path -> sha256 at completion

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "attempts": self.attempts, "started_at": self.started_at,
                "finished_at": self.finished_at, "reason": self.reason, "artifacts": dict(self.artifacts)}


@dataclass
class State:
    schema_version: int
    op_name: str
    request_dir: str
    engine: str
    created_at: str
    updated_at: str
    current_stage: int
    stages: dict[int, StageRecord]
    perf: dict[str, Any] = field(default_factory=_new_perf)
    spec_hash: str | None = None
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    terminal: dict[str, str] | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def new(cls, op_name: str, request_dir: str | os.PathLike, engine: str = "deterministic",
            options: dict[str, Any] | None = None) -> State:
        now = utc_now()
        return cls(schema_version=SCHEMA_VERSION, op_name=op_name, request_dir=str(request_dir),
                   engine=engine, created_at=now, updated_at=now, current_stage=1,
                   stages={k: StageRecord() for k in STAGES}, options=dict(options or {}))

    # -- serialisation -------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "op_name": self.op_name,
            "request_dir": self.request_dir,
            "engine": self.engine,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "current_stage": self.current_stage,
            "stages": {str(k): self.stages[k].to_dict() for k in sorted(self.stages)},
            "perf": json.loads(json.dumps(self.perf)),
            "spec_hash": self.spec_hash,
            "rollbacks": [dict(r) for r in self.rollbacks],
            "terminal": dict(self.terminal) if self.terminal is not None else None,
            "options": json.loads(json.dumps(self.options)),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "state") -> State:
        """Validate and convert; any violation is an InputError(where, "<key>: <problem>")."""
        return _parse_state(d, where)

    # -- transitions ---------------------------------------------------------------------------------------

    def _rec(self, stage: int) -> StageRecord:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages are 1..7")
        return self.stages[stage]

    def begin(self, stage: int) -> None:
        """Start an attempt; it becomes the current stage. Stage 7 is bounded by rounds, not attempts."""
        rec = self._rec(stage)
        if stage != PERF_STAGE and rec.attempts + 1 > RETRY_BUDGET[stage]:
            raise BudgetExceeded(
                f"stage {stage} ({STAGES[stage]}) has used all {RETRY_BUDGET[stage]} attempts")
        rec.status = "in_progress"
        rec.attempts += 1
        rec.started_at = utc_now()
        rec.finished_at = None
        rec.reason = None
        self.current_stage = stage

    def complete(self, stage: int, artifacts: dict[str, str]) -> None:
        rec = self._rec(stage)
        rec.status = "completed"
        rec.finished_at = utc_now()
        rec.reason = None
        rec.artifacts = dict(artifacts)

    def fail(self, stage: int, reason: str) -> None:
        rec = self._rec(stage)
        rec.status = "failed"
        rec.finished_at = utc_now()
        rec.reason = reason

    def skip(self, stage: int, reason: str) -> None:
        rec = self._rec(stage)
        rec.status = "skipped"
        rec.finished_at = utc_now()
        rec.reason = reason

    def set_terminal(self, status: str, reason: str) -> None:
        if status not in TERMINAL_STATUSES:
            raise ValueError(
                f"unknown terminal status {status!r}; expected one of {', '.join(TERMINAL_STATUSES)}")
        self.terminal = {"status": status, "reason": reason}

    def reset_from(self, stage: int, reason: str | None = None) -> None:
        """Send `stage` and everything after it back to pending; with a reason, record it as a rollback.

        Perf progress is cleared too: stage 7 always comes after, and its budget is counted in rounds.
        """
        self._rec(stage)
        for k in STAGES:
            if k >= stage:
                self.stages[k] = StageRecord()
        self.perf = _new_perf()
        self.terminal = None
        self.current_stage = stage
        if reason is not None:
            self.rollbacks.append({"at": utc_now(), "to_stage": stage, "reason": reason})

    def freeze_spec(self, spec_hash: str) -> None:
        if self.spec_hash is not None and self.spec_hash != spec_hash:
            raise RuntimeError("the spec is frozen with a different hash; use amend_spec to change it")
        self.spec_hash = spec_hash

    def amend_spec(self, spec_hash: str, reason: str = "spec amended",
                   artifacts: dict[str, str] | None = None) -> None:
        """Replace the frozen spec hash; every stage built on the old spec starts over.

        `artifacts`, when given, replaces stage 1's recorded hashes so they match the amended files.
        """
        self.spec_hash = spec_hash
        if artifacts is not None:
            self.stages[1].artifacts = dict(artifacts)
        self.reset_from(2, reason=reason)

    # -- queries -------------------------------------------------------------------------------------------

    def next_stage(self) -> int | None:
        for k in sorted(STAGES):
            if self.stages[k].status not in ("completed", "skipped"):
                return k
        return None

    def budget_left(self, stage: int) -> int:
        rec = self._rec(stage)
        # the performance stage's budget is its tuning rounds, but a stage that keeps crashing before its first
        # round must run out too
        used = max(self.perf["rounds"], rec.attempts) if stage == PERF_STAGE else rec.attempts
        return max(0, RETRY_BUDGET[stage] - used)


# -- loading -------------------------------------------------------------------------------------------------


class _Bad(Exception):
    def __init__(self, key: str, what: str):
        self.key = key
        self.what = what


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _get(d: dict, key: str, path: str) -> Any:
    if key not in d:
        raise _Bad(path + key, "missing key")
    return d[key]


def _int(v: Any, key: str) -> int:
    # bool is an int in Python but never a valid count or stage here.
    if not isinstance(v, int) or isinstance(v, bool):
        raise _Bad(key, f"expected an integer, got {_type_name(v)}")
    return v


def _str(v: Any, key: str, nullable: bool = False) -> str | None:
    if v is None and nullable:
        return None
    if not isinstance(v, str):
        raise _Bad(key, f"expected a string{' or null' if nullable else ''}, got {_type_name(v)}")
    return v


def _dict(v: Any, key: str) -> dict:
    if not isinstance(v, dict):
        raise _Bad(key, f"expected an object, got {_type_name(v)}")
    return v


def _list(v: Any, key: str) -> list:
    if not isinstance(v, list):
        raise _Bad(key, f"expected a list, got {_type_name(v)}")
    return v


def _stage_no(v: int, key: str) -> int:
    if v not in STAGES:
        raise _Bad(key, f"unknown stage number {v}; stages are 1..7")
    return v


def _no_extra(d: dict, allowed: tuple[str, ...], path: str) -> None:
    for k in d:
        if k not in allowed:
            raise _Bad(path + str(k), "unknown key")


_TOP_KEYS = ("schema_version", "op_name", "request_dir", "engine", "created_at", "updated_at",
             "current_stage", "stages", "perf", "spec_hash", "rollbacks", "terminal", "options")
_STAGE_KEYS = ("status", "attempts", "started_at", "finished_at", "reason", "artifacts")


def _parse_stage(d: Any, path: str) -> StageRecord:
    d = _dict(d, path.rstrip("."))
    _no_extra(d, _STAGE_KEYS, path)
    status = _str(_get(d, "status", path), path + "status")
    if status not in STAGE_STATUSES:
        raise _Bad(path + "status", f"unknown status {status!r}; expected one of {', '.join(STAGE_STATUSES)}")
    attempts = _int(_get(d, "attempts", path), path + "attempts")
    if attempts < 0:
        raise _Bad(path + "attempts", f"negative attempt count {attempts}")
    artifacts = _dict(_get(d, "artifacts", path), path + "artifacts")
    for rel, digest in artifacts.items():
        _str(digest, f"{path}artifacts.{rel}")
    return StageRecord(
        status=status,
        attempts=attempts,
        started_at=_str(_get(d, "started_at", path), path + "started_at", nullable=True),
        finished_at=_str(_get(d, "finished_at", path), path + "finished_at", nullable=True),
        reason=_str(_get(d, "reason", path), path + "reason", nullable=True),
        artifacts=dict(artifacts),
    )


def _parse(d: Any) -> State:
    if not isinstance(d, dict):
        raise _Bad("(top level)", f"expected an object, got {_type_name(d)}")
    version = _int(_get(d, "schema_version", ""), "schema_version")
    if version > SCHEMA_VERSION:
        raise _Bad("schema_version",
                   f"version {version} is newer than this opforge supports ({SCHEMA_VERSION})")
    if version < 1:
        raise _Bad("schema_version", f"invalid version {version}")
    _no_extra(d, _TOP_KEYS, "")

    raw_stages = _dict(_get(d, "stages", ""), "stages")
    stages: dict[int, StageRecord] = {}
    for k, v in raw_stages.items():
        if k not in {str(n) for n in STAGES}:
            raise _Bad(f"stages.{k}", "unknown stage number; stages are 1..7")
        stages[int(k)] = _parse_stage(v, f"stages.{k}.")
    for k in STAGES:
        if k not in stages:
            raise _Bad(f"stages.{k}", "missing key")

    perf = _dict(_get(d, "perf", ""), "perf")
    for k in ("rounds", "rounds_without_gain"):
        _int(_get(perf, k, "perf."), f"perf.{k}")
    for k in ("best", "last_improvement"):
        _get(perf, k, "perf.")
    _list(_get(perf, "history", "perf."), "perf.history")

    rollbacks = _list(_get(d, "rollbacks", ""), "rollbacks")
    for i, r in enumerate(rollbacks):
        p = f"rollbacks.{i}."
        r = _dict(r, p.rstrip("."))
        _str(_get(r, "at", p), p + "at")
        _stage_no(_int(_get(r, "to_stage", p), p + "to_stage"), p + "to_stage")
        _str(_get(r, "reason", p), p + "reason")

    terminal = _get(d, "terminal", "")
    if terminal is not None:
        terminal = _dict(terminal, "terminal")
        _no_extra(terminal, ("status", "reason"), "terminal.")
        status = _str(_get(terminal, "status", "terminal."), "terminal.status")
        if status not in TERMINAL_STATUSES:
            raise _Bad("terminal.status",
                       f"unknown status {status!r}; expected one of {', '.join(TERMINAL_STATUSES)}")
        _str(_get(terminal, "reason", "terminal."), "terminal.reason")
        terminal = dict(terminal)

    return State(
        schema_version=version,
        op_name=_str(_get(d, "op_name", ""), "op_name"),
        request_dir=_str(_get(d, "request_dir", ""), "request_dir"),
        engine=_str(_get(d, "engine", ""), "engine"),
        created_at=_str(_get(d, "created_at", ""), "created_at"),
        updated_at=_str(_get(d, "updated_at", ""), "updated_at"),
        current_stage=_stage_no(_int(_get(d, "current_stage", ""), "current_stage"), "current_stage"),
        stages={k: stages[k] for k in sorted(stages)},
        perf=perf,
        spec_hash=_str(_get(d, "spec_hash", ""), "spec_hash", nullable=True),
        rollbacks=[dict(r) for r in rollbacks],
        terminal=terminal,
        options=dict(_dict(_get(d, "options", ""), "options")),
    )


def _parse_state(d: Any, where: str) -> State:
    try:
        return _parse(d)
    except _Bad as e:
        raise InputError(where, f"invalid state file: {e.key}: {e.what}; it was not modified") from None


def state_path(ws_dir: str | os.PathLike) -> Path:
    return Path(ws_dir) / STATE_FILE


def load_state(ws_dir: str | os.PathLike) -> State:
    path = state_path(ws_dir)
    where = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(where, "no state file: not an opforge workspace") from None
    except OSError as e:
        raise InputError(where, f"cannot read state file: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(where, f"corrupt state file (not UTF-8 at byte {e.start}); "
                                "it was not modified") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(where, f"corrupt state file (invalid JSON at line {e.lineno} column {e.colno}); "
                                "it was not modified") from None
    return _parse_state(data, where)


def save_state(ws_dir: str | os.PathLike, state: State) -> None:
    state.updated_at = utc_now()
    write_json_atomic(state_path(ws_dir), state.to_dict())
