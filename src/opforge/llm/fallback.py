"""Stages 2 and 4 when the templates cannot lower an op and a model engine will write the kernel instead.

Stage 2 still runs as always; when it stops on unsupported ops, the report keeps them, now under
`model_lowered` with the engine's name, and gains the cost model the templates could not give (minimum bytes:
each input read once, each output written once). Stage 4 writes the verification matrix exactly as the
template design does (the tests depend only on it) and a fusion plan that leaves the kernel to stage 5.
"""

from __future__ import annotations

import json

from opforge.codegen.build import numel_of
from opforge.codegen.eager_dispatch import eager_cost
from opforge.codegen.trace import trace_request
from opforge.i18n import N_, _
from opforge.verify.cases import largest_input, level0_cases, level1_cases
from opforge.workspace import StageOutcome, Workspace
from opforge.workspace.atomic import write_json_atomic, write_text_atomic

ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _outputs(gm):
    out = next(n for n in gm.graph.nodes if n.op == "output")
    vals = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    return [v for v in vals if hasattr(v, "op")]


def _pass_cost(gm, numel, eb: int, eager: dict, n_inputs: int | None = None) -> dict:
    places = [n for n in gm.graph.nodes if n.op == "placeholder"][:n_inputs]
    fused = sum(numel(p) for p in places) * eb + sum(numel(o) for o in _outputs(gm)) * eb
    n_elem = max([numel(p) for p in places] or [0])
    flops = sum(1 for n in gm.graph.nodes if n.op == "call_function") * n_elem
    # max(1, ...): reports divide by the eager figures
    return {"fused_kernels": 1, "fused_bytes": fused, "eager_kernels": max(1, eager["kernels"]),
            "eager_bytes": max(1, eager["bytes"]), "eager_ops": eager["ops"],
            "flops": flops, "arithmetic_intensity": round(flops / max(1, fused), 3)}


def cost_rows(req, traced) -> list[dict]:
    rows = []
    fn = req.load_reference()
    for binding in req.p0:
        for dt in req.dtypes:
            eb = ELEM_BYTES.get(dt, 4)
            eager = eager_cost(req, binding, dt, fn)
            row = {"binding": binding, "dtype": dt, "elements": 0,
                   "forward": _pass_cost(traced.forward, numel_of(traced.forward, req, binding), eb,
                                         eager["forward"])}
            if traced.joint is not None:
                row["backward"] = _pass_cost(traced.joint, numel_of(traced.joint, req, binding), eb,
                                             eager["backward"])
            rows.append(row)
    return rows


PASSES = {"forward": N_("forward"), "backward": N_("backward")}


def api_stage(ws: Workspace, req, state, default, engine: str) -> StageOutcome:
    outcome = default(ws, req, state)
    if outcome.status != "blocked" or not ws.path("api_report.json").exists():
        return outcome
    rep = json.loads(ws.path("api_report.json").read_text())
    ops = list(rep.get("unsupported") or [])
    if not ops:
        return outcome
    traced = trace_request(req)
    rep.update(unsupported=[], model_lowered=ops, model_lowered_reason=rep.get("unsupported_reason"),
               engine=engine, unsupported_reason=None, cost=cost_rows(req, traced))
    write_json_atomic(ws.path("api_report.json"), rep)
    md = ws.path("API_REPORT.md").read_text().replace(  # the report is in the run's language: so is the sentence
        _("The deterministic engine cannot fuse this request; the run stops as BLOCKED_API."),
        _("The templates cannot fuse this request; the `{engine}` engine writes the kernel at stage 5, held to the "
          "same gates and tests.").format(engine=engine))
    md += ("\n" + _("## Cost model (minimum bytes)") + "\n\n"
           + _("| shape | dtype | pass | eager kernels | eager bytes | minimum bytes |") + "\n"
           + "|---|---|---|---|---|---|\n")
    for c in rep["cost"]:
        for p, shown_as in PASSES.items():
            if p in c:
                x = c[p]
                md += (f"| {c['binding']} | {c['dtype']} | {_(shown_as)} | {x['eager_kernels']} | "
                       f"{x['eager_bytes']:,} | {x['fused_bytes']:,} |\n")
    write_text_atomic(ws.path("API_REPORT.md"), md)
    state.options["model_ops"] = ops
    return StageOutcome("completed", f"templates cannot lower {', '.join(ops)}; the {engine} engine writes the "
                                     "kernel at stage 5", artifacts=["API_REPORT.md", "api_report.json"])


def design_stage(ws: Workspace, req, state) -> StageOutcome:
    spec = json.loads(ws.path("spec.json").read_text())
    l0 = level0_cases(spec["supported_dtypes"], spec["p0_shapes"])
    l1 = level1_cases(spec["supported_dtypes"], spec["dynamic_axes"],
                      {k: spec["default_params"][k] for k in spec["runtime_params"]}, largest_input(spec))
    ops = state.options.get("model_ops", [])
    design = {"op_name": req.name,
              "kernels": [{"kernel": f"{req.name} forward", "written_by": "model engine, stage 5", "ops": ops}] +
              ([{"kernel": f"{req.name} backward", "written_by": "model engine, stage 5"}] if spec["backward"] else []),
              "tiling": {"BLOCK": 1024, "num_warps": 4, "grid": "cdiv(n_elements, BLOCK)"},
              "verification": {"level0": l0, "level1": l1}}
    lines = [_("# Design: {op}").format(op=req.name), "", _("## Compute graph"), "",
             _("The traced graphs are in SPEC.md. The templates cannot lower {ops} (API_REPORT.md), so the kernels "
               "are written at stage 5 by the model engine.").format(ops=", ".join(f"`{o}`" for o in ops)), "",
             "## " + _("Fusion plan"), "",
             _("One kernel per pass ({n}): every op of the pass fused, each input read once and each output written "
               "once, as the cost model's minimum bytes assume.").format(n=len(design["kernels"])), "",
             "## " + _("Tiling and loops"), "",
             _("- 1-D grid of `cdiv(n_elements, BLOCK)` programs, at least one; `BLOCK` = 1024, 4 warps."), "",
             "## " + _("Memory layout"), "",
             _("- Contiguous inputs walked as one flat range, int64 offsets, float32 compute, outputs rounded to their "
               "dtype."), "",
             "## " + _("Verification matrix"), "",
             _("Level 0: {l0} cases (every SPEC dtype × every p0 shape). Level 1: {l1} cases.").format(
                 l0=len(l0), l1=len(l1)), "",
             _("| id | level | dtype | binding | distribution |"), "|---|---|---|---|---|"]
    lines += [f"| {c['id']} | {c['level']} | {c['dtype']} | {c['binding']} | {c['distribution']} |" for c in l0 + l1]
    write_json_atomic(ws.path("design.json"), design)
    write_text_atomic(ws.path("DESIGN.md"), "\n".join(lines) + "\n")
    return StageOutcome("completed", f"kernels left to the model engine; {len(l0)}+{len(l1)} verification cases",
                        artifacts=["DESIGN.md", "design.json"])
