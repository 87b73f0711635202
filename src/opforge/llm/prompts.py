"""System prompts: a role's instructions followed by the SKILL.md text of the skills it holds, the same text a
host gets from `opforge init`."""

from __future__ import annotations

from opforge.agents.roles import ROLES, role_body, role_skills
from opforge.hosts.catalog import package_skills


def system_prompt(role_name: str) -> str:
    skills, _ = package_skills()
    names = [r.name for r in skills]
    role = ROLES[role_name]
    parts = [role_body(role, names).rstrip()]
    own = set(role_skills(role, names))
    for r in skills:
        if r.name in own:
            parts.append(f"# Skill `{r.name}`\n\n{r.description}\n\n{r.body.strip()}")
    parts.append("You work through the tools you are given; the tool results are the only facts. "
                 "opforge checks everything you write with its own gates and tests after you finish.")
    return "\n\n".join(parts) + "\n"
