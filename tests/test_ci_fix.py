"""ci-fix end to end on a fixture repository made here with `git init`: a change that breaks formatting, leaves
unused imports, misspells words in comments, docstrings and string literals, and trips rules whose fixes are
unsafe. The real linters run; nothing is mocked."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opforge.cli import app
from opforge.skills.ci_fix import ci_fix
from opforge.skills.ci_fix.edits import Block, apply_blocks
from opforge.skills.ci_fix.linters import Linters

BASE_FILES = {
    "pyproject.toml": '[tool.ruff]\nline-length = 100\n\n[tool.ruff.lint]\nselect = ["E", "F", "W", "I"]\n',
    ".clang-format": "BasedOnStyle: LLVM\n",
    "calc/__init__.py": '"""A tiny calculator."""\n\nfrom calc.core import add\n',
    "calc/core.py": '"""Core arithmetic."""\n\n\ndef add(a, b):\n    return a + b\n',
    "calc/legacy.py": "import os\nx=1\n",                                  # outside the change: never touched
    "csrc/kernel.c": "int add(int a, int b) { return a + b; }\n",
    "docs/guide.md": "# Guide\n\nCall `add`.\n",
    "tests/test_calc.py": (
        "from calc import add, greet\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_greet():\n    assert greet('bob') == 'recieved bob'\n    assert greet(None) is None\n"),
}

CHANGE = {
    "calc/__init__.py": '"""A tiny calculator."""\n\nfrom calc.core import add, greet\nimport os\n',
    "calc/core.py": (
        '"""Core arithmetic: we recieve numbers."""\n'
        "import sys\n"
        "import os, json\n"
        "from typing import List\n\n\n"
        "def add(a,b):\n"
        "    # teh sum of both\n"
        "    return a+b\n"
        "def greet(name):\n"
        "    '''Greet whoever was recieved.'''\n"
        "    unused = 3\n"
        "    if name == None:\n"
        "        return None\n"
        "    return 'recieved ' + name\n"),
    "csrc/kernel.c": (
        "#include <string.h>\n#include <stdio.h>\n"
        "// teh adder\n"
        "int add(int a,int b){return a+b;}\n"
        'const char *msg = "recieved";\n'),
    "docs/guide.md": "# Guide\n\nCall `add` to recieve a sum. `recieve_all` is in the code span.\n",
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def write(repo: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = repo / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def make_repo(root: Path) -> Path:
    repo = root / "proj"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "dev@example.com")
    git(repo, "config", "user.name", "Dev")
    write(repo, BASE_FILES)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    write(repo, CHANGE)
    return repo


def tree_hashes(repo: Path) -> dict[str, str]:
    out = {}
    for p in sorted(repo.rglob("*")):
        if p.is_file() and ".git" not in p.relative_to(repo).parts and "__pycache__" not in p.parts:
            out[str(p.relative_to(repo))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_fixture_tests(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=repo,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """The fixture repository fixed once, with its state before and after and the report."""
    repo = make_repo(tmp_path_factory.mktemp("cifix"))
    before = tree_hashes(repo)
    originals = {rel: (repo / rel).read_text() for rel in CHANGE}
    tests_before = run_fixture_tests(repo)
    rep = ci_fix(repo)
    return {"repo": repo, "before": before, "originals": originals, "tests_before": tests_before, "rep": rep,
            "after": tree_hashes(repo)}


def test_whitelisted_issues_fixed(fixed):
    repo, rep = fixed["repo"], fixed["rep"]
    core = (repo / "calc/core.py").read_text()
    assert "import sys" not in core and "import os" not in core and "json" not in core and "List" not in core
    assert "def add(a, b):" in core and "return a + b" in core          # ruff format
    assert "# the sum of both" in core                                  # comment typo
    assert "we receive numbers" in core and "Greet whoever was received." in core   # docstrings (whitelisted)
    kernel = (repo / "csrc/kernel.c").read_text()
    assert "int add(int a, int b) { return a + b; }" in kernel and "// the adder" in kernel
    guide = (repo / "docs/guide.md").read_text()
    assert "to receive a sum" in guide and "`recieve_all`" in guide      # prose fixed, code span left
    lint = Linters(repo, lambda *a, **k: None)
    for d in lint.ruff_check("calc/core.py", core):
        assert d.code in ("F841", "E711"), d                          # only the unsafe ones are left
    assert lint.ruff_format("calc/core.py", core) == core
    rules = {f["rule"] for f in rep["fixes"]}
    assert {"F401", "I001", "format", "typo:teh", "typo:recieve", "typo:recieved"} <= rules


def test_strings_and_unsafe_fixes_untouched_and_residual(fixed):
    repo, rep = fixed["repo"], fixed["rep"]
    core = (repo / "calc/core.py").read_text()
    assert "return 'recieved ' + name" in core.replace('"', "'")        # string literal kept
    assert "unused = 3" in core and "name == None" in core             # unsafe fixes never applied
    assert 'const char *msg = "recieved";' in (repo / "csrc/kernel.c").read_text()
    res = {(r["file"], r["rule"]): r["why"] for r in rep["residual"]}
    assert "string literal" in res[("calc/core.py", "typo:recieved")]
    assert "string literal" in res[("csrc/kernel.c", "typo:recieved")]
    assert "unsafe" in res[("calc/core.py", "F841")] and "unsafe" in res[("calc/core.py", "E711")]
    assert "re-exporting" in res[("calc/__init__.py", "F401")]
    assert "import os" in (repo / "calc/__init__.py").read_text()      # F401 in __init__.py never fixed
    assert "#include <string.h>\n#include <stdio.h>" in (repo / "csrc/kernel.c").read_text()
    assert "include" in res[("csrc/kernel.c", "format")]
    assert rep["exit_code"] == 1 and rep["summary"]["residual"] == len(rep["residual"])


def test_files_outside_change_byte_identical(fixed):
    before, after = fixed["before"], fixed["after"]
    for rel in before:
        if rel not in CHANGE:
            assert before[rel] == after[rel], rel
    assert set(before) == set(after)
    assert {f["file"] for f in fixed["rep"]["files"]} == set(CHANGE)


def test_fixture_project_tests_pass_before_and_after(fixed):
    assert fixed["tests_before"].returncode == 0, fixed["tests_before"].stdout
    after = run_fixture_tests(fixed["repo"])
    assert after.returncode == 0, after.stdout
    assert "2 passed" in after.stdout


def test_every_fix_traces_to_an_edit_in_the_diff(fixed):
    """Replaying the report's steps on the original text gives exactly the fixed file: every edit is listed,
    and every listed fix names a rule and a block that is really applied."""
    repo, rep = fixed["repo"], fixed["rep"]
    for entry in rep["files"]:
        text = fixed["originals"][entry["file"]]
        for step in entry["steps"]:
            text = apply_blocks(text, [Block(b["line"], b["before"], b["after"]) for b in step["blocks"]])
        assert text == (repo / entry["file"]).read_text(), entry["file"]
        assert entry["edited"] == (text != fixed["originals"][entry["file"]])
    for f in rep["fixes"]:
        step = next(e for e in rep["files"] if e["file"] == f["file"])["steps"][f["step"]]
        block = step["blocks"][f["block"]]
        assert step["tool"] == f["tool"] and f["rule"] and f["reason"]
        assert (block["before"], block["after"]) == (f["before"], f["after"]) and f["before"] != f["after"]
    used = {(f["file"], f["step"], f["block"]) for f in rep["fixes"]}
    listed = {(e["file"], s["step"], i) for e in rep["files"] for s in e["steps"] for i in range(len(s["blocks"]))}
    assert used == listed


def test_second_run_changes_nothing(fixed):
    repo = fixed["repo"]
    rep2 = ci_fix(repo)
    assert rep2["fixes"] == [] and tree_hashes(repo) == fixed["after"]
    assert rep2["exit_code"] == 1
    assert sorted((r["file"], r["rule"]) for r in rep2["residual"]) == \
        sorted((r["file"], r["rule"]) for r in fixed["rep"]["residual"])


def test_commands_recorded_verbatim(fixed):
    cmds = [c["command"] for c in fixed["rep"]["commands"]]
    assert any(" check --no-fix --output-format json" in c for c in cmds)
    assert any(c.split()[0].endswith("codespell") for c in cmds)
    assert any("--output-replacements-xml" in c for c in cmds)
    assert all(isinstance(c["exit_code"], int) for c in fixed["rep"]["commands"])


def test_cli_dry_run_commit_and_report(tmp_path):
    repo = make_repo(tmp_path)
    before = tree_hashes(repo)
    runner = CliRunner()
    res = runner.invoke(app, ["ci-fix", "--repo", str(repo), "--dry-run", "--json"])
    assert res.exit_code == 1, res.output
    rep = json.loads(res.stdout)
    assert rep["dry_run"] and rep["summary"]["fixes"] > 0 and tree_hashes(repo) == before

    head = git(repo, "rev-parse", "HEAD").strip()
    out = tmp_path / "report"
    res = runner.invoke(app, ["ci-fix", "--repo", str(repo), "--commit", "--report", str(out)])
    assert res.exit_code == 1, res.output
    rep = json.loads((out / "ci-fix.json").read_text())
    assert git(repo, "rev-parse", "HEAD~1").strip() == head
    message = git(repo, "log", "-1", "--format=%B")
    assert f"{rep['summary']['fixes']} whitelisted fix(es)" in message
    for f in rep["fixes"]:
        assert f"- {f['file']}:{f['line']} {f['tool']} {f['rule']}: {f['message']}" in message
    assert set(git(repo, "show", "--name-only", "--format=", "HEAD").split()) == \
        {e["file"] for e in rep["files"] if e["edited"]}
    md = (out / "ci-fix.md").read_text()
    assert "## Residual issues" in md and "string literal" in md and "## Commands run" in md

    inside = repo / "ci-report"                 # a report folder inside the repository is not part of the change
    res = runner.invoke(app, ["ci-fix", "--repo", str(repo), "--base", head, "--report", str(inside), "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["fixes"] == []
    res = runner.invoke(app, ["ci-fix", "--repo", str(repo), "--base", head, "--report", str(inside), "--json"])
    rep = json.loads(res.stdout)
    assert (inside / "ci-fix.md").is_file() and not any(e["file"].startswith("ci-report") for e in rep["files"])
    assert {e["file"] for e in rep["files"]} == set(CHANGE)


def test_changed_lines_only(tmp_path):
    repo = tmp_path / "cl"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo, {"m.py": "def f( a ):\n    return a\n\n\ndef g(b):\n    return b\n"})
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=d", "-c", "user.email=d@e", "commit", "-qm", "base")
    write(repo, {"m.py": "def f( a ):\n    return a\n\n\ndef g(b):\n    return b   +1  # teh end\n"})
    rep = ci_fix(repo, changed_lines=True)
    text = (repo / "m.py").read_text()
    assert text == "def f( a ):\n    return a\n\n\ndef g(b):\n    return b + 1  # the end\n"
    assert {r["line"] for r in rep["residual"]} <= {5, 6} and rep["exit_code"] == 0


def test_proof_failure_is_reverted_and_reported(tmp_path):
    """A whitelist that allows F541 (f-string without placeholders): ruff calls the fix safe, but it turns an
    f-string node into a plain constant, so the AST proof rejects it and the file keeps the f-string."""
    repo = tmp_path / "pf"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo, {"m.py": "X = 1\n"})
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=d", "-c", "user.email=d@e", "commit", "-qm", "base")
    write(repo, {"m.py": 'import os\nX = f"plain"\n'})
    cfg = tmp_path / "wl.yaml"
    cfg.write_text("ruff_rules:\n  F541: f-string without placeholders\n  F401: unused import\n")
    rep = ci_fix(repo, config=cfg)
    assert (repo / "m.py").read_text() == 'X = f"plain"\n'
    res = [r for r in rep["residual"] if r["rule"] == "F541"]
    assert res and res[0]["why"].startswith("reverted: the AST changed")


@pytest.mark.parametrize("args, where", [
    (["--repo", "{tmp}/missing"], "--repo"),
    (["--repo", "{tmp}"], "--repo"),
    (["--base", "no-such-rev"], "--base"),
    (["--config", "{tmp}/bad.yaml"], "bad.yaml: colour"),
    (["--dry-run", "--commit"], "--commit"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, where):
    repo = make_repo(tmp_path) if "--repo" not in args else None
    (tmp_path / "bad.yaml").write_text("colour: blue\n")
    argv = ["ci-fix"] + [a.format(tmp=tmp_path) for a in args]
    if repo is not None:
        argv += ["--repo", str(repo)]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and where in lines[0]


def test_docstring_policy_and_doctests(tmp_path):
    repo = tmp_path / "ds"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo, {"m.py": "X = 1\n"})
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=d", "-c", "user.email=d@e", "commit", "-qm", "base")
    src = 'def f():\n    """Return what we recieve.\n\n    >>> f()  # teh call\n    1\n    """\n    return 1\n'
    write(repo, {"m.py": src})
    cfg = tmp_path / "wl.yaml"
    cfg.write_text("codespell:\n  docstrings: false\n")
    rep = ci_fix(repo, config=cfg)
    assert (repo / "m.py").read_text() == src
    why = {r["rule"]: r["why"] for r in rep["residual"]}
    assert "docstring fixes are off" in why["typo:recieve"] and "doctest" in why["typo:teh"]
    rep = ci_fix(repo)
    assert "what we receive." in (repo / "m.py").read_text() and "# teh call" in (repo / "m.py").read_text()
    assert [r["rule"] for r in rep["residual"]] == ["typo:teh"]


