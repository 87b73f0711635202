"""Fusion planning: from an ATen graph to the statements of one flat Triton kernel.

The flat kernel walks the operator's largest tensor as a 1-D range of `n_elements` in blocks. Every value is
either *full* (one element per position of that range) or *scalar* (one element for the whole tensor,
e.g. a (1, 1) scale). Pointwise work on full and scalar values fuses into the block body; a full
reduction (sum/mean/max/min over every element) is reduced inside the block and then across blocks, and
the scalar work that follows it runs once, in the last program to finish (the epilogue). A full value
that needs a finished reduction would need a second pass over the data; this planner refuses it by name.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import sympy
import torch

from opforge.codegen.ops import (
    COLUMN,
    CONSTANT,
    INDEX_KINDS,
    OP_TABLE,
    REDUCE_IDENTITY,
    REDUCE_KIND,
    REDUCTION,
    SCAN,
    SHIFT,
    SYMBOLIC,
    VIEW,
    block_reduce,
    ieee_nodes,
    is_mask,
    op_name,
    upstream,
)
from opforge.codegen.symbolic import hint, shape_env_of, shape_exprs
from opforge.codegen.trace import INDEX, AttrRef


class Unsupported(Exception):
    """The graph holds ops or patterns the deterministic engine cannot lower; `ops` names them."""

    def __init__(self, ops: list[str], why: str):
        self.ops = ops
        self.why = why
        super().__init__(f"{why}: {', '.join(ops)}" if ops else why)


class PlanOfParts:
    """The PassPlan answers of a plan made of parts (`_parts`: its kernels or sub-plans): any part's."""

    def _parts(self) -> list: ...

    @property
    def reduce_kinds(self) -> list[str]:
        return sorted({x for p in self._parts() for x in p.reduce_kinds})

    @property
    def reduces_across_programs(self) -> bool:
        return any(p.reduces_across_programs for p in self._parts())

    @property
    def meets_at_ticket(self) -> bool:
        return any(p.meets_at_ticket for p in self._parts())

    @property
    def column_sums(self) -> bool:
        return any(p.column_sums for p in self._parts())

    @property
    def splits_rows(self) -> bool:
        return any(p.splits_rows for p in self._parts())


@dataclass
class Stmt:
    target: str
    expr: str
    comment: str
    block: bool = True  # reads the block's elements (False: a scalar, the same in every block)


@dataclass
class Reduction:
    name: str  # variable holding the finished value in the epilogue
    kind: str  # sum | mean | max | min
    source: str  # full value reduced
    slot: int


@dataclass
class TensorArg:
    name: str  # kernel parameter is f"{name}_ptr"
    full: bool
    placeholder: int  # position in the graph's placeholders
    boolean: bool = False  # a mask (a comparison handed over from another kernel): loaded as a condition


@dataclass
class OutArg:
    name: str
    value: str
    full: bool
    in_epilogue: bool
    shape: list  # sympy exprs or ints
    like: str | None  # input whose dtype the output takes, or INDEX for indices
    exact: bool  # bit-exact against the float32 golden
    block: bool  # the register value is a block (False: a scalar broadcast at the store)
    store: str = "full"  # row kernels: full | row | col | scalar

    @property
    def dtype(self) -> str:
        """The output's dtype, as launcher source."""
        return dtype_source(self.like)


def dtype_source(like: str | None) -> str:
    """Launcher source for the dtype of an output that follows input `like`: float32 when None, int64 indices."""
    return "torch.float32" if like is None else like if like == INDEX else f"{like}.dtype"


class PassPlan(Protocol):
    """What every plan of a pass answers: the flat kernel (KernelPlan, below), the row kernel and the chain of
    row kernels (codegen/rows.py). Emitters, the cost model and the reports read these, never the class."""

    name: str
    layout: str  # "flat": one range of elements; "rows": rows of columns
    chained: bool  # several kernels, each handing finished reductions to the next
    why: list[str]  # what made a chain
    walks: int  # walks over a row too long for one chunk, all kernels together

    @property
    def kernels(self) -> list: ...  # in launch order; a one-kernel plan is [itself]

    @property
    def reduce_kinds(self) -> list[str]: ...  # kinds of its full reductions

    @property
    def reduces_across_programs(self) -> bool: ...  # programs combine results: column or full reductions

    @property
    def meets_at_ticket(self) -> bool: ...  # full reductions, finished by the last program

    @property
    def column_sums(self) -> bool: ...  # column reductions, added up by a second kernel

    @property
    def splits_rows(self) -> bool: ...  # a row kernel whose rows several programs may share (ROW_SPLIT)


