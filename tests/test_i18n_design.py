"""DESIGN.md in Chinese: no English sentence left but the user's own words, the same figures and table columns as
the English report, the gate's section headings; design.json and the English report stay as they were."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
from i18n_scan import english_sentences, figures
from test_reports import table_problems

from opforge import i18n
from opforge.orchestrator.gates import DESIGN_SECTIONS
from opforge.request import load_request
from opforge.workspace import Workspace
from opforge.workspace.atomic import write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
# a flat pass, rows with saved statistics, a pass split in two kernels, a matrix product with saved products, a
# prologue, attention with sinks (forward and backward), a pooling
EXAMPLES = ("qat_symmetric_per_tensor", "rms_norm", "cross_entropy_labels", "linear_gelu", "int8_weight_linear",
            "attention_sink", "max_pool2d")


@pytest.fixture(scope="module")
def designs(tmp_path_factory):
    """{(name, kind, lang): (DESIGN.md, design.json)} for the template design and the fallback's, each request
    planned once."""
    from opforge.codegen import build
    from opforge.llm.fallback import design_stage
    from opforge.skills.op_design import stage
    from opforge.skills.op_requirement.stage import build_spec

    plans: dict = {}
    planned = pytest.MonkeyPatch()
    planned.setattr(stage, "plan_request", lambda req: plans.setdefault(req.name, build.plan_request(req)))
    out = {}
    try:
        for name in EXAMPLES:
            req = load_request(ROOT / "examples" / name)
            with i18n.using("en"):
                spec, _traced = build_spec(req)
            for kind, run in (("template", stage.run), ("fallback", design_stage)):
                if kind == "fallback" and name != "qat_symmetric_per_tensor":
                    continue
                for lang in ("en", "zh"):
                    ws = Workspace(tmp_path_factory.mktemp(f"{name}_{kind}_{lang}"), req.name)
                    write_json_atomic(ws.path("spec.json"), spec)
                    state = SimpleNamespace(options={"quick": True, "model_ops": ["aten.foo.default"]})
                    with i18n.using(lang):
                        run(ws, req, state)
                    out[name, kind, lang] = (ws.path("DESIGN.md").read_text(),
                                             json.loads(ws.path("design.json").read_text()), req)
    finally:
        planned.undo()
    return out


def _allowed(req) -> tuple[str, ...]:
    return (req.name, req.description)


@pytest.mark.parametrize("key", [(n, "template") for n in EXAMPLES] + [("qat_symmetric_per_tensor", "fallback")])
def test_the_chinese_design_has_no_english_sentence_and_the_same_figures(designs, key):
    (en, en_json, req), (zh, zh_json, _req) = designs[(*key, "en")], designs[(*key, "zh")]
    assert zh != en
    assert english_sentences(en, allowed=_allowed(req))  # the check can fail: the English report has sentences
    assert english_sentences(zh, allowed=_allowed(req)) == []
    assert figures(zh) == figures(en)
    assert table_problems(zh) == []
    heads = lambda md: [line.count("|") for line in md.splitlines() if line.startswith("|")]  # noqa: E731
    assert heads(zh) == heads(en)
    assert zh_json == en_json  # design.json stays English
    with i18n.using("zh"):
        for section in DESIGN_SECTIONS:  # what the stage-4 gate looks for
            assert "## " + i18n._(section) in zh.splitlines()


def test_the_english_design_reads_as_before(designs):
    en = designs["qat_symmetric_per_tensor", "template", "en"][0]
    assert "2 kernel(s) for 2 pass(es). A pass is one kernel unless" in en
    assert "- writes grad_weight (full, every program), grad_scale (scalar, last program (after the reductions)), " \
           "each once;" in en
    assert "| id | level | dtype | binding | distribution | breakers |" in en
    split = designs["cross_entropy_labels", "template", "en"][0]
    assert "- where_5 needs a finished column or full reduction for every row (div_1): kernel backward_a finishes " \
           "it, then backward_b reads backward_r0\n" in split
    zh = designs["cross_entropy_labels", "template", "zh"][0]
    assert "- where_5 需要每一行都已完成的列归约或全归约（div_1）：内核 backward_a 先完成它，随后 backward_b 读取 " \
           "backward_r0\n" in zh
    assert "## 融合方案" in zh and "| 编号 | 级别 | 数据类型 | 形状取值 | 分布 | 压力项 |" in zh


def test_a_plans_reasons_stay_english_text_and_translate_in_the_report():
    from opforge.i18n import N_, Joined, Msg, shown

    why = Msg(N_("{why}: kernel {first} finishes them, then {rest} reads {temps}"),
                why=Joined("; ", [Msg(N_("{node} moves the columns of a scan"), node="cumsum")] * 2),
                first="b_a", rest="b_b", temps="b_r0, b_r1")
    english = ("cumsum moves the columns of a scan; cumsum moves the columns of a scan: kernel b_a finishes them, then "
               "b_b reads b_r0, b_r1")
    with i18n.using("zh"):
        assert why == english and f"{why}" == english and json.loads(json.dumps([why])) == [english]
        chinese = shown(why)
    assert chinese != english and english_sentences(chinese) == [] and figures(chinese) == figures(english)
    copy = pickle.loads(pickle.dumps(why))
    with i18n.using("en"):
        assert copy == english and shown(copy) == english
    with i18n.using("zh"):
        assert shown(copy) == chinese
