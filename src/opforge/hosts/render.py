"""The text opforge writes into a host: role files in each host's format, the rules block, the hooks."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import yaml

from opforge.agents.roles import ROLES, STATE_COMMANDS, Role, role_body, role_skills

# one block per host: Codex, OpenCode and Cursor all read AGENTS.md
BEGIN = "<!-- opforge:begin {host} (written by `opforge init`; `opforge init --uninstall` removes it) -->"
END = "<!-- opforge:end {host} -->"
# the command opforge wrote before hooks named their entry point by absolute path: uninstall still removes it
LEGACY_HOOK_COMMAND = "opforge-hook gate --host {host}"
HOOK_MODULE = "opforge.hosts.gate_hook"
# Claude Code subagents get only the tools their role needs: the orchestrator has no Write or Edit
_CLAUDE_TOOLS = {True: "Read, Grep, Glob, Bash", False: "Read, Grep, Glob, Bash, Write, Edit"}
# Copilot's tool aliases (custom agents' `tools`): the same split, by its names
_COPILOT_TOOLS = {True: ["read", "search", "execute"], False: ["read", "search", "execute", "edit"]}


def _front(meta: dict) -> str:
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, width=1000, allow_unicode=True) + "---\n\n"


def agent_file(host: str, role: Role, skills: list[str]) -> str:
    body = role_body(role, skills)
    if host == "claude":
        return _front({"name": role.name, "description": role.description,
                       "tools": _CLAUDE_TOOLS[role.moves_state]}) + body
    if host == "opencode":
        meta = {"description": role.description, "mode": "primary" if role.moves_state else "subagent"}
        if role.moves_state:
            meta["permission"] = {"edit": "deny"}
        else:
            # OpenCode applies the last matching pattern: allow everything, then deny the state commands
            meta["permission"] = {"bash": {"*": "allow", **{f"{c}*": "deny" for c in STATE_COMMANDS}}}
        return _front(meta) + body
    if host in ("cursor", "trae"):  # a rule the agent pulls in when its description fits the task
        return _front({"description": role.description, "alwaysApply": False}) + body
    if host == "copilot":
        return _front({"name": role.name, "description": role.description,
                       "tools": _COPILOT_TOOLS[role.moves_state]}) + body
    raise ValueError(f"{host} has no agent files")


def rules_block(host: str, skills: list[str], roles_inline: bool) -> str:
    lines = [BEGIN.format(host=host), "# opforge", "",
             "This project builds PyTorch operators with opforge: a request (request.yaml + a PyTorch reference) goes "
             "through seven gated stages (requirement, API exploration, golden, design, develop, precision, "
             "performance) into a verified Triton kernel. Every command prints JSON with `--json`.", "",
             "Rules:",
             "- Only the orchestrator moves the state, through " + ", ".join(f"`{c}`" for c in STATE_COMMANDS) + ".",
             "- The orchestrator never writes kernels; the developer writes `<op>_impl.py`, the analyst the "
             "specification artifacts.",
             "- Never edit `.orchestrator_state.json` or `events.jsonl`; a stage is done only when "
             "`opforge op gate WS --stage N --json` reports `\"passed\": true`.",
             "- Exit codes: 0 done, 1 blocked or a failing gate, 2 bad input (one line names the field or file).", "",
             "Roles: " + "; ".join(f"**{r.name}** (stages {', '.join(map(str, r.stages))})" for r in ROLES.values())
             + ".", "", "Skills: " + ", ".join(f"`{s}`" for s in skills) + "."]
    if roles_inline:
        for role in ROLES.values():
            lines += ["", role_body(role, skills).replace("# ", "## Role: ", 1).rstrip()]
    lines.append(END.format(host=host))
    return "\n".join(lines) + "\n"


def _split(text: str, host: str) -> tuple[str, str] | None:
    """(text before the host's block, text after it), or None when the block is not there."""
    begin, end = BEGIN.format(host=host), END.format(host=host)
    if begin not in text or end not in text:
        return None
    head, rest = text.split(begin, 1)
    return head, rest.split(end, 1)[1].removeprefix("\n")


def merge_block(existing: str | None, block: str, host: str) -> str:
    """The rules file with the host's block put in place of an older one, or appended."""
    if not existing:
        return block
    parts = _split(existing, host)
    if parts:
        return parts[0] + block + parts[1]
    return existing.rstrip("\n") + "\n\n" + block


def strip_block(text: str, host: str) -> str:
    parts = _split(text, host)
    if not parts:
        return text
    head, tail = parts
    if head.endswith("\n\n"):
        head = head[:-1]  # the blank line merge_block put before the block
    return head + tail


def hook_argv() -> list[str]:
    """The hook's entry point by absolute path, so that a host whose PATH lacks this environment's scripts folder
    (an editor started from the desktop, a venv not activated) still runs this opforge: the light `opforge-hook`
    script installed next to this interpreter, else this interpreter running the hook's module."""
    python = os.path.abspath(sys.executable)  # not resolved: a venv's python is a link out of the venv
    script = Path(python).parent / ("opforge-hook.exe" if os.name == "nt" else "opforge-hook")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [python, "-m", HOOK_MODULE]


def hook_command(host: str, argv: list[str] | None = None) -> str:
    """The hook as one shell command line (Claude Code runs settings hooks through a shell)."""
    return shlex.join([*(argv or hook_argv()), "gate", "--host", host])


def claude_hook_entries(host: str = "claude", command: str | None = None) -> dict[str, list[dict]]:
    """Claude Code settings hooks: before a Bash tool call (the hook lets only state commands through when
    the gates hold) and when the agent or a subagent would stop. `command` defaults to this interpreter's."""
    cmd = {"type": "command", "command": command or hook_command(host), "timeout": 300}
    return {"PreToolUse": [{"matcher": "Bash", "hooks": [cmd]}],
            "SubagentStop": [{"hooks": [cmd]}],
            "Stop": [{"hooks": [cmd]}]}


def merge_claude_settings(existing: dict, entries: dict[str, list[dict]]) -> dict:
    out = json.loads(json.dumps(existing))
    hooks = out.setdefault("hooks", {})
    for event, groups in entries.items():
        have = hooks.setdefault(event, [])
        for g in groups:
            if g not in have:
                have.append(g)
    return out


def strip_claude_settings(existing: dict, entries: dict[str, list[dict]]) -> dict:
    out = json.loads(json.dumps(existing))
    hooks = out.get("hooks", {})
    for event, groups in entries.items():
        if event in hooks:
            hooks[event] = [g for g in hooks[event] if g not in groups]
            if not hooks[event]:
                del hooks[event]
    if "hooks" in out and not out["hooks"]:
        del out["hooks"]
    return out


_OPENCODE_PLUGIN = """\
// Written by `opforge init --host opencode`; `opforge init --uninstall` removes it.
// Before a command that moves an opforge workflow (run, resume, stage, rollback), the gates of every
// workspace in the project must hold: a failing S0/S1 rule stops the command and tells the agent why.
const STATE_COMMAND = /\\bopforge\\s+op\\s+(run|resume|stage|rollback)\\b/;
// the hook by absolute path (this project's Python environment), not looked up on PATH
const HOOK = @HOOK@;

export const OpforgeGate = async ({ $, directory }) => {
  return {
    "tool.execute.before": async (input, output) => {
      if (input.tool !== "bash") return;
      const command = String((output.args && output.args.command) || "");
      if (!STATE_COMMAND.test(command)) return;
      const result = await $`${HOOK} gate --host opencode --root ${directory}`.nothrow().quiet();
      if (result.exitCode !== 0) {
        throw new Error(result.stderr.toString() || result.stdout.toString());
      }
    },
  };
};
"""


def opencode_plugin(argv: list[str] | None = None) -> str:
    """The OpenCode plugin, calling the hook by absolute path (Bun's shell passes each element of HOOK as one
    argument, quoted)."""
    return _OPENCODE_PLUGIN.replace("@HOOK@", json.dumps(argv or hook_argv()))


def all_role_files(host: str, skills: list[str], ext: str) -> dict[str, str]:
    return {f"{name}{ext}": agent_file(host, role, skills) for name, role in ROLES.items()}


__all__ = ["agent_file", "rules_block", "merge_block", "strip_block", "claude_hook_entries",
           "merge_claude_settings", "strip_claude_settings", "opencode_plugin", "hook_argv", "hook_command",
           "all_role_files", "role_skills"]
