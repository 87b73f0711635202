"""Stage 1, requirement: the request becomes SPEC.md (front matter + sections) and spec.json.

The reference is traced here, so a reference that raises, branches on data, or computes an attribute in
Python fails at stage 1 with one line. SPEC.md is then frozen: its hash is kept in the state.
"""

from __future__ import annotations

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from opforge.codegen.graph_text import dataflow_ascii, formula_lines, output_traits
from opforge.codegen.ops import op_name
from opforge.codegen.trace import example_inputs, symbol_map, trace_request
from opforge.i18n import _
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
        return _("- Dimensions that vary: every size above, and {names} may have more leading dimensions than "
                 "{rows!r} (a (B, S, ...) input for ({rows!r}, ...)): together they are the rows, and the outputs "
                 "with rows have them too. The reference was probed: on inputs stacked to (2, ...) it gives the "
                 "(2·rows, ...) outputs reshaped.").format(names=names, rows=rows)
    return _("- Dimensions that vary: every size above; the rank is the declared one (the reference, probed with "
             "leading dimensions stacked, means something else by them, or its first input has no row dimension).")


def _names(names: list[str]) -> str:
    """A list of outputs for a sentence: their names, or "none"."""
    return ", ".join(names) or _("none")


def _like(text) -> str:
    """A dtype or shape cell: "like x" (spec.json's spelling) in the report's language, anything else as is."""
    if isinstance(text, str) and text.startswith("like "):
        return _("like {name}").format(name=text[len("like "):])
    return text


def render_spec(req: Request, spec: dict, traced) -> str:
    fm = yaml.safe_dump({k: spec[k] for k in ("schema_version", "op_name", "category", "supported_dtypes",
                                              "p0_shapes", "tolerance", "dynamic_axes", "default_params",
                                              "perf_target")}, sort_keys=False).strip()
    ins, outs = traced.input_names, traced.output_names
    lines = [f"---\n{fm}\n---", f"# {req.name}", "", req.description + ".", "", _("## Formula"), "",
             _("Read off the traced forward graph (float32 compute; `round_half_even` is `torch.round`):"), "",
             "```", *formula_lines(traced.forward, ins, outs), "```", ""]
    if traced.joint is not None:
        grads = [f"grad_{g}" for g in traced.grad_inputs]
        lines += [_("Backward, from autograd of the reference (the joint graph, forward values recomputed):"), "",
                  "```", *formula_lines(traced.joint, ins + [f"grad_{o}" for o in outs], outs + grads)[-40:],
                  "```", ""]
    lines += [_("## Inputs and outputs"), "", _("| name | shape | dtype | requires_grad | test range |"),
              "|---|---|---|---|---|"]
    drawn, traced_shape = _("distribution"), _("traced")  # the test range without a declared one; an output's shape
    for s in spec["inputs"]:
        dt = _like(s["dtype"]) if isinstance(s["dtype"], str) else ", ".join(s["dtype"])
        lines.append(f"| {s['name']} | {tuple(s['shape'])} | {dt} | {s['requires_grad']} | "
                     f"{s.get('range', drawn)} |")
    for o in spec["outputs"]:
        lines.append(f"| → {o['name']} | {traced_shape} | {_like(o['dtype'])} | | |")
    for g in spec["grad_inputs"]:
        like = _("like {name}").format(name=g)
        lines.append(f"| → grad_{g} | {like} | {like} | | |")
    lines += ["", output_count_line(spec)]
    attrs = ", ".join(f"`{k}={v!r}`" for k, v in spec["default_params"].items()) or _("none")
    lines += ["", _("Attributes: {attributes}. Run-time kernel arguments: {arguments}.").format(
                  attributes=attrs, arguments=spec["runtime_params"] or _("none")),
              "", _("## Dtypes"), "", _("| dtype | loaded as | computed in | stored as | atol | rtol |"),
              "|---|---|---|---|---|---|"]
    for dt, tol in spec["tolerance"].items():
        lines.append(f"| {dt} | {dt} | float32 | {dt} | {tol['atol']:g} | {tol['rtol']:g} |")
    lines += ["", _("## Precision"), "",
              _("- Bit-exact against the golden's float32 path cast to the dtype: {outputs} (only exact operations "
                "on their path).").format(outputs=_names(spec["exact_outputs"])),
              _("- Reductions, compared with float64 truth within tolerance (atol grows with √K for K reduced "
                "elements, and admits 4× the reference's own float32 error): {outputs}.").format(
                  outputs=_names(spec["reduced_outputs"])),
              _("- Everything else, compared with float64 truth within the dtype tolerance above: {outputs}.").format(
                  outputs=_names(_other_outputs(spec))), "",
              numerics_vs_eager(req, spec, traced), "",
              _("## Boundary handling"), "",
              *boundary_lines(req, spec, traced), "",
              _("## Dataflow (traced forward graph)"), "", "```",
              dataflow_ascii(traced.forward, ins, outs, symbol_map(traced.forward, req)), "```",
              ""]
    if traced.joint is not None:
        grads = [f"grad_{g}" for g in traced.grad_inputs]
        lines += [_("## Dataflow (traced joint forward + backward graph)"), "", "```",
                  dataflow_ascii(traced.joint, ins + [f"grad_{o}" for o in outs], outs + grads,
                                 symbol_map(traced.joint, req)), "```", ""]
    lines += [_("## Typical configurations"), "", _("| shape binding | elements |"), "|---|---|"]
    for b in spec["p0_shapes"]:
        numel = 1
        for v in b.values():
            numel *= v
        lines.append(f"| {b} | {numel:,} |")
    return "\n".join(lines) + "\n"


