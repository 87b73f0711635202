"""opforge init / skills validate / hooks gate: host layouts, idempotence, exact uninstall, Agent Skills rules."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opforge.cli import app
from opforge.hosts import install, render
from opforge.hosts.catalog import SKILLS_ROOT
from opforge.hosts.validate import split_front_matter

runner = CliRunner()


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under root (but .git) with its bytes and mtime: what 'changes nothing' is measured on."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts}


def _dirs(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir() and ".git" not in p.parts}


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def _init(*args) -> dict:
    res = runner.invoke(app, ["init", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


# ------------------------------------------------------------------ skills validate

def test_project_skills_pass_validate():
    res = runner.invoke(app, ["skills", "validate", str(SKILLS_ROOT), "--json"])
    out = json.loads(res.stdout)
    assert res.exit_code == 0, out
    names = {s["name"] for s in out["skills"]}
    assert {"op-requirement", "op-api", "op-golden", "op-design", "op-develop", "op-precision", "op-perf"} <= names
    assert len(out["skills"]) == len(list(SKILLS_ROOT.glob("*/SKILL.md")))


def _skill(root: Path, folder: str, front: str, body: str = "Run `opforge op status WS --json`.\n") -> Path:
    d = root / folder
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text(f"---\n{front}\n---\n\n{body}")
    return d


@pytest.mark.parametrize("folder,front,body,needle", [
    ("good-skill", "name: other-name\ndescription: Does a thing.", None, "does not match the folder"),
    ("Bad", "name: Bad\ndescription: Does a thing.", None, "lowercase letters and digits"),
    ("a--b", "name: a--b\ndescription: x", None, "single hyphens"),
    ("x" * 65, f"name: {'x' * 65}\ndescription: x", None, "65 characters, the limit is 64"),
    ("long-desc", "name: long-desc\ndescription: " + "y" * 1025, None, "description: 1025 characters"),
    ("no-desc", "name: no-desc", None, "description: missing"),
    ("colon", "name: colon\ndescription: Plan it: fusion, tiling", None, "not valid YAML"),
    ("extra", "name: extra\ndescription: x\nversion: 2", None, "unknown field(s) version"),
    ("big-body", "name: big-body\ndescription: x", "line\n" * 500, "body: 500 lines"),
    ("link", "name: link\ndescription: x", "See [the contract](references/contract.md).\n", "references/contract.md"),
])
def test_validate_names_what_is_wrong(tmp_path, folder, front, body, needle):
    kw = {} if body is None else {"body": body}
    _skill(tmp_path, folder, front, **kw)
    res = runner.invoke(app, ["skills", "validate", str(tmp_path), "--json"])
    assert res.exit_code == 1
    problems = json.loads(res.stdout)["skills"][0]["problems"]
    assert any(needle in p for p in problems), problems


def test_validate_accepts_a_good_skill_and_rejects_missing_paths(tmp_path):
    d = _skill(tmp_path, "fine", "name: fine\ndescription: Use to check things.\nmetadata:\n  owner: ops")
    (d / "references").mkdir()
    (d / "references" / "more.md").write_text("detail\n")
    (d / "SKILL.md").write_text((d / "SKILL.md").read_text() + "See [more](references/more.md).\n")
    assert runner.invoke(app, ["skills", "validate", str(d)]).exit_code == 0
    res = runner.invoke(app, ["skills", "validate", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "does not exist" in res.output
    empty = tmp_path / "empty"
    empty.mkdir()
    res = runner.invoke(app, ["skills", "validate", str(empty)])
    assert res.exit_code == 2 and "holds no SKILL.md" in res.output


# ------------------------------------------------------------------ init: layouts

def _independent_validate(skills_dir: Path) -> dict[str, list[str]]:
    skills_ref = pytest.importorskip("skills_ref")
    return {d.name: skills_ref.validate(d) for d in sorted(skills_dir.iterdir()) if d.is_dir()}


def test_init_claude_layout_idempotent_and_exact_uninstall(repo):
    (repo / "CLAUDE.md").write_text("# House rules\n\nBe brief.\n")
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.json").write_text(json.dumps({"model": "x", "hooks": {"Stop": [
        {"hooks": [{"type": "command", "command": "echo mine"}]}]}}))
    before, before_dirs = _tree(repo), _dirs(repo)

    out = _init("--host", "claude", str(repo))
    skills = repo / ".claude" / "skills"
    assert set(out["skills"]) == {d.name for d in skills.iterdir()}
    assert _independent_validate(skills) == {d.name: [] for d in skills.iterdir()}
    for role in ("orchestrator", "analyst", "developer", "perf-tuner"):
        meta, body = split_front_matter((repo / ".claude" / "agents" / f"{role}.md").read_text())
        assert meta["name"] == role and meta["description"]
        assert "You may not" in body
    orch, _ = split_front_matter((repo / ".claude" / "agents" / "orchestrator.md").read_text())
    dev, dev_body = split_front_matter((repo / ".claude" / "agents" / "developer.md").read_text())
    assert "Write" not in orch["tools"] and "Edit" in dev["tools"]  # the orchestrator cannot write kernels
    assert "G5-IMPL-TRITON-ONLY" in dev_body
    rules = (repo / "CLAUDE.md").read_text()
    assert rules.startswith("# House rules\n\nBe brief.\n") and "Only the orchestrator moves the state" in rules
    settings = json.loads((repo / ".claude" / "settings.json").read_text())
    assert settings["model"] == "x"
    assert {"PreToolUse", "SubagentStop", "Stop"} <= set(settings["hooks"])
    cmds = [h["command"] for g in settings["hooks"]["Stop"] for h in g["hooks"]]
    assert cmds == ["echo mine", render.hook_command("claude")]
    entry = shlex.split(cmds[1])[0]  # the hook by absolute path: a host without this venv on PATH still runs it
    assert os.path.isabs(entry) and Path(entry).is_file(), cmds[1]
    assert out["hook"] == {"command": cmds[1], "runs": True, "problem": None}
    assert settings["hooks"]["PreToolUse"][0]["matcher"] == "Bash"

    after_first = _tree(repo)
    again = _init("--host", "claude", str(repo))
    assert again["changed"] == []
    assert _tree(repo) == after_first  # same bytes, same mtimes

    res = runner.invoke(app, ["init", "--uninstall", str(repo), "--json"])
    assert res.exit_code == 0, res.output
    assert {k: v[0] for k, v in _tree(repo).items()} == {k: v[0] for k, v in before.items()}
    assert _dirs(repo) == before_dirs


def test_init_opencode_layout(repo):
    out = _init("--host", "opencode", str(repo))
    skills = repo / ".opencode" / "skills"
    assert _independent_validate(skills) == {n: [] for n in out["skills"]}
    orch, _ = split_front_matter((repo / ".opencode" / "agents" / "orchestrator.md").read_text())
    analyst, _ = split_front_matter((repo / ".opencode" / "agents" / "analyst.md").read_text())
    assert orch["mode"] == "primary" and orch["permission"] == {"edit": "deny"}
    assert analyst["mode"] == "subagent"
    bash = analyst["permission"]["bash"]
    assert list(bash)[0] == "*" and bash["opforge op resume*"] == "deny"
    plugin = (repo / ".opencode" / "plugins" / "opforge-gate.js").read_text()
    assert "tool.execute.before" in plugin and "$`${HOOK} gate --host opencode" in plugin
    assert f"const HOOK = {json.dumps(render.hook_argv())};" in plugin and os.path.isabs(render.hook_argv()[0])
    if os.path.exists("/usr/bin/node"):  # the plugin must at least be valid JavaScript
        check = subprocess.run(["node", "--check", "--input-type=module"], input=plugin, text=True,
                               capture_output=True)
        assert check.returncode == 0, check.stderr
    assert "opforge:begin opencode" in (repo / "AGENTS.md").read_text()
    first = _tree(repo)
    assert _init("--host", "opencode", str(repo))["changed"] == []
    assert _tree(repo) == first


def test_codex_and_cursor_share_agents_md_and_uninstall_one(repo):
    (repo / "AGENTS.md").write_text("# Team notes\n")
    _init("--host", "codex", str(repo))
    _init("--host", "cursor", str(repo))
    text = (repo / "AGENTS.md").read_text()
    assert text.startswith("# Team notes\n") and "opforge:begin codex" in text and "opforge:begin cursor" in text
    assert "## Role: developer" in text  # codex has no agent files: roles live in AGENTS.md
    assert (repo / ".agents" / "skills" / "op-develop" / "SKILL.md").is_file()
    rule, _ = split_front_matter((repo / ".cursor" / "rules" / "opforge-developer.mdc").read_text())
    assert rule["alwaysApply"] is False and rule["description"]
    assert runner.invoke(app, ["init", "--uninstall", "--host", "codex", str(repo)]).exit_code == 0
    text = (repo / "AGENTS.md").read_text()
    assert "opforge:begin codex" not in text and "opforge:begin cursor" in text
    assert not (repo / ".agents").exists() and (repo / ".cursor" / "skills").is_dir()
    assert runner.invoke(app, ["init", "--uninstall", str(repo)]).exit_code == 0
    assert (repo / "AGENTS.md").read_text() == "# Team notes\n"
    assert not (repo / ".cursor").exists() and not (repo / ".opforge").exists()


def test_global_install_goes_under_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    out = _init("--host", "opencode", "--global")
    assert (home / ".config" / "opencode" / "skills" / "op-api" / "SKILL.md").is_file()
    assert (home / ".config" / "opencode" / "AGENTS.md").is_file()
    assert out["global"] is True
    assert runner.invoke(app, ["init", "--uninstall", "--global"]).exit_code == 0
    assert list(home.iterdir()) == []


def test_init_refuses_foreign_files_and_bad_input(repo):
    (repo / ".claude" / "agents").mkdir(parents=True)
    (repo / ".claude" / "agents" / "analyst.md").write_text("my own analyst\n")
    res = runner.invoke(app, ["init", "--host", "claude", str(repo)])
    assert res.exit_code == 2 and "analyst.md" in res.output and "not written by opforge" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert (repo / ".claude" / "agents" / "analyst.md").read_text() == "my own analyst\n"
    res = runner.invoke(app, ["init", "--host", "vim", str(repo)])
    assert res.exit_code == 2 and "--host" in res.output
    res = runner.invoke(app, ["init", "--uninstall", str(repo)])
    assert res.exit_code == 2 and "nothing installed" in res.output
    (repo / ".claude" / "agents" / "analyst.md").unlink()
    (repo / ".claude" / "settings.json").write_text("{not json")
    res = runner.invoke(app, ["init", "--host", "claude", str(repo)])
    assert res.exit_code == 2 and "settings.json" in res.output


def test_uninstall_keeps_a_file_the_user_edited(repo):
    _init("--host", "claude", str(repo))
    edited = repo / ".claude" / "skills" / "op-api" / "SKILL.md"
    edited.write_text(edited.read_text() + "\nMy note.\n")
    res = runner.invoke(app, ["init", "--uninstall", str(repo), "--json"])
    changes = json.loads(res.stdout)[0]["changes"]
    assert changes[".claude/skills/op-api/SKILL.md"] == "kept (edited since install)"
    assert edited.is_file() and not (repo / ".claude" / "agents").exists()


def test_new_skills_are_discovered_not_listed(tmp_path, monkeypatch):
    """A skill folder added to the package is exported without code changes; an invalid one is skipped."""
    import shutil

    from opforge.hosts import catalog, install

    pkg = tmp_path / "skills"
    shutil.copytree(SKILLS_ROOT / "op_api", pkg / "op_api", ignore=shutil.ignore_patterns("__pycache__"))
    _skill(pkg, "ci_fix", "name: ci-fix\ndescription: Fix CI static errors safely.")
    (pkg / "ci_fix" / "__init__.py").write_text("")
    _skill(pkg, "broken", "name: Broken\ndescription: x")
    monkeypatch.setattr(install, "package_skills", lambda: catalog.package_skills(pkg))
    proj = tmp_path / "proj"
    proj.mkdir()
    out = install.install("claude", proj)
    assert out["skills"] == ["ci-fix", "op-api"]
    assert [s["folder"].endswith("broken") for s in out["skipped_skills"]] == [True]
    orch = (proj / ".claude" / "agents" / "orchestrator.md").read_text()
    assert "`ci-fix`" in orch  # a skill no role claims goes to the orchestrator's toolbox
    shutil.rmtree(pkg / "ci_fix")  # a skill that leaves the package leaves the host on the next install
    out = install.install("claude", proj)
    assert out["changes"][".claude/skills/ci-fix/SKILL.md"] == "removed"
    assert not (proj / ".claude" / "skills" / "ci-fix").exists() and "`ci-fix`" not in \
        (proj / ".claude" / "agents" / "orchestrator.md").read_text()
    install.uninstall(proj)
    assert list(proj.iterdir()) == []


# ------------------------------------------------------------------ hooks gate

def _hook(event: dict, root: Path):
    return runner.invoke(app, ["hooks", "gate", "--host", "claude", "--root", str(root)], input=json.dumps(event))


def test_gate_hook_blocks_state_commands_when_a_gate_fails(ws_copy):
    root = ws_copy.parent
    state = {"hook_event_name": "PreToolUse", "tool_name": "Bash",
             "tool_input": {"command": f"opforge op resume {ws_copy}"}}
    assert _hook(state, root).exit_code == 0
    impl = next(ws_copy.glob("*_impl.py"))  # a hand edit after stage 5: torch math on the launch path
    impl.write_text(impl.read_text() + "\n\ndef _shortcut(x: torch.Tensor):\n    return torch.sin(x)\n")
    res = _hook(state, root)
    assert res.exit_code == 2 and "G5-IMPL-TRITON-ONLY" in res.output
    other = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls -la"}}
    assert _hook(other, root).exit_code == 0
    assert _hook({"hook_event_name": "Stop", "stop_hook_active": False}, root).exit_code == 2
    assert _hook({"hook_event_name": "Stop", "stop_hook_active": True}, root).exit_code == 0
    # the light entry point the installed hooks call gives the same answer without loading the CLI
    light = subprocess.run([sys.executable, "-m", "opforge.hosts.gate_hook", "gate", "--root", str(root)],
                           input=json.dumps(state), capture_output=True, text=True)
    assert light.returncode == 2 and "G5-IMPL-TRITON-ONLY" in light.stderr
    # the command `init` writes into Claude Code's settings, run by a shell whose PATH has no opforge on it
    installed = subprocess.run(["/bin/sh", "-c", render.hook_command("claude") + f" --root {shlex.quote(str(root))}"],
                               input=json.dumps(state), capture_output=True, text=True, env={"PATH": "/nonexistent"})
    assert installed.returncode == 2 and "G5-IMPL-TRITON-ONLY" in installed.stderr, installed.stderr


# ------------------------------------------------------------------ hooks: the entry point by absolute path

def test_hook_entry_point_is_absolute_and_falls_back_to_the_interpreter(tmp_path, monkeypatch):
    argv = render.hook_argv()
    assert os.path.isabs(argv[0]) and Path(argv[0]).parent == Path(os.path.abspath(sys.executable)).parent
    # the fallback, this interpreter running the module, runs without PATH too
    assert install.check_hook([os.path.abspath(sys.executable), "-m", render.HOOK_MODULE]) == \
        {"runs": True, "problem": None}
    lone = tmp_path / "bin" / "python"  # an interpreter outside this venv, no opforge-hook script next to it
    lone.parent.mkdir()
    lone.symlink_to(os.path.realpath(sys.executable))
    monkeypatch.setattr(sys, "executable", str(lone))
    assert render.hook_argv() == [str(lone), "-m", "opforge.hosts.gate_hook"]
    if sys.prefix != sys.base_prefix:  # in a venv, the base interpreter lacks opforge: the check says so
        check = install.check_hook(render.hook_argv())
        assert check["runs"] is False and "No module named 'opforge'" in check["problem"], check
    assert render.hook_command("claude", ["/a b/python", "-m", "x"]) == "'/a b/python' -m x gate --host claude"


def test_init_says_when_the_hook_does_not_run(repo, monkeypatch):
    monkeypatch.setattr(render, "hook_argv", lambda: ["/nonexistent/opforge-hook"])
    res = runner.invoke(app, ["init", "--host", "claude", str(repo)])
    assert res.exit_code == 0, res.output
    assert "warning: the hook command does not run here" in res.stderr and "/nonexistent/opforge-hook" in res.stderr
    assert "hooks call: /nonexistent/opforge-hook gate --host claude (it does NOT run here)" in res.stdout
    out = _init("--host", "claude", str(repo))
    assert out["hook"]["runs"] is False and "FileNotFoundError" in out["hook"]["problem"]


def test_reinstall_replaces_hooks_of_another_interpreter_and_of_older_installs(repo, monkeypatch):
    settings_path = repo / ".claude" / "settings.json"

    def commands() -> list[str]:
        doc = json.loads(settings_path.read_text())
        return [h["command"] for groups in doc.get("hooks", {}).values() for g in groups for h in g["hooks"]]

    real = render.hook_argv
    monkeypatch.setattr(render, "hook_argv", lambda: ["/old/venv/bin/opforge-hook"])
    _init("--host", "claude", str(repo))
    assert set(commands()) == {"/old/venv/bin/opforge-hook gate --host claude"}
    monkeypatch.setattr(render, "hook_argv", real)
    out = _init("--host", "claude", str(repo))  # a new environment: its hooks replace the old ones
    assert set(commands()) == {render.hook_command("claude")} and len(commands()) == 3
    assert out["changes"][".claude/settings.json"] == "updated"

    # an install by an opforge that wrote the bare command and recorded no hooks in its manifest
    mpath = install.manifest_path(repo, "claude")
    manifest = json.loads(mpath.read_text())
    del manifest["settings"]["hooks"]
    mpath.write_text(json.dumps(manifest))
    legacy = render.claude_hook_entries("claude", "opforge-hook gate --host claude")
    settings_path.write_text(json.dumps(render.merge_claude_settings({}, legacy)))
    _init("--host", "claude", str(repo))
    assert set(commands()) == {render.hook_command("claude")} and len(commands()) == 3
    assert runner.invoke(app, ["init", "--uninstall", str(repo)]).exit_code == 0
    assert not settings_path.exists() and not (repo / ".claude").exists()


@pytest.mark.parametrize("host, skills, agent, rules", [
    ("copilot", ".github/skills", ".github/agents/developer.agent.md", ".github/copilot-instructions.md"),
    ("trae", ".trae/skills", ".trae/rules/opforge-developer.md", ".trae/rules/project_rules.md"),
])
def test_copilot_and_trae_get_their_documented_files_idempotently_and_uninstall_exactly(repo, host, skills, agent,
                                                                                          rules):
    (repo / "README.md").write_text("# Project\n")
    before, before_dirs = _tree(repo), _dirs(repo)
    out = _init("--host", host, str(repo))
    assert (repo / skills / "op-develop" / "SKILL.md").is_file() and out["skills"]
    meta, body = split_front_matter((repo / agent).read_text())
    assert meta["description"] and "developer" in body.lower()
    if host == "copilot":
        assert meta["name"] == "developer" and "edit" in meta["tools"]
        orchestrator, _ = split_front_matter((repo / ".github/agents/orchestrator.agent.md").read_text())
        assert "edit" not in orchestrator["tools"]  # the orchestrator moves the state and writes no code
    else:
        assert meta["alwaysApply"] is False  # pulled in by its description, as Trae's rules are
    assert f"opforge:begin {host}" in (repo / rules).read_text()
    assert runner.invoke(app, ["skills", "validate", str(repo / skills)]).exit_code == 0
    installed = _tree(repo)
    assert _init("--host", host, str(repo))["changed"] == [] and _tree(repo) == installed
    assert runner.invoke(app, ["init", "--uninstall", "--host", host, str(repo)]).exit_code == 0
    assert _tree(repo) == before and _dirs(repo) == before_dirs


def test_trae_has_no_user_level_install(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    res = runner.invoke(app, ["init", "--host", "trae", "--global"])
    assert res.exit_code == 2 and "per project only" in res.output and len(res.output.strip().splitlines()) == 1


def test_codearts_gets_its_skills_folder_and_one_rule_file_holding_the_roles(repo, tmp_path, monkeypatch):
    (repo / "README.md").write_text("# Project\n")
    before, before_dirs = _tree(repo), _dirs(repo)
    out = _init("--host", "codearts", str(repo))
    assert (repo / ".codeartsdoer/skills/op-develop/SKILL.md").is_file() and out["skills"]
    assert runner.invoke(app, ["skills", "validate", str(repo / ".codeartsdoer/skills")]).exit_code == 0
    rule = (repo / ".codeartsdoer/rule/opforge.mdc").read_text()
    assert "opforge:begin codearts" in rule and "## Role: " in rule  # no agent files: the roles live in the rule
    assert not rule.startswith("---")  # CodeArts documents no rule fields
    installed = _tree(repo)
    assert _init("--host", "codearts", str(repo))["changed"] == [] and _tree(repo) == installed
    assert runner.invoke(app, ["init", "--uninstall", "--host", "codearts", str(repo)]).exit_code == 0
    assert _tree(repo) == before and _dirs(repo) == before_dirs

    monkeypatch.setenv("HOME", str(tmp_path))  # for the user: skills only, its rules live in its cloud
    out = _init("--host", "codearts", "--global")
    assert (tmp_path / ".codeartsdoer/skills/op-develop/SKILL.md").is_file()
    assert not (tmp_path / ".codeartsdoer/rule").exists()


def test_init_lang_zh_installs_the_chinese_skill_texts_where_they_exist(repo):
    translated = sorted(p.parent.name for p in SKILLS_ROOT.glob("*/SKILL.zh.md"))
    assert translated, "no skill has a Chinese text"
    _init("--host", "claude", str(repo), "--lang", "zh")
    for folder in SKILLS_ROOT.glob("*/SKILL.md"):
        name = split_front_matter(folder.read_text())[0]["name"]
        installed = (repo / ".claude/skills" / name / "SKILL.md").read_text()
        zh = folder.parent / "SKILL.zh.md"
        assert installed == (zh if zh.exists() else folder).read_text()
    assert runner.invoke(app, ["skills", "validate", str(repo / ".claude/skills")]).exit_code == 0
    out = _init("--host", "claude", str(repo), "--lang", "en")  # back to English: the skills change, nothing else
    assert {k for k in out["changed"]} == {f".claude/skills/{split_front_matter(p.read_text())[0]['name']}/SKILL.md"
                                          for p in SKILLS_ROOT.glob("*/SKILL.zh.md")}
    res = runner.invoke(app, ["init", "--host", "claude", str(repo), "--lang", "fr"])
    assert res.exit_code == 2 and "--lang: unknown language 'fr'" in res.output


def test_every_chinese_skill_text_keeps_its_skills_name_and_is_valid(tmp_path):
    for zh in SKILLS_ROOT.glob("*/SKILL.zh.md"):
        meta, body = split_front_matter(zh.read_text())
        english, _ = split_front_matter((zh.parent / "SKILL.md").read_text())
        assert meta["name"] == english["name"] and meta["description"] != english["description"], zh
        assert any("\u4e00" <= ch <= "\u9fff" for ch in body), f"{zh}: no Chinese in its body"
        copy = tmp_path / meta["name"]
        copy.mkdir()
        (copy / "SKILL.md").write_text(zh.read_text())
        res = runner.invoke(app, ["skills", "validate", str(copy)])
        assert res.exit_code == 0, res.output
