"""API_REPORT.md in Chinese: no English sentence left but the user's own words, the same figures as the English
report, the same table columns; api_report.json and the design summaries keep their English."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from i18n_scan import english_sentences, figures
from test_reports import table_problems

from opforge import i18n
from opforge.request import load_request

ROOT = Path(__file__).resolve().parents[1]
# a flat pass, a row pass, a matrix product with a prologue, a pooling: every layout the report describes
EXAMPLES = ("qat_symmetric_per_tensor", "rms_norm", "int8_weight_linear", "linear_gelu", "max_pool2d")


@pytest.fixture(scope="module")
def reports():
    from opforge.skills.op_api.stage import NO_LOWERING, _md, explore

    out = {}
    for name in EXAMPLES:
        req = load_request(ROOT / "examples" / name)
        report, build = explore(req)
        for lang in ("en", "zh"):
            with i18n.using(lang):
                out[name, lang] = _md(req, report["ops"], report["unsupported"], report["unsupported_reason"],
                                      report["cost"], build)
                out[name, lang, "blocked"] = _md(req, report["ops"], ["aten.foo.default"], NO_LOWERING, [], None)
    return out


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("blocked", [False, True])
def test_the_chinese_report_has_no_english_sentence_and_the_same_figures(reports, name, blocked):
    suffix = ("blocked",) if blocked else ()
    en, zh = reports[(name, "en", *suffix)], reports[(name, "zh", *suffix)]
    assert zh != en
    assert english_sentences(zh, allowed=(name,)) == []
    assert english_sentences(en, allowed=(name,))  # the check can fail: the English report has sentences
    assert figures(zh) == figures(en)
    assert table_problems(zh) == []
    heads = lambda md: [line.count("|") for line in md.splitlines() if line.startswith("|")]  # noqa: E731
    assert heads(zh) == heads(en)


def test_the_english_report_reads_as_before(reports):
    en = reports["max_pool2d", "en"]
    assert "| ATen op | forward | joint fwd+bwd | kind | Triton | bit-exact |" in en
    assert ("- forward_0: max pooling over 2 dimensions (kernel (3, 3), stride (2, 2), padding (1, 1), dilation "
            "(1, 1)): getitem, getitem_1 from x, one lane per output element walking its window.") in en
    assert "| forward | 1 (0) | 115,605,504 | 1 | 115,605,504 | 1.0× |" in en and "| memory |" in en
    assert "no Triton lowering for:\n" in reports["max_pool2d", "en", "blocked"]
    zh = reports["max_pool2d", "zh"]
    assert "| 前向 | 1 (0) | 115,605,504 | 1 | 115,605,504 | 1.0× |" in zh and "2 维最大池化" in zh


def test_pool_text_stays_english_for_the_summaries_unless_asked():
    from opforge.codegen.pooling import PoolStage, pool_text

    st = PoolStage(name="p", op="aten.avg_pool3d_backward.default", kind="avg", adaptive=False, backward=True,
                   rank=3, x="x", out="dx", indices=None, grad="g", kernel=(2, 2, 2), stride=(2, 2, 2),
                   padding=(0, 0, 0), ceil_mode=True)
    english = ("the gradient of avg pooling over 3 dimensions (kernel (2, 2, 2), stride (2, 2, 2), padding (0, 0, 0), "
               "ceil mode): dx from g, one lane per input element gathering from the windows that hold it.")
    with i18n.using("zh"):
        assert pool_text(st) == english
        chinese = pool_text(st, None)
    assert english_sentences(chinese) == [] and figures(chinese) == figures(english)


def test_every_triton_primitive_in_words_has_a_translation():
    """OP_TABLE's primitives are code (`tl.where`, `>=`) or say something in words, which the report translates:
    a primitive added in words without a catalog entry fails here."""
    from opforge.codegen.ops import OP_TABLE
    from opforge.skills.op_api.stage import _triton

    def in_words(text: str) -> bool:
        return any(re.fullmatch(r"[A-Za-z]{2,}", token.strip("(),;:")) for token in text.split())

    worded = sorted({r.primitive for r in OP_TABLE.values() if in_words(r.primitive)})
    assert "tl.where over interleaved columns" in worded and "tl.where" not in worded
    with i18n.using("zh"):
        missing = [p for p in worded if _triton(p) == p or english_sentences(_triton(p))]
    assert missing == []
