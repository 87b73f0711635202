"""`opforge op run … --lang zh` end to end: the demo operator built again in Chinese. Its reports have no English
sentence left, and their figures equal the English run's (the session's `built_ws`). Reports whose figures are
measured (timings, errors on fresh inputs) are compared on the same data: the English run's JSON rendered in
Chinese."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from opforge import i18n
from opforge.bench.aot import to_markdown
from opforge.orchestrator.runner import create_workspace, run_stages
from opforge.request import load_request
from opforge.skills.op_develop.stage import render_precision, render_readme
from opforge.skills.op_perf.stage import render_perf

sys.path.insert(0, str(Path(__file__).parent))
from conftest import make_request  # noqa: E402
from i18n_scan import english_sentences, figures  # noqa: E402

COMPUTED = ("SPEC.md", "API_REPORT.md", "DESIGN.md")  # the same request gives the same figures
MEASURED = ("PRECISION.md", "PERF.md", "README.md", "COMPILE.md")  # timings, fresh inputs' errors, a date


@pytest.fixture(scope="module")
def zh_ws(built_ws, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("zh")
    ws = create_workspace(make_request(base / "request"), base / "ws", lang="zh")
    state = run_stages(ws.root)
    assert state.terminal["status"] == "SUCCESS", state.terminal
    return ws.root


def _user_words(ws: Path) -> tuple[str, ...]:
    """The request's own words: its description, its name, its attributes' names (SPEC lists them as a list)."""
    doc = yaml.safe_load((ws / "request" / "request.yaml").read_text())
    return (doc["description"], doc["name"], str(list(doc.get("attributes") or {})))


@pytest.mark.parametrize("report", COMPUTED + MEASURED)
def test_a_chinese_run_leaves_no_english_sentence(zh_ws, built_ws, report):
    zh = (zh_ws / report).read_text()
    assert not english_sentences(zh, _user_words(zh_ws)), report
    assert english_sentences((built_ws / report).read_text(), _user_words(built_ws))  # the scan sees English


@pytest.mark.parametrize("report", COMPUTED)
def test_a_chinese_run_shows_the_english_runs_figures(zh_ws, built_ws, report):
    assert figures((zh_ws / report).read_text()) == figures((built_ws / report).read_text())


def test_measured_reports_show_the_same_figures_in_chinese(built_ws):
    req_doc = yaml.safe_load((built_ws / "request" / "request.yaml").read_text())
    ws = built_ws
    precision = json.loads((ws / "precision.json").read_text())
    compiled = json.loads((ws / "compile.json").read_text())
    perf = json.loads((ws / "perf.json").read_text())
    spec = json.loads((ws / "spec.json").read_text())
    req = load_request(ws / "request")
    rendered = {}
    for lang in ("en", "zh"):
        with i18n.using(lang):
            rendered[lang] = {"PRECISION.md": render_precision(req_doc["name"], precision),
                              "PERF.md": render_perf(perf), "README.md": render_readme(req, spec, precision, perf),
                              "COMPILE.md": to_markdown(compiled)}
    for report in MEASURED:
        assert rendered["en"][report] == (ws / report).read_text(), report  # the files are these renderings
        assert figures(rendered["zh"][report]) == figures(rendered["en"][report]), report
        assert not english_sentences(rendered["zh"][report], _user_words(ws)), report


def test_a_stage_run_again_writes_the_workspaces_language(zh_ws, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(zh_ws, ws)
    (ws / "DESIGN.md").unlink()
    state = run_stages(ws, only=4)  # in a process whose own language is English
    assert state.stages[4].status == "completed" and i18n.language() == "en"
    assert (ws / "DESIGN.md").read_text() == (zh_ws / "DESIGN.md").read_text()
