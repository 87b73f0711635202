"""From a request to generated kernel source: trace, plan both passes, emit the impl module."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from opforge.codegen.emit import emit_module
from opforge.codegen.plan import KernelPlan, Unsupported, plan_kernel, shape_exprs
from opforge.codegen.rows import ChainPlan, RowPlan, plan_chain
from opforge.codegen.symbolic import shape_env_of, shape_of
from opforge.codegen.trace import TracedOp, trace_request
from opforge.request import INDEX_DTYPES, Request


@dataclass
class Build:
    traced: TracedOp
    forward: KernelPlan | RowPlan | ChainPlan
    backward: KernelPlan | RowPlan | ChainPlan | None
    dims: dict  # shape symbol -> Python expression reading it from an input


def graph_dims(gm, names: list[str]) -> dict:
    """Each size symbol of a graph -> Python source reading it off an input ('weight.shape[0]')."""
    dims = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for pname, node in zip(names, placeholders):
        for d, e in enumerate(shape_exprs(node.meta["val"])):
            if isinstance(e, sympy.Symbol) and e not in dims:
                dims[e] = f"{pname}.shape[{d}]"
    return dims


def plan_pass(req: Request, name: str, gm, input_names: list[str], outputs: list[tuple[str, int]],
              like: dict) -> KernelPlan | RowPlan | ChainPlan:
    """The flat kernel when every value is full-size or a scalar; otherwise the row kernel, or a chain of them
    when a value needs a finished column or full reduction for every row."""
    try:
        return plan_kernel(name, gm, input_names, outputs, like)
    except Unsupported:
        dims = graph_dims(gm, input_names)
        named = symbol_map(gm, req, products=True)
        names = {s: named.get(s, str(s)) for s in dims}
        plan = plan_chain(name, gm, input_names, outputs, like, names)
        for k in kernels_of(plan):
            k.dims = graph_dims(k.gm, k.input_names)
        plan.dims = dims
        return plan


def kernels_of(plan) -> list:
    """The kernels of one pass, in launch order."""
    return list(getattr(plan, "kernels", [plan]))


def plan_request(req: Request, traced: TracedOp | None = None) -> Build:
    traced = traced or trace_request(req)
    fwd = plan_pass(req, "forward", traced.forward, traced.input_names,
                    [(n, i) for i, n in enumerate(traced.output_names)], traced.output_like)
    bwd = None
    if traced.joint is not None:
        n_out = len(traced.output_names)
        grad_names = [f"grad_{g}" for g in traced.grad_inputs]
        like = {g: g[len("grad_"):] for g in grad_names}
        bwd = plan_pass(req, "backward", traced.joint, traced.input_names + [f"grad_{o}" for o in traced.output_names],
                        [(g, n_out + k) for k, g in enumerate(grad_names)], like)
    return Build(traced, fwd, bwd, graph_dims(traced.forward, traced.input_names))


def generate_impl(req: Request, build: Build) -> str:
    t = build.traced
    fixed = {a.name: a.default for a in req.attributes if a.type != "float"}
    return emit_module(req.name, req.description, build.forward, build.backward, inputs=t.input_names,
                       grad_inputs=t.grad_inputs, output_names=t.output_names, runtime_attrs=t.runtime_attrs,
                       attr_defaults=req.attr_defaults, fixed_attrs=fixed, dims=build.dims,
                       input_shapes={s.name: tuple(s.shape) for s in req.inputs}, deterministic=req.deterministic,
                       no_grad_inputs=tuple(s.name for s in req.inputs
                                            if not s.requires_grad and s.dtypes[0] not in INDEX_DTYPES))


def symbol_map(gm, req: Request, products: bool = False) -> dict:
    """Graph shape symbols -> the request's shape symbols, read off the placeholders. With `products`, a
    dimension declared as 'G*32' maps to the expression 32*G."""
    out = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for spec, node in zip(req.inputs, placeholders):
        for d, e in zip(spec.shape, shape_exprs(node.meta["val"])):
            if isinstance(e, sympy.Symbol) and isinstance(d, str) and d.isidentifier():
                out[e] = d
            elif products and isinstance(e, sympy.Symbol) and isinstance(d, str) and e not in out:
                expr = sympy.Integer(1)
                for f in d.split("*"):
                    f = f.strip()
                    expr = expr * (int(f) if f.isdigit() else sympy.Symbol(f, integer=True, positive=True))
                out[e] = expr
    return out


def graph_binding(gm, req: Request, binding: dict) -> dict:
    """Graph size symbols -> sizes, read off the inputs' shapes under a binding of the request's symbols."""
    out = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for spec, node in zip(req.inputs, placeholders):
        for size, e in zip(req.input_shape(spec, binding), shape_exprs(node.meta["val"])):
            if isinstance(e, sympy.Symbol):
                out[e] = size
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
