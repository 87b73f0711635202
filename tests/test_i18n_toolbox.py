"""pr-analysis and ci-fix in Chinese: the same input reported in English and in Chinese shows the same figures, the
Chinese report holds no English sentence (the users' own words aside), and what machines read stays English."""

from __future__ import annotations

import json
from pathlib import Path

import openpyxl
import pytest
import yaml
from i18n_scan import english_sentences, figures, prose
from test_ci_fix import make_repo
from typer.testing import CliRunner

from opforge import i18n
from opforge.cli import app
from opforge.skills.ci_fix import ci_fix
from opforge.skills.ci_fix.report import to_markdown as ci_markdown
from opforge.skills.ci_fix.whitelist import DEFAULT_FILE, DEFAULT_REASONS
from opforge.skills.pr_analysis import load_profile
from opforge.skills.pr_analysis.synthrepo import build_repo

runner = CliRunner()
N_COMMITS = 31  # every scenario of the synthetic repository once
TIMING = ("elapsed_s", "commits_per_minute")


def _cells(path: Path) -> list[list[list]]:
    wb = openpyxl.load_workbook(path)
    return [[[c.value for c in row] for row in ws.iter_rows()] for ws in wb.worksheets]


def _without_timing(doc: dict) -> dict:
    return {**doc, "summary": {k: v for k, v in doc["summary"].items() if k not in TIMING}}


def _compare_workbooks(en: Path, zh: Path, allowed: tuple[str, ...]) -> None:
    """Cell by cell: the same shape, the same figures in every cell, and no English sentence in the Chinese one."""
    wb_en, wb_zh = openpyxl.load_workbook(en), openpyxl.load_workbook(zh)
    assert len(wb_zh.sheetnames) == len(wb_en.sheetnames)
    assert all(a != b for a, b in zip(wb_en.sheetnames, wb_zh.sheetnames)), wb_zh.sheetnames
    left = []
    for sheet_en, sheet_zh in zip(_cells(en), _cells(zh)):
        assert len(sheet_en) == len(sheet_zh) and sheet_en[0] != sheet_zh[0]
        for row_en, row_zh in zip(sheet_en, sheet_zh):
            assert len(row_en) == len(row_zh)
            for a, b in zip(row_en, row_zh):
                if not isinstance(a, str):
                    assert a == b
                    continue
                assert figures(b) == figures(a), (a, b)
                left += english_sentences(b, allowed)
    assert not left, left


@pytest.fixture(scope="module")
def window_reports(tmp_path_factory):
    """The synthetic window analysed by the CLI in each language: {lang: (json, xlsx, md, stdout)}."""
    tmp = tmp_path_factory.mktemp("i18n_pr")
    repo = tmp / "pytorch"
    build_repo(repo, N_COMMITS, load_profile("dispatch:CPU").operators)
    out = {}
    for lang in ("en", "zh"):
        paths = [tmp / f"{lang}.json", tmp / f"{lang}.xlsx", tmp / f"{lang}.md"]
        res = runner.invoke(app, ["pr-analysis", "--repo", str(repo), "--range", f"main~{N_COMMITS}..main",
                                  "--json", str(paths[0]), "--out", str(paths[1]), "--md", str(paths[2]),
                                  "--lang", lang])
        assert res.exit_code == 0, res.output
        i18n._current = None
        out[lang] = (json.loads(paths[0].read_text()), paths[1], paths[2].read_text(), res.stdout)
    return out


def _user_words(rep: dict) -> tuple[str, ...]:
    """The commits' own words (titles, authors), and identifiers: schemas, which are code, and area names."""
    words = {r[k] for r in rep["rows"] for k in ("title", "author")} | {", ".join(r["areas"]) for r in rep["rows"]}
    words |= {o[k] for o in rep["operators"] for k in ("old", "new") if o.get(k)}
    return tuple(sorted(words, key=len, reverse=True))


def test_pr_analysis_window_in_chinese(window_reports):
    rep_en, xlsx_en, md_en, out_en = window_reports["en"]
    rep_zh, xlsx_zh, md_zh, out_zh = window_reports["zh"]
    assert _without_timing(rep_zh) == _without_timing(rep_en)          # JSON stays English
    assert any(r["suggestion"] and r["impact"] == "High" for r in rep_zh["rows"])
    allowed = _user_words(rep_en)
    _compare_workbooks(xlsx_en, xlsx_zh, allowed)
    assert figures(md_zh) == figures(md_en)
    assert "## " in md_zh and not english_sentences(md_zh, allowed), english_sentences(md_zh, allowed)
    assert english_sentences(md_en, allowed)                          # the check reads the English report as such
    for rep, out in ((rep_en, out_en), (rep_zh, out_zh)):
        assert str(rep["summary"]["elapsed_s"]) in out
    timing = str(rep_zh["summary"]["elapsed_s"]), str(rep_en["summary"]["elapsed_s"])
    assert figures(out_zh.replace(timing[0], "")) == figures(out_en.replace(timing[1], ""))
    assert not english_sentences(out_zh, allowed), english_sentences(out_zh, allowed)
    assert "commits" in out_en and "commits" not in out_zh


