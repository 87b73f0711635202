"""api-consistency in Chinese: analysis.md, repro.md and the printed verdicts read in the language of --lang, with
the same figures as in English; result.json, summary.json and --json stay English."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from opforge.i18n import using
from opforge.skills.api_consistency.command import api_consistency

sys.path.insert(0, str(Path(__file__).parent))
from i18n_scan import english_sentences, figures  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "consistency"

app = typer.Typer()
app.command()(api_consistency)


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cases")
    for name in ("rope_fp16_overflow.py", "scaled_softmax_promotion.py", "row_sum.py", "kernels.py"):
        shutil.copy(EXAMPLES / name, d / name)
    (d / "add.py").write_text(textwrap.dedent("""
        import torch

        def forward(x, y):
            return x + y

        def inputs():
            return torch.randn(64), torch.randn(64)
        """))
    # a module name no other test imports: custom targets are imported by name, and Python keeps the first
    (d / "zh_impls.py").write_text("def add_crash(x, y):\n    return x + y[:-1]\n")
    return d


@pytest.fixture(scope="module")
def diagnosed(cases):
    """One real diagnosis per triage path: R3 (overflow), R2 (dtype promotion), R4 (order-dependent sum), R1 (crash),
    R8 (consistent)."""
    from opforge.skills.api_consistency.case import load_case
    from opforge.skills.api_consistency.targets import parse_target
    from opforge.skills.api_consistency.triage import diagnose

    out = []
    for spec, target in [("rope_fp16_overflow.py", "half"), ("scaled_softmax_promotion.py", "half"),
                         ("row_sum.py", "custom:kernels:row_sum_shuffled"), ("add.py", "custom:zh_impls:add_crash"),
                         ("row_sum.py", "half")]:
        case = load_case(str(cases / spec), None)
        out.append(diagnose(case, parse_target(target, case.path.parent), seed=0, runs=3))
    return out


def _allowed(dg) -> tuple[str, ...]:
    """The user's own words: the source lines and comments of the case, and the exception a crash raised."""
    words = [dg.checks.get("functional", {}).get("error", "")]
    op = dg.operator or {}
    words += [s["code"] for s in [op.get("site") or {}] + op.get("stack", []) if s.get("code")]
    return tuple(w for w in words if w)


def test_reports_read_in_chinese_with_the_figures_of_the_english_ones(diagnosed):
    from opforge.skills.api_consistency.report import analysis_md, repro_md

    assert [dg.rule for dg in diagnosed] == ["R3", "R2", "R4", "R1", "R8"]
    for dg in diagnosed:
        for render in (lambda d: analysis_md(d), lambda d: repro_md(d, d.operator is not None)):
            with using("en"):
                en = render(dg)
            with using("zh"):
                zh = render(dg)
            assert zh != en
            assert english_sentences(zh, allowed=_allowed(dg)) == [], (dg.case, zh)
            assert figures(zh) == figures(en), (dg.case, figures(zh) - figures(en), figures(en) - figures(zh))
    with using("zh"):
        md = analysis_md(diagnosed[0])
    assert md.startswith("# api-consistency 分析结论：rope_fp16_overflow 在 half 上")
    assert "**第 3 类：算子缺陷（数值或确定性）** — 规则 R3" in md and "| R3 | 3 | **是** |" in md
    assert "## 定位到的算子" in md and "- 算子：`aten._to_copy.default`（aten）" in md
    assert "| 精度 | 失败 |" in md and "## 规则（首个触发的规则决定结论）" in md
    with using("zh"):
        assert "## 目标上的调用栈" in analysis_md(diagnosed[3])
        assert "## 时间线" in repro_md(diagnosed[2], True) and "`aten.sum.dim_IntList`" in repro_md(diagnosed[2], True)


def test_the_diagnosis_itself_stays_english(diagnosed):
    """What result.json keeps is English whatever the language: the translation happens when a report is shown."""
    with using("zh"):
        d = diagnosed[0].to_dict()
        text = json.dumps(d)
    assert d["conclusion"].startswith("output 0: ") and "localised to aten._to_copy.default at " in d["conclusion"]
    assert d["timeline"][0]["what"] == "reference in float64 on the CPU" and d["timeline"][0]["result"] == "ok"
    assert "\\u" not in text  # no Chinese escaped in the JSON


def test_the_command_prints_and_writes_chinese_with_lang_zh(cases, tmp_path):
    folder = tmp_path / "cases"
    folder.mkdir()
    for name in ("rope_fp16_overflow.py", "scaled_softmax_promotion.py"):
        shutil.copy(cases / name, folder / name)
    runner = CliRunner()
    en = runner.invoke(app, [str(folder), "--target", "half", "--out", str(tmp_path / "en")])
    zh = runner.invoke(app, [str(folder), "--target", "half", "--out", str(tmp_path / "zh"), "--lang", "zh"])
    assert en.exit_code == zh.exit_code == 1, zh.output
    lines = zh.stdout.strip().splitlines()
    assert lines[0].startswith("算子缺陷（第 3 类） rope_fp16_overflow 在 half 上：输出 0：")
    assert lines[1].startswith("框架问题（第 2 类） scaled_softmax_promotion 在 half 上：数据类型不同：")
    assert lines[-1] == "退出码 1：2 个用例：算子缺陷 1 个、框架问题 1 个"
    assert english_sentences(zh.stdout) == [], zh.stdout
    assert figures(zh.stdout.replace(str(tmp_path / "zh"), "")) == figures(en.stdout.replace(str(tmp_path / "en"), ""))
    case_dir = tmp_path / "zh" / "rope_fp16_overflow__half"
    allowed = ("the planted defect: float16 positions overflow",)  # a comment in the case's own source
    for name in ("analysis.md", "repro.md"):
        text = (case_dir / name).read_text()
        assert english_sentences(text, allowed=allowed) == [], text
    assert (case_dir / "analysis.md").read_text().startswith("# api-consistency 分析结论：")
    assert (case_dir / "repro.md").read_text().startswith("# 复现记录：")
    result = json.loads((case_dir / "result.json").read_text())
    assert result["conclusion"].startswith("output 0: ")  # JSON stays English
    rows = json.loads((tmp_path / "zh" / "summary.json").read_text())
    assert rows[0]["conclusion"] == result["conclusion"]


def test_json_output_stays_english_with_lang_zh(cases, tmp_path):
    res = CliRunner().invoke(app, [str(cases / "scaled_softmax_promotion.py"), "--target", "half", "--out",
                                   str(tmp_path), "--lang", "zh", "--json"])
    doc = json.loads(res.stdout)
    assert doc["verdict"] == "1 case(s): 1 framework problem" and doc["cases"][0]["verdict"] == "framework problem"
    assert doc["cases"][0]["conclusion"].startswith("dtype differs: output 0: dtype float32, expected float16")
    md = (tmp_path / "scaled_softmax_promotion__half" / "analysis.md").read_text()
    assert md.startswith("# api-consistency 分析结论：")


def test_an_unknown_language_is_one_line_and_exit_2(cases, tmp_path):
    res = CliRunner().invoke(app, [str(cases / "add.py"), "--target", "half", "--out", str(tmp_path), "--lang",
                                   "fr"])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert lines == ["error: --lang: unknown language 'fr': expected one of en, zh"], res.stderr
    assert not (tmp_path / "summary.json").exists()
