"""The stage reports say what they mean: tables keep their columns, pipes stay pipes, extremes carry their
context, SPEC states only the boundary behaviours its reference has, PERF states its target and spreads."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from opforge.request import load_request

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ("SPEC.md", "API_REPORT.md", "PRECISION.md", "PERF.md", "DESIGN.md")
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def table_problems(md: str) -> list[str]:
    """Rows of a markdown table whose cell count differs from its header's (GFM splits cells at every
    unescaped `|`, inside code spans too); fenced code blocks are skipped."""
    problems, header, fenced = [], None, False
    for i, line in enumerate(md.splitlines(), 1):
        if line.startswith("```"):
            fenced, header = not fenced, None
            continue
        if fenced or not line.startswith("|"):
            header = None
            continue
        cells = len(_UNESCAPED_PIPE.split(line.strip().strip("|")))
        if header is None:
            header = cells
        elif cells != header:
            problems.append(f"line {i}: {cells} cells under a {header}-cell header: {line}")
    return problems


def test_the_checker_counts_escaped_pipes_as_text():
    assert table_problems("| a | b |\n|---|---|\n| `x \\| y` | 1 |\n") == []
    assert table_problems("| a | b |\n|---|---|\n| x | y | z |\n")
    assert table_problems("```\n| a |\n| b | c |\n```\n") == []


# --- API_REPORT and docs/ops.md: a Triton primitive's `|` is escaped, not a column and not a division


def _traced(name: str):
    from opforge.codegen.trace import trace_request

    req = load_request(ROOT / "examples" / name)
    return req, trace_request(req)


def test_api_report_ops_table_keeps_its_columns_when_a_primitive_has_a_pipe():
    from opforge.codegen.build import plan_request
    from opforge.skills.op_api.stage import _md, _op_rows

    req, traced = _traced("rms_norm")
    rows = _op_rows(traced)
    assert any("|" in r["triton"] for r in rows)  # aten.sum.dim_IntList: tl.sum + atomic_add | ordered partials
    md = _md(req, rows, [], "", [], plan_request(req, traced))
    assert table_problems(md) == []
    assert "| tl.sum + atomic_add \\| ordered partials | no |" in md


def test_ops_doc_escapes_pipes_instead_of_writing_a_division():
    from opforge.codegen.ops import markdown_table

    md = markdown_table()
    assert table_problems(md) == []
    assert "| `aten.bitwise_or.Tensor` | pointwise | \\| | yes |" in md
    assert "| `aten.sum.dim_IntList` | reduction | tl.sum + atomic_add \\| ordered partials | no |" in md
    assert "atomic_add / ordered" not in md
    assert (ROOT / "docs" / "ops.md").read_text() == md


# --- SPEC: boundary behaviours only where the traced graph has the ops; outputs counted once each


def _spec(name: str):
    from opforge.skills.op_requirement.stage import build_spec, render_spec

    req = load_request(ROOT / "examples" / name)
    spec, traced = build_spec(req)
    return spec, render_spec(req, spec, traced)


def _boundary(md: str) -> str:
    return md.split("## Boundary handling", 1)[1].split("## ", 1)[0]


def test_spec_of_an_op_without_clamp_or_round_states_neither():
    from opforge.skills.op_requirement.stage import spec_summary

    spec, md = _spec("rms_norm")
    section = _boundary(md)
    assert "clamp" not in section and "ties" not in section and "floor" not in section
    assert "a sum over no elements is 0" in section  # grad_weight sums over rows, and N=0 is a tested case
    assert "NaN and ±Inf propagate" in section
    assert "3 outputs: one forward output (out) and 2 gradients (grad_x, grad_weight)." in md
    assert "| → grad_x | like x | like x | | |" in md and "| → grad_weight | like weight | like weight | | |" in md
    assert table_problems(md) == []
    assert spec_summary(spec) == "SPEC with 3 outputs: 0 bit-exact, 3 reduced, 0 elementwise within tolerance"


def test_spec_of_an_elementwise_op_names_the_outputs_compared_elementwise():
    from opforge.skills.op_requirement.stage import spec_summary

    spec, md = _spec("geglu")
    assert "Everything else, compared with float64 truth within the dtype tolerance above: out, grad_a, grad_b." in md
    assert spec_summary(spec) == "SPEC with 3 outputs: 0 bit-exact, 0 reduced, 3 elementwise within tolerance"
    section = _boundary(md)
    assert "sum" not in section and "clamp" not in section and "ties" not in section


def test_spec_of_a_quantizer_states_its_clamp_ties_and_scale_floor():
    _, md = _spec("qat_symmetric_per_tensor")
    section = _boundary(md)
    assert "Values beyond a clamp saturate at its bounds" in section
    assert "Exact .5 ties round to even, as `torch.round`." in section
    assert "A `scale` below its floor takes the floor" in section  # where(scale > eps, scale, eps)


def test_spec_floor_line_needs_a_bound_on_the_scalar_itself():
    # LSQ clamps x / step, never step: its step has no floor, and SPEC must not claim one
    _, md = _spec("lsq_fake_quant")
    section = _boundary(md)
    assert "Values beyond a clamp saturate" in section and "ties round to even" in section
    assert "floor" not in section


# --- PRECISION: every headline extreme with its case, dtype, magnitude, tolerance and verdict


def _record(case: str, dtype: str, outputs: list[dict]) -> dict:
    return {"case": case, "level": 1, "dtype": dtype, "binding": {"N": 4}, "seed": 1,
            "passed": all(o["passed"] for o in outputs), "outputs": outputs}


def _compared(actual, truth, atol, rtol, exact=False, name="out"):
    from opforge.verify.metrics import compare
    from opforge.verify.tolerance import Tolerance

    return compare(torch.tensor(actual), torch.tensor(truth), Tolerance(atol, rtol, exact=exact), name=name)


def _row(md: str, output: str, extreme: str) -> str:
    lines = md.split("## Per output", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {output} |"))
    return next(line for line in lines[start:start + 2] if f"| {extreme} |" in line)


def test_precision_locates_a_huge_ulp_near_zero_as_a_pass_by_atol():
    from opforge.skills.op_develop.stage import precision_report, render_precision

    # float32: 1e-30 against 0 is ~2^30 ulps apart and 1e-30 off in value, well within atol
    near_zero = _compared([0.0, 1.0], [1e-30, 1.0], 1e-5, 1.3e-6)
    big = _compared([15.3 + 3e4, 2.0], [3e4, 2.0], 1e-5, 1e-3)
    records = [_record("L1-float32-N2-small", "float32", [near_zero]),
               _record("L1-float32-N2-uniform_large", "float32", [big])]
    md = render_precision("op", precision_report(records, 0, "2 passed"))
    assert table_problems(md) == []
    ulp = _row(md, "out", "max ULP")
    assert f"| {near_zero['max_ulp']:,} | L1-float32-N2-small | float32 |" in ulp
    assert "\\|ref\\| = 1e-30 at (0,)" in ulp and "atol 1e-05 + rtol 1.3e-06·\\|ref\\|" in ulp
    assert "passed by atol" in ulp and "near zero" in ulp
    abs_row = _row(md, "out", "max abs error")
    assert "| L1-float32-N2-uniform_large | float32 | \\|ref\\| = 3e+04 at (0,) |" in abs_row
    assert "passed by rtol: error 15.3, 0.00051 of \\|ref\\|" in abs_row


def test_precision_says_which_extreme_failed_and_by_how_much():
    from opforge.skills.op_develop.stage import precision_report, render_precision

    bad = _compared([1.5, 1.0], [1.0, 1.0], 1e-5, 1e-3)
    exact = _compared([2.0], [2.0], 0.0, 0.0, exact=True, name="grad_x")
    records = [_record("L0-bfloat16-N2", "bfloat16", [bad, exact])]
    md = render_precision("op", precision_report(records, 1, "1 failed"))
    assert "| bfloat16 (output float32) |" in _row(md, "out", "max abs error")
    assert "**failed**: error 0.5 is 495× the limit" in _row(md, "out", "max abs error")
    assert "| grad_x | 1 | 1 | max abs error | 0 |" in md
    assert "bit-exact against the golden's float32 path | passed: bit-identical |" in _row(md, "grad_x", "max ULP")


def test_precision_from_records_without_locations_still_names_case_and_tolerance():
    from opforge.skills.op_precision.summary import per_output_lines

    o = {"name": "out", "dtype": "float16", "atol": 1e-5, "rtol": 1e-3, "passed": True, "max_abs": 0.5,
         "max_ulp": 3, "max_abs_truth": 700.0}
    md = "\n".join(per_output_lines([_record("L1-float16-N3", "float16", [o])]))
    row = _row(md, "out", "max ULP")
    assert "| L1-float16-N3 | float16 | max \\|ref\\| of the output = 700 |" in row
    assert "passed (the output's verdict in this case)" in row


# --- PERF: the target stated, "not measured" where it was not; spreads honest; times on a log axis


def _cpu_perf(times: dict) -> dict:
    from opforge.skills.op_perf.stage import NO_KERNEL_TIMING

    cost = {"forward": {"eager_kernels": 4, "fused_kernels": 1, "eager_bytes": 400, "fused_bytes": 100}}
    row = {"binding": {"N": 8}, "dtype": "float32", "device": "cpu", "times": times, "launches": {},
           "cost": cost, "figures": {}}
    return {"device": "cpu", "device_name": "cpu", "torch": torch.__version__, "kernel_timing": NO_KERNEL_TIMING,
            "compile_modes": {}, "copy_ceiling": None, "rows": [row],
            "tuning": {"rounds": 0, "history": [], "shapes": [], "reason": "autotuning runs on an accelerator"}}


def test_perf_states_the_target_and_that_a_cpu_did_not_measure_it():
    from opforge.skills.op_perf.stage import _ms, render_perf

    req = SimpleNamespace(name="op", perf_target={"speedup_vs_eager": 3.0})
    times = {"eager_forward": {"median_ms": 812.5, "iqr_ms": 0.0, "runs": 1, "timer": "cpu"},
             "compile_default_forward": {"median_ms": 0.012346, "iqr_ms": 0.00021, "runs": 40, "timer": "cpu"}}
    md = render_perf({**_cpu_perf(times), "op_name": req.name, "perf_target": req.perf_target})
    target = md.split("## Target", 1)[1].split("## ", 1)[0]
    assert "`perf_target.speedup_vs_eager` = 3 (speedup over eager ≥ 3×)" in target
    assert "**not measured**: kernel timing needs an accelerator" in target
    assert "| eager | 812.5 (one sample) |" in md and not re.search(r"± 0\.0* \|", md)
    assert "| compile_default | 0.01235 ± 0.00021 |" in md
    assert _ms({"median_ms": 0.099996, "iqr_ms": 0.0, "runs": 3}) == "0.1000 ± 0"  # rounded, then to 4 digits
    assert table_problems(md) == []
    assert "The request sets no `perf_target`." in render_perf({**_cpu_perf(times), "op_name": "op", "perf_target": {}})


def test_perf_on_an_accelerator_compares_each_row_with_the_target():
    from opforge.skills.op_perf.stage import render_perf

    perf = _cpu_perf({"eager_forward": {"median_ms": 1.0, "iqr_ms": 0.01, "reps": 100},
                      "fused_forward": {"median_ms": 0.5, "iqr_ms": 0.002, "reps": 100}})
    perf.update(device="cuda", kernel_timing=None, copy_ceiling={"gbps": 100.0})
    perf["rows"][0]["figures"] = {"forward": {"fused_ms": 0.5, "gbps": 1.0, "speedup_vs_eager": 2.0}}
    md = render_perf({**perf, "op_name": "op", "perf_target": {"speedup_vs_eager": 3.0}})
    assert "| {'N': 8} | float32 | forward | 2.00× | **no** |" in md
    assert table_problems(md) == []


def test_perf_plot_puts_cpu_times_on_a_log_axis(tmp_path, monkeypatch):
    from opforge.skills.op_perf import stage
    from opforge.workspace import Workspace

    seen = {}
    monkeypatch.setattr(stage, "_save", lambda ws, fig, plt: seen.update(scale=fig.axes[0].get_yscale()))
    perf = _cpu_perf({"eager_forward": {"median_ms": 0.01, "iqr_ms": 0.001, "runs": 9},
                      "compile_default_forward": {"median_ms": 300.0, "iqr_ms": 0.0, "runs": 1}})
    stage._plot(Workspace(tmp_path, "op"), perf["rows"])
    assert seen["scale"] == "log"


# --- every table of a real workspace's reports has as many cells in each row as in its header


@pytest.mark.parametrize("report", REPORTS)
def test_generated_report_tables_keep_their_columns(built_ws, report):
    md = (built_ws / report).read_text()
    assert table_problems(md) == [], report


def test_perf_md_keeps_the_tensor_core_count_of_each_compiled_kernel():
    from opforge.skills.op_perf.stage import _compiled, _md_compiled

    build = {"dtype": "bfloat16", "binding": {"S": 64}, "pass": "backward", "kernel": "_op_backward_0_dq_kernel",
             "num_warps": 4, "registers": 172, "spill_bytes": 0, "shared_bytes": 49152, "wgmma": 20}
    report = {"arch": "sm_90", "toolchain": {"unavailable": None}, "ops": [{"builds": [build]}]}
    md = "\n".join(_md_compiled(_compiled(report, {"supported_dtypes": ["bfloat16"]})))
    assert "| 64 | backward | _op_backward_0_dq_kernel | 4 | 172 | 0 | 49152 | — | wgmma ×20 |" in md
