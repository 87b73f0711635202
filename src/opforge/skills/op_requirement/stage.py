"""Stage 1, requirement: the request becomes SPEC.md (front matter + sections) and spec.json.

The reference is traced here, so a reference that raises, branches on data, or computes an attribute in
Python fails at stage 1 with one line. SPEC.md is then frozen: its hash is kept in the state.
"""

from __future__ import annotations

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from opforge.codegen.build import symbol_map
from opforge.codegen.graph_text import dataflow_ascii, formula_lines, output_traits
from opforge.codegen.trace import example_inputs, trace_request
from opforge.request import Request
from opforge.verify.tolerance import parse_dtype, tolerance_for
from opforge.workspace import StageOutcome, Workspace
from opforge.workspace.atomic import write_json_atomic, write_text_atomic

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
        "leading_dimensions": list(traced.leading["inputs"]) if traced.leading else [],
        "exact_outputs": [n for n, t in traits.items() if t["exact"]],
        "reduced_outputs": [n for n, t in traits.items() if t["reduced"]],
        "reduced_extent": {n: t["reduced_extent"] for n, t in traits.items() if t["reduced"]},
    }
    return spec, traced


def _leading_line(req: Request, spec: dict) -> str:
    rows = req.inputs[0].shape[0] if req.inputs[0].shape else None
    if spec["leading_dimensions"]:
        names = ", ".join(spec["leading_dimensions"])
        return (f"- Dimensions that vary: every size above, and {names} may have more leading dimensions than "
                f"{rows!r} (a (B, S, ...) input for ({rows!r}, ...)): together they are the rows, and the outputs "
                "with rows have them too. The reference was probed: on inputs stacked to (2, ...) it gives the "
                "(2·rows, ...) outputs reshaped.")
    return ("- Dimensions that vary: every size above; the rank is the declared one (the reference, probed with "
            "leading dimensions stacked, means something else by them, or its first input has no row dimension).")


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
              numerics_vs_eager(req, spec, traced), "",
              "## Boundary handling", "",
              "- Zero elements: outputs are empty; a full reduction of nothing is its identity (0 for sums).",
              "- Shapes are run-time arguments: any size, including sizes that are not block multiples.",
              _leading_line(req, spec),
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


_NARROW = (torch.bfloat16, torch.float16)
_CASTS = ("_to_copy", "convert_element_type")


class _CastLog(TorchDispatchMode):
    """The dtype conversions an eager run makes: (from, to, result's storage)."""

    def __init__(self):
        super().__init__()
        self.casts: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(c in str(func) for c in _CASTS) and isinstance(out, torch.Tensor) and args[0].dtype != out.dtype:
            self.casts.append((args[0].dtype, out.dtype, out.untyped_storage().data_ptr()))
        return out


def _eager_casts(req: Request, traced, dtype: torch.dtype) -> tuple[int, int, int] | None:
    """(upcasts, downcasts to a narrow dtype, downcasts to a narrow dtype the traced forward keeps) of the
    reference's forward run eagerly in `dtype`; a cast whose result is returned is the store, not counted.
    None when the reference cannot run eagerly in the dtype."""
    tensors = example_inputs(req, traced.example_binding, dtype=dtype)
    log = _CastLog()
    try:
        with log:
            outs = req.load_reference()(*tensors, **req.attr_defaults)
    except Exception:
        return None
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    returned = {o.untyped_storage().data_ptr() for o in outs if isinstance(o, torch.Tensor)}
    up = sum(a in _NARROW and b.itemsize > a.itemsize for a, b, _ in log.casts)
    down = sum(b in _NARROW and a.itemsize > b.itemsize and ptr not in returned for a, b, ptr in log.casts)
    kept = sum(1 for n in traced.forward.graph.nodes if n.op == "call_function"
               and any(c in str(n.target) for c in _CASTS) and n.kwargs.get("dtype", None) in _NARROW)
    return up, down, kept


def _count(n: int, noun: str) -> str:
    return f"one {noun}" if n == 1 else f"{n} {noun}s"


def _be(n: int) -> str:
    return "is" if n == 1 else "are each"


def numerics_vs_eager(req: Request, spec: dict, traced) -> str:
    """SPEC's paragraph on how the kernel's results stand to eager PyTorch's in the same dtype."""
    low = [d for d in spec["supported_dtypes"] if parse_dtype(d) in _NARROW]
    head = "**Numerics against eager.** "
    tail = ("Tolerances hold the kernel to float64, never to eager; PRECISION.md shows per dtype and output the "
            "kernel's error and eager's own error against float64 side by side, and how many elements differ from "
            "eager.")
    if not low:
        return (head + "The kernel computes in float32 as eager PyTorch does in float32; results differ from eager's "
                "only by the order of operations (a few ulps, most in reductions). " + tail)
    text = (head + "The kernel loads each input in its dtype, computes in float32 and rounds once per output, when "
            f"it stores it. Eager PyTorch in {' and '.join(low)} rounds each intermediate tensor to the dtype, so "
            "where it does the kernel's results differ from eager's in many elements, by about one ulp of the dtype "
            "(more where a result cancels towards zero), while lying closer to float64; where an eager op computes "
            "in float32 itself and rounds once, the two can agree bit for bit. ")
    casts = _eager_casts(req, traced, parse_dtype(low[0]))
    if casts:
        up, down, kept = casts
        if kept:
            text += (f"The reference's {_count(kept, 'cast')} to a fixed narrow dtype (`.to(torch.bfloat16)` and "
                     f"the like) {_be(kept)} a rounding step in the kernel too. ")
        if down > kept:
            # traced in float32, `.to(x.dtype)` is a cast to float32: a no-op that leaves no node to lower
            text += (f"Its {_count(down - kept, 'cast')} back to the inputs' dtype between steps (`.to(x.dtype)` "
                     f"and the like) {_be(down - kept)} a no-op in the float32 trace the kernel is built from: "
                     "eager rounds there, the kernel does not. ")
        if up:
            text += (f"Its {_count(up, 'upcast')} to float32 (`.float()`) {'matches' if up == 1 else 'match'} what "
                     "the kernel does throughout. ")
    return text + tail


def run(ws: Workspace, req: Request, state) -> StageOutcome:
    spec, traced = build_spec(req)
    write_json_atomic(ws.path("spec.json"), spec)
    write_text_atomic(ws.path("SPEC.md"), render_spec(req, spec, traced))
    return StageOutcome("completed", f"SPEC with {len(spec['exact_outputs'])} exact and "
                                     f"{len(spec['reduced_outputs'])} reduced outputs",
                        artifacts=["SPEC.md", "spec.json"])
