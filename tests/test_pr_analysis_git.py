"""Reading history with git: renames, deletions, merged PRs in forks; profiles from files and the live dispatcher."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from opforge.errors import InputError
from opforge.skills.pr_analysis import analyze_window, load_profile
from opforge.skills.pr_analysis.gitlog import iter_commits
from opforge.skills.pr_analysis.grade import grade_op
from opforge.skills.pr_analysis.schema_diff import OpChange


def _git(repo: Path, *args: str) -> str:
    env_args = ["-c", "user.name=Dev One", "-c", "user.email=dev@example.com"]
    return subprocess.run(["git", "-C", str(repo), *env_args, *args], check=True, capture_output=True,
                          text=True).stdout


def _write(repo: Path, path: str, text: str) -> None:
    p = repo / path
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


@pytest.fixture
def fork(tmp_path):
    """A fork that merges PRs with merge commits; one PR renames and deletes files."""
    repo = tmp_path / "fork"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "remote", "add", "origin", "git@github.com:acme/pytorch.git")
    _write(repo, "c10/core/DispatchKey.h", "enum class DispatchKey {\n  CPU,\n  PrivateUse1,\n};\n")
    _write(repo, "docs/notes.md", "-- a line that starts like a diff header\nkeep\n")
    _write(repo, "torch/_inductor/old_name.py", "x = 1\n")
    _write(repo, "test/test_gone.py", "assert True\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "checkout", "-q", "-b", "feature")
    _write(repo, "c10/core/DispatchKey.h", "enum class DispatchKey {\n  CPU,\n  PrivateUse1,\n  PrivateUse2,\n};\n")
    _git(repo, "commit", "-qam", "add a key")
    _write(repo, "docs/notes.md", "keep\n")
    _git(repo, "mv", "torch/_inductor/old_name.py", "torch/_inductor/new_name.py")
    _git(repo, "rm", "-q", "test/test_gone.py")
    _git(repo, "commit", "-qam", "tidy")
    _git(repo, "checkout", "-q", "main")
    _git(repo, "merge", "-q", "--no-ff", "feature", "-m", "Merge pull request #42 from dev/feature\n\nAdd a key")
    return repo


def test_merged_pr_of_a_fork_is_one_row_with_its_whole_diff(fork):
    rep = analyze_window(fork, load_profile(None), rev_range="main~1..main")
    assert [r["pr"] for r in rep["rows"]] == [42]
    row = rep["rows"][0]
    assert row["impact"] == "High" and row["points"] == ["dispatch_keys"]
    assert row["pr_url"] == "https://github.com/acme/pytorch/pull/42"
    assert row["commit_url"].startswith("https://github.com/acme/pytorch/commit/")
    ev = row["evidence"][0]
    assert ev["file"] == "c10/core/DispatchKey.h" and ev["lines"] == "L4" and "PrivateUse2" in ev["snippet"]


def test_renames_deletions_and_header_like_lines(fork):
    commits = list(iter_commits(fork, ["main~1..feature"]))
    tidy = next(c for c in commits if c.title == "tidy")
    files = {f.path: f for f in tidy.files}
    assert files["torch/_inductor/new_name.py"].status == "R"
    assert files["torch/_inductor/new_name.py"].old_path == "torch/_inductor/old_name.py"
    assert files["test/test_gone.py"].status == "D" and files["test/test_gone.py"].removed == [(1, "assert True")]
    # A removed line reading "-- ..." shows as "--- ..." in the patch and is still a removed line.
    notes = files["docs/notes.md"]
    assert notes.removed == [(1, "-- a line that starts like a diff header")] and notes.added == []


def test_profiles_from_lists_and_profile_yaml(tmp_path):
    lst = tmp_path / "ops.txt"
    lst.write_text("# ops of my backend\naten::add.Tensor\nmul.Tensor  # with a comment\n\n")
    p = load_profile(str(lst))
    assert p.operators == {"add.Tensor", "mul.Tensor"} and not p.generic and p.has_family("add_.Tensor")
    assert p.implements("add.Tensor") and not p.implements("add.out")
    lst.write_text("abs\n")
    p = load_profile(str(lst))
    assert p.implements("abs") and p.implements("abs.out") and not p.implements("abs_")
    yml = tmp_path / "p.yaml"
    yml.write_text("- add.Tensor\n- relu\n")
    assert load_profile(str(yml)).operators == {"add.Tensor", "relu"}
    stubs = tmp_path / "npu_native_functions.yaml"
    stubs.write_text("backend: NPU\ncpp_namespace: at_npu::native\nsupported:\n  - add.Tensor\n  - abs\n"
                     "autograd:\n  - npu_dropout\n"
                     "custom:\n  - func: npu_dropout(Tensor self, float p) -> (Tensor, Tensor)\n")
    p = load_profile(str(stubs))
    assert p.operators == {"add.Tensor", "abs", "npu_dropout"} and p.autograd_ops == {"npu_dropout"}
    assert not p.implements("abs.out")  # backend yaml names are exact overloads
    assert p.name == "NPU"
    js = tmp_path / "ops.json"
    js.write_text('["add.Tensor", "aten::relu"]')
    assert load_profile(str(js)).operators == {"add.Tensor", "relu"}
    g = load_profile(None)
    assert g.generic and g.relies_on("c10d") and not g.operators


def test_profile_from_the_live_dispatcher():
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("abs", lambda x: x, "PrivateUse1")
        prof = load_profile("dispatch:PrivateUse1")
    finally:
        lib._destroy()
    assert "abs" in prof.operators and prof.dispatch_key == "PrivateUse1"
    ch = OpChange(op="abs", change="changed", kinds=["return_changed"], details=["returns Tensor -> (Tensor, Tensor)"],
                  old="abs(Tensor self) -> Tensor", new="abs(Tensor self) -> (Tensor, Tensor)", schema_differs=True)
    assert grade_op(ch, prof)[0] == "High"
    assert len(load_profile("dispatch:CPU").operators) > 500
    with pytest.raises(InputError, match="unknown dispatch key"):
        load_profile("dispatch:NoSuchKey")
    with pytest.raises(InputError, match="cannot import backend module"):
        load_profile("dispatch:PrivateUse1@no_such_backend_module")
