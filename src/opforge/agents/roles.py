"""The four roles: orchestrator, analyst, developer, perf-tuner.

Only the orchestrator moves the state (the `opforge op` commands that run, resume, re-run or roll back
stages); it never writes kernels. The others produce and review artifacts and hand back to it. The same
text becomes host agent files (`opforge init`) and the LLM engine's system prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

STATE_COMMANDS = ("opforge op run", "opforge op resume", "opforge op stage", "opforge op rollback")


@dataclass(frozen=True)
class Role:
    name: str
    description: str
    stages: tuple[int, ...]
    skills: tuple[str, ...]
    duties: tuple[str, ...]
    may_not: tuple[str, ...]
    moves_state: bool = False
    writes_code: bool = False


IMPL_CONTRACT = """\
The impl module `<op>_impl.py` (read by the tests; the gates read its source):
- `@triton.jit` kernels do all the arithmetic. Outside them only allocation (`torch.empty`, `torch.empty_like`,
  `torch.zeros`, `torch.full`), views (`.contiguous()`, `.view()`, `.reshape()`, `.numel()`, `.stride()`) and
  kernel launches are allowed (gate G5-IMPL-TRITON-ONLY); no torch math, no casts, no `.item()`.
- It never imports or names the golden or the reference, not even in a string (gate G5-IMPL-SEPARATE). It
  imports only torch, triton (with triton.language and its extra/libdevice), math, functools, typing and os, and
  of os uses only `os.environ` (read, `setdefault`), `os.getenv` and `os.path`; no torch.nn, torch.fft,
  torch.linalg, torch.special, torch.compile or torch.ops.aten; no open, exec, eval (gate G5-IMPL-IMPORTS).
- `_<op>_op` is a `torch.library.custom_op("opforge::<op>", mutates_args=())` taking the tensors in request
  order, then each run-time float attribute, then `deterministic: bool`; it has `register_fake`, and
  `register_autograd` when the request has a backward.
- `<op>(*tensors, <attribute>=<default>, ..., deterministic=False)` calls `_<op>_op` and returns the outputs
  in request order (one tensor, or a tuple).
- Outputs are new tensors (never an input or a view of one), in the input's dtype; compute in float32; use int64
  offsets; launch at least one program so empty tensors work."""

ROLES: dict[str, Role] = {r.name: r for r in (
    Role("orchestrator",
         "Drives an opforge operator run: starts it, reads state and gates, decides the next stage, hands work to "
         "the analyst, developer and perf-tuner, and is the only role that moves the workflow state.",
         stages=(1, 2, 3, 4, 5, 6, 7),
         skills=("op-requirement",),
         duties=("Start with `opforge op run REQUEST --out WS --json` (or `opforge op resume WS --json`).",
                 "After each stage read `opforge op status WS --json` and `opforge op gate WS --stage N --json`.",
                 "Hand stages 1-4 to the analyst, 5-6 to the developer, 7 to the perf-tuner; re-run a stage with "
                 "`opforge op stage WS N` once its owner has fixed its inputs.",
                 "When a run ends BLOCKED_API, the deterministic engine cannot fuse the request: ask the developer "
                 "for a hand-written impl and continue with `opforge op resume WS --engine host`; after the "
                 "developer fixes it, re-run the stage with `opforge op stage WS 5`.",
                 "Report the terminal status and its reason to the user; quote the gate ids that failed."),
         may_not=("write or edit kernels, `<op>_impl.py`, the golden or the tests",
                  "edit `.orchestrator_state.json` or `events.jsonl` by hand",
                  "declare a stage done while `opforge op gate` reports a failing S0/S1 rule"),
         moves_state=True),
    Role("analyst",
         "Turns an operator request into its specification and reference artifacts: SPEC.md, the API report, the "
         "golden and the design (stages 1-4). Use for reading requests, ATen graphs, tolerances and fusion plans.",
         stages=(1, 2, 3, 4),
         skills=("op-requirement", "op-api", "op-golden", "op-design"),
         duties=("Read request.yaml and the reference; list every assumption you make about shapes, dtypes and "
                 "attributes.",
                 "Review SPEC.md, API_REPORT.md (`unsupported` in api_report.json), `<op>_golden.py` and DESIGN.md; "
                 "check them with `opforge op gate WS --stage N --json`.",
                 "Tell the orchestrator which stage to re-run and why."),
         may_not=("run the state commands (" + ", ".join(STATE_COMMANDS) + "): ask the orchestrator",
                  "write kernels or edit `<op>_impl.py`",
                  "change SPEC.md after stage 1 froze it without the orchestrator re-running stage 1")),
    Role("developer",
         "Writes and fixes the Triton kernels of an operator (stages 5-6): `<op>_impl.py`, held to the stage 5 "
         "gates and tests. Use when a kernel must be written by hand or a precision failure must be fixed.",
         stages=(5, 6),
         skills=("op-develop", "op-precision"),
         duties=("Read SPEC.md, DESIGN.md and api_report.json before writing; keep the contract below.",
                 "Check the impl with `opforge op gate WS --stage 5 --json` and run the tests with `pytest -q` in "
                 "the workspace; read PRECISION.md for the worst elements.",
                 "Hand back to the orchestrator to run the stage; never claim a pass the gates did not report."),
         may_not=("run the state commands (" + ", ".join(STATE_COMMANDS) + "): ask the orchestrator",
                  "edit the golden, the tests, SPEC.md or DESIGN.md",
                  "compute with torch outside Triton kernels, or read the golden or the reference from the impl"),
         writes_code=True),
    Role("perf-tuner",
         "Measures and tunes an operator that already passed precision (stage 7): block sizes, warps, stages, "
         "launch grid, against eager and torch.compile. Use after stage 6 is completed or skipped.",
         stages=(7,),
         skills=("op-perf",),
         duties=("Read PERF.md and perf.json; propose one change at a time and say what figure it should move.",
                 "After a change the developer's gates and tests must still pass: ask the orchestrator to re-run "
                 "stage 5, then stage 7."),
         may_not=("run the state commands (" + ", ".join(STATE_COMMANDS) + "): ask the orchestrator",
                  "change what the kernel computes, its dtypes or its tolerances",
                  "time kernels under Triton's interpreter and report the figures as speed"),
         writes_code=True),
)}


def role_skills(role: Role, all_skills: list[str]) -> list[str]:
    """The role's own skills that exist, plus, for the orchestrator, every skill no role claims (the toolbox)."""
    claimed = {s for r in ROLES.values() for s in r.skills}
    own = [s for s in role.skills if s in all_skills]
    if role.moves_state:
        own += [s for s in all_skills if s not in claimed]
    return own


def role_body(role: Role, all_skills: list[str]) -> str:
    """The role's instructions as Markdown: the host agent file's body and the engine's system prompt."""
    lines = [f"# {role.name}", "", role.description, "",
             f"Stages: {', '.join(str(s) for s in role.stages)}.", "", "## Skills", ""]
    lines += [f"- `{s}`" for s in role_skills(role, all_skills)] or ["- (none installed)"]
    lines += ["", "## Duties", ""] + [f"- {d}" for d in role.duties]
    lines += ["", "## You may not", ""] + [f"- {m}" for m in role.may_not]
    lines += ["", "Only the orchestrator moves the state." if not role.moves_state else
              "You alone move the state, and only through the `opforge op` commands."]
    if role.writes_code:
        lines += ["", "## The impl contract", "", IMPL_CONTRACT]
    return "\n".join(lines) + "\n"