@dataclass
class KernelPlan:
    name: str
    inputs: list[TensorArg]
    outputs: list[OutArg]
    attrs: list[str]
    body: list[Stmt]
    reductions: list[Reduction]
    epilogue: list[Stmt]
    op_counts: Counter = field(default_factory=Counter)

    @property
    def reduce_kinds(self) -> list[str]:
        return sorted({"sum" if r.kind == "mean" else r.kind for r in self.reductions})

    @property
    def reduces_across_programs(self) -> bool:
        return bool(self.reductions)

    @property
    def meets_at_ticket(self) -> bool:
        return bool(self.reductions)

    @property
    def kernels(self) -> list[KernelPlan]:
        return [self]

    @property
    def full_reductions(self) -> list[Reduction]:
        return self.reductions

    layout = "flat"
    chained = False
    column_sums = False
    splits_rows = False
    walks = 1  # a flat kernel reads each element once
    why = ()  # one kernel: nothing to explain


def _numel(val) -> sympy.Expr:
    n = sympy.Integer(1)
    for d in val.shape:
        n = n * (d.node.expr if isinstance(d, torch.SymInt) else sympy.Integer(int(d)))
    return _simplified(n)


@functools.lru_cache(maxsize=4096)
def _simplified(expr: sympy.Expr) -> sympy.Expr:
    """sympy.simplify, once per expression: a graph's kernels ask it of the same few sizes again and again."""
    return sympy.simplify(expr)


def _literal(v) -> str | None:
    if v is None:  # an absent optional argument (clamp's min) stays absent
        return None
    if isinstance(v, AttrRef):
        return v.name
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        if v != v:
            return "float('nan')"
        if v in (float("inf"), float("-inf")):
            return "float('inf')" if v > 0 else "-float('inf')"
        return repr(v)
    if isinstance(v, int):
        return f"{v}.0"
    return repr(v)


def check_output(oname: str, node) -> None:
    """An output must be computed from the inputs: a constant cannot be a kernel's output. An input returned as
    it is (a sum's gradient is the upstream gradient) is loaded and stored: a copy, never an alias."""
    if not isinstance(node, torch.fx.Node):
        raise Unsupported([], f"output {oname} is a constant, not computed from the inputs")


def unsupported_ops(graph: torch.fx.Graph) -> list[str]:
    """Ops of `graph` no planner lowers. Matrix products, the views around them that the staged planner
    takes as strides, and the position masks an attention kernel computes count as lowered where the graph has
    a product (codegen/gemm.py, codegen/attention.py); one outside a recognised place is refused by name when
    its glue is planned."""
    from opforge.codegen.attention import IN_ATTENTION
    from opforge.codegen.gemm import HOST_VIEWS, STAGES

    # an attention traced as one op returns its values as a tuple, read with getitem
    staged = STAGES | HOST_VIEWS | IN_ATTENTION | {"operator.getitem"} if any(
        n.op == "call_function" and op_name(n.target) in STAGES for n in graph.nodes) else set()
    names = []
    for n in graph.nodes:
        name = op_name(n.target) if n.op == "call_function" else None
        if name and name not in OP_TABLE and name not in staged and name not in names:
            names.append(name)
    return names


