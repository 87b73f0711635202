"""graph diagnose's and test-triage's reports in Chinese: every heading, sentence, label and table header
translated, with the same figures as the English ones; what code or another program reads (JSON, category and
rule names, ids, file names, repro.py, sheet names) stays English. Rendered from constructed results: no script
or test runs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from i18n_scan import english_sentences, figures
from openpyxl import load_workbook
from typer.testing import CliRunner

from opforge import i18n
from opforge.cli import app
from opforge.skills.graph_diagnose import profile as gd_profile
from opforge.skills.graph_diagnose import report as gd
from opforge.skills.test_triage import report as tt

UNSUPPORTED = {"type": "torch._dynamo.exc.Unsupported", "message": "Unsupported: generic_jump", "cause": None}
STEPS = [{"step": "as-is", "status": "error", "seconds": 3.25, "exit_code": 1, "exception": UNSUPPORTED},
         {"step": "no-compile", "status": "ok", "seconds": 1.5, "exit_code": 0, "exception": None},
         {"step": "eager", "status": "error", "seconds": 2.0, "exit_code": 1, "exception": UNSUPPORTED}]
EVENTS = {"graph_breaks": [{"file": "/w/branch.py", "line": 12, "reason": "generic_jump TensorVariable()",
                            "gb_id": "GB0170"}],
          "recompiles": [{"function": "forward", "file": "/w/branch.py", "line": 9, "guard": "L['n'] == 3"}],
          "recompile_limits": [{"limit": "recompile_limit", "value": 8, "function": "forward"}]}
NEXT = "Move the data-dependent branch out of the compiled region, or rewrite it with torch.cond."
EXPLANATION = "Dynamo does not know how to trace a data-dependent branch."
HINT = "Use torch.cond to express dynamic control flow."


def _finding() -> dict:
    return {"script": "/w/branch.py", "args": ["--n", "3"], "conclusion": "user_code", "layer": "dynamo",
            "located": None, "rule": "data-dependent-branch", "failing_step": "as-is", "runs": False,
            "evidence": {"step": "as-is", "exception": STEPS[0]["exception"],
                         "user_line": {"file": "/w/branch.py", "line": 12, "code": "if x.sum() > 0:"},
                         "operator": "aten::nonzero", "guard": "L['n'] == 3",
                         "opcheck": {"mylib::scale": {"test_faketensor": "no fake kernel registered"}},
                         "bisect": {"backend": "inductor", "subsystem": "lowerings", "bisect_number": 4,
                                    "debug_info": "op='aten.sum', overload='default'"},
                         "torch_npu_source": {"file": "torch_npu/dynamo/convert.py", "line": 88},
                         "registered_at": {"file": "/w/ext.py", "line": 7, "code": "register_decomposition(op)"},
                         "framework_frame": {"file": "torch/_dynamo/symbolic_convert.py", "line": 1234,
                                             "function": "generic_jump"}},
            "graph_break": {"id": "GB0170", "type": "Data-dependent branching", "explanation": EXPLANATION,
                            "hints": [HINT]},
            "events": EVENTS, "next_action": NEXT, "steps": STEPS}


def _framework_bug() -> dict:
    r = _finding()
    return {**r, "conclusion": "framework_bug", "layer": "inductor", "located": True, "failing_step": "inductor",
            "evidence": {"step": "inductor", "exception": STEPS[2]["exception"], "user_line": None,
                         "setting": "TORCHINDUCTOR_FREEZING", "module": "torch.nn.Linear"},
            "graph_break": None, "events": {}}


def _clean() -> dict:
    return {"script": "/w/clean.py", "args": [], "conclusion": "clean", "layer": None, "located": None,
            "rule": None, "evidence": {}, "graph_break": None, "runs": True, "events": {},
            "next_action": "Nothing to fix: the script runs to the end as it is, without graph breaks or recompiles.",
            "steps": STEPS[:1]}


def _log_finding() -> dict:
    r = _finding()
    return {**{k: v for k, v in r.items() if k != "script"}, "source": "/w/run.log", "steps": [],
            "failing_step": None, "located": False}


DIAGNOSES = {"finding": _finding, "framework_bug": _framework_bug, "clean": _clean, "log": _log_finding}
# the diagnosis's own data: result.json's next action, torch's graph-break registry, the log's reasons
DATA = (NEXT, EXPLANATION, HINT, "generic_jump TensorVariable()", "Data-dependent branching",
        "Nothing to fix: the script runs to the end as it is, without graph breaks or recompiles.",
        "no fake kernel registered", "op='aten.sum', overload='default'")


def _both(render, *args):
    with i18n.using("en"):
        en = render(*args)
    with i18n.using("zh"):
        zh = render(*args)
    return en, zh


@pytest.mark.parametrize("name", DIAGNOSES)
def test_analysis_md_in_chinese_has_no_english_sentence_and_the_same_figures(name):
    en, zh = _both(gd.analysis_md, DIAGNOSES[name]())
    assert zh != en
    assert english_sentences(zh, allowed=DATA) == []
    assert english_sentences(en, allowed=DATA)  # the check sees English where there is some
    assert figures(zh) == figures(en)
    assert [line.count("|") for line in zh.splitlines()] == [line.count("|") for line in en.splitlines()]
    line_en, line_zh = _both(gd.summary_line, DIAGNOSES[name]())
    assert english_sentences(line_zh) == [] and figures(line_zh) == figures(line_en)


def test_analysis_md_in_english_reads_as_before():
    en, zh = _both(gd.analysis_md, _finding())
    assert "**Conclusion: a user code problem** (`user_code`), layer `dynamo`." in en
    assert "- your code: `/w/branch.py:12`: `if x.sum() > 0:`" in en
    assert "- **recompile_limit (8) reached** by `forward`: it runs eagerly from then on" in en
    assert "**结论：用户代码问题**（`user_code`），层 `dynamo`。" in zh
    assert "## 依据" in zh and "## 下一步" in zh and "| 步骤 | 状态 | 秒 | 错误 |" in zh
    assert NEXT in zh  # result.json's next action, as JSON holds it
    bug_en, bug_zh = _both(gd.analysis_md, _framework_bug())
    assert "(`framework_bug`), layer `inductor`, located." in bug_en and "，已定位。" in bug_zh
    assert _both(gd.summary_line, _finding()) == (
        "branch.py: a user code problem in dynamo at branch.py:12, operator aten::nonzero (step as-is)",
        "branch.py：dynamo 中的用户代码问题，位于 branch.py:12，算子 aten::nonzero（步骤 as-is）")
    assert _both(gd.summary_line, _clean()) == ("clean.py: runs clean (1 step)", "clean.py：运行正常（1 个步骤）")


def test_repro_py_stays_english(tmp_path):
    script = tmp_path / "branch.py"
    script.write_text("print('hi')\n")
    result = {**_finding(), "script": str(script)}
    en, zh = _both(gd.repro_py, result)
    assert zh == en and "a user code problem at step as-is" in en


def _profile() -> dict:
    return {"script": "/w/model.py", "args": [], "status": {"compiled": "error", "eager": "ok"}, "graphs": 3,
            "compile_seconds": {"dynamo": 1.25, "backend": 4.5, "inductor": 3.75},
            "compiles": [{"frame": "0/0", "function": "forward", "seconds": 2.5, "backend_seconds": 2.0,
                          "graph_ops": 14},
                         {"frame": "0/1", "function": "forward", "seconds": 3.25, "backend_seconds": 2.5,
                          "graph_ops": None}],
            "graph_breaks": EVENTS["graph_breaks"], "recompiles": [{**EVENTS["recompiles"][0], "frame": "0/1"}],
            "recompile_limits": [],
            "functions": [{"function": "model.py:9 forward", "calls": 20, "first_call_s": 5.5,
                           "compiled_median_s": 0.002, "eager_median_s": 0.001, "speedup": 0.5}],
            "error": {"type": "RuntimeError", "message": "shape mismatch"}}


def test_profile_md_in_chinese_has_no_english_sentence_and_the_same_figures():
    p = _profile()
    p["fixes"] = gd_profile.fixes(p)  # a recompile, a graph break, a function slower compiled
    assert [f["seconds"] for f in p["fixes"]] == [3.25, 0.019, 0.0]
    en, zh = _both(gd_profile.profile_md, p, True)
    error = "RuntimeError: shape mismatch"  # the compiled run's own error
    assert zh != en and english_sentences(zh, allowed=(error,)) == [] and figures(zh) == figures(en)
    assert "3 graph(s) from 2 compilation(s), 1 graph break(s), 1 recompile(s). Compile time: Dynamo 1.25 s" in en
    assert "1. `forward` recompiles 1 time(s) on the guard `L['n'] == 3`: pass `L['n']` as a tensor or mark it " \
           "dynamic — 3.25 s (compile time spent recompiling)" in en
    assert "| 函数 | 调用次数 | 首次调用 s | 编译 s | eager s | 加速比 |" in zh and "](profile.png)" in zh
    # profile.json keeps the English words
    assert json.loads(json.dumps(p["fixes"]))[0]["what"] == "compile time spent recompiling"
    empty = {**p, "fixes": [], "error": None}
    en, zh = _both(gd_profile.profile_md, empty, False)
    assert english_sentences(zh) == [] and figures(zh) == figures(en)


def test_the_batch_summary_translates_its_headers_and_keeps_its_keys(tmp_path):
    rows = [gd.summary_row({**_finding(), "script": "/w/branch.py"}, "branch"), gd.summary_row(_clean(), "clean")]
    for lang in ("en", "zh"):
        (tmp_path / lang).mkdir()
        with i18n.using(lang):
            gd.write_summary(tmp_path / lang, rows)
    en = load_workbook(tmp_path / "en" / "summary.xlsx")["scripts"]
    zh = load_workbook(tmp_path / "zh" / "summary.xlsx")["scripts"]
    head_en = [c.value for c in en[1]]
    assert head_en == gd.SUMMARY_COLUMNS and head_en[:3] == ["script", "conclusion", "layer"]
    assert [c.value for c in zh[1]][:3] == ["脚本", "结论", "层"]
    assert list(zh.iter_rows(min_row=2, values_only=True)) == list(en.iter_rows(min_row=2, values_only=True))
    assert (tmp_path / "zh" / "summary.json").read_text() == (tmp_path / "en" / "summary.json").read_text()


# -- test-triage ----------------------------------------------------------------------------------------------------

RULES = yaml.safe_load((Path(tt.__file__).parent / "rules.yaml").read_text())["rules"]


def _cluster(i: int, rule: dict, **kw) -> dict:
    return {"id": f"C{i:03d}", "category": rule["category"], "rule": rule["id"], "why": rule["why"],
            "operator": "aten::abs", "size": 16, "dtypes": ["float16", "float32"],
            "generics": ["TestCommon.test_compare_cpu"], "flaky": False, "reruns": 0, "passed_on_rerun": 0,
            "cpu_twins": {}, "signature": "abs|AssertionError: Tensor-likes are not close!",
            "causal_frame": "torch/testing/_comparison.py:1234",
            "tests": [f"test_ops.py::TestCommonOPDEV::test_compare_cpu_abs_opdev_float{16 * (i + 1)}"],
            "message": "AssertionError: Tensor-likes are not close!\nMismatched elements: 3 / 12 (25.0%)", **kw}


def _triage() -> dict:
    clusters = [_cluster(i, rule) for i, rule in enumerate(RULES)]
    clusters[0].update(flaky=True, reruns=2, passed_on_rerun=1, cpu_twins={"passed": 3, "failed": 1})
    clusters[1].update(generics=[], dtypes=[], causal_frame=None, operator=None, reruns=2)
    return {"device": "opdev", "imports": ["opforge.backend.device"], "suite": "ops", "file": "/t/test_ops.py",
            "ops": "abs", "dtypes": "", "executor": "local", "workers": 2, "reruns": 2, "tests": 640,
            "counts": {"passed": 600, "failed": 35, "skipped": 5}, "failed": 35, "wall_s": 81.5,
            "phases_s": {"run": 70.0}, "python": "3.12",
            "shards": [{"index": 0, "tests": 320, "processes": ["pid 11", "pid 12"], "error": None},
                       {"index": 1, "tests": 300, "processes": ["pid 13"], "error": {"error": "ShardLost: killed"}},
                       {"index": 2, "tests": 20, "processes": ["pid 14"], "error": None}],
            "clusters": clusters}


def test_triage_md_in_chinese_has_no_english_sentence_and_the_same_figures():
    run = _triage()
    en, zh = _both(tt.markdown, run)
    assert zh != en
    # the run's own words: a shard's error, the failures' signature in the table
    data = ("ShardLost: killed", run["clusters"][0]["signature"].replace("|", "\\|"))
    assert english_sentences(zh, allowed=data) == []
    assert english_sentences(en)
    assert figures(zh) == figures(en)
    assert [line.count("|") for line in zh.splitlines()] == [line.count("|") for line in en.splitlines()]
    assert "640 tests of `test_ops.py` on `opdev` (600 passed, 35 failed, 5 skipped), run in 3 shards by the local " \
           "executor with 2 workers in 81.5 s. 35 failures in 13 clusters; up to five tests of each were rerun 2 " \
           "times." in en
    for rule in RULES:  # category and rule names stay as code compares them
        assert f"**{rule['category']}**（规则 `{rule['id']}`）：" in zh
    assert "- 重跑：2 次中 1 次通过（不稳定：只在部分时候失败）" in zh
    line_en, line_zh = _both(tt.summary_line, run)
    assert line_en.startswith("opdev: 640 tests, 35 failed in 13 clusters (")
    assert english_sentences(line_zh) == [] and figures(line_zh) == figures(line_en)


def test_every_rules_why_has_a_translation():
    whys = [r["why"] for r in RULES]
    with i18n.using("zh"):
        assert all(i18n._(why) != why and english_sentences(i18n._(why)) == [] for why in whys)


def test_summary_xlsx_keeps_its_sheet_and_its_values():
    run = _triage()
    books = {}
    for lang in ("en", "zh"):
        with i18n.using(lang):
            books[lang] = load_workbook(io.BytesIO(tt.xlsx(run)))["clusters"]
    rows = {lang: list(ws.iter_rows(values_only=True)) for lang, ws in books.items()}
    head = rows["en"][0]
    assert head[-3:] == ("tests file", "repro", "log") and "signature" in head
    assert rows["zh"][0][-3:] == ("测试列表文件", "复现", "日志")
    flaky = head.index("flaky")
    assert [r[:flaky] + r[flaky + 1:] for r in rows["zh"][1:]] == [r[:flaky] + r[flaky + 1:] for r in rows["en"][1:]]
    assert rows["en"][1][flaky] == "yes" and rows["zh"][1][flaky] == "是"


@pytest.mark.parametrize("argv", [["graph", "diagnose", "missing.py"], ["graph", "logs", "missing.log"],
                                  ["graph", "profile", "missing.py"], ["test-triage", "run", "--device", "cpu"]])
def test_an_unknown_language_is_bad_input(tmp_path, argv):
    res = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "out"), "--lang", "fr"])
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "unknown language 'fr'" in res.output
    assert not (tmp_path / "out").exists()


def test_every_next_action_graph_diagnose_can_give_reads_in_chinese():
    """The signatures' advice (signatures.yaml) and the fixed next actions are Msg: result.json keeps English,
    analysis.md and the printed `next:` line show the chosen language."""
    from opforge.i18n import Msg, data_texts, shown
    from opforge.skills.graph_diagnose import diagnose

    words = {"operator": "mylib::scale", "name": "scale", "module": "scipy", "setting": "", "count": 12,
             "function": "step", "guard": "L['n'] == 3", "reason": "Tensor.item()", "limit": "recompile_limit",
             "value": 8, "backend": "aot_eager", "subsystem": "decomposition", "number": 4, "what": "aten.add",
             "table": "lowering", "file": "ext.py", "line": 31, "version": "2.13.0", "message_id": "EZ3003"}
    advice = [text for _line, text in data_texts(Path(diagnose.__file__).with_name("signatures.yaml"), ("advice",))]
    assert len(advice) > 20
    for template in advice:
        english = Msg(template, **{k: v for k, v in words.items() if "{" + k in template})
        assert json.loads(json.dumps(english)) == str(english) == template.format(**words)
        with i18n.using("zh"):
            chinese = shown(english)
        assert chinese != english and english_sentences(chinese) == [], template
        assert figures(chinese) == figures(english), template
    clean = diagnose.conclude_log({"error": None, "graph_breaks": [], "recompiles": []}, "log.txt")
    assert clean["next_action"].startswith("Nothing to fix in this log")
    with i18n.using("zh"):
        assert shown(clean["next_action"]).startswith("此日志中没有需要修复的内容")
