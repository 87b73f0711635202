"""From a request to generated kernel source: trace, plan both passes, emit the impl module."""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from opforge.codegen.attention import regions_of
from opforge.codegen.emit import MAX_BLOCK_C, emit_module
from opforge.codegen.gemm import SAVED_LIBRARY, StagedPlan, has_products, operands, plan_staged
from opforge.codegen.ops import op_name
from opforge.codegen.plan import KernelPlan, Unsupported, plan_kernel
from opforge.codegen.rows import ChainPlan, RowPlan, plan_chain
from opforge.codegen.saved import (
    SavedStats,
    add_outputs,
    forward_attentions,
    forward_pool_indices,
    forward_products,
    forward_scans,
    forward_stats,
    read_instead,
)
from opforge.codegen.symbolic import (
    exact_groups,
    renamed,
    shape_env_of,
    shape_exprs,
    shape_of,
)
from opforge.codegen.trace import INDEX, TracedOp, symbol_map, trace_request
from opforge.request import INDEX_DTYPES, Request


@dataclass
class Build:
    traced: TracedOp
    forward: KernelPlan | RowPlan | ChainPlan
    backward: KernelPlan | RowPlan | ChainPlan | None
    dims: dict  # shape symbol -> Python expression reading it from an input
    saved: SavedStats | None = None  # per-row statistics the forward hands the backward (codegen/saved.py)


def graph_dims(gm, names: list[str]) -> dict:
    """Each size symbol of a graph -> Python source reading it off an input ('weight.shape[0]')."""
    dims = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for pname, node in zip(names, placeholders):
        for d, e in enumerate(shape_exprs(node.meta["val"])):
            if isinstance(e, sympy.Symbol) and e not in dims:
                dims[e] = f"{pname}.shape[{d}]"
    return dims


def _glue_dims(gm, names: list[str], outer: dict) -> dict:
    """graph_dims of a glue graph, and the pass's for any symbol its inputs' or outputs' shapes hold only inside
    an expression (a view (T, s46 // D, D) of a product: s46 is read off the pass's weight)."""
    dims = graph_dims(gm, names)
    out = gm.graph.find_nodes(op="output")[0].args[0]
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if hasattr(o, "meta")]
    for node in gm.graph.find_nodes(op="placeholder") + outs:
        for e in shape_exprs(node.meta["val"]):
            for s in sorted(getattr(e, "free_symbols", ()), key=str):
                if s not in dims and s in outer:
                    dims[s] = outer[s]
    return dims


def plan_pass(req: Request, name: str, gm, input_names: list[str], outputs: list[tuple[str, int]],
              like: dict, named: dict | None = None, outer: dict | None = None) -> KernelPlan | RowPlan | ChainPlan:
    """The flat kernel when every value is full-size or a scalar; otherwise the row kernel, or a chain of them
    when a value needs a finished column or full reduction for every row. `named` maps the graph's size
    symbols to the request's (read off `gm`'s inputs when not given: a glue graph's inputs are not the
    request's); `outer`, a glue graph's pass's dims."""
    if named is None:
        named = symbol_map(gm, req, products=True)
        named.update(grad_symbols(gm, req, input_names, named))
    if has_products(gm):  # matrix products: GEMM stages, the rest planned as glue by this function
        dims = graph_dims(gm, input_names)

        def glue(gname, sub, names, outs, glike):
            plan = plan_pass(req, gname, sub, names, outs, glike, named, dims)
            if not hasattr(plan, "dims"):  # a flat plan's launcher reads its sizes off its inputs
                plan.dims = _glue_dims(sub, names, dims)
            return plan
        plan = plan_staged(name, gm, input_names, outputs, like, glue)
        plan.dims = dims
        return plan
    try:
        return plan_kernel(name, gm, input_names, outputs, like)
    except Unsupported:
        dims = _glue_dims(gm, input_names, outer or {})
        names = {s: named.get(s, str(s)) for s in dims}
        plan = plan_chain(name, gm, input_names, outputs, like, names)
        for k in kernels_of(plan):
            k.dims = graph_dims(k.gm, k.input_names)
        plan.dims = dims
        return plan


def kernels_of(plan) -> list:
    """The kernels of one pass, in launch order."""
    return list(plan.kernels)


