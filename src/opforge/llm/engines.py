"""Engines the runner asks for a stage's work: `deterministic` (templates only), `llm` (a configured model
writes stage 5's kernel), `auto` (templates where they can, the model where stage 2 finds what they cannot
lower), `host` (the kernel a host agent's developer wrote into the workspace).

Whatever an engine produces goes through the same runner, gates and stage 5 tests as a template kernel. An
engine only decides who writes; it never decides what passes.
"""

from __future__ import annotations

from pathlib import Path

from opforge.errors import InputError
from opforge.llm.config import LlmConfig, load_config
from opforge.workspace import StageFn, StageOutcome, Workspace, events

ENGINES = ("deterministic", "llm", "auto", "host")


class Engine:
    name = "deterministic"
    cfg: LlmConfig | None = None

    def writes_kernels(self, state) -> bool:
        """Whether stage 5's impl comes from this engine instead of the templates."""
        return False

    def stage_fn(self, stage: int, state, default: StageFn) -> StageFn:
        return default

    def reopens(self, state) -> bool:
        """A run that ended BLOCKED_API may go on with an engine that writes kernels itself."""
        return False


class ModelEngine(Engine):
    """Shared by llm, auto and host: what to do when the templates cannot lower an op."""

    always = True  # llm and host write every kernel; auto only those the templates cannot

    def writes_kernels(self, state) -> bool:
        return self.always or bool(state.options.get("model_ops"))

    def reopens(self, state) -> bool:
        return bool(state.terminal and state.terminal.get("status") == "BLOCKED_API")

    def stage_fn(self, stage: int, state, default: StageFn) -> StageFn:
        from opforge.llm import fallback

        if stage == 2:
            return lambda ws, req, st: fallback.api_stage(ws, req, st, default, self.name)
        if stage == 4 and state.options.get("model_ops"):
            return fallback.design_stage
        if stage == 5 and self.writes_kernels(state):
            return self.develop
        return default

    def develop(self, ws: Workspace, req, state) -> StageOutcome:
        raise NotImplementedError


class LlmEngine(ModelEngine):
    name = "llm"

    def __init__(self, cfg: LlmConfig):
        self.cfg = cfg

    def develop(self, ws, req, state):
        from opforge.llm.agent import model_develop

        return model_develop(ws, req, state, self.cfg, self.name)


class AutoEngine(LlmEngine):
    name = "auto"
    always = False


class HostEngine(ModelEngine):
    name = "host"
    code_timeout_s = 1800

    def develop(self, ws, req, state):
        from opforge.llm.develop import verify, write_tests

        if not ws.path(ws.impl).exists():
            return StageOutcome("failed", f"{ws.impl} is missing: the developer writes it before stage 5 runs",
                                artifacts=[], retryable=False)
        write_tests(ws)
        v = verify(ws, req, state, self.code_timeout_s)
        arts = ws.stage_artifacts(5)
        present = [a for a in arts if ws.path(a).exists()]
        if v.kind in ("gate", "missing"):
            return StageOutcome("failed", v.summary, artifacts=present)
        # as with a template kernel, a precision failure goes on to stage 6, which localises it
        return StageOutcome("completed", v.summary if v.passed else f"precision failed: {v.summary}",
                            artifacts=present, details={"precision_passed": v.passed})


def make_engine(name: str, llm_config: str | Path | None = None) -> Engine:
    """The engine by name; `llm` needs a configuration (InputError when missing or wrong), `auto` uses one if
    it finds one and behaves as `deterministic` otherwise."""
    if name not in ENGINES:
        raise InputError("--engine", f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}")
    if name == "deterministic":
        return Engine()
    if name == "host":
        return HostEngine()
    cfg = load_config(llm_config, required=name == "llm")
    if cfg is None:
        return Engine()
    return LlmEngine(cfg) if name == "llm" else AutoEngine(cfg)


def last_failures(ws_dir: Path, stage: int) -> list[str]:
    """Reasons of the stage's failed attempts, oldest first (from the events log)."""
    return [e.get("reason", "") for e in events.read_events(ws_dir)
            if e.get("kind") == "stage_failed" and e.get("stage") == stage]


def attempt_mode(attempt: int, failures: list[str]) -> str:
    if attempt <= 1 or not failures:
        return "first_impl"
    return "precision_fix" if failures[-1].startswith("precision failed") else "retry_impl"
