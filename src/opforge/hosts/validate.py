"""Agent Skills rules for skill folders: the checks `opforge skills validate` runs.

A skill is a folder holding SKILL.md: YAML front matter (`name`, `description`, optional `license`,
`compatibility`, `metadata`, `allowed-tools`) and a Markdown body. `name` is lowercase letters and digits
joined by single hyphens, at most 64 characters, and equals the folder's name; inside opforge's own package a
folder is a Python package and cannot hold a hyphen, so there `name` is the folder name with `_` read as `-`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SKILL_FILE = "SKILL.md"
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_COMPATIBILITY = 500
MAX_BODY_LINES = 500  # the body must stay under this many lines
ALLOWED_FIELDS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")
_LINK_RE = re.compile(r"\]\(((?:references|scripts|assets)/[^)#\s]+)\)")


@dataclass
class SkillReport:
    folder: Path
    name: str | None = None
    description: str | None = None
    body: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"folder": str(self.folder), "name": self.name, "ok": self.ok, "problems": list(self.problems)}


def split_front_matter(text: str) -> tuple[dict, str]:
    """(front matter, body); ValueError with a one-line reason when the front matter is missing or broken."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise ValueError("does not start with a '---' front matter line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise ValueError("front matter has no closing '---' line") from None
    try:
        meta = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (front matter line {mark.line + 1})" if mark else ""
        raise ValueError(f"front matter is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(meta, dict):
        raise ValueError("front matter is not a mapping of fields")
    return meta, "\n".join(lines[end + 1:]).lstrip("\n")


def expected_name(folder: Path) -> str:
    return folder.name.replace("_", "-") if (folder / "__init__.py").exists() else folder.name


def validate_skill(folder: Path) -> SkillReport:
    folder = Path(folder)
    rep = SkillReport(folder)
    path = folder / SKILL_FILE
    if not path.is_file():
        rep.problems.append(f"{SKILL_FILE}: missing")
        return rep
    try:
        meta, body = split_front_matter(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        rep.problems.append(f"{SKILL_FILE}: not UTF-8 text")
        return rep
    except ValueError as exc:
        rep.problems.append(f"{SKILL_FILE}: {exc}")
        return rep
    rep.body = body
    extra = sorted(str(k) for k in meta if k not in ALLOWED_FIELDS)
    if extra:
        rep.problems.append(f"front matter: unknown field(s) {', '.join(extra)} (allowed: {', '.join(ALLOWED_FIELDS)})")
    name = meta.get("name")
    if not isinstance(name, str) or not name.strip():
        rep.problems.append("name: missing or not a string")
    else:
        rep.name = name
        if len(name) > MAX_NAME:
            rep.problems.append(f"name: {len(name)} characters, the limit is {MAX_NAME}")
        if not NAME_RE.match(name):
            rep.problems.append(f"name: {name!r} is not lowercase letters and digits joined by single hyphens")
        want = expected_name(folder)
        if name != want:
            rep.problems.append(f"name: {name!r} does not match the folder name {want!r}")
    desc = meta.get("description")
    if not isinstance(desc, str) or not desc.strip():
        rep.problems.append("description: missing or not a string")
    else:
        rep.description = desc
        if len(desc) > MAX_DESCRIPTION:
            rep.problems.append(f"description: {len(desc)} characters, the limit is {MAX_DESCRIPTION}")
    comp = meta.get("compatibility")
    if comp is not None and (not isinstance(comp, str) or len(comp) > MAX_COMPATIBILITY):
        rep.problems.append(f"compatibility: must be a string of at most {MAX_COMPATIBILITY} characters")
    md = meta.get("metadata")
    if md is not None and not (isinstance(md, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                              for k, v in md.items())):
        rep.problems.append("metadata: must map strings to strings")
    n_lines = len(body.splitlines())
    if not body.strip():
        rep.problems.append("body: empty; it must tell the model what to do")
    elif n_lines >= MAX_BODY_LINES:
        rep.problems.append(f"body: {n_lines} lines, it must stay under {MAX_BODY_LINES} (move detail to references/)")
    for rel in sorted(set(_LINK_RE.findall(body))):
        if not (folder / rel).is_file():
            rep.problems.append(f"body: links to {rel}, which is not in the skill folder")
    return rep


def find_skill_folders(root: Path) -> list[Path]:
    """`root` itself when it holds SKILL.md, else its sub-folders that do (one level down), sorted."""
    root = Path(root)
    if (root / SKILL_FILE).is_file():
        return [root]
    return sorted(p.parent for p in root.glob(f"*/{SKILL_FILE}"))


def validate_tree(root: Path) -> list[SkillReport]:
    """Every skill under `root`; a name used twice is a problem of each skill that uses it."""
    reports = [validate_skill(f) for f in find_skill_folders(root)]
    seen: dict[str, list[SkillReport]] = {}
    for r in reports:
        if r.name:
            seen.setdefault(r.name, []).append(r)
    for name, rs in seen.items():
        if len(rs) > 1:
            for r in rs:
                others = ", ".join(str(o.folder.name) for o in rs if o is not r)
                r.problems.append(f"name: {name!r} is also used by {others}")
    return reports