def device_events(plan, subs: dict, max_block_c: int = MAX_BLOCK_C) -> dict:
    """What one call of a pass launches on the device, as its launcher issues it by default (atomics, the
    default MAX_BLOCK_C), under `subs` (graph size symbol -> size): kernels (a row kernel with column sums has
    a second one that adds their partial rows) and memsets or fills (the zeroed ticket and accumulators of a
    kernel whose programs meet, a max or min accumulator's identity, the zeroed partial rows of rows too long
    for registers)."""
    if plan.layout == "staged":  # one kernel a GEMM or attention stage, and what each glue stage launches
        glue = [device_events(p, subs, max_block_c) for p in plan.glue]
        return {"kernels": len(plan.gemms) + sum(a.launches for a in plan.attentions) + sum(g["kernels"] for g in glue)
                + len(plan.copies) + len(plan.cats) + len(plan.libraries) + len(plan.pools),
                "memsets": sum(g["memsets"] for g in glue)}
    kernels = memsets = 0
    for k in kernels_of(plan):
        kernels += 1 + k.column_sums
        if k.meets_at_ticket:
            memsets += 1 + sum(r.kind in ("max", "min") for r in k.full_reductions)
        if k.column_sums:
            memsets += _size(k, k.n_cols, subs) > max_block_c
    return {"kernels": kernels, "memsets": memsets}


def plan_request(req: Request, traced: TracedOp | None = None) -> Build:
    traced = traced or trace_request(req)
    fwd = _plan_forward(req, traced, traced.forward)
    scans = forward_scans(traced.forward, traced.backward_graph, len(traced.input_names),
                          len(traced.output_names)) if traced.backward_graph is not None else []
    names = [f"saved_{f.name}" for _, f in scans]
    fwd_saving, bwd = _plan_saving(req, traced, scans, names) if scans else (None, None)  # saved always (saved.py)
    if fwd_saving is not None:
        fwd = fwd_saving
    elif traced.backward_graph is not None:  # nothing to save, or saving does not plan: the backward as traced
        bwd = _plan_backward(req, traced, traced.backward_graph)
    build = Build(traced, fwd, bwd, graph_dims(traced.forward, traced.kernel_inputs))
    if fwd_saving is not None:
        build.saved = SavedStats(names, 0, (0, 0), "scans")
    elif isinstance(fwd, RowPlan) and isinstance(bwd, RowPlan):
        _save_stats(req, build)
    if isinstance(fwd, StagedPlan) and isinstance(bwd, StagedPlan):
        _save_products(req, build)
    return build


def _plan_forward(req: Request, t: TracedOp, gm, saved: tuple[str, ...] | list[str] = ()):
    """The forward pass of `gm`: the op's outputs, then any statistics it saves for the backward."""
    names = t.output_names + list(saved)
    like = {o: t.kernel_names.get(i, i) for o, i in t.output_like.items()}
    # a saved value is float32, or int64 where the graph's is (a max pooling's indices)
    results = list(gm.graph.find_nodes(op="output")[0].args[0])[len(t.output_names):]
    kept = {n: INDEX if getattr(getattr(r, "meta", {}).get("val"), "dtype", None) == torch.int64 else None
            for n, r in zip(saved, results)}
    return plan_pass(req, "forward", gm, t.kernel_inputs, [(n, i) for i, n in enumerate(names)], {**like, **kept})


def _plan_backward(req: Request, t: TracedOp, gm, saved: tuple[str, ...] | list[str] = ()):
    """The backward pass of the joint graph `gm`: inputs, upstream gradients, then any saved statistics."""
    n_out = len(t.output_names)
    grad_names = [f"grad_{g}" for g in t.kernel_grad_inputs]
    return plan_pass(req, "backward", gm, t.kernel_inputs + [f"grad_{o}" for o in t.grad_outputs] + list(saved),
                     [(g, n_out + k) for k, g in enumerate(grad_names)], {g: g[len("grad_"):] for g in grad_names})


def _plan_saving(req: Request, t: TracedOp, pairs: list, names: list[str]) -> tuple:
    """The pair planned again with each forward value of `pairs` (backward node, forward node) an extra output
    of the forward and an input of the backward; (None, None) when that does not plan."""
    try:
        return (_plan_forward(req, t, add_outputs(t.forward, [f for _, f in pairs]), names),
                _plan_backward(req, t, read_instead(t.backward_graph, [b for b, _ in pairs], names), names))
    except Unsupported:
        return None, None


