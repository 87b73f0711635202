"""opforge's own skills, found by globbing the package: every `skills/*/SKILL.md` is one skill. A skill may also
hold its text in another language as `SKILL.<lang>.md` (one language per file), installed as its SKILL.md for
`opforge init --lang <lang>`."""

from __future__ import annotations

from pathlib import Path

from opforge.hosts.validate import SkillReport, validate_tree

SKILLS_ROOT = Path(__file__).resolve().parents[1] / "skills"
SUPPORT_DIRS = ("references", "scripts", "assets")  # what a host copy carries besides SKILL.md


def package_skills(root: Path = SKILLS_ROOT) -> tuple[list[SkillReport], list[SkillReport]]:
    """(valid, invalid) skill reports, each sorted by folder."""
    reports = validate_tree(root)
    return [r for r in reports if r.ok], [r for r in reports if not r.ok]


def skill_text(folder: Path, lang: str = "en") -> Path:
    """The skill's SKILL.md in `lang` where it exists, else the English one."""
    translated = folder / f"SKILL.{lang}.md"
    return translated if lang != "en" and translated.is_file() else folder / "SKILL.md"


def skill_files(report: SkillReport, lang: str = "en") -> dict[str, bytes]:
    """The files a host copy of the skill holds, by path relative to the skill folder."""
    files = {"SKILL.md": skill_text(report.folder, lang).read_bytes()}
    for sub in SUPPORT_DIRS:
        d = report.folder / sub
        if d.is_dir():
            for f in sorted(d.rglob("*")):
                if f.is_file() and "__pycache__" not in f.parts:
                    files[str(f.relative_to(report.folder))] = f.read_bytes()
    return files
