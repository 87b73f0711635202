"""op-adapt, op-apidoc and op-test in Chinese: the CHECKLIST, the API page and the printed summaries of the same
adaptation show the same figures in both languages, the Chinese ones hold no English sentence (code, schemas, error
messages and the file classes and actions tools compare aside), and checklist.json and --json stay English."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest
from i18n_scan import english_sentences, figures
from typer.testing import CliRunner

from opforge import i18n
from opforge.cli import app
from opforge.skills.op_adapt import adapt, check, command, texts
from opforge.skills.op_adapt.checklist import Argument, Checklist, Conflict, Constraint, _constraints, markdown
from opforge.skills.op_adapt.modify import load_checklist
from opforge.skills.op_apidoc import page
from opforge.skills.op_test import run as op_test_run

runner = CliRunner()

# what stays English in a Chinese page, besides the kernels' error messages: an InputError's text, file classes
MACHINE = ("the vendor library has no kernel", "API doc (op-apidoc)", "registration yaml", "C++ kernel")


def hypot() -> Checklist:
    args = [Argument("self", "Tensor", None), Argument("other", "Tensor", None), Argument("alpha", "Scalar", "1", True)]
    dtypes = ["float32", "float64", "float16"]
    out = {"size": "broadcast", "dtype": "result_type", "inputs": ["self", "other"]}
    c = Checklist(op="aten::hypot", kind="aten", schema="hypot(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
                  name="hypot", overload="", class_name="Hypot", arguments=args, returns="Tensor", dtypes=dtypes,
                  dtype_sources={"vendor": [*dtypes, "bfloat16"], "opinfo": [*dtypes, "int32"]}, output=out,
                  constraints=_constraints("hypot", ["self", "other"], dtypes, out),
                  backward={"source": "torch derivatives.yaml", "formulas": {"self": "grad * self / result"},
                            "differentiable": ["self", "other"], "ops": ["div.Tensor", "mul.Tensor"],
                            "missing": ["div.Tensor"]},
                  vendor_kernel="vkHypot", opinfo="hypot")
    c.conflicts = [
        Conflict("dtypes", texts.TORCH_ONLY_DTYPES.format(dtypes="int32", kernel="vkHypot"), texts.REFUSED),
        Conflict("dtypes", texts.VENDOR_ONLY_DTYPES.format(dtypes="bfloat16"), texts.UNTESTED),
        Conflict("backward", texts.BACKWARD_LACKS.format(op="div.Tensor", why="the vendor library has no kernel"),
                 texts.GRADIENTS_FAIL),
        Conflict("backward", texts.BACKWARD_LACKED.format(ops="mul.Tensor, sum.dim_IntList"), texts.ALONGSIDE)]
    c.files = [{"path": "opdev_functions.yaml", "class": "registration yaml", "action": "add hypot"},
               {"path": "ops/HypotKernelOpdev.cpp", "class": "C++ kernel", "action": "create"},
               {"path": "docs/hypot.md", "class": "API doc (op-apidoc)", "action": "create"},
               {"path": "adaptations/hypot/CHECKLIST.md", "class": "checklist", "action": "create"}]
    return c


def scaled_silu() -> Checklist:
    """A custom operator: a same-shape constraint, a traced backward, no vendor kernel, no conflict."""
    args = [Argument("x", "Tensor", None), Argument("w", "Tensor", None), Argument("alpha", "float", "1.0")]
    return Checklist(
        op="myops::scaled_silu", kind="custom", schema="myops::scaled_silu(Tensor x, Tensor w, float alpha=1.0) -> "
        "Tensor", name="scaled_silu", overload="", class_name="ScaledSilu", arguments=args, returns="Tensor",
        dtypes=["float32", "float16"], dtype_sources={"reference": ["float32", "float16"]},
        output={"size": "same", "dtype": "self", "inputs": ["x", "w"]},
        constraints=[Constraint("dtype_x", texts.DTYPE_RULE.format(tensor="x", dtypes="float32, float16"), "c", "m",
                                "scaled_silu: x must have dtype in [float32 float16] on opdev"),
                     Constraint("same_shape", texts.SAME_SHAPE_RULE.format(tensors="x, w"), "c", "m",
                                "scaled_silu: x, w must have the same shape")],
        backward={"source": texts.TRACED, "differentiable": [], "formulas": {}, "ops": [], "missing": []},
        vendor_kernel=None, opinfo=None)


def not_differentiable() -> Checklist:
    c = hypot()
    c.backward = {"source": texts.NOT_DIFFERENTIABLE, "formulas": {}, "differentiable": []}
    c.conflicts = []
    return c


CHECKLISTS = {"aten": hypot, "custom": scaled_silu, "no-backward": not_differentiable}
MACHINE += tuple(r.message for make in CHECKLISTS.values() for r in make().constraints)


@pytest.fixture(autouse=True)
def no_docstring(monkeypatch):
    # torch's docstrings are torch's own English words: the page's description is not ours to translate
    monkeypatch.setattr(page, "_docstring", lambda c: "")


def _both(render):
    with i18n.using("en"):
        en = render()
    with i18n.using("zh"):
        zh = render()
    return en, zh


def _same_figures_no_english(en: str, zh: str, allowed: tuple[str, ...] = ()) -> None:
    assert zh != en
    assert figures(zh) == figures(en)
    left = english_sentences(zh, MACHINE + allowed)
    assert not left, left
    assert english_sentences(en, MACHINE + allowed)  # the scan does see English


@pytest.mark.parametrize("kind", sorted(CHECKLISTS))
def test_the_checklist_in_chinese_has_the_figures_of_the_english_one(kind):
    en, zh = _both(lambda: markdown(CHECKLISTS[kind]()))
    _same_figures_no_english(en, zh)
    assert zh.startswith("# 检查清单：") and "## 函数签名 (schema)" in zh
    c = CHECKLISTS[kind]()
    assert f"`{c.schema}`" in zh  # the schema as it is
    for f in c.files:  # classes and actions, which tools compare, stay English
        assert f"| {f['path']} | {f['class']} | {f['action']} |" in zh


@pytest.mark.parametrize("kind", sorted(CHECKLISTS))
def test_the_api_page_in_chinese_has_the_figures_of_the_english_one(kind):
    c = CHECKLISTS[kind]()
    en, zh = _both(lambda: page.markdown(c, page.example_code(c), page.pending_output()))
    _same_figures_no_english(en, zh)
    assert "## 参数" in zh and "输出（在 opdev 上运行）：" in zh
    assert f"```\n{c.schema}\n```" in zh and page.example_code(c).rstrip() in zh  # schema and code untouched


def test_a_checklist_read_back_from_json_shows_the_same_chinese_text(tmp_path):
    """--modify reads checklist.json, whose sentences are plain English: CHECKLIST.md comes out as if fresh."""
    c = hypot()
    c.overload = ""
    data = json.loads(json.dumps(c.to_json()))
    assert data["conflicts"][0]["detail"] == "torch supports int32; the vendor kernel vkHypot does not"
    assert data["constraints"][2]["text"] == "the shapes of self, other broadcast together"
    folder = tmp_path / "adaptations" / "hypot"
    folder.mkdir(parents=True)
    (folder / "checklist.json").write_text(json.dumps(data))
    again = load_checklist(tmp_path, "hypot")
    with i18n.using("zh"):
        assert markdown(again) == markdown(c)
    assert asdict(again) == data


def test_check_reads_the_parameters_table_of_a_page_in_either_language():
    c = hypot()
    for lang in i18n.LANGUAGES:
        with i18n.using(lang):
            text = page.markdown(c, page.example_code(c), page.pending_output())
        rows, _end = check._doc_table(text)
        assert [(r.name, r.type, r.default) for r in rows] == [("self", "Tensor", None), ("other", "Tensor", None),
                                                              ("alpha", "Scalar", "1")], lang


def _fake_result(c: Checklist) -> adapt.Result:
    return adapt.Result(c, [scaled_silu()], [f["path"] for f in c.files], "",
                        {"library": "/tmp/libopdev.so", "seconds": 12.345, "cached": False})


def test_the_adaptation_summary_in_chinese(monkeypatch):
    monkeypatch.setattr(command, "_run", lambda *a, **k: _fake_result(hypot()))
    out = {lang: runner.invoke(app, ["op-adapt", "aten::hypot", "--lang", lang], env={"COLUMNS": "200"})
           for lang in ("en", "zh")}
    assert out["en"].exit_code == out["zh"].exit_code == 0, out["zh"].output
    assert "aten::hypot adapted" in out["en"].stdout and "aten::hypot 已适配" in out["zh"].stdout
    assert "后端构建用时 12.3 秒：/tmp/libopdev.so" in out["zh"].stdout
    _same_figures_no_english(out["en"].stdout, out["zh"].stdout)
    js = runner.invoke(app, ["op-adapt", "aten::hypot", "--lang", "zh", "--json"])
    doc = json.loads(js.stdout)
    assert doc["checklist"]["conflicts"][2]["resolution"] == "gradients will fail on the device until it is adapted"


def test_the_check_summary_in_chinese(monkeypatch):
    monkeypatch.setattr(check, "run", lambda p: check.Report(Path(p), "reference", [], ["aten::hypot", "aten::exp"]))
    en = runner.invoke(app, ["op-adapt", "check", "/tmp", "--lang", "en"])
    zh = runner.invoke(app, ["op-adapt", "check", "/tmp", "--lang", "zh"])
    assert en.stdout == "OK: /tmp: 2 adaptation(s) cross-checked, no disagreement\n"
    assert zh.exit_code == 0 and zh.stdout.startswith("OK：/tmp：") and figures(zh.stdout) == figures(en.stdout)
    assert not english_sentences(zh.stdout)


REPORT = {"root": "/r", "tests": 12, "failed": 2, "passed": 9, "verdicts": [
    {"test": "tests/test_hypot_opdev.py::test_a", "verdict": "environment", "rule": "flaky", "file": None,
     "evidence": {"exception": "RuntimeError", "message": "device lost", "location": ""},
     "why": "it failed, then passed when rerun unchanged"},
    {"test": "tests/test_hypot_opdev.py::test_b", "verdict": "adaptation_bug", "rule": "wrong-values",
     "file": "ops/HypotKernelOpdev.cpp", "evidence": {"exception": "AssertionError", "message": "Tensor-likes are "
                                                      "not close", "location": "t.py:3"},
     "why": "the device's result differs from the CPU's"}]}


def test_the_op_test_report_in_chinese_and_its_json_in_english(monkeypatch):
    def fake_run(root, tests, reruns, progress):
        progress(0, 2, "tests/test_hypot_opdev.py::test_a")
        return REPORT

    monkeypatch.setattr(op_test_run, "run", fake_run)
    out = {lang: runner.invoke(app, ["op-test", "run", "/r", "--lang", lang], env={"COLUMNS": "200"})
           for lang in ("en", "zh")}
    assert out["en"].exit_code == out["zh"].exit_code == 1
    assert "12 tests: 9 passed, 2 failed" in out["en"].stdout and "12 个测试：9 个通过，2 个失败" in out["zh"].stdout
    assert "正在重跑失败的测试 1/2" in out["zh"].stderr
    # what the failing tests raised is theirs, not ours to translate
    own = ("RuntimeError: device lost", "AssertionError: Tensor-likes are not close")
    _same_figures_no_english(out["en"].stdout, out["zh"].stdout, own)
    js = runner.invoke(app, ["op-test", "run", "/r", "--lang", "zh", "--json"])
    assert json.loads(js.stdout) == REPORT


@pytest.mark.parametrize("argv", [["op-adapt", "aten::hypot"], ["op-adapt", "check", "/tmp"], ["op-test", "run", "/r"]])
def test_an_unknown_language_is_refused_with_one_line(argv, monkeypatch):
    res = runner.invoke(app, [*argv, "--lang", "fr"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "unknown language 'fr'" in res.output
    monkeypatch.setenv("OPFORGE_LANG", "klingon")
    i18n._current = None
    res = runner.invoke(app, argv)
    assert res.exit_code == 2 and "OPFORGE_LANG" in res.output and len(res.output.strip().splitlines()) == 1


def test_every_stored_sentence_has_a_chinese_form():
    """Each template's English, read back by shown(), comes out in Chinese with the same fields filled in."""
    for template in texts.TEMPLATES:
        fields = {name: f"<{name}>" for name in re.findall(r"\{(\w+)\}", template)}
        english = template.format(**fields)
        with i18n.using("en"):
            assert texts.shown(english) == english
        with i18n.using("zh"):
            zh = texts.shown(english)
        assert zh != english and all(v in zh for v in fields.values()), template