def plan_kernel(name: str, gm: torch.fx.GraphModule, input_names: list[str], outputs: list[tuple[str, int]],
                output_like: dict[str, str | None]) -> KernelPlan:
    """Plan the kernel computing `outputs` (name, index into the graph's output tuple) of `gm`.

    Placeholders are matched to `input_names` by position (inputs first, then upstream gradients).
    """
    graph = gm.graph
    bad = unsupported_ops(graph)
    if bad:
        raise Unsupported(bad, "no Triton lowering for")
    shaped = [op_name(n.target) for n in graph.nodes
              if n.op == "call_function" and OP_TABLE[op_name(n.target)].kind in (SHIFT, SYMBOLIC, COLUMN, SCAN)]
    if shaped:
        raise Unsupported(shaped[:1], "the flat kernel has no column index (slices, sizes, scans): the row kernel")
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in graph.nodes if n.op == "output")
    results = out_node.args[0] if isinstance(out_node.args[0], (tuple, list)) else (out_node.args[0],)
    wanted = [results[i] for _, i in outputs]

    numels = {p: _numel(p.meta["val"]) for p in placeholders}
    env = shape_env_of(gm)
    domain = max(numels.values(), key=lambda e: hint(e, env) or 0)  # the sizes it was traced at

    def is_full(node) -> bool:
        n = _numel(node.meta["val"])
        if n == domain:
            return True
        if n == 1:
            return False
        if _simplified(n - domain) == 0:
            return True
        raise Unsupported([op_name(node.target) if node.op == "call_function" else node.name],
                          f"value {node.name} of shape {list(node.meta['val'].shape)} is neither the full "
                          f"tensor nor a scalar (row/column broadcasts need the row kernel)")

    needed = upstream(wanted)  # the nodes the wanted outputs depend on

    held = ieee_nodes(graph, wanted)
    var: dict = {}  # node -> variable name (views alias their source)
    full: dict = {}  # node -> whether the register value is a block (True) or a scalar
    after_reduce: dict = {}  # node -> depends on a finished reduction
    exact: dict = {}
    body, epilogue, reductions = [], [], []
    attrs: list[str] = []
    inputs: list[TensorArg] = []
    counts: Counter = Counter()
    seen_body: dict[str, str] = {}
    seen_epi: dict[str, str] = {}

    def render(a):
        if isinstance(a, torch.fx.Node):
            return var[a]
        if isinstance(a, AttrRef) and a.name not in attrs:
            attrs.append(a.name)
        if isinstance(a, (list, tuple)):
            return a
        return _literal(a)

    for node in graph.nodes:
        if node not in needed:
            continue
        if node.op == "placeholder":
            i = placeholders.index(node)
            pname = input_names[i]
            f = is_full(node)
            inputs.append(TensorArg(pname, f, i, is_mask(node)))
            var[node], full[node], after_reduce[node], exact[node] = pname, f, False, True
            continue
        if node.op != "call_function":
            continue
        key = op_name(node.target)
        rule = OP_TABLE[key]
        counts[key] += 1
        srcs = node.all_input_nodes
        dep_red = any(after_reduce[s] for s in srcs)
        exact[node] = rule.exact and all(exact[s] for s in srcs)
        if rule.kind == VIEW:
            src = node.args[0]
            var[node], full[node], after_reduce[node] = var[src], full[src], after_reduce[src]
            continue
        target = node.name
        if rule.kind == REDUCTION:
            src = node.args[0]
            if is_full(node) or not is_full(src):
                raise Unsupported([key], f"{node.name} reduces only some dimensions (row reductions need the "
                                         "row kernel)")
            if after_reduce[src]:
                raise Unsupported([key], f"{node.name} reduces a value that itself needs a finished reduction "
                                         "(two passes over the data)")
            kind = REDUCE_KIND[key]
            if kind in INDEX_KINDS:
                raise Unsupported([key], f"{node.name}: indices are found along the rows only (the row kernel)")
            slot = len(reductions)
            part = f"{target}_part"
            body.append(Stmt(part, block_reduce(kind, f"tl.where(mask, {var[src]}, {REDUCE_IDENTITY[kind]})"),
                             f"{key}: this block's share"))
            reductions.append(Reduction(target, kind, var[src], slot))
            var[node], full[node], after_reduce[node] = target, False, True
            continue
        args = [render(a) for a in node.args]
        kwargs = {k: render(v) for k, v in node.kwargs.items() if k not in ("pin_memory", "layout", "device",
                                                                          "memory_format")}
        if key == "aten._to_copy.default":
            kwargs["dtype"] = str(node.kwargs.get("dtype"))
        elif rule.kind == CONSTANT:
            kwargs.pop("dtype", None)  # compute is float32 whatever dtype the constant was made in
        expr = rule.emit(*args, **kwargs, ieee=node in held)
        node_full = is_full(node)
        block = rule.kind != CONSTANT and any(full[s] for s in srcs)
        if expr.isidentifier():  # x ** 1: the operand itself
            var[node], full[node], after_reduce[node] = expr, block, dep_red
            continue
        if dep_red and node_full:
            raise Unsupported([key], f"{node.name} is a full-size value that needs a finished reduction "
                                     "(a second pass over the data)")
        # common subexpressions: the joint graph recomputes forward values (e.g. weight / scale twice)
        seen = seen_epi if dep_red else seen_body
        if expr in seen or (dep_red and expr in seen_body):
            var[node] = seen.get(expr) or seen_body[expr]
            full[node], after_reduce[node] = block, dep_red
            continue
        seen[expr] = target
        (epilogue if dep_red else body).append(Stmt(target, expr, key, block))
        var[node], full[node], after_reduce[node] = target, block, dep_red

    outs: list[OutArg] = []
    for (oname, _), node in zip(outputs, wanted):
        check_output(oname, node)
        o_full = is_full(node)
        if after_reduce[node] and o_full:
            raise Unsupported([], f"output {oname} is full-size but needs a finished reduction")
        outs.append(OutArg(oname, var[node], o_full, after_reduce[node], shape_exprs(node.meta["val"]),
                           output_like.get(oname), exact[node], full[node]))
    return KernelPlan(name, inputs, outs, attrs, body, reductions, epilogue, counts)
