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
    for g in spec["grad_inputs"]:
        lines.append(f"| → grad_{g} | like {g} | like {g} | | |")
    lines += ["", output_count_line(spec)]
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
              f"- Everything else, compared with float64 truth within the dtype tolerance above: "
              f"{', '.join(_other_outputs(spec)) or 'none'}.", "",
              numerics_vs_eager(req, spec, traced), "",
              "## Boundary handling", "",
              *boundary_lines(req, spec, traced), "",
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
    text = f"{_count(len(fwd) + len(grads), 'output')}: {_count(len(fwd), 'forward output')} ({', '.join(fwd)})"
    if grads:
        text += f" and {_count(len(grads), 'gradient')} ({', '.join(grads)})"
    return text + "."


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
    empty = "- Zero elements: outputs are empty"
    if "sum" in ops:
        empty += "; a sum over no elements is 0, its identity"
    if ops & {"amax", "amin"}:
        empty += ("; a max or min over no elements is undefined: the reference raises there, and the tests skip "
                  "such a case")
    lines = [empty + ".", "- Shapes are run-time arguments: any size, including sizes that are not block multiples.",
             _leading_line(req, spec)]
    if ops & set(_CLAMPS):
        lines.append("- Values beyond a clamp saturate at its bounds, as `torch.clamp`.")
    if "round" in ops:
        lines.append("- Exact .5 ties round to even, as `torch.round`.")
    lines.append("- NaN and ±Inf propagate as they do through the reference, position by position.")
    for name in _floored_scalars(req, traced):
        lines.append(f"- A `{name}` below its floor takes the floor, as the reference does (a per-tensor scalar; "
                     f"tested with {name} = 1e-6).")
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
    return StageOutcome("completed", spec_summary(spec), artifacts=["SPEC.md", "spec.json"])
