"""Stage 6 names the fused step that diverges: a bug planted in one statement of the built kernel is found
there, by replaying a failing case with the kernel's intermediates against the golden graph in float64."""

from __future__ import annotations

import json
import re

from opforge.orchestrator.state import load_state
from opforge.request import load_request
from opforge.skills.op_develop.stage import precision_report, run_tests
from opforge.skills.op_precision.stage import run as run_stage6
from opforge.workspace import Workspace
from opforge.workspace.atomic import write_json_atomic

OP = "qat_symmetric_per_tensor"


def plant(ws) -> str:
    """Multiply the result of the forward kernel's first division by 1.01; returns the statement's node."""
    path = ws / f"{OP}_impl.py"
    src = path.read_text()
    kernel = src.index(f"def _{OP}_forward_kernel(")
    m = re.compile(r"^(\s+)(\w+) = (tl\.div_rn\(.+\))  # aten\.div\.Tensor$", re.M).search(src, kernel)
    assert m, "no division statement in the forward kernel"
    path.write_text(src[:m.start()] + f"{m.group(1)}{m.group(2)} = {m.group(3)} * 1.01  # aten.div.Tensor" +
                    src[m.end():])
    return m.group(2)


def test_stage6_names_the_planted_step(ws_copy):
    planted = plant(ws_copy)
    state = load_state(ws_copy)
    ws = Workspace(ws_copy, state.op_name)
    rc, line, records, failed = run_tests(ws)
    assert rc != 0
    write_json_atomic(ws.path("precision.json"), precision_report(records, rc, line, failed))
    outcome = run_stage6(ws, load_request(ws_copy / "request"), state)
    assert outcome.status == "failed"
    loc = json.loads(ws.path("precision.json").read_text())["localisation"]
    firsts = {name: (v["fused_step"] or {}).get("first") for name, v in loc.items()}
    assert any(f and f["node"] == planted for f in firsts.values()), firsts
    f = next(f for f in firsts.values() if f and f["node"] == planted)
    assert "* 1.01" in f["source"] and f["kernel"] == f"_{OP}_forward_kernel"
    assert f"diverging fused step: `{planted}`" in ws.path("PRECISION.md").read_text()