def test_pr_analysis_release_in_chinese(tmp_path):
    old = ("- func: add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor\n"
           "  dispatch:\n    CPU: add_cpu\n"
           "- func: relu(Tensor self) -> Tensor\n  tags: [core, pointwise]\n"
           "- func: gone(Tensor self) -> Tensor\n"
           "- func: softmax.int(Tensor self, int dim) -> Tensor\n")
    new = ("- func: add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1, bool fast=False) -> Tensor\n"
           "  dispatch:\n    CPU: add_cpu\n"
           "- func: relu(Tensor self) -> Tensor\n  tags: [core]\n"
           "- func: softmax.int_dim(Tensor self, int dim) -> Tensor\n"
           "- func: fancy_op(Tensor self, *, float scale=1.0) -> Tensor\n")
    (tmp_path / "old.yaml").write_text(old)
    (tmp_path / "new.yaml").write_text(new)
    out = {}
    for lang in ("en", "zh"):
        res = runner.invoke(app, ["pr-analysis", "--from-torch", str(tmp_path / "old.yaml"), "--to-torch",
                                  str(tmp_path / "new.yaml"), "--out", str(tmp_path / f"{lang}.xlsx"),
                                  "--md", str(tmp_path / f"{lang}.md"), "--lang", lang])
        assert res.exit_code == 0, res.output
        i18n._current = None
        out[lang] = (tmp_path / f"{lang}.xlsx", (tmp_path / f"{lang}.md").read_text(), res.stdout)
    rep = json.loads(runner.invoke(app, ["pr-analysis", "--from-torch", str(tmp_path / "old.yaml"), "--to-torch",
                                         str(tmp_path / "new.yaml"), "--out", "-", "--json", "-"]).stdout)
    assert {o["change"] for o in rep["operators"]} == {"added", "removed", "renamed", "changed"}
    allowed = _user_words(rep)
    _compare_workbooks(out["en"][0], out["zh"][0], allowed)
    for en, zh in zip(out["en"][1:], out["zh"][1:]):
        assert figures(zh) == figures(en)
        assert not english_sentences(zh, allowed), english_sentences(zh, allowed)


@pytest.fixture(scope="module")
def ci_report(tmp_path_factory):
    """ci-fix on the fixture repository of test_ci_fix, with a file no linter reads and one that is not UTF-8; a dry
    run, so the repository stays as it is for the next run."""
    repo = make_repo(tmp_path_factory.mktemp("i18n_ci"))
    (repo / "setup.cfg").write_text("[metadata]\nname = calc\n")
    (repo / "calc" / "latin1.py").write_bytes(b"# caf\xe9\n")
    return repo, ci_fix(repo, dry_run=True)


def test_ci_fix_report_in_chinese(ci_report):
    repo, rep = ci_report
    with i18n.using("en"):
        md_en = ci_markdown(rep)
    with i18n.using("zh"):
        md_zh = ci_markdown(rep)
    assert rep["fixes"] and rep["residual"] and rep["skipped"]
    # the linters' own messages are quoted as they are (read as the scan reads the report), and "ruff F401" or
    # "ruff format format" name a tool and its rule
    quoted = {r["message"] for r in rep["residual"]} | {f["message"] for f in rep["fixes"]}
    ids = set(rep["summary"]["fixes_by_rule"]) | set(rep["summary"]["residual_by_rule"])
    allowed = tuple(sorted({prose(m) for m in quoted} | ids, key=len, reverse=True))
    assert figures(md_zh) == figures(md_en)
    assert md_zh.count("\n") == md_en.count("\n")
    assert not english_sentences(md_zh, allowed), english_sentences(md_zh, allowed)
    assert english_sentences(md_en, allowed)
    assert "## 遗留问题" in md_zh and "## Residual issues" in md_en
    # JSON stays English: the report's values are the English sentences
    doc = json.loads(json.dumps(rep))
    assert any("string literal" in r["why"] for r in doc["residual"])


def test_ci_fix_cli_in_chinese(ci_report, tmp_path):
    repo, rep = ci_report
    res = runner.invoke(app, ["ci-fix", "--repo", str(repo), "--dry-run", "--report", str(tmp_path), "--lang", "zh"])
    assert res.exit_code == 1, res.output
    line = res.stdout.strip()
    assert "报告位于" in line and not english_sentences(line)
    written = json.loads((tmp_path / "ci-fix.json").read_text())
    assert [r["why"] for r in written["residual"]] == [r["why"] for r in rep["residual"]]
    md = (tmp_path / "ci-fix.md").read_text()
    assert md.startswith("# ci-fix 报告")
    assert figures(line) == figures(f"{rep['summary']['fixes']} {rep['summary']['files_edited']} "
                                    f"{rep['summary']['residual']} {tmp_path}")


def test_default_whitelist_reasons_are_all_translatable():
    reasons = yaml.safe_load(DEFAULT_FILE.read_text())["ruff_rules"].values()
    assert set(reasons) == set(DEFAULT_REASONS)


@pytest.mark.parametrize("command", [["pr-analysis", "--repo", "."], ["ci-fix", "--repo", "."]])
def test_unknown_language_is_bad_input(command, monkeypatch):
    res = runner.invoke(app, [*command, "--lang", "fr"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--lang: unknown language 'fr'" in lines[0]
    monkeypatch.setenv("OPFORGE_LANG", "klingon")
    i18n._current = None
    res = runner.invoke(app, [*command])
    assert res.exit_code == 2 and "OPFORGE_LANG: unknown language" in res.stderr
