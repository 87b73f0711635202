"""The package's layers: the workspace is a leaf that everything builds on, and the runner's stage registry
covers every stage of the state machine."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import opforge

SRC = Path(opforge.__file__).parent
# What the workspace leaf may reach, itself included; anything else would let a skill's import pull in the
# runner, which imports every skill.
LEAF_MAY_IMPORT = ("opforge.workspace", "opforge.errors", "opforge.request")


def module_file(name: str) -> Path | None:
    rel = Path(*name.split(".")[1:])
    for path in (SRC / rel / "__init__.py", (SRC / rel).with_suffix(".py")):
        if path.is_file():
            return path
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(("opforge",) + (parts[:-1] if parts[-1] == "__init__" else parts))


def opforge_imports(path: Path) -> set[str]:
    """Every opforge module `path` imports, at the top or inside a function (a late import is still one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            # `from opforge.workspace import events` imports a module, not a name
            found |= {f"{base}.{a.name}" for a in node.names if module_file(f"{base}.{a.name}")}
    return {m for m in found if m == "opforge" or m.startswith("opforge.")}


def test_workspace_is_a_leaf():
    """The workspace and what it imports, followed to the end, stay inside errors, request and itself."""
    todo = sorted((SRC / "workspace").rglob("*.py"))
    assert todo, "the workspace package moved: update LEAF_MAY_IMPORT"
    seen: set[Path] = set()
    bad = []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for mod in sorted(opforge_imports(path)):
            if not any(mod == ok or mod.startswith(ok + ".") for ok in LEAF_MAY_IMPORT):
                bad.append(f"{path.relative_to(SRC)} imports {mod}")
            elif (target := module_file(mod)) is not None:
                todo.append(target)
    assert not bad, "the workspace must stay a leaf:\n" + "\n".join(bad)


def test_the_backend_is_a_substrate_not_a_skill():
    """The reference backend is built on by skills (op-adapt, test-triage); it never reaches up into one."""
    bad = [f"{path.relative_to(SRC)} imports {mod}"
           for path in sorted((SRC / "backend").rglob("*.py"))
           for mod in sorted(opforge_imports(path))
           if not mod.startswith(("opforge.backend", "opforge.workspace", "opforge.errors"))]
    assert not bad, "\n".join(bad)


def test_leaf_check_sees_late_and_relative_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "opforge" / "workspace"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("def f():\n    from opforge.orchestrator import runner\n"
                                "from ..skills.op_api import stage\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "opforge")
    assert opforge_imports(pkg / "bad.py") == {"opforge.orchestrator", "opforge.skills.op_api"}


def test_stage_registry_covers_every_stage():
    from opforge.orchestrator.runner import STAGE_REGISTRY
    from opforge.orchestrator.state import BLOCKED_BY_STAGE, RETRY_BUDGET, STAGES
    from opforge.workspace import Workspace

    assert list(STAGE_REGISTRY) == list(STAGES) == list(RETRY_BUDGET) == list(BLOCKED_BY_STAGE)
    assert all(callable(run) for run in STAGE_REGISTRY.values())
    assert all(Workspace(Path("."), "op").stage_artifacts(k) for k in STAGES)