def _save_stats(req: Request, build: Build) -> None:
    """Plan the pair again with the forward's per-row statistics handed to the backward, and keep that when it
    moves fewer bytes at the request's first P0 shape (codegen/saved.py)."""
    t, fwd, bwd = build.traced, build.forward, build.backward
    stats = forward_stats(fwd, bwd, t.forward, t.backward_graph, len(t.input_names))
    if not stats:
        return
    names = [f"saved_{f.name}" for _, f in stats]
    fwd2, bwd2 = _plan_saving(req, t, stats, names)
    if not (isinstance(fwd2, RowPlan) and isinstance(bwd2, RowPlan)):
        return
    binding = req.p0[0]
    subs = graph_binding(t.backward_graph, req, binding)
    n_rows, n_cols = (_size(bwd, e, subs) for e in (bwd.n_rows, bwd.n_cols))
    eb = 4 if "float32" in req.dtypes[:1] else 2
    per_walk = sum(n_rows * n_cols * eb for a in bwd.inputs if a.full)
    looped = n_cols > MAX_BLOCK_C
    gain = (bwd.walks - bwd2.walks) * per_walk * looped - 2 * 4 * n_rows * len(stats)
    build.saved = SavedStats(names, gain, (bwd.walks, bwd2.walks))
    if gain > 0:
        build.forward, build.backward = fwd2, bwd2


def _save_products(req: Request, build: Build) -> None:
    """Plan the pair again with the forward's matrix products handed to the backward (codegen/saved.py)."""
    t = build.traced
    regions = regions_of(t.forward)
    inside = {n.name for r in regions for n in r.nodes}  # a product inside an attention kernel is never in memory
    products = [(b, f) for b, f in forward_products(t.forward, t.backward_graph, len(t.input_names),
                                                    len(t.output_names))
                if f.name not in inside]
    attentions = forward_attentions(t.forward, regions, t.backward_graph, len(t.input_names), len(t.output_names))
    pools = forward_pool_indices(t.forward, t.backward_graph, len(t.input_names), len(t.output_names))
    pairs = products + [(b, f) for b, f, _ in attentions] + pools
    if not pairs:
        return
    names = [f"saved_{f.name}" if isinstance(f, torch.fx.Node) else f"saved_{f[0].name}_indices" for _, f in pairs]
    fwd2, bwd2 = _plan_saving(req, t, pairs, names)
    if fwd2 is None:
        return
    numel = numel_of(t.forward, req, req.p0[0])
    eb = 4 if "float32" in req.dtypes[:1] else 2
    moved = flops = 0
    subs = graph_binding(t.forward, req, req.p0[0])
    for _, _, region in attentions:  # Q, K and V read again, the attention kernel run again
        moved += sum(numel(x) * (eb if x.op == "placeholder" else 4) for x in (region.q, region.k, region.v))
    saved = set(fwd2.results[len(t.output_names):])
    flops += sum(st.flops(lambda shape: shape_numel(shape, subs)) for st in fwd2.attentions if st.node in saved)
    for _, f in products:  # what recomputing would read (an input in the op's dtype, a value between stages float32)
        a, b = operands(f)
        moved += sum(numel(x) * (eb if x.op == "placeholder" else 4) for x in (a, b))
        if op_name(f.target) in SAVED_LIBRARY:  # a weight row per output element (input, if transposed)
            flops += 2 * numel(a if f.args[6] else f) * shape_numel(shape_exprs(b.meta["val"])[1:], subs)
        else:
            flops += 2 * numel(f) * shape_numel(shape_exprs(a.meta["val"])[-1:], subs)
    for _, (f, _) in pools:  # the pooled input read again
        moved += numel(f.args[0]) * (eb if f.args[0].op == "placeholder" else 4)
    build.saved = SavedStats(names, moved, (0, 0), "products", flops)
    build.forward, build.backward = fwd2, bwd2


