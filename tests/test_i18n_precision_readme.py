"""README.md, PRECISION.md (with stage 6's localisation) and COMPILE.md in Chinese: rendered from the same data as
the English ones, they leave no English sentence but the user's own words and show the same figures; the JSON they
are rendered from stays English."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from i18n_scan import english_sentences, figures

from opforge import i18n
from opforge.bench.aot import to_markdown
from opforge.request import load_request
from opforge.skills.op_develop.stage import EAGER_NOTE, precision_report, render_precision, render_readme
from opforge.skills.op_perf.stage import _headline
from opforge.skills.op_precision.stage import render_localisation

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "qat_symmetric_per_tensor"


def _output(name: str, **over) -> dict:
    o = {"name": name, "dtype": "bfloat16", "numel": 4096, "exact": False, "atol": 1e-3, "rtol": 1.6e-2,
         "max_abs": 2.5e-3, "max_ulp": 7, "passed": True, "mismatches": 0, "max_abs_truth": 4.5,
         "max_abs_at": {"index": [3, 5], "truth": 0.125, "abs_err": 2.5e-3, "actual": 0.1275},
         "max_ulp_at": {"index": [0, 9], "truth": 1e-30, "abs_err": 1e-30, "actual": 0.0},
         "worst": [{"index": [3, 5], "truth": 0.125, "abs_err": 2.5e-3, "actual": 0.1275}],
         "vs_float64": {"max_abs": 3e-3, "max_rel": 0.02, "max_ulp": 7},
         "eager": {"vs_float64": {"max_abs": 6e-3, "max_rel": 0.04, "max_ulp": 12},
                   "vs_fused": {"differing": 1234, "max_ulp": 2}}}
    o.update(over)
    return o


def _case(case: str, outputs: list[dict], **over) -> dict:
    r = {"case": case, "level": 1, "dtype": "bfloat16", "binding": {"N": 64, "M": 64}, "seed": 17,
         "passed": all(o["passed"] for o in outputs), "outputs": outputs}
    r.update(over)
    return r


@pytest.fixture(scope="module")
def data():
    """Every branch worth a message: a failure, an exact output, a skipped case, blocks widened in the interpreter,
    eager unavailable, extremes without a located element; a backward pass; a kernel that spills, one that fails."""
    failing = _output("grad_scale", passed=False, mismatches=3, max_abs=0.5, dtype="float32",
                      max_abs_at={"index": [1, 2], "truth": 1.0, "abs_err": 0.5, "actual": 1.5})
    records = [
        _case("L0-bfloat16-N64xM64", [_output("out", exact=True, max_abs=0.0, max_ulp=0), _output("grad_weight")],
              interpreter_blocks={"ran": {"BLOCK": 32768}, "shipped": {"BLOCK": 1024}}),
        _case("L1-bfloat16-N3xM5-normal", [_output("out", exact=True, max_abs=0.0, max_ulp=1), failing]),
        _case("L1-float16-N7xM9-edges", [_output("grad_weight", eager={"unavailable": "x"}, max_abs_at=None,
                                                 max_ulp_at=None, worst=[])], dtype="float16"),
        _case("L1-float32-N2xM2-zeros", [_output("out", max_abs=0.0, max_ulp=0)], dtype="float32",
              skipped="undefined", passed=False),
    ]
    precision = precision_report(records, 1, "1 failed, 2 passed", ["FAILED test_op.py::test_case"])
    located = dict(precision, localisation={
        "grad_scale": {"cases": [1, 2], "ops_on_path": [{"node": "mul_1", "op": "aten.mul", "exact": False}],
                       "fused_step": {"case": "L1-bfloat16-N3xM5-normal", "first": {
                           "node": "mul_1", "op": "aten.mul", "kernel": "_qat_backward_kernel", "source": None,
                           "inputs": ["x", "scale"], "rel_error": 0.0123}}},
        "out": {"cases": [1], "ops_on_path": [], "fused_step": None}})
    cost = {"forward": {"eager_kernels": 9, "fused_kernels": 1, "eager_bytes": 700, "fused_bytes": 100},
            "backward": {"eager_kernels": 17, "fused_kernels": 2, "eager_bytes": 800, "fused_bytes": 96}}
    rows = [{"binding": {"N": 1024, "M": 2048}, "dtype": "bfloat16", "cost": cost}]
    perf = {"rows": rows, "headline": _headline(rows)}
    build = {"kernel": "_qat_symmetric_per_tensor_forward_kernel", "binding": {"N": 1024, "M": 2048},
             "dtype": "bfloat16", "pass": "forward", "constexprs": {"BLOCK": 1024}, "num_stages": 3, "num_warps": 4,
             "registers": 40, "spill_bytes": 16, "shared_bytes": 0, "loads": 2, "loads_128": 2, "stores": 1,
             "stores_128": 1, "occupancy": 0.75, "programs": 2048, "waves": 1.94}
    broken = {k: build[k] for k in ("kernel", "binding", "dtype", "pass")} | {"error": "ptxas: out of registers"}
    compiled = {"arch": "sm_90", "date": "2026-12-07T14:17:50+00:00", "failed": 1,
                "toolchain": {"torch": "2.13.0", "triton": "3.9.0", "unavailable": None},
                "ops": [{"op": "qat_symmetric_per_tensor", "builds": [build, broken], "failed": 1}]}
    req = load_request(EXAMPLE)
    spec = {"supported_dtypes": ["bfloat16", "float16", "float32"], "exact_outputs": ["out", "grad_weight"],
            "default_params": {"eps": 0.0001}, "inputs": [{"name": "weight", "shape": ["N", "M"]},
                                                          {"name": "scale", "shape": [1, 1]}]}

    def render() -> dict[str, str]:
        return {"README.md": render_readme(req, spec, precision, perf),
                "PRECISION.md": render_precision(req.name, located) + render_localisation(located),
                "COMPILE.md": to_markdown(compiled),
                "COMPILE.md (no toolchain)": to_markdown(dict(compiled, toolchain={"unavailable": "none here"}))}

    with i18n.using("en"):
        en = render()
    with i18n.using("zh"):
        zh = render()
    return {"req": req, "precision": precision, "perf": perf, "records": records, "en": en, "zh": zh}


@pytest.mark.parametrize("name", ["README.md", "PRECISION.md", "COMPILE.md", "COMPILE.md (no toolchain)"])
def test_the_chinese_report_has_no_english_sentence_and_the_same_figures(data, name):
    en, zh = data["en"][name], data["zh"][name]
    assert zh != en
    # the user's words and what the data itself says (a compile error, a skip reason) stay as they are
    allowed = (data["req"].description, "ptxas: out of registers", "none here")
    assert english_sentences(zh, allowed) == []
    assert english_sentences(en, allowed), "the scan finds nothing even in English: it checks nothing"
    assert figures(zh) == figures(en)
    assert zh.count("|") == en.count("|") and zh.count("\n") == en.count("\n")


def test_the_english_readme_states_perf_jsons_headline(data):
    assert f"- Performance: {data['perf']['headline']}\n" in data["en"]["README.md"]
    assert "- 性能：" in data["zh"]["README.md"]


def test_the_json_behind_the_reports_stays_english(data):
    with i18n.using("zh"):
        report = precision_report(data["records"], 1, "1 failed, 2 passed")
        assert "## 与 eager 模式的数值对比" in render_precision("op", report)
    assert report["numerics_vs_eager"]["note"] == EAGER_NOTE
    assert not any("\u4e00" <= ch <= "\u9fff" for ch in json.dumps(report, ensure_ascii=False))
