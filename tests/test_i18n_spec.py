"""SPEC.md in Chinese: every sentence, heading and table header of stage 1's report is translated, with the same
figures, tables and code as the English one; the front matter, formulas and dataflow stay as they are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from i18n_scan import english_sentences, figures, prose

from opforge import i18n
from opforge.request import load_request
from opforge.skills.op_requirement.stage import build_spec, output_count_line, render_spec

ROOT = Path(__file__).resolve().parents[1]
# rms_norm: a backward, casts in eager, leading dimensions; qat: clamp, round, a floored scalar;
# softmax: a sum and a max over no elements; group_norm: no leading dimensions
EXAMPLES = ("rms_norm", "qat_symmetric_per_tensor", "softmax", "group_norm")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


@pytest.fixture(scope="module")
def specs():
    out = {}
    for name in EXAMPLES:
        req = load_request(ROOT / "examples" / name)
        spec, traced = build_spec(req)
        with i18n.using("en"):
            en = render_spec(req, spec, traced)
        with i18n.using("zh"):
            zh = render_spec(req, spec, traced)
        # the user's own words: the description, and the run-time argument names shown as a Python list
        out[name] = (req, spec, en, zh, (prose(req.description), str(spec["runtime_params"])))
    return out


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_chinese_spec_has_no_english_sentence_and_the_same_figures(specs, name):
    req, spec, en, zh, allowed = specs[name]
    assert english_sentences(zh, allowed=allowed) == []
    assert english_sentences(en, allowed=allowed)  # the check sees English where there is some
    assert figures(zh) == figures(en)


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_chinese_spec_keeps_front_matter_code_and_tables(specs, name):
    _req, _spec, en, zh, _allowed = specs[name]
    assert zh != en
    assert zh.split("\n---\n", 1)[0] == en.split("\n---\n", 1)[0]  # YAML front matter: English keys and values
    assert _FENCE.findall(zh) == _FENCE.findall(en)  # formulas and dataflow
    shape = [(line[:1], line.count("|")) for line in en.splitlines() if line[:1] in "#|-"]
    assert [(line[:1], line.count("|")) for line in zh.splitlines() if line[:1] in "#|-"] == shape
    assert "## 公式" in zh and "## 边界处理" in zh and "| 名称 | 形状 | 数据类型 | requires_grad | 测试范围 |" in zh
    # a bold label closed by punctuation must be followed by a space or punctuation to render as bold
    assert not re.search(r"[。：，]\*\*[^\s\W]", zh)


def test_outputs_are_counted_with_the_same_figures_in_both_languages():
    def spec(fwd, grads):
        return {"outputs": [{"name": n} for n in fwd], "grad_inputs": grads}

    cases = [(["out"], []), (["out", "idx"], []), (["out"], ["x"]), (["out", "mean"], ["x", "w", "b"])]
    for fwd, grads in cases:
        with i18n.using("en"):
            en = output_count_line(spec(fwd, grads))
        with i18n.using("zh"):
            zh = output_count_line(spec(fwd, grads))
        assert figures(zh) == figures(en), (en, zh)
        assert english_sentences(zh) == [] and "output" not in zh
    with i18n.using("en"):
        assert output_count_line(spec(["out"], [])) == "one output: one forward output (out)."
        assert output_count_line(spec(["out"], ["x"])) == ("2 outputs: one forward output (out) and one gradient "
                                                           "(grad_x).")
    with i18n.using("zh"):
        assert output_count_line(spec(["out"], ["x"])) == "2 个输出：一个前向输出（out）和 一个梯度（grad_x）。"
