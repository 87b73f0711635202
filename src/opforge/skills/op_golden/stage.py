"""Stage 3, golden: `<op>_golden.py`, the reference as truth (float64) and as compute path (float32),
gradients by autograd, and seeded input generators. It imports no kernel."""

from __future__ import annotations

import json
from pathlib import Path

from opforge.request import Request
from opforge.workspace import StageOutcome, Workspace
from opforge.workspace.atomic import write_text_atomic

TEMPLATE = Path(__file__).with_name("golden.py.tmpl")


def render_golden(req: Request, spec: dict) -> str:
    inputs = [{"name": s.name, "shape": list(s.shape), **({"range": list(s.range)} if s.range else {}),
               **({"index_dtype": s.dtypes[0], "edges": list(s.edges)} if s.index else {})} for s in req.inputs]
    return TEMPLATE.read_text().format(
        op=req.name, reference=f"{req.reference_file}:{req.reference_func}", ref_file=req.reference_file,
        ref_func=req.reference_func, inputs=inputs, outputs=[o["name"] for o in spec["outputs"]],
        grad_inputs=spec["grad_inputs"], attributes=req.attr_defaults)


def run(ws: Workspace, req: Request, state) -> StageOutcome:
    spec = json.loads(ws.path("spec.json").read_text())
    write_text_atomic(ws.path(ws.golden), render_golden(req, spec))
    return StageOutcome("completed", "golden written; it imports in a fresh interpreter (gate G3-IMPORT)",
                        artifacts=[ws.golden])
