"""The hook hosts call (`opforge hooks gate`): the gates of every opforge workspace under a folder must hold.

Claude Code sends a JSON event on standard input: for a Bash call (PreToolUse) only the commands that move
a workflow are held back; when the agent or a subagent stops, every workspace is checked (a second stop
after a block is let through, as Claude Code asks of stop hooks, so the agent cannot loop). A failing
S0/S1 rule makes the hook exit 2 with one line per failure on stderr, which the host shows to the model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from opforge.orchestrator.state import STATE_FILE

STATE_COMMAND = re.compile(r"\bopforge\s+op\s+(run|resume|stage|rollback)\b")
SKIP_DIRS = {".git", "node_modules", "history_version", "__pycache__", ".venv", "request"}
MAX_DEPTH = 4


def find_workspaces(root: Path, depth: int = MAX_DEPTH) -> list[Path]:
    found = []
    if (root / STATE_FILE).is_file():
        return [root]
    if depth == 0:
        return found
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and p.name not in SKIP_DIRS)
    except OSError:
        return found
    for child in children:
        found += find_workspaces(child, depth - 1)
    return found


def workspace_failures(ws_dir: Path) -> list[str]:
    """Blocking gate failures of the latest completed stage ('' when none has completed)."""
    from opforge.errors import InputError
    from opforge.orchestrator.gates import blocking_failures, run_gates
    from opforge.orchestrator.state import load_state
    from opforge.workspace import Workspace

    try:
        state = load_state(ws_dir)
    except InputError as exc:
        return [str(exc)]
    done = [k for k, r in state.stages.items() if r.status == "completed"]
    if not done:
        return []
    stage = max(done)
    bad = blocking_failures(run_gates(Workspace(ws_dir, state.op_name), stage, state))
    return [f"{ws_dir}: stage {stage}: {g['id']}: {g['message']}" for g in bad]


def should_check(event: dict) -> bool:
    name = event.get("hook_event_name", "")
    if name == "PreToolUse":
        return bool(STATE_COMMAND.search(str((event.get("tool_input") or {}).get("command", ""))))
    if name in ("Stop", "SubagentStop"):
        return not event.get("stop_hook_active", False)
    return True


def run_hook(stdin_text: str, root: Path | None) -> tuple[int, list[str]]:
    """(exit code, failure lines) for one hook call."""
    try:
        event = json.loads(stdin_text) if stdin_text.strip() else {}
    except json.JSONDecodeError:
        event = {}
    if not isinstance(event, dict):
        event = {}
    if not should_check(event):
        return 0, []
    base = Path(root or event.get("cwd") or ".")
    failures = [line for ws in find_workspaces(base) for line in workspace_failures(ws)]
    return (2 if failures else 0), failures


def main(argv: list[str] | None = None) -> int:
    """`opforge-hook gate`: the same check as `opforge hooks gate`, without loading the whole CLI, because a
    host runs it before every shell command (torch is imported only when a workspace is really checked)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="opforge-hook")
    ap.add_argument("action", choices=["gate"])
    ap.add_argument("--host", default="claude")
    ap.add_argument("--root", type=Path, default=None)
    args = ap.parse_args(argv)
    stdin = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    code, lines = run_hook(stdin, args.root)
    for line in lines:
        print(line, file=sys.stderr)
    if code:
        print(f"opforge ({args.host}): fix the failing gates above before moving the workflow on.", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
