"""Release mode on the installed torch's native_functions.yaml against a copy edited the way releases change it."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import openpyxl
import pytest
import yaml
from registry_data import by_codegen_yaml
from torchgen.model import FunctionSchema
from typer.testing import CliRunner

from opforge.cli import app
from opforge.skills.pr_analysis import load_profile, release_diff
from opforge.skills.pr_analysis.release import PACKAGED, installed_yaml
from opforge.skills.pr_analysis.schema_diff import classify_schema

runner = CliRunner()


def _entry(text: str, key: str) -> str:
    start = text.index(f"\n- func: {key}(") + 1
    end = text.find("\n- func:", start)
    return text[start:end + 1]


def _edit(text: str, key: str, old: str, new: str) -> str:
    entry = _entry(text, key)
    assert old in entry, (key, old)
    return text.replace(entry, entry.replace(old, new, 1), 1)


@pytest.fixture(scope="module")
def texts():
    base = installed_yaml().read_text(encoding="utf-8")
    t = base
    t = _edit(t, "add.Tensor", "Scalar alpha=1) -> Tensor", "Scalar alpha=1, bool fast=False) -> Tensor")
    t = _edit(t, "mul.Tensor", "Tensor other) -> Tensor", "Tensor other, Tensor scale) -> Tensor")
    t = t.replace(_entry(t, "abs_"), "", 1)
    t = _edit(t, "abs", "(Tensor self) -> Tensor", "(Tensor self) -> (Tensor, Tensor)")
    t = _edit(t, "softmax.int", "- func: softmax.int(", "- func: softmax.int_dim(")
    t = _edit(t, "sub.Tensor", "Tensor other, *", "Tensor other_t, *")
    t = _edit(t, "relu", "tags: [core, pointwise]", "tags: [core]")
    t = _edit(t, "sin", "    NestedTensorCPU, NestedTensorHPU, NestedTensorCUDA: NestedTensor_sin\n", "")
    # Neither a comment nor moving an entry changes an operator.
    t = _edit(t, "cos", "- func: cos(", "# cos follows sin\n- func: cos(")
    moved = _entry(t, "softmax.int_out")
    t = t.replace(moved, "", 1).rstrip("\n") + "\n\n" + moved
    t += "\n- func: fancy_op(Tensor self, *, float scale=1.0) -> Tensor\n  variants: function\n"
    return base, t


def _independent_schema_diff(a: str, b: str) -> set[str]:
    """Overloads whose schema differs, the slow obvious way: whole yaml, every schema parsed."""
    def schemas(text):
        out = {}
        for e in yaml.load(text, Loader=yaml.CSafeLoader):
            fs = FunctionSchema.parse(e["func"])
            out[str(fs.name)] = str(fs)
        return out
    sa, sb = schemas(a), schemas(b)
    return {k for k in sa.keys() | sb.keys() if sa.get(k) != sb.get(k)}


def test_release_lists_exactly_the_overloads_that_differ(texts, tmp_path):
    base, edited = texts
    new = tmp_path / "native_functions.yaml"
    new.write_text(edited)
    rep = release_diff("installed", str(new), load_profile(None))
    by = {o["op"]: o for o in rep["operators"]}
    differs = {o["op"] for o in rep["operators"] if o["schema_differs"]}
    differs |= {o["old_op"] for o in rep["operators"] if o["old_op"]}
    assert differs == _independent_schema_diff(base, edited)
    assert differs == {"add.Tensor", "mul.Tensor", "abs_", "abs", "softmax.int", "softmax.int_dim", "sub.Tensor",
                       "fancy_op"}
    assert by["add.Tensor"]["kinds"] == ["argument_added_with_default"]
    assert by["mul.Tensor"]["kinds"] == ["argument_added_without_default"]
    assert by["abs_"]["change"] == "removed"
    assert by["abs"]["kinds"] == ["return_changed"]
    assert by["softmax.int_dim"]["change"] == "renamed" and by["softmax.int_dim"]["old_op"] == "softmax.int"
    assert by["sub.Tensor"]["kinds"] == ["argument_renamed"]
    assert by["fancy_op"]["change"] == "added"
    # Metadata changes are listed too, marked as leaving the schema alone.
    assert by["relu"]["kinds"] == ["tags_changed"] and not by["relu"]["schema_differs"]
    assert by["sin"]["kinds"] == ["dispatch_changed"] and by["sin"]["dispatch_keys_changed"] == [
        "NestedTensorCPU", "NestedTensorCUDA", "NestedTensorHPU"]
    assert set(by) == differs - {"softmax.int"} | {"relu", "sin"}
    s = rep["summary"]
    assert (s["added"], s["removed"], s["renamed"], s["changed"]) == (1, 1, 1, 6)
    assert s["overloads_to"] == s["overloads_from"]  # one removed, one added, one renamed


def test_release_grades_against_a_backend_profile(texts, tmp_path):
    base, edited = texts
    new = tmp_path / "native_functions.yaml"
    new.write_text(edited)
    prof = load_profile(str(by_codegen_yaml()))  # torch_npu's operators, from the torch-npu wheel on the registry
    rep = release_diff("installed", str(new), prof)
    by = {o["op"]: o for o in rep["operators"]}
    for op in ("add.Tensor", "mul.Tensor", "abs", "sub.Tensor"):
        assert prof.implements(op)
        assert by[op]["impact"] == "High" and by[op]["implemented"], by[op]
    assert by["fancy_op"]["impact"] == "Medium"
    assert by["sin"]["impact"] == "None"  # only another device's kernel moved


def test_release_from_wheels_folders_and_git_revisions(texts, tmp_path):
    base, edited = texts
    wheels = []
    for version, text in (("9.0.0", base), ("9.1.0", edited)):
        whl = tmp_path / f"torch-{version}-cp311-cp311-linux_x86_64.whl"
        with zipfile.ZipFile(whl, "w") as z:
            z.writestr(PACKAGED, text)
        wheels.append(whl)
    rep = release_diff(str(wheels[0]), str(wheels[1]), load_profile(None))
    assert rep["from"]["version"] == "9.0.0" and rep["to"]["version"] == "9.1.0"
    assert rep["summary"]["schema_differs"] == 7
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / PACKAGED
    site.parent.mkdir(parents=True)
    site.write_text(edited)
    assert release_diff("installed", str(tmp_path / "venv"), load_profile(None))["summary"]["schema_differs"] == 7
    repo = tmp_path / "pytorch"
    nf = repo / "aten/src/ATen/native/native_functions.yaml"
    nf.parent.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for tag, text in (("v9.0.0", base), ("v9.1.0", edited)):
        nf.write_text(text)
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", tag],
                       check=True)
        subprocess.run(["git", "-C", str(repo), "tag", tag], check=True)
    rep = release_diff("v9.0.0", "v9.1.0", load_profile(None), repo=repo)
    assert rep["summary"]["schema_differs"] == 7


def test_release_cli_json_xlsx_and_errors(texts, tmp_path):
    _, edited = texts
    new = tmp_path / "nf.yaml"
    new.write_text(edited)
    out = tmp_path / "release.xlsx"
    res = runner.invoke(app, ["pr-analysis", "--from-torch", "installed", "--to-torch", str(new), "--out", str(out),
                              "--json", "-"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    wb = openpyxl.load_workbook(out)
    assert wb.sheetnames == ["Summary", "Operators"]
    ops = wb["Operators"]
    assert ops.max_row == len(rep["operators"]) + 1 and ops.freeze_panes == "A2"
    assert {ops.cell(r, 1).value for r in range(2, ops.max_row + 1)} == {o["op"] for o in rep["operators"]}
    bad = tmp_path / "notes.yaml"
    bad.write_text("just: a mapping\n")
    for argv, where in ((["--to-torch", str(bad)], "--to-torch: "), (["--to-torch", "0.0.1"], "--to-torch: '0.0.1'"),
                        (["--to-torch", str(tmp_path / "torch-1.0-x.whl")], "--to-torch")):
        if argv[1].endswith(".whl"):
            Path(argv[1]).write_bytes(b"not a zip")
        res = runner.invoke(app, ["pr-analysis", "--from-torch", "installed", *argv, "--out", str(out)])
        assert res.exit_code == 2, res.output
        assert len(res.stderr.strip().splitlines()) == 1 and where in res.stderr, res.stderr


@pytest.mark.parametrize("old, new, kinds", [
    ("f(Tensor self, int dim) -> Tensor", "f(Tensor self, int dim=0) -> Tensor", ["argument_default_changed"]),
    ("f(Tensor self, int dim) -> Tensor", "f(Tensor self, SymInt dim) -> Tensor", ["argument_type_changed"]),
    ("f(Tensor self, int dim=0) -> Tensor", "f(Tensor self, *, int dim=0) -> Tensor", ["argument_kwarg_only_changed"]),
    ("f(Tensor self) -> Tensor", "f(Tensor(a) self) -> Tensor(a)", ["alias_annotation_changed", "return_changed"]),
    ("f(Tensor self, int a, int b) -> Tensor", "f(Tensor self, int b, int a) -> Tensor", ["argument_reordered"]),
    ("f(Tensor self, int a) -> Tensor", "f(Tensor self) -> Tensor", ["argument_removed"]),
])
def test_kinds_of_schema_change(old, new, kinds):
    got, details = classify_schema(FunctionSchema.parse(old), FunctionSchema.parse(new))
    assert got == kinds and len(details) >= len(kinds)


def test_yaml_written_by_a_dumper_that_sorts_keys():
    """Entries whose `func:` is not the first key, and schemas folded over two lines, diff the same way."""
    from opforge.skills.pr_analysis.schema_diff import diff_native

    a = [{"func": "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", "dispatch": {"CPU": "k"}},
         {"func": "relu(Tensor self) -> Tensor", "variants": "function, method"},
         {"func": "abs(Tensor self) -> Tensor"}]
    b = [dict(a[0], func="add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1, bool a_long_flag_name_that_"
                         "makes_the_dumper_fold_the_line=False) -> Tensor"),
         a[1], {"func": "abs(Tensor self) -> (Tensor, Tensor)", "autogen": "abs.out"},
         {"func": "new_op(Tensor self) -> Tensor"}]
    old, new = yaml.safe_dump(a), yaml.safe_dump(b)
    assert new.startswith("- dispatch:") and "\n    -> Tensor" in new
    got = {c.op: (c.change, c.kinds) for c in diff_native(old, new)}
    assert got == {"add.Tensor": ("changed", ["argument_added_with_default"]),
                   "abs": ("changed", ["return_changed", "field_changed:autogen"]),
                   "new_op": ("added", ["added"])}