def _compared_outputs(spec: dict) -> list[str]:
    """Every tensor the kernel returns and the tests compare: the forward outputs, then the gradients."""
    return [o["name"] for o in spec["outputs"]] + [f"grad_{g}" for g in spec["grad_inputs"]]


def _other_outputs(spec: dict) -> list[str]:
    kept = set(spec["exact_outputs"]) | set(spec["reduced_outputs"])
    return [n for n in _compared_outputs(spec) if n not in kept]


def output_count_line(spec: dict) -> str:
    """How many outputs the op has, counted once each: forward outputs and input gradients."""
    fwd = [o["name"] for o in spec["outputs"]]
    grads = [f"grad_{g}" for g in spec["grad_inputs"]]
    # "one" is spelled out in English: each count picks its own message, so a translation shows the same figures
    forward = (_("one forward output") if len(fwd) == 1 else _("{n} forward outputs")).format(n=len(fwd))
    names = ", ".join(fwd)
    if not grads:
        if len(fwd) == 1:
            return _("one output: {forward} ({names}).").format(forward=forward, names=names)
        return _("{n} outputs: {forward} ({names}).").format(n=len(fwd), forward=forward, names=names)
    gradients = (_("one gradient") if len(grads) == 1 else _("{n} gradients")).format(n=len(grads))
    return _("{n} outputs: {forward} ({names}) and {gradients} ({gradient_names}).").format(
        n=len(fwd) + len(grads), forward=forward, names=names, gradients=gradients, gradient_names=", ".join(grads))


def spec_summary(spec: dict) -> str:
    """The stage's one-line outcome: the outputs, each in the one comparison class it falls in."""
    n = len(_compared_outputs(spec))
    return (f"SPEC with {_count(n, 'output')}: {len(spec['exact_outputs'])} bit-exact, "
            f"{len(spec['reduced_outputs'])} reduced, {len(_other_outputs(spec))} elementwise within tolerance")


_CLAMPS = ("clamp", "clamp_min", "clamp_max")
_FLOORS = _CLAMPS + ("maximum", "minimum", "where")
_COMPARISONS = ("gt", "ge", "lt", "le")
_PASS_THROUGH = ("view", "_to_copy", "detach", "alias", "clone", "expand", "reshape", "squeeze", "unsqueeze")


def _base(node) -> str:
    """'clamp' for aten.clamp.default: the op's name without namespace and overload."""
    name = op_name(node.target)
    return name.split(".")[1] if name.startswith("aten.") else name


def _graph_ops(traced) -> set[str]:
    graphs = [traced.forward] + ([traced.joint] if traced.joint is not None else [])
    return {_base(n) for g in graphs for n in g.graph.nodes if n.op == "call_function"}


def _floored_scalars(req: Request, traced) -> list[str]:
    """Per-tensor scalar inputs (declared all-ones shape: the `below_eps` cases set them to 1e-6) that the
    forward graph bounds directly, by a clamp, a maximum/minimum or a `where` choosing them or a bound."""
    placeholders = [n for n in traced.forward.graph.nodes if n.op == "placeholder"]
    scalars = {p: s.name for p, s in zip(placeholders, req.inputs)
               if not s.index and s.shape and all(d == 1 for d in s.shape)}

    def source(a):
        while isinstance(a, torch.fx.Node) and a.op == "call_function" and _base(a) in _PASS_THROUGH:
            a = a.args[0]
        return a if isinstance(a, torch.fx.Node) else None

    def bounded(n) -> list:
        if _base(n) in _CLAMPS:
            return list(n.args[:1])
        if _base(n) != "where":
            return list(n.args[:2])
        cond = n.args[0]  # `where(scale > eps, scale, eps)`: a choice by comparing the scalar itself
        if not (isinstance(cond, torch.fx.Node) and cond.op == "call_function" and _base(cond) in _COMPARISONS):
            return []
        compared = {source(a) for a in cond.args[:2]} - {None}
        return [a for a in n.args[1:3] if source(a) in compared]

    found = []
    for n in traced.forward.graph.nodes:
        if n.op != "call_function" or _base(n) not in _FLOORS:
            continue
        for a in bounded(n):
            name = scalars.get(source(a))
            if name and name not in found:
                found.append(name)
    return found


