"""pr-analysis over a synthetic PyTorch-shaped repository whose commits have known grades."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import openpyxl
import pytest
import yaml
from registry_data import by_codegen_yaml, native_yaml
from typer.testing import CliRunner

from opforge.cli import app
from opforge.skills.pr_analysis import analyze_window, load_profile
from opforge.skills.pr_analysis.synthrepo import build_repo

N_COMMITS = 62  # every scenario twice
AFTER_IMPORT = "2026-01-01T00:10:00Z"  # the base commit is at 00:00, scenarios every 30 minutes after it

runner = CliRunner()


@pytest.fixture(scope="module")
def npu_yaml() -> Path:
    """Every overload torch_npu implements (its own and op-plugin's), from the torch-npu wheel on the registry."""
    return by_codegen_yaml()


@pytest.fixture(scope="module")
def op_plugin(npu_yaml):
    return load_profile(str(npu_yaml))


@pytest.fixture(scope="module")
def synth(tmp_path_factory, op_plugin):
    repo = tmp_path_factory.mktemp("synth") / "pytorch"
    expected = build_repo(repo, N_COMMITS, op_plugin.operators)
    return repo, expected


@pytest.fixture(scope="module")
def reports(synth, op_plugin):
    repo, _ = synth
    return {"op_plugin": analyze_window(repo, op_plugin, since=AFTER_IMPORT),
            "generic": analyze_window(repo, load_profile(None), since=AFTER_IMPORT)}


def _independent_overloads(path: Path) -> dict[str, set[str]]:
    """Each section's overloads, the plain way: a name, or the name before the schema's '(' in `func`."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {section: {(e if isinstance(e, str) else e["func"]).split("(", 1)[0].strip() for e in entries}
            for section, entries in doc.items() if isinstance(entries, list)}


def test_profiles_from_the_torch_npu_wheel_list_every_overload_of_the_yaml(npu_yaml, op_plugin):
    own_yaml = native_yaml()
    for path in (own_yaml, npu_yaml):
        sections = _independent_overloads(path)
        prof = load_profile(str(path))
        assert prof.operators == set().union(*sections.values()), path
        assert prof.autograd_ops == sections.get("autograd", set()), path
        assert prof.name == "NPU" and prof.dispatch_key == "PrivateUse1" and not prof.loose
    # torch_npu's own registrations, `- func: NAME` entries with options among them, are part of the full set
    own = load_profile(str(own_yaml))
    named = [e["func"] for e in yaml.safe_load(own_yaml.read_text(encoding="utf-8"))["supported"]
             if isinstance(e, dict) and "(" not in e["func"]]
    assert named and all(own.implements(op) for op in named)
    assert own.operators < op_plugin.operators


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize("kind", ["op_plugin", "generic"])
def test_every_known_commit_gets_its_grade(synth, reports, kind):
    _, expected = synth
    rows = {r["title"]: r for r in reports[kind]["rows"]}
    assert reports[kind]["summary"]["commits"] == N_COMMITS
    wrong = [(e["name"], rows[e["title"]]["impact"], e["expected"][kind]) for e in expected
             if rows[e["title"]]["impact"] != e["expected"][kind]]
    assert not wrong, wrong
    assert {e["expected"][kind] for e in expected} == {"High", "Medium", "Low", "None"}


def test_high_rows_name_their_operator_or_integration_point_with_lines(synth, reports):
    repo, expected = synth
    rows = {r["title"]: r for r in reports["op_plugin"]["rows"]}
    highs = [e for e in expected if e["expected"]["op_plugin"] == "High"]
    assert len(highs) >= 20
    for e in highs:
        row = rows[e["title"]]
        top = [ev for ev in row["evidence"] if ev["level"] == "High"]
        assert top, e
        named = " ".join(ev["subject"] + " " + ev["why"] for ev in top)
        assert e["subject"] in named, (e["subject"], named)
        assert all(ev["file"] and ev["lines"].startswith("L") for ev in top), top
        assert row["suggestion"]


def test_evidence_lines_are_the_changed_lines(synth, reports):
    repo, expected = synth
    rows = {r["title"]: r for r in reports["op_plugin"]["rows"]}
    e = next(x for x in expected if x["name"] == "dispatch_key")
    row = rows[e["title"]]
    ev = next(v for v in row["evidence"] if v["subject"] == "dispatch_keys")
    line_no = int(ev["lines"][1:].split("-")[0].split(",")[0])
    text = _git(repo, "show", f"{row['commits'][0]}:{ev['file']}").splitlines()[line_no - 1]
    assert "reserved bit" in text and ev["file"] == "c10/core/DispatchKey.h"
    # An operator's evidence points at its entry in the yaml of that commit.
    e = next(x for x in expected if x["name"] == "arg_default")
    row = rows[e["title"]]
    ev = row["evidence"][0]
    line_no = int(ev["lines"][1:])
    text = _git(repo, "show", f"{row['commits'][0]}:{ev['file']}").splitlines()[line_no - 1]
    assert text.startswith(f"- func: {e['subject']}(") and "synth_flag" in text


def test_operator_changes_carry_the_kind_of_change(synth, reports):
    _, expected = synth
    ops = reports["op_plugin"]["operators"]
    by = {}
    for o in ops:
        by.setdefault(o["op"], []).append(o)
    e = next(x for x in expected if x["name"] == "arg_default")
    assert any("argument_added_with_default" in o["kinds"] and o["implemented"] for o in by[e["subject"]])
    e = next(x for x in expected if x["name"] == "rename_overload")
    renamed = [o for o in ops if o["change"] == "renamed" and o["old_op"] == e["subject"]]
    assert len(renamed) == 1 and renamed[0]["impact"] == "High"
    e = next(x for x in expected if x["name"] == "ret_change")
    assert any("return_changed" in o["kinds"] for o in by[e["subject"]])
    e = next(x for x in expected if x["name"] == "dispatch_cuda")
    row = next(r for r in reports["op_plugin"]["rows"] if r["title"] == e["title"])
    got = [(o["op"], o["impact"], o["dispatch_keys_changed"]) for o in row["operators"]]
    assert got == [(e["op"], "None", ["MTIA"])]


def test_pr_numbers_reverts_and_plain_commits(synth, reports):
    _, expected = synth
    rows = {r["title"]: r for r in reports["generic"]["rows"]}
    for e in expected:
        row = rows[e["title"]]
        if e["revert_of"] is not None:
            assert row["kind"] == "revert" and row["pr"] == e["revert_of"]
        elif e["pr"] is None:
            assert row["kind"] == "commit" and row["pr"] is None and row["pr_url"] is None
        else:
            assert row["pr"] == e["pr"] and row["pr_url"] == f"https://github.com/pytorch/pytorch/pull/{e['pr']}"
        assert row["commit_url"].endswith(row["commits"][0])
    assert any(e["pr"] is None and e["revert_of"] is None for e in expected)
    reverted = {e["revert_of"] for e in expected if e["revert_of"] is not None}
    assert reverted & {e["pr"] for e in expected}  # a PR and its revert in one window
    assert {r["pr"] for r in rows.values() if r["reverted"]} == reverted & {e["pr"] for e in expected}


def test_range_and_until_select_the_window(synth, op_plugin):
    repo, expected = synth
    rep = analyze_window(repo, op_plugin, rev_range="main~10..main")
    assert rep["summary"]["commits"] == 10
    assert [r["title"] for r in rep["rows"]] == [e["title"] for e in expected[-10:]][::-1]
    # Commits are 30 minutes apart from 2026-01-01T00:00Z; the first scenario is at 00:30.
    rep = analyze_window(repo, op_plugin, since=AFTER_IMPORT, until="2026-01-01T02:10:00Z")
    assert [r["title"] for r in rep["rows"]] == [e["title"] for e in expected[:4]][::-1]
    # Bare dates are whole UTC days, whatever the time of day the command runs at.
    rep = analyze_window(repo, op_plugin, since="2026-01-01", until="2026-01-01")
    assert rep["summary"]["commits"] == 48  # the import at 00:00 and scenarios up to 23:30
    assert rep["rows"][0]["date"] == "2026-01-01T23:30:00+00:00"


def test_profile_without_an_integration_point_grades_it_medium(synth, tmp_path):
    repo, expected = synth
    prof = tmp_path / "backend.yaml"
    prof.write_text("name: small\ndispatch_key: PrivateUse1\noperators: [add.Tensor]\n"
                    "integration_points: [dispatch_keys]\n")
    rep = analyze_window(repo, load_profile(str(prof)), rev_range="main~29..main")
    rows = {r["title"]: r for r in rep["rows"]}
    c10d = next(e for e in reversed(expected) if e["name"] == "c10d")
    dk = next(e for e in reversed(expected) if e["name"] == "dispatch_key")
    assert rows[c10d["title"]]["impact"] == "Medium"
    assert rows[dk["title"]]["impact"] == "High"
    assert rep["profile"]["integration_points"] == ["dispatch_keys"]


def test_cli_writes_xlsx_json_md_with_links(synth, npu_yaml, tmp_path):
    repo, expected = synth
    out, js, md = tmp_path / "r.xlsx", tmp_path / "r.json", tmp_path / "r.md"
    res = runner.invoke(app, ["pr-analysis", "--repo", str(repo), "--since", AFTER_IMPORT, "--backend",
                              str(npu_yaml), "--out", str(out), "--json", str(js), "--md", str(md)])
    assert res.exit_code == 0, res.output
    rep = json.loads(js.read_text())
    wb = openpyxl.load_workbook(out)
    assert wb.sheetnames == ["Summary", "PRs", "Operators"]
    ws = wb["PRs"]
    header = [c.value for c in ws[1]]
    assert header[:3] == ["PR", "Commit", "Title"] and "Impact" in header and "Evidence" in header
    assert ws.freeze_panes == "A2" and ws.auto_filter.ref == f"A1:{ws.cell(1, len(header)).column_letter}" \
                                                             f"{len(rep['rows']) + 1}"
    impact_col = header.index("Impact") + 1
    for r, row in enumerate(rep["rows"], 2):
        pr_cell, commit_cell = ws.cell(r, 1), ws.cell(r, 2)
        assert commit_cell.hyperlink.target == row["commit_url"]
        if row["pr"]:
            assert pr_cell.hyperlink.target == row["pr_url"]
        high = ws.cell(r, impact_col).value == "High"
        assert high == (row["impact"] == "High")
        assert (ws.cell(r, 3).fill.fgColor.rgb == "00F8CBAD") == high
    assert wb["Operators"].max_row == len(rep["operators"]) + 1
    summary = {ws_row[0].value: ws_row[1].value for ws_row in wb["Summary"].iter_rows()}
    assert summary["High"] == rep["summary"]["by_impact"]["High"] and summary["Commits"] == N_COMMITS
    text = md.read_text()
    assert f"| High | {rep['summary']['by_impact']['High']} |" in text
    assert "https://github.com/pytorch/pytorch/pull/" in text


def test_cli_json_on_stdout_and_web_base(synth, tmp_path):
    repo, _ = synth
    res = runner.invoke(app, ["pr-analysis", "--repo", str(repo), "--range", "main~3..main", "--json", "-",
                              "--out", str(tmp_path / "x.xlsx"), "--web", "https://github.com/acme/pytorch"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["summary"]["commits"] == 3
    assert all(r["commit_url"].startswith("https://github.com/acme/pytorch/commit/") for r in rep["rows"])


def test_empty_window_is_a_valid_empty_report(synth, tmp_path):
    repo, _ = synth
    out = tmp_path / "empty.xlsx"
    res = runner.invoke(app, ["pr-analysis", "--repo", str(repo), "--since", "2031-01-01", "--out", str(out),
                              "--json", "-"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows"] == []
    assert openpyxl.load_workbook(out)["PRs"].max_row == 1


@pytest.mark.parametrize("argv, where", [
    (["--repo", "{tmp}/nowhere", "--since", "2026-01-01"], "--repo: no such directory"),
    (["--repo", "{tmp}", "--since", "2026-01-01"], "--repo: not a git repository"),
    (["--repo", "{repo}", "--since", "last tuesday"], "--since: not an ISO date"),
    (["--repo", "{repo}", "--range", "main..no-such-branch"], "--range: unknown revision 'no-such-branch'"),
    (["--repo", "{repo}"], "--since: a window needs"),
    (["--repo", "{repo}", "--since", "2026-01-01", "--backend", "{tmp}/missing.yaml"], "--backend: no such file"),
    (["--repo", "{repo}", "--since", "2026-01-01", "--out", "{tmp}/no/dir/r.xlsx"],
     "--out: {tmp}/no/dir/r.xlsx: {tmp}/no/dir does not exist"),
    (["--repo", "{repo}", "--since", "2026-01-01", "--out", "{tmp}/adir"],
     "--out: {tmp}/adir: is a folder; --out names a file to write"),
    (["--repo", "{repo}", "--since", "2026-01-01", "--out", "{tmp}/afile/r.xlsx"],
     "--out: {tmp}/afile/r.xlsx: {tmp}/afile is a file, not a folder"),
    (["--repo", "{repo}", "--since", "2026-01-01", "--md", "{tmp}/adir"],
     "--md: {tmp}/adir: is a folder; --md names a file to write"),
    (["--repo", "{repo}", "--since", "2026-01-01", "--json", "{tmp}/afile/r.json"],
     "--json: {tmp}/afile/r.json: {tmp}/afile is a file, not a folder"),
    (["--from-torch", "installed"], "--to-torch: release mode needs both"),
])
def test_bad_input_exits_2_with_one_line(synth, tmp_path, argv, where):
    repo, _ = synth
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    argv = [a.format(tmp=tmp_path, repo=repo) for a in argv]
    res = runner.invoke(app, ["pr-analysis", *argv, "--out", str(tmp_path / "r.xlsx")] if "--out" not in argv
                        else ["pr-analysis", *argv])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and where.format(tmp=tmp_path) in lines[0], res.stderr


@pytest.mark.parametrize("name, text, where", [
    ("bad.yaml", "official:\n  - func: add.Tensor(Tensor self\n    op_api: [v2.1\n", "bad.yaml:"),
    ("noplugin.yaml", "official:\n  - op_api: all_version\n", "noplugin.yaml: official[0]"),
    ("list.txt", "add.Tensor\nthis is not an op\n", "list.txt:2"),
    ("npu.yaml", "backend: NPU\nsupported:\n  - clone\n  - func: not an op\n    op_api: True\n",
     "npu.yaml: supported[1]"),
    ("points.yaml", "operators: [add.Tensor]\nintegration_points: [warp_drive]\n", "points.yaml: integration_points"),
    ("empty.txt", "# nothing\n", "empty.txt: the operator list is empty"),
])
def test_malformed_profile_exits_2_naming_the_file(synth, tmp_path, name, text, where):
    repo, _ = synth
    (tmp_path / name).write_text(text)
    res = runner.invoke(app, ["pr-analysis", "--repo", str(repo), "--since", "2026-01-01", "--backend",
                              str(tmp_path / name), "--out", str(tmp_path / "r.xlsx")])
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and where in res.stderr, res.stderr
    assert not (tmp_path / "r.xlsx").exists()


@pytest.mark.parametrize("path, level, point", [
    ("c10/core/DispatchKeySet.h", "Low", "dispatch_keys"),
    ("aten/src/ATen/detail/PrivateUse1HooksInterface.cpp", "Low", "privateuse1_hooks"),
    ("torch/csrc/distributed/c10d/ProcessGroup.hpp", "Low", "c10d"),
    ("torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp", "None", None),
    ("torch/_inductor/codegen/common.py", "Low", "compile_device_interface"),
    ("torch/_inductor/codegen/triton.py", "Low", None),
    ("torch/testing/_internal/common_device_type.py", "Low", "device_test_base"),
    ("torch/_decomp/decompositions.py", "Medium", None),
    ("aten/src/ATen/native/cuda/Loss.cu", "None", None),
    ("aten/src/ATen/native/mps/operations/Loss.mm", "None", None),
    ("docs/source/accelerator.md", "None", None),
    (".github/workflows/trunk.yml", "None", None),
    ("test/test_ops.py", "Low", None),
    ("cmake/Dependencies.cmake", "Low", None),
    ("benchmarks/dynamo/huggingface.py", "None", None),
])
def test_path_rules(path, level, point):
    from opforge.skills.pr_analysis.areas import classify_path

    info = classify_path(path)
    assert (info.level, info.point) == (level, point)
