"""Where each host looks for skills, agents, its rules file and hooks, in a project and for the user.

Claude Code: `.claude/skills/<name>/SKILL.md`, subagents in `.claude/agents/<name>.md`, `CLAUDE.md`, hooks in
`.claude/settings.json` (user level: the same under `~/.claude/`). OpenCode: `.opencode/skills`,
`.opencode/agents`, `AGENTS.md`, local plugins in `.opencode/plugins/` (user level: `~/.config/opencode/`).
Codex: skills in `.agents/skills` (user: `~/.agents/skills`), rules and roles in `AGENTS.md` (user:
`~/.codex/AGENTS.md`); it has no agent files or hooks. Cursor: `.cursor/skills`, roles as rules in
`.cursor/rules/*.mdc`, `AGENTS.md`; user-level rules live in its settings, so `--global` installs skills only.
GitHub Copilot (docs.github.com, "Adding agent skills", "Creating custom agents", "Adding repository custom
instructions"): project skills in `.github/skills/<name>/SKILL.md`, custom agents as `.github/agents/<name>.agent.md`
(front matter `name`, `description`, `tools`), repository instructions in `.github/copilot-instructions.md`; for
the user, `~/.copilot/skills` and `~/.copilot/agents` (its personal instructions live in its settings). Trae
(docs.trae.ai, "Rules" and "Skills"): skills in `.trae/skills/<name>/SKILL.md`, rules as Markdown files in
`.trae/rules/` (front matter `description`, `alwaysApply`; the project's own rules in `project_rules.md`), so the
roles become rules the agent pulls in by description; Trae keeps both per project only, so it has no `--global`.
CodeArts, Huawei Cloud's code agent (support.huaweicloud.com, CodeArts Agent user guide "技能" and "规则"): skills in
`.codeartsdoer/skills/<name>/SKILL.md` (user: `~/.codeartsdoer/skills`), the same SKILL.md format; project rules as
`.mdc` files in `.codeartsdoer/rule/`. It documents no agent files and no rule fields (whether a rule applies
always or on `#` is chosen in its settings page), so the roles go into opforge's rule file, which carries no front
matter; personal rules live in its cloud Rules Center, so `--global` installs skills only.
"""

from __future__ import annotations

from dataclasses import dataclass

HOSTS = ("claude", "opencode", "codex", "cursor", "copilot", "trae", "codearts")


@dataclass(frozen=True)
class Layout:
    host: str
    skills_dir: str
    agents_dir: str | None  # None: the roles go into the rules file
    agent_ext: str
    rules_file: str | None
    hooks: str | None  # "claude-settings" | "opencode-plugin" | None
    hooks_path: str | None


_PROJECT = {
    "claude": Layout("claude", ".claude/skills", ".claude/agents", ".md", "CLAUDE.md", "claude-settings",
                     ".claude/settings.json"),
    "opencode": Layout("opencode", ".opencode/skills", ".opencode/agents", ".md", "AGENTS.md", "opencode-plugin",
                       ".opencode/plugins/opforge-gate.js"),
    "codex": Layout("codex", ".agents/skills", None, "", "AGENTS.md", None, None),
    "cursor": Layout("cursor", ".cursor/skills", ".cursor/rules", ".mdc", "AGENTS.md", None, None),
    "copilot": Layout("copilot", ".github/skills", ".github/agents", ".agent.md", ".github/copilot-instructions.md",
                      None, None),
    "trae": Layout("trae", ".trae/skills", ".trae/rules", ".md", ".trae/rules/project_rules.md", None, None),
    "codearts": Layout("codearts", ".codeartsdoer/skills", None, "", ".codeartsdoer/rule/opforge.mdc", None, None),
}
_GLOBAL = {  # relative to the home folder
    "claude": Layout("claude", ".claude/skills", ".claude/agents", ".md", ".claude/CLAUDE.md", "claude-settings",
                     ".claude/settings.json"),
    "opencode": Layout("opencode", ".config/opencode/skills", ".config/opencode/agents", ".md",
                       ".config/opencode/AGENTS.md", "opencode-plugin", ".config/opencode/plugins/opforge-gate.js"),
    "codex": Layout("codex", ".agents/skills", None, "", ".codex/AGENTS.md", None, None),
    "cursor": Layout("cursor", ".cursor/skills", None, "", None, None, None),
    "copilot": Layout("copilot", ".copilot/skills", ".copilot/agents", ".agent.md", None, None, None),
    "codearts": Layout("codearts", ".codeartsdoer/skills", None, "", None, None, None),
}


def layout(host: str, global_: bool) -> Layout | None:
    """Where the host looks; None where it has no such place (Trae for the user)."""
    return (_GLOBAL if global_ else _PROJECT).get(host)
