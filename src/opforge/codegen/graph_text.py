"""Traced graphs as text for people: formulas, an ASCII dataflow, and per-output traits."""

from __future__ import annotations

import torch

from opforge.codegen.ops import INDEX_KINDS, OP_TABLE, REDUCE_KIND, REDUCTION, SCAN, VIEW, op_name
from opforge.codegen.symbolic import hint, product, pysrc, shape_env_of, shape_of
from opforge.codegen.trace import AttrRef

_MATH = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}", "neg": "-{0}",
    "gt": "{0} > {1}", "ge": "{0} >= {1}", "lt": "{0} < {1}", "le": "{0} <= {1}", "eq": "{0} == {1}",
    "ne": "{0} != {1}", "where": "where({0}, {1}, {2})", "clamp": "clamp({0}, {1}, {2})",
    "round": "round_half_even({0})", "logical_and": "{0} & {1}", "logical_and_": "{0} & {1}",
    "logical_or": "{0} | {1}", "full_like": "{1}", "scalar_tensor": "{0}", "sum": "sum({0})",
    "mean": "mean({0})", "amax": "max({0})", "amin": "min({0})", "exp": "exp({0})", "log": "log({0})",
    "sqrt": "sqrt({0})", "rsqrt": "rsqrt({0})", "abs": "|{0}|", "pow": "{0} ** {1}",
}


def _arg(a, names) -> str:
    if isinstance(a, torch.fx.Node):
        return names.get(a, a.name)
    if isinstance(a, AttrRef):
        return a.name
    if isinstance(a, float):
        return f"{a:g}"
    return str(a)


def _shape(node, sym_names: dict | None = None) -> str:
    val = node.meta.get("val")
    if val is None or not hasattr(val, "shape"):
        return ""
    names = {str(k): v for k, v in (sym_names or {}).items()}
    return "(" + ", ".join(names.get(str(d), str(d)) for d in val.shape) + ")"


def readable_names(gm: torch.fx.GraphModule, input_names: list[str]) -> dict:
    """Placeholders get the request's input names; views take their source's name."""
    names = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, name in zip(placeholders, input_names):
        names[n] = name
    for n in gm.graph.nodes:
        if n.op == "call_function" and OP_TABLE.get(op_name(n.target)) and \
                OP_TABLE[op_name(n.target)].kind == VIEW:
            names[n] = names.get(n.args[0], n.args[0].name)
    return names


def formula_lines(gm: torch.fx.GraphModule, input_names: list[str], output_names: list[str]) -> list[str]:
    names = readable_names(gm, input_names)
    lines = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n in names:
            continue
        base = op_name(n.target).split(".")[1]
        args = [_arg(a, names) for a in n.args]
        template = _MATH.get(base)
        try:
            expr = template.format(*args) if template else f"{base}({', '.join(args)})"
        except IndexError:
            expr = f"{base}({', '.join(args)})"
        lines.append(f"{n.name} = {expr}")
    out = next(n for n in gm.graph.nodes if n.op == "output")
    results = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    for name, r in zip(output_names, results):
        lines.append(f"{name} = {_arg(r, names)}")
    return lines


def dataflow_ascii(gm: torch.fx.GraphModule, input_names: list[str], output_names: list[str],
                   sym_names: dict | None = None) -> str:
    """One line per value in graph order: inputs (○), computed (▸), reduced (Σ), outputs (◆)."""
    names = readable_names(gm, input_names)
    rows = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            rows.append(("in", names[n], "input", _shape(n, sym_names)))
        elif n.op == "call_function" and n not in names:
            base = op_name(n.target).split(".")[1]
            reads = ", ".join(_arg(a, names) for a in n.args if not isinstance(a, (list, tuple)))
            kind = "Σ" if OP_TABLE.get(op_name(n.target)) and OP_TABLE[op_name(n.target)].kind == REDUCTION \
                else "▸"
            rows.append((kind, n.name, f"{base}({reads})", _shape(n, sym_names)))
    out = next(n for n in gm.graph.nodes if n.op == "output")
    results = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    for name, r in zip(output_names, results):
        rows.append(("out", name, f"= {_arg(r, names)}", _shape(r, sym_names) if isinstance(r, torch.fx.Node) else ""))
    w_name = max(len(r[1]) for r in rows)
    w_expr = max(len(r[2]) for r in rows)
    lines = []
    for i, (kind, name, expr, shape) in enumerate(rows):
        rail = "┌─" if i == 0 else ("└─" if i == len(rows) - 1 else "├─")
        mark = {"in": "○", "Σ": "Σ", "▸": "▸", "out": "◆"}[kind]
        lines.append(f"{rail}{mark} {name:<{w_name}} {expr:<{w_expr}}  {shape}".rstrip())
    return "\n".join(lines)


def output_traits(gm: torch.fx.GraphModule, indices: list[int], sym_names: dict | None = None) -> list[dict]:
    """For each wanted output: exact (only exact ops, no reduction), reduced (a reduction or scan upstream) and
    reduced_extent, the most elements any upstream reduction sums, as Python over the request's symbols
    (the K of the √K tolerance: a row's length for a norm, every element for a loss)."""
    env = shape_env_of(gm)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    results = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    memo: dict = {}

    def extent(n):
        shape = shape_of(n.args[0], env)
        dims = n.args[1] if len(n.args) > 1 and n.args[1] not in (None, []) else range(len(shape))
        dims = [dims] if isinstance(dims, int) else dims
        return product([shape[d % len(shape)] for d in dims]) if shape else product([])

    def walk(n):
        if n in memo:
            return memo[n]
        exact, extents = True, []
        if n.op == "call_function":
            rule = OP_TABLE.get(op_name(n.target))
            index = REDUCE_KIND.get(op_name(n.target)) in INDEX_KINDS  # argmax: exact where its values are
            exact = bool(rule and rule.exact and (rule.kind != REDUCTION or index))
            if rule and rule.kind in (REDUCTION, SCAN) and not index:  # a scan's last element sums its dimension
                extents.append(extent(n))
        for a in n.all_input_nodes:
            e, ext = walk(a)
            exact = exact and e
            extents += [x for x in ext if all(x != y for y in extents)]
        memo[n] = (exact, extents)
        return memo[n]

    traits = []
    for i in indices:
        e, extents = walk(results[i])
        k = max(extents, key=lambda x: _hint(x, env)) if extents else None
        traits.append({"exact": e and not extents, "reduced": bool(extents),
                       "reduced_extent": pysrc(k, sym_names or {}) if k is not None else None})
    return traits


def _hint(expr, env) -> int:
    return hint(expr, env) or 0

