"""Stage 1, requirement: the request becomes SPEC.md (front matter + sections) and spec.json.

The reference is traced here, so a reference that raises, branches on data, or computes an attribute in
Python fails at stage 1 with one line. SPEC.md is then frozen: its hash is kept in the state.
"""

from __future__ import annotations

import yaml

from opforge.codegen.build import symbol_map
from opforge.codegen.graph_text import dataflow_ascii, formula_lines, output_traits
from opforge.codegen.trace import trace_request
from opforge.orchestrator.atomic import write_json_atomic, write_text_atomic
from opforge.orchestrator.workspace import StageOutcome, Workspace
from opforge.request import Request
from opforge.verify.tolerance import tolerance_for

SCHEMA_VERSION = 1


def build_spec(req: Request) -> tuple[dict, object]:
    traced = trace_request(req)
    n_out = len(traced.output_names)
    fwd_traits = output_traits(traced.forward, list(range(n_out)), symbol_map(traced.forward, req, products=True))
    grad_names = [f"grad_{g}" for g in traced.grad_inputs]
    bwd_traits = output_traits(traced.joint, list(range(n_out, n_out + len(grad_names))),
                               symbol_map(traced.joint, req, products=True)) if traced.joint else []
    traits = dict(zip(traced.output_names + grad_names, fwd_traits + bwd_traits))
    tolerance = {}
    for dt in req.dtypes:
        t = tolerance_for(dt, req.tolerance)
        tolerance[dt] = {"atol": t.atol, "rtol": t.rtol}
    spec = {
        "schema_version": SCHEMA_VERSION,
        "op_name": req.name,
        "category": req.category,
        "description": req.description,
        "supported_dtypes": req.dtypes,
        "p0_shapes": req.p0,
        "tolerance": tolerance,
        "dynamic_axes": req.symbols,
        "default_params": req.attr_defaults,
        "runtime_params": traced.runtime_attrs,
        "perf_target": req.perf_target,
        "backward": req.backward,
        "deterministic": req.deterministic,
        "inputs": [{"name": s.name, "shape": s.shape, "dtype": f"like {s.like}" if s.like else s.dtypes,
                    "requires_grad": s.requires_grad, **({"range": list(s.range)} if s.range else {})}
                   for s in req.inputs],
        "outputs": [{"name": n, "dtype": f"like {traced.output_like[n]}" if traced.output_like[n] else "float32"}
                    for n in traced.output_names],
        "grad_inputs": traced.grad_inputs if req.backward else [],
        "exact_outputs": [n for n, t in traits.items() if t["exact"]],
        "reduced_outputs": [n for n, t in traits.items() if t["reduced"]],
        "reduced_extent": {n: t["reduced_extent"] for n, t in traits.items() if t["reduced"]},
    }
    return spec, traced


def render_spec(req: Request, spec: dict, traced) -> str:
    fm = yaml.safe_dump({k: spec[k] for k in ("schema_version", "op_name", "category", "supported_dtypes",
                                              "p0_shapes", "tolerance", "dynamic_axes", "default_params",
                                              "perf_target")}, sort_keys=False).strip()
    ins, outs = traced.input_names, traced.output_names
    lines = [f"---\n{fm}\n---", f"# {req.name}", "", req.description + ".", "", "## Formula", "",
             "Read off the traced forward graph (float32 compute; `round_half_even` is `torch.round`):", "",
             "```", *formula_lines(traced.forward, ins, outs), "```", ""]
    if traced.joint is not None:
        grads = [f"grad_{g}" for g in traced.grad_inputs]
        lines += ["Backward, from autograd of the reference (the joint graph, forward values recomputed):", "",
                  "```", *formula_lines(traced.joint, ins + [f"grad_{o}" for o in outs], outs + grads)[-40:],
                  "```", ""]
    lines += ["## Inputs and outputs", "", "| name | shape | dtype | requires_grad | test range |",
              "|---|---|---|---|---|"]
    for s in spec["inputs"]:
        dt = s["dtype"] if isinstance(s["dtype"], str) else ", ".join(s["dtype"])
        lines.append(f"| {s['name']} | {tuple(s['shape'])} | {dt} | {s['requires_grad']} | "
                     f"{s.get('range', 'distribution')} |")
    for o in spec["outputs"]:
        lines.append(f"| → {o['name']} | traced | {o['dtype']} | | |")
    lines += ["", "Attributes: " + (", ".join(f"`{k}={v!r}`" for k, v in spec["default_params"].items()) or
                                   "none") + f". Run-time kernel arguments: {spec['runtime_params'] or 'none'}.",
              "", "## Dtypes", "", "| dtype | loaded as | computed in | stored as | atol | rtol |",
              "|---|---|---|---|---|---|"]
    for dt, tol in spec["tolerance"].items():
        lines.append(f"| {dt} | {dt} | float32 | {dt} | {tol['atol']:g} | {tol['rtol']:g} |")
    lines += ["", "## Precision", "",
              f"- Bit-exact against the golden's float32 path cast to the dtype: "
              f"{', '.join(spec['exact_outputs']) or 'none'} (only exact operations on their path).",
              f"- Reductions, compared with float64 truth within tolerance (atol grows with √K for K reduced "
              f"elements, and admits 4× the reference's own float32 error): "
              f"{', '.join(spec['reduced_outputs']) or 'none'}.",
              "- Everything else: float64 truth within the dtype tolerance above.", "",
              "## Boundary handling", "",
              "- Zero elements: outputs are empty; a full reduction of nothing is its identity (0 for sums).",
              "- Shapes are run-time arguments: any size, including sizes that are not block multiples.",
              "- Values beyond a clamp saturate at its bounds; exact .5 ties round to even, as `torch.round`.",
              "- NaN and ±Inf propagate as they do through the reference, position by position.",
              "- Per-tensor scalars below a floor attribute take the floor, as the reference does "
              "(tested with scalars of 1e-6).", "",
              "## Dataflow (traced forward graph)", "", "```",
              dataflow_ascii(traced.forward, ins, outs, symbol_map(traced.forward, req)), "```",
              ""]
    if traced.joint is not None:
        grads = [f"grad_{g}" for g in traced.grad_inputs]
        lines += ["## Dataflow (traced joint forward + backward graph)", "", "```",
                  dataflow_ascii(traced.joint, ins + [f"grad_{o}" for o in outs], outs + grads,
                                 symbol_map(traced.joint, req)), "```", ""]
    lines += ["## Typical configurations", "", "| shape binding | elements |", "|---|---|"]
    for b in spec["p0_shapes"]:
        numel = 1
        for v in b.values():
            numel *= v
        lines.append(f"| {b} | {numel:,} |")
    return "\n".join(lines) + "\n"


def run(ws: Workspace, req: Request, state) -> StageOutcome:
    spec, traced = build_spec(req)
    write_json_atomic(ws.path("spec.json"), spec)
    write_text_atomic(ws.path("SPEC.md"), render_spec(req, spec, traced))
    return StageOutcome("completed", f"SPEC with {len(spec['exact_outputs'])} exact and "
                                     f"{len(spec['reduced_outputs'])} reduced outputs",
                        artifacts=["SPEC.md", "spec.json"])