def boundary_lines(req: Request, spec: dict, traced) -> list[str]:
    """SPEC's boundary behaviours: the general ones, then only those the traced graphs' ops have."""
    ops = _graph_ops(traced)
    sums, extrema = "sum" in ops, bool(ops & {"amax", "amin"})
    if sums and extrema:
        empty = _("- Zero elements: outputs are empty; a sum over no elements is 0, its identity; a max or min over "
                  "no elements is undefined: the reference raises there, and the tests skip such a case.")
    elif sums:
        empty = _("- Zero elements: outputs are empty; a sum over no elements is 0, its identity.")
    elif extrema:
        empty = _("- Zero elements: outputs are empty; a max or min over no elements is undefined: the reference "
                  "raises there, and the tests skip such a case.")
    else:
        empty = _("- Zero elements: outputs are empty.")
    lines = [empty, _("- Shapes are run-time arguments: any size, including sizes that are not block multiples."),
             _leading_line(req, spec)]
    if ops & set(_CLAMPS):
        lines.append(_("- Values beyond a clamp saturate at its bounds, as `torch.clamp`."))
    if "round" in ops:
        lines.append(_("- Exact .5 ties round to even, as `torch.round`."))
    lines.append(_("- NaN and ±Inf propagate as they do through the reference, position by position."))
    for name in _floored_scalars(req, traced):
        lines.append(_("- A `{name}` below its floor takes the floor, as the reference does (a per-tensor scalar; "
                       "tested with {name} = 1e-6).").format(name=name))
    return lines


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
    up = sum(a in _NARROW and b.itemsize > a.itemsize for a, b, _ptr in log.casts)
    down = sum(b in _NARROW and a.itemsize > b.itemsize and ptr not in returned for a, b, ptr in log.casts)
    kept = sum(1 for n in traced.forward.graph.nodes if n.op == "call_function"
               and any(c in str(n.target) for c in _CASTS) and n.kwargs.get("dtype", None) in _NARROW)
    return up, down, kept


def _count(n: int, noun: str) -> str:
    """English only: spec_summary's outcome line."""
    return f"one {noun}" if n == 1 else f"{n} {noun}s"


def numerics_vs_eager(req: Request, spec: dict, traced) -> str:
    """SPEC's paragraph on how the kernel's results stand to eager PyTorch's in the same dtype. Each sentence is
    one message and carries the space that follows it; a count of one is spelled out, so it has its own message."""
    low = [d for d in spec["supported_dtypes"] if parse_dtype(d) in _NARROW]
    head = _("**Numerics against eager.** ")
    tail = _("Tolerances hold the kernel to float64, never to eager; PRECISION.md shows per dtype and output the "
             "kernel's error and eager's own error against float64 side by side, and how many elements differ from "
             "eager.")
    if not low:
        return (head + _("The kernel computes in float32 as eager PyTorch does in float32; results differ from "
                         "eager's only by the order of operations (a few ulps, most in reductions). ") + tail)
    dtypes = low[0] if len(low) == 1 else _("{first} and {second}").format(first=low[0], second=low[1])
    text = head + _("The kernel loads each input in its dtype, computes in float32 and rounds once per output, when "
                    "it stores it. Eager PyTorch in {dtypes} rounds each intermediate tensor to the dtype, so where it "
                    "does the kernel's results differ from eager's in many elements, by about one ulp of the dtype "
                    "(more where a result cancels towards zero), while lying closer to float64; where an eager op "
                    "computes in float32 itself and rounds once, the two can agree bit for bit. ").format(dtypes=dtypes)
    casts = _eager_casts(req, traced, parse_dtype(low[0]))
    if casts:
        up, down, kept = casts
        if kept:
            text += (_("The reference's one cast to a fixed narrow dtype (`.to(torch.bfloat16)` and the like) is a "
                       "rounding step in the kernel too. ") if kept == 1 else
                     _("The reference's {n} casts to a fixed narrow dtype (`.to(torch.bfloat16)` and the like) are "
                       "each a rounding step in the kernel too. ").format(n=kept))
        if down > kept:
            # traced in float32, `.to(x.dtype)` is a cast to float32: a no-op that leaves no node to lower
            back = down - kept
            text += (_("Its one cast back to the inputs' dtype between steps (`.to(x.dtype)` and the like) is a no-op "
                       "in the float32 trace the kernel is built from: eager rounds there, the kernel does not. ")
                     if back == 1 else
                     _("Its {n} casts back to the inputs' dtype between steps (`.to(x.dtype)` and the like) are each "
                       "a no-op in the float32 trace the kernel is built from: eager rounds there, the kernel does "
                       "not. ").format(n=back))
        if up:
            text += (_("Its one upcast to float32 (`.float()`) matches what the kernel does throughout. ") if up == 1
                     else _("Its {n} upcasts to float32 (`.float()`) match what the kernel does throughout. ").format(
                         n=up))
    return text + tail


def run(ws: Workspace, req: Request, state) -> StageOutcome:
    spec, traced = build_spec(req)
    write_json_atomic(ws.path("spec.json"), spec)
    write_text_atomic(ws.path("SPEC.md"), render_spec(req, spec, traced))
    return StageOutcome("completed", spec_summary(spec), artifacts=["SPEC.md", "spec.json"])