def test_project_configuration_is_honoured(tmp_path):
    """The project's own settings: ruff's `fix = true` must not turn the report into fixed source, and
    codespell's ignore list keeps a word out of both fixes and residual issues."""
    repo = tmp_path / "cfg"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo, {"pyproject.toml": "[tool.ruff]\nfix = true\n", "m.py": "X = 1\n",
                 ".codespellrc": "[codespell]\nignore-words-list = teh\n"})
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=d", "-c", "user.email=d@e", "commit", "-qm", "base")
    write(repo, {"m.py": "import os\n\nX = 1  # teh value, recieved\n"})
    rep = ci_fix(repo)
    assert (repo / "m.py").read_text() == "X = 1  # teh value, received\n"
    assert [f["rule"] for f in rep["fixes"]] == ["F401", "format", "typo:recieved"] and rep["residual"] == []
    assert rep["exit_code"] == 0


def test_c_style_that_changes_tokens_is_reverted(tmp_path):
    """A project style with InsertBraces: clang-format adds braces, which the token-stream proof rejects. Its
    whitespace-only replacements are kept; the braces are reported with the token that changed."""
    repo = tmp_path / "cb"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo, {".clang-format": "BasedOnStyle: LLVM\nInsertBraces: true\n", "k.c": "int x;\n"})
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=d", "-c", "user.email=d@e", "commit", "-qm", "base")
    src = "int f(int a){\n  if (a) return 1;\n  return 0; // teh end\n}\n"
    write(repo, {"k.c": src})
    rep = ci_fix(repo)
    assert (repo / "k.c").read_text() == "int f(int a) {\n  if (a) return 1;\n  return 0; // the end\n}\n"
    res = [r for r in rep["residual"] if r["rule"] == "format"]
    assert res and "the rest reverted: the token stream changed" in res[0]["why"] and "{" in res[0]["why"]
    assert [f["rule"] for f in rep["fixes"]] == ["format", "typo:teh"]