def _size(plan: RowPlan, expr: str, subs: dict) -> int:
    names = {v: sym for sym, v in plan.symbols.items() if isinstance(v, str)}
    try:
        return int(sympy.sympify(expr, locals=names).subs(subs))
    except (TypeError, ValueError, sympy.SympifyError):
        return 0


def generate_impl(req: Request, build: Build) -> str:
    t = build.traced
    fixed = {a.name: a.default for a in req.attributes if a.type != "float" or a.default is None}
    return emit_module(req.name, req.description, build.forward, build.backward, inputs=t.kernel_inputs,
                       public_inputs=t.input_names, grad_inputs=t.kernel_grad_inputs, output_names=t.output_names,
                       runtime_attrs=t.runtime_attrs,
                       attr_defaults=req.attr_defaults, fixed_attrs=fixed, dims=build.dims,
                       input_shapes={s.name: tuple(s.shape) for s in req.inputs}, deterministic=req.deterministic,
                       leading=t.leading,
                       size_names=symbol_map(t.forward, req, products=True),
                       no_grad_inputs=tuple(s.name for s in req.inputs
                                            if not s.requires_grad and s.dtypes[0] not in INDEX_DTYPES))


def grad_symbols(gm, req: Request, input_names: list[str], named: dict) -> dict:
    """In a joint graph, the size symbols an output's gradient was traced with -> that output's sizes in the
    request's symbols (`named`): a gradient of shape [N, G, 64] gets a symbol of its own for the 64, which the
    backward would otherwise read off the gradient and tie the weight's columns to (G*s31, not 64*G). Its
    inputs follow the request's: grad_<output> in the outputs' order, the first outputs of the graph."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    results = list(gm.graph.find_nodes(op="output")[0].args[0])
    out = {}
    for k, (pname, node) in enumerate(zip(input_names[len(req.inputs):], placeholders[len(req.inputs):])):
        if not pname.startswith("grad_") or k >= len(results) or not hasattr(results[k], "meta"):
            break
        for g, o in zip(shape_exprs(node.meta["val"]), shape_exprs(results[k].meta["val"])):
            if isinstance(g, sympy.Symbol) and g not in named and g not in out:
                size = exact_groups(renamed(o, named))
                if {str(x) for x in size.free_symbols} <= set(req.symbols):
                    out[g] = str(size) if size.is_Symbol else size
    return out


def graph_binding(gm, req: Request, binding: dict) -> dict:
    """Graph size symbols -> sizes, read off the inputs' shapes under a binding of the request's symbols."""
    out = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for spec, node in zip(req.inputs, placeholders):
        for size, e in zip(req.input_shape(spec, binding), shape_exprs(node.meta["val"])):
            if isinstance(e, sympy.Symbol):
                out[e] = size
    for spec, node in zip(req.inputs, placeholders):  # a size traced as a product (w: [E, s23*s7]) names s23
        for size, e in zip(req.input_shape(spec, binding), shape_exprs(node.meta["val"])):
            expr = sympy.sympify(sympy.sympify(e).xreplace(out))
            free = expr.free_symbols
            if len(free) == 1:
                roots = [r for r in sympy.solve(expr - size, *free) if r.is_Integer]
                if len(roots) == 1:
                    out[free.pop()] = int(roots[0])
    # an output's gradient in a joint graph has symbols of its own: its sizes are the output's
    results = list(gm.graph.find_nodes(op="output")[0].args[0])
    for node, res in zip(placeholders[len(req.inputs):], results):
        if not hasattr(res, "meta") or "val" not in res.meta:
            break
        for g, o in zip(shape_exprs(node.meta["val"]), shape_exprs(res.meta["val"])):
            size = sympy.sympify(sympy.sympify(o).xreplace(out))
            if isinstance(g, sympy.Symbol) and g not in out and size.is_Integer:
                out[g] = int(size)
    return out


def numel_of(gm, req: Request, binding: dict):
    """A function node -> element count under a shape binding of the request's symbols."""
    env = shape_env_of(gm)
    subs = graph_binding(gm, req, binding)
    return lambda node: shape_numel(shape_of(node, env), subs)


def shape_numel(shape, subs: dict) -> int:
    """Elements of a shape of graph expressions, under sizes for the graph's symbols (`graph_binding`)."""
    n = 1
    for d in shape:
        n *= int(sympy.sympify(d).xreplace(subs))
    return n
