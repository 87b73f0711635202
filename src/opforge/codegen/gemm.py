"""Passes with matrix products: the graph is cut at each `mm`, `addmm` and `bmm` into stages run in order.

A product is a tiled GEMM kernel (codegen/emit_gemm.py) that reads its operands through their strides, so the
transposes and reshapes around it (`t`, `transpose`, `permute`, `view`, `expand`, `detach`) are taken by the
launcher as torch views, never copied. The pointwise and reduction work between products is planned by the
existing planners (flat, row, chain) as glue stages; a glue stage that is pointwise and reads a product at the
product's own shape runs inside that product's kernel instead, on the tile still in registers (the epilogue),
so the product is never written to memory. Values handed between stages are float32 buffers, except where a
product is itself an output of the pass.

Stages follow the depth of products: glue that needs no product, then the products of depth 1 (operands from
inputs and that glue), then the glue that reads them, then the products of depth 2, and so on.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv

from opforge.codegen.attention import ATTENTION, AttentionStage, fuse_attention, side_kind
from opforge.codegen.attention_grad import ATTENTION_BACKWARD, ATTENTION_OP, AttentionBackwardStage, bias_sums
from opforge.codegen.decompose import sum_terms
from opforge.codegen.ops import OP_TABLE, POINTWISE, REDUCTION, SCAN, SHIFT, SYMBOLIC, VIEW, op_name
from opforge.codegen.plan import KernelPlan, OutArg, PlanOfParts, Unsupported
from opforge.codegen.pooling import POOLS, PoolStage, pool_stage
from opforge.codegen.symbolic import SYM_OPS, expr_of, hint, pysrc, same, shape_env_of

PRODUCTS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default"}
# what a stage of its own computes: a product, a recognised attention, an attention traced as one op with its
# backward (codegen/attention_grad.py)
# ops the vendor library computes through torch (cuDNN's convolutions, or the backend's own): one call in the
# launcher each, the glue around them fused as around a product
LIBRARY = {"aten.convolution.default", "aten.convolution_backward.default"}
# poolings and their backwards: a Triton kernel of their own each (codegen/pooling.py)
STAGES = PRODUCTS | LIBRARY | set(POOLS) | {ATTENTION, ATTENTION_OP, ATTENTION_BACKWARD}
SAVED_LIBRARY = {"aten.convolution.default"}  # forward values the backward reads instead of computing again
# views the launcher takes with torch when they lead only to products, outputs and other such views
HOST_VIEWS = {"aten.t.default", "aten.transpose.int", "aten.permute.default", "aten.view.default",
              "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default", "aten.detach.default",
              "aten.alias.default", "aten.clone.default", "aten.unsqueeze.default", "aten.squeeze.dim",
              "aten.squeeze.dims"}
# a slice is a launcher view (narrow) only where it leads to a stage, as the columns of an attention's Q, K, V
# in one projection do; a glue kernel reads other slices at a column offset
SLICES = {"aten.slice.Tensor"}
# a concatenation of values in memory (the gradients of Q, K and V sliced from one projection) is torch.cat in
# the launcher: one copy, where the glue's row kernels cannot read parts narrower than the result
HOST_CATS = {"aten.cat.default"}
IDENTITY_VIEWS = {"aten.detach.default", "aten.alias.default", "aten.clone.default"}  # the value itself
# the Tensor method the launcher takes each view with (an _unsafe_view follows a copy: reshape). A view is a
# reshape: a stage stores its outputs dense, where eager's strides followed the value's inputs (the gradient
# of a transposed product), so a view the trace took may need the copy that reshape makes
VIEW_METHODS = {"aten.t.default": "t", "aten.transpose.int": "transpose", "aten.permute.default": "permute",
                "aten.view.default": "reshape", "aten._unsafe_view.default": "reshape",
                "aten.reshape.default": "reshape",
                "aten.expand.default": "expand", "aten.unsqueeze.default": "unsqueeze", "aten.squeeze.dim": "squeeze",
                "aten.squeeze.dims": "squeeze", "aten.slice.Tensor": "narrow"}


def einsum_problem(equation: str) -> str | None:
    """Why an einsum is not one (batched) matrix product the GEMM stage computes, or None when it is: two
    operands, no index twice in one (a diagonal), none summed within one operand alone."""
    eq = equation.replace(" ", "").replace("...", "")
    ins, _, out = eq.partition("->")
    operands = ins.split(",")
    if len(operands) != 2:
        return f"multiplies {len(operands)} operands; one product of two is fused"
    for op in operands:
        twice = sorted({c for c in op if op.count(c) > 1})
        if twice:
            return f"repeats index {twice[0]} within an operand (a diagonal)"
    if not out and "->" not in eq:  # implicit output: the indices that occur once, in order
        out = "".join(sorted(c for c in ins if c.isalpha() and ins.count(c) == 1))
    for a, b in (operands, operands[::-1]):
        alone = sorted(c for c in a if c not in b and c not in out)
        if alone:
            return f"sums index {alone[0]} within one operand, outside the product"
    return None


def has_products(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and op_name(n.target) in STAGES for n in gm.graph.nodes)


ITEM_NAMES = {ATTENTION_BACKWARD: ("dq", "dk", "dv", "dsinks", "dbias"),
              "aten.convolution_backward.default": ("dinput", "dweight", "dbias")}


def _stage_item(n) -> bool:
    """One of the values of a stage that returns several (an attention backward's gradients): in memory once the
    stage ran."""
    return n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node) \
        and op_name(n.args[0].target) in STAGES


@dataclass
class Prologue:
    """Pointwise work whose only reader is one operand of a product (a weight's dequantization): it runs on each
    K step's operand tile as the tile is loaded, so the operand is never in memory."""

    plan: KernelPlan  # flat and pointwise, on the value before its views
    loads: list[str]  # inputs read as tiles: broadcast to the value's shape, then taken through `views`
    scalars: list[str]  # one-value inputs
    views: list[tuple[str, tuple]]  # (Tensor method, arguments as source) from the value to the operand
    # A 3-D value whose dimensions (i, i+1) a view merges into one of the operand's (a weight dequantized with one
    # scale per group of g columns: (N, G, g) -> (N, G·g)): (i, the operand's axis they become). Its inputs stay
    # 3-D, indexed along the merged axis by (index // g, index % g): no view can take a stride-0 scale there.
    merge: tuple[int, int] | None = None


@dataclass
class GemmStage:
    """One product C = A·B (batched for bmm), addmm's beta·bias + alpha·C, then an optional pointwise epilogue."""

    name: str  # names the kernel: _{op}_{name}_kernel
    node: str  # the product's value in the pass
    a: str
    b: str
    bias: str | None
    alpha: float
    beta: float
    batched: bool
    shape: list  # the product's shape (symbolic)
    k: object  # the reduced extent K (symbolic)
    store_product: bool  # the product itself is read after this stage
    like: str | None  # input whose dtype a stored product takes (None: a float32 buffer)
    epilogue: KernelPlan | None = None
    acc_input: str | None = None  # the epilogue's input that is the product
    loads: list[str] = field(default_factory=list)  # the epilogue's other inputs, at the product's shape
    scalars: list[str] = field(default_factory=list)  # the epilogue's one-value inputs
    prologues: dict = field(default_factory=dict)  # "a" or "b" -> the Prologue that computes that operand
    # Row work on the product (log-softmax, a norm): run on the tile when the tile holds whole rows (N within
    # the GEMM_ROWS_N knob), else by its own row kernel after the product is stored (GlueStage of a row plan)
    rows: GlueStage | None = None

    @property
    def attrs(self) -> list[str]:
        """Run-time float attributes the prologues and the epilogue read, each once."""
        prologues = [a for pro in self.prologues.values() for a in pro.plan.attrs]
        return list(dict.fromkeys((self.epilogue.attrs if self.epilogue else []) + prologues))

    @property
    def operand_reads(self) -> list[str]:
        """What the K loop reads: each operand, or the inputs of the prologue that computes it."""
        out = []
        for side, name in (("a", self.a), ("b", self.b)):
            pro = self.prologues.get(side)
            out += pro.loads + pro.scalars if pro else [name]
        return out

    @property
    def tiles_in(self) -> list[str]:
        """Inputs read as tiles at the product's shape, broadcast by their strides: the bias, the epilogue's."""
        return ([self.bias] if self.bias else []) + self.loads

    @property
    def writes(self) -> list[str]:
        """What the stage stores: the product where it is read later, the epilogue's outputs."""
        return ([self.node] if self.store_product else []) + (
            [o.name for o in self.epilogue.outputs] if self.epilogue else []) + (self.rows.outputs if self.rows else [])

    @property
    def row_reads(self) -> list[str]:
        """What the row work reads besides the product, which it takes from the tile."""
        return [n for n in self.rows.inputs if n != self.node] if self.rows else []


@dataclass
class GlueStage:
    plan: object  # a flat, row or chain plan of the existing planners
    inputs: list[str]
    outputs: list[str]


@dataclass
class HostView:
    target: str
    op: str  # ATen overload, e.g. aten.t.default
    args: tuple  # values by name, sizes as fx nodes or ints
    reads: list = field(default_factory=list)  # what a concatenation copies (a view copies nothing)


@dataclass
class LibraryStage:
    """A convolution or its backward, called in the launcher as the ATen op: torch dispatches it to the vendor
    library (cuDNN, or the backend's own). Its operands are in the op's dtype, as eager's are."""

    name: str
    op: str  # ATen overload
    args: list[str]  # each argument as launcher source
    reads: list[str]
    writes: list[str]  # its value, or each item it returns (a backward's unread gradients too)
    shape: list  # the convolution's output (its input, when transposed): one weight row is summed per element
    reduce: list  # the weight's extents after the first: what each element multiplies with
    products: int  # 1 the forward; the backward's input and weight gradients, each as costly

    def flops(self, numel) -> int:
        return 2 * self.products * numel(self.shape) * numel(self.reduce)


@dataclass
class StagedPlan(PlanOfParts):
    """A pass of GEMM and glue stages; `steps` in launch order (GemmStage, GlueStage or HostView)."""

    name: str
    steps: list
    results: list[str]  # the values the pass returns, in order
    input_names: list[str]
    outputs: list  # OutArg of each, for the op's fake and signature
    shapes: dict = field(default_factory=dict)  # every value the stages hand over -> its shape (symbolic)
    layout: str = "staged"
    chained: bool = False
    why: list = field(default_factory=list)
    dims: dict = field(default_factory=dict)

    @property
    def glue(self) -> list:
        return [s.plan for s in self.steps if isinstance(s, GlueStage)]

    @property
    def gemms(self) -> list:
        return [s for s in self.steps if isinstance(s, GemmStage)]

    @property
    def attentions(self) -> list:
        return [s for s in self.steps if isinstance(s, AttentionStage)]

    @property
    def pools(self) -> list:
        return [s for s in self.steps if isinstance(s, PoolStage)]

    @property
    def kernels(self) -> list:
        """The pass's Triton kernels in launch order (a library stage launches none of them)."""
        return [k for s in self.steps for k in ([s] if isinstance(s, (GemmStage, AttentionStage, PoolStage)) else
                                                s.plan.kernels if isinstance(s, GlueStage) else [])]

    @property
    def libraries(self) -> list:
        return [s for s in self.steps if isinstance(s, LibraryStage)]

    @property
    def in_dtype(self) -> set:
        """Values handed between stages in the op's dtype rather than float32: what a library stage reads
        and writes."""
        return {v for s in self.libraries for v in s.reads + s.writes} - set(self.input_names)

    @property
    def cats(self) -> list:
        return [s for s in self.steps if isinstance(s, HostView) and s.op in HOST_CATS]

    @property
    def walks(self) -> int:
        return sum(p.walks for p in self.glue)

    @property
    def copies(self) -> list[str]:
        """Results the launcher returns as a copy: an input, or a view of one, returned as it is (a residual's
        gradient is the upstream gradient), and a value returned twice. An operator's outputs may alias
        neither its inputs nor each other."""
        views = {s.target: s.args[0] for s in self.steps if isinstance(s, HostView)}
        out, seen = [], set()
        for r in self.results:
            base = r
            while base in views:
                base = views[base]
            if base in self.input_names or r in seen:
                out.append(r)
            seen.add(r)
        return out

    def moves(self) -> list[tuple[str, str]]:
        """(value, "read" or "write") of every stage, in order: what the stages move through memory, a GEMM
        reading each operand once (its tiles' re-reads are the cache's), the glue its own inputs and outputs;
        then the copies of results that would alias."""
        out = [(v, rw) for v in self.copies for rw in ("read", "write")]
        for s in self.steps:
            if isinstance(s, HostView) and s.reads:
                out += [(v, "read") for v in s.reads] + [(s.target, "write")]
            elif isinstance(s, GemmStage):
                out += [(v, "read") for v in s.operand_reads + s.tiles_in + s.scalars + s.row_reads]
                out += [(v, "write") for v in s.writes]
            elif isinstance(s, (AttentionStage, LibraryStage, PoolStage)):
                out += [(v, "read") for v in s.reads] + [(v, "write") for v in s.writes]
            elif isinstance(s, GlueStage):
                out += [(v, "read") for v in s.inputs] + [(v, "write") for v in s.outputs]
        return out

    def _parts(self) -> list:  # the GEMM stages reduce nothing across programs; the glue may (and the row
        return self.glue + [s.rows.plan for s in self.gemms if s.rows]  # kernel of a product too wide may split)


def _host_views(gm) -> set:
    """The views the launcher takes: those that lead only to products, the output and other such views, and
    those of a value in memory (an input, a stored product), so that the glue reads the viewed tensor and its
    sizes off it rather than off whichever input the trace first saw them on."""
    host: set = set()
    for n in reversed(list(gm.graph.nodes)):
        if n.op != "call_function" or op_name(n.target) not in HOST_VIEWS | SLICES:
            continue
        if op_name(n.target) in SLICES and (len(n.args) > 4 and n.args[4] != 1):
            continue
        if all(u.op == "output" or (u.op == "call_function" and op_name(u.target) in STAGES) or u in host
               or _symbolic(u) for u in n.users):  # a size read off it is read off the inputs
            host.add(n)
    for n in gm.graph.nodes:
        if n.op == "call_function" and op_name(n.target) in HOST_CATS and all(
                p.op == "placeholder" or p in host or _stage_item(p) for p in n.args[0]):
            host.add(n)
            continue
        src = n.args[0] if n.op == "call_function" and op_name(n.target) in HOST_VIEWS else None
        if src is not None and (src.op == "placeholder" or src in host or _stage_item(src) or
                                (src.op == "call_function" and op_name(src.target) in PRODUCTS)):
            host.add(n)
    return host


def _concatenations(gm) -> None:
    """A sum of slice_backwards whose ranges tile one dimension (a split's gradient: each piece's gradient
    placed in zeros, added up) is the concatenation of the pieces' gradients: rewritten as aten.cat where the
    pieces are in memory (views of a stage's results), so the launcher copies each once."""
    graph, env = gm.graph, shape_env_of(gm)
    for n in list(graph.nodes):
        leaves = sum_terms(n) if n.users else None  # the root of the sum only
        if leaves is None:
            continue
        if not all(isinstance(x, torch.fx.Node) and x.target == torch.ops.aten.slice_backward.default
                   for x in leaves):
            continue
        pieces = sorted(((_size_expr(x.args[3], env), x) for x in leaves), key=lambda t: hint(t[0], env) or 0)
        sizes, dim = list(pieces[0][1].args[1]), pieces[0][1].args[2]
        size = expr_of(n.meta["val"].shape[dim], env)
        ends = [_size_expr(x.args[4], env) if not (isinstance(x.args[4], int) and x.args[4] >= 2 ** 62) else size
                for _, x in pieces]
        starts = [start for start, _ in pieces]
        tiled = starts[0] == 0 and same(ends[-1], size, env) and all(
            same(e, b, env) for e, b in zip(ends, starts[1:]))
        if not tiled or any(list(x.args[1]) != sizes or x.args[2] != dim or (len(x.args) > 5 and x.args[5] != 1)
                            for _, x in pieces) or not all(_in_memory(x.args[0]) for _, x in pieces):
            continue
        with graph.inserting_before(n):
            cat = graph.call_function(torch.ops.aten.cat.default, ([x.args[0] for _, x in pieces], dim))
        cat.meta = dict(n.meta)
        n.replace_all_uses_with(cat)
    graph.eliminate_dead_code()


def _size_expr(a, env) -> sympy.Expr:
    return expr_of(a.meta["val"] if isinstance(a, torch.fx.Node) else a, env)


def _in_memory(n) -> bool:
    """A value a stage wrote or an input, through views."""
    while n.op == "call_function" and op_name(n.target) in HOST_VIEWS:
        n = n.args[0]
    return n.op == "placeholder" or _stage_item(n) or (n.op == "call_function" and op_name(n.target) in STAGES)


def _depths(gm) -> dict:
    """Products on the longest path to each value: the stage that can compute it."""
    depth: dict = {}
    for n in gm.graph.nodes:  # sizes are known from the inputs, whatever value the trace read them off
        d = 0 if _symbolic(n) else max((depth[a] for a in n.all_input_nodes), default=0)
        depth[n] = d + 1 if n.op == "call_function" and op_name(n.target) in STAGES else d
    return depth


def _sink(compute: list, depth: dict, needed: set) -> None:
    """Pointwise glue computed from the pass's inputs alone and read only by glue of later depths is computed
    there again instead of stored and loaded (a GELU's derivative at the saved pre-activation, needed only once
    dh = dy·W2ᵀ is known): a few flops per element instead of a full-size write and read. Consumers first, so
    that chains move together."""
    members = set(compute)

    def an_input(a) -> bool:  # an input of the pass, or a view of one
        while a.op == "call_function" and a not in members and op_name(a.target) in HOST_VIEWS:
            a = a.args[0]
        return a.op == "placeholder"

    pure = set()
    for n in compute:  # pointwise functions of the inputs (and sizes), through other such values
        rule = OP_TABLE.get(op_name(n.target))
        if rule is not None and rule.kind == POINTWISE and all(a in pure or _free(a) or an_input(a)
                                                               for a in n.all_input_nodes):
            pure.add(n)
    for n in reversed(compute):
        users = [u for u in n.users if u in needed and not _symbolic(u)]
        if n not in pure or not users or any(u not in members for u in users):
            continue
        later = min(depth[u] for u in users)
        if later > depth[n]:
            depth[n] = later


def _subgraph(nodes: list, inputs: list, outputs: list, names: dict, sizes: dict,
              tile: torch.Tensor | None = None) -> torch.fx.GraphModule:
    """The nodes as a graph of their own: `inputs` become placeholders (named as in the pass), `outputs` its
    output tuple, and each size of `sizes` is read off the input and dimension it names. With `tile` (an
    epilogue's product), an input that broadcasts to it is seen at its shape: the kernel reads it as a tile."""
    g = torch.fx.Graph()
    env: dict = {}
    by_name: dict = {}  # a value and its detached alias are one input
    for n in inputs:
        if names[n] not in by_name:
            by_name[names[n]] = g.placeholder(names[n])
            by_name[names[n]].meta = dict(n.meta)
            val = n.meta.get("val")
            if tile is not None and isinstance(val, torch.Tensor) and val.numel() != 1 and val.shape != tile.shape:
                by_name[names[n]].meta["val"] = val.expand(tile.shape)
        env[n] = by_name[names[n]]
    for n in nodes:
        if n in sizes:
            env[n] = _size_node(g, *sizes[n], env)
        else:
            env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[n] for n in outputs))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _symbolic(n) -> bool:
    """Arithmetic on sizes (sym_size, sym_numel, Python operators on them): recomputed where it is read."""
    rule = OP_TABLE.get(op_name(n.target)) if n.op == "call_function" else None
    return rule is not None and rule.kind == SYMBOLIC


def _free(n) -> bool:
    """Sizes, and constants made from nothing but sizes (a scalar_tensor, a full): recomputed where read."""
    return _symbolic(n) or (n.op == "call_function" and all(_symbolic(a) for a in n.all_input_nodes))


def _closure(nodes: list) -> list:
    """`nodes` with the sizes and constants they read, in graph order."""
    keep, stack = set(nodes), list(nodes)
    while stack:
        for a in stack.pop().all_input_nodes:
            if _free(a) and a not in keep:
                keep.add(a)
                stack.append(a)
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)} if nodes else {}
    return sorted(keep, key=order.get)


def plan_staged(name: str, gm: torch.fx.GraphModule, input_names: list[str], outputs: list[tuple[str, int]],
                like: dict, plan_glue) -> StagedPlan:
    """`plan_glue(name, gm, input_names, outputs, like)` plans a glue subgraph (build.plan_pass)."""
    g = torch.fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    gm = torch.fx.GraphModule(gm, g)  # attention regions are replaced in a copy: the trace stays as it was
    fuse_attention(gm)
    _concatenations(gm)
    graph = gm.graph
    placeholders = graph.find_nodes(op="placeholder")
    out_node = graph.find_nodes(op="output")[0]
    results = [out_node.args[0][i] for _, i in outputs]
    names = {p: n for p, n in zip(placeholders, input_names)}
    for n in graph.nodes:
        names.setdefault(n, n.name)
    taken = set(names.values())
    for n in graph.nodes:  # an attention's gradients by what they are: attention_dq, attention_dk, ...
        if _stage_item(n) and op_name(n.args[0].target) in ITEM_NAMES:
            label = f"{n.args[0].name.replace('_backward', '')}_{ITEM_NAMES[op_name(n.args[0].target)][n.args[1]]}"
            if label not in taken:
                names[n] = label
                taken.add(label)
    host = _host_views(gm)
    for n in graph.nodes:  # detach and alias are the value itself
        if n in host and op_name(n.target) in IDENTITY_VIEWS:
            names[n] = names[n.args[0]]
    result_like: dict = {}  # an output's dtype is taken by the value under its views
    for (oname, _), node in zip(outputs, results):
        while node in host:
            node = node.args[0]
        result_like.setdefault(node, like.get(oname))
    for p in graph.nodes:  # a library op's operands are in its dtype: one that is computed is stored in it
        if p.op == "call_function" and op_name(p.target) in LIBRARY:
            _library_dtypes(p, host, names, result_like)
    depth = _depths(gm)
    needed: set = set()
    stack = list(results)
    while stack:
        n = stack.pop()
        if n not in needed:  # a size is read off the inputs, never off a value computed for it alone
            needed.add(n)
            stack += [a for a in n.all_input_nodes if not _symbolic(n) or _symbolic(a)]
    compute = [n for n in graph.nodes if n in needed and n.op == "call_function" and n not in host
               and op_name(n.target) not in STAGES and not _stage_item(n) and not _free(n)]
    products = [n for n in graph.nodes if n in needed and n.op == "call_function" and op_name(n.target) in STAGES]
    _sink(compute, depth, needed)
    steps: list = []
    done: set = set(placeholders)
    count = iter(range(len(graph.nodes)))  # names the kernels: {name}_0, {name}_1, ...

    def need(v):  # a host view (and the views under it), taken just before the stage that reads it
        if v in done or _free(v):
            return
        if v not in host:
            raise Unsupported([op_name(v.target)], f"{v.name} is read before the stage that computes it")
        for a in v.all_input_nodes:
            need(a)
        done.add(v)
        if op_name(v.target) in IDENTITY_VIEWS:
            return
        args = tuple(_host_arg(a, names, placeholders) for a in v.args)
        if op_name(v.target) in HOST_CATS:
            steps.append(HostView(names[v], op_name(v.target), args, [names[a] for a in v.args[0]]))
            return
        if op_name(v.target) in SLICES:  # narrow(dim, start, length), each read off the inputs' sizes
            dim = v.args[1] if len(v.args) > 1 else 0
            start = v.args[2] if len(v.args) > 2 and v.args[2] is not None else 0
            start = start.meta["val"] if isinstance(start, torch.fx.Node) else start
            args = (args[0], repr(dim), _size_arg(start, placeholders, names),
                    _size_arg(v.meta["val"].shape[dim], placeholders, names))
        steps.append(HostView(names[v], op_name(v.target), args))
        done.add(v)

    prologues: dict = {}  # product -> {"a" or "b": Prologue}, found with the glue of the depth before it
    prologue_inputs: dict = {}  # product -> what its prologues read

    def gemm(stage_name: str, p) -> GemmStage:
        stage = _gemm(stage_name, p, names, result_like)
        stage.prologues = prologues.get(p, {})
        return stage

    for d in range(max(depth.values(), default=0) + 1):
        prods = [p for p in products if depth[p] == d]
        groups = []  # the glue of this depth, one stage per connected part: each has its own shape
        for part in _components([n for n in compute if depth[n] == d]):
            members = set(part)
            g_inputs, sizes = _glue_inputs(part, placeholders)
            g_outputs = [n for n in part if n in results or any(u not in members and u in needed and not _symbolic(u)
                                                                  for u in n.users)]
            fused = _fusable(prods, part, g_inputs, g_outputs, results, members)
            rows = _fusable(prods, part, g_inputs, g_outputs, results, members, True) if fused is None else None
            groups.append((part, g_inputs, g_outputs, fused, rows, sizes))
        for p in prods:
            computed = {operands(p)["ab".index(side)] for side in prologues.get(p, {})}
            for a in p.all_input_nodes + prologue_inputs.get(p, []):
                if a not in computed:
                    need(a)
        epilogues = {g[3] for g in groups} | {g[4] for g in groups}
        for p in prods:
            if p in epilogues:
                continue
            op = op_name(p.target)
            if op == ATTENTION:
                steps.append(_attention(f"{name}_{next(count)}", p, names, result_like, placeholders))
            elif op in (ATTENTION_OP, ATTENTION_BACKWARD):
                steps.append(_traced_attention(f"{name}_{next(count)}", p, names, result_like, input_names))
            elif op in LIBRARY:
                steps.append(_library(f"{name}_{next(count)}", p, names, placeholders))
            elif op in POOLS:
                steps.append(pool_stage(f"{name}_{next(count)}", p, names, result_like, needed))
            else:
                steps.append(gemm(f"{name}_{next(count)}", p))
            done.add(p)
            done.update(u for u in p.users if _stage_item(u))
        for part, g_inputs, g_outputs, fused, rows, sizes in groups:
            target = None  # the product operand this part alone computes, through views: its prologue
            if fused is None and len(g_outputs) == 1 and g_outputs[0] not in results:
                target = _operand_chain(g_outputs[0], host, needed)
            tile = fused if fused is not None else g_outputs[0] if target else None
            rows_name = f"{name}_{next(count)}" if rows is not None else None  # named before its glue
            sub = _subgraph(_closure(part), g_inputs, g_outputs, names, sizes,
                            tile.meta["val"] if tile is not None else None)
            plan = plan_glue(f"{name}_{next(count)}", sub, list(dict.fromkeys(names[a] for a in g_inputs)),
                             [(names[n], i) for i, n in enumerate(g_outputs)],
                             {names[n]: result_like.get(n) for n in g_outputs})
            pointwise = isinstance(plan, KernelPlan) and not plan.reductions
            if rows is not None:
                stage = gemm(rows_name, rows)
                if target is None and _row_tile(plan, rows, names[rows]):
                    for a in g_inputs:
                        if a is not rows:
                            need(a)
                    stage.rows = GlueStage(plan, list(dict.fromkeys(names[a] for a in g_inputs)),
                                           [names[n] for n in g_outputs])
                    stage.store_product = rows in results  # returned too (saved for the backward)
                    steps.append(stage)
                    done.add(rows)
                    done.update(g_outputs)
                    continue
                steps.append(stage)  # stored, then the glue
                done.add(rows)
            if target is not None and not pointwise:
                # an RMSNorm before a product: the row statistics stay a glue stage, the pointwise rest at the
                # operand's shape (x · rstd · gamma) becomes the product's prologue
                split = _split_tail(part, g_outputs[0])
                if split is not None:
                    head, tail = split
                    h_inputs, h_sizes = _glue_inputs(head, placeholders)
                    h_outputs = [n for n in head if any(u in tail for u in n.users)]
                    h_plan = plan_glue(f"{name}_{next(count)}", _subgraph(_closure(head), h_inputs, h_outputs, names,
                                                                       h_sizes),
                                       list(dict.fromkeys(names[a] for a in h_inputs)),
                                       [(names[n], i) for i, n in enumerate(h_outputs)], {})
                    t_inputs, t_sizes = _glue_inputs(tail, placeholders)
                    t_plan = plan_glue(f"{name}_{next(count)}", _subgraph(_closure(tail), t_inputs, g_outputs, names,
                                                                       t_sizes, g_outputs[0].meta["val"]),
                                       list(dict.fromkeys(names[a] for a in t_inputs)),
                                       [(names[g_outputs[0]], 0)], {})
                    if isinstance(t_plan, KernelPlan) and not t_plan.reductions:
                        for a in h_inputs:
                            need(a)
                        steps.append(GlueStage(h_plan, list(dict.fromkeys(names[a] for a in h_inputs)),
                                               [names[n] for n in h_outputs]))
                        done.update(h_outputs)
                        plan, g_inputs, pointwise = t_plan, t_inputs, True
            if target is not None and pointwise:
                p, side, views, merge = target
                ins = list(dict.fromkeys(names[a] for a in g_inputs))
                full = {a.name for a in plan.inputs if a.full}
                prologues.setdefault(p, {})[side] = Prologue(
                    plan, [n for n in ins if n in full], [n for n in ins if n not in full],
                    [] if merge else [(VIEW_METHODS[op_name(v.target)],
                                       tuple(_host_arg(a, names, placeholders) for a in v.args[1:])) for v in views],
                    merge)
                prologue_inputs.setdefault(p, []).extend(g_inputs)
                continue
            if fused is not None and not pointwise:
                steps.append(gemm(f"{name}_{next(count)}", fused))  # stored, then the glue
                done.add(fused)
                fused = None
            for a in g_inputs:
                if a is not fused:
                    need(a)
            if fused is not None:
                stage = gemm(plan.name, fused)  # the epilogue's kernel is the product's
                full = {a.name for a in plan.inputs if a.full}
                stage.epilogue, stage.acc_input = plan, names[fused]
                stage.store_product = fused in results  # returned too (saved for the backward): one more store
                stage.loads = [names[a] for a in g_inputs if a is not fused and names[a] in full]
                stage.scalars = [names[a] for a in g_inputs if a is not fused and names[a] not in full]
                steps.append(stage)
                done.add(fused)
            else:
                steps.append(GlueStage(plan, list(dict.fromkeys(names[a] for a in g_inputs)),
                                       [names[n] for n in g_outputs]))
            done.update(g_outputs)
    for r in results:
        need(r)
    outs = [OutArg(oname, names[r], True, False, list(r.meta["val"].shape), like.get(oname), False, True)
            for (oname, _), r in zip(outputs, results)]
    shapes = {names[n]: list(n.meta["val"].shape) for n in graph.nodes
              if isinstance(n.meta.get("val"), torch.Tensor)}
    return StagedPlan(name, steps, [names[r] for r in results], list(input_names), outs, shapes)


def _glue_inputs(part: list, placeholders: list) -> tuple[list, dict]:
    """The values a glue stage reads, and where it reads its sizes: the trace reads a size off the first
    value that has it (often a weight the glue never touches, or a value of another stage), so a size is read
    off the values the glue reads anyway where they have its symbols; else off the pass's inputs, which then
    join the stage."""
    members, inputs, sizes = set(part), [], {}
    for n in part:
        for a in n.all_input_nodes:
            if a not in members and not _free(a) and a not in inputs:
                inputs.append(a)
    for n in _closure(part):
        if n in members:
            continue
        if op_name(n.target) == "aten.sym_size.int" and n.args[0] not in inputs:
            size = n.args[0].meta["val"].shape[n.args[1]]
            found = _size_source(size, inputs) or _size_source(size, placeholders)
            inputs += [a for a, _ in found[1].values() if a not in inputs]
            sizes[n] = found
        if n not in sizes:
            inputs += [a for a in n.all_input_nodes if not _free(a) and a not in inputs]
    return inputs, sizes


def _size_source(size, inputs: list):
    """(expression, {symbol: (input, dim)}) reading `size` off the dimensions of `inputs`, or None."""
    expr = expr_of(size)
    where: dict = {}
    for sym in expr.free_symbols:
        for a in inputs:
            dims = [d for d, x in enumerate(getattr(a.meta["val"], "shape", ())) if expr_of(x) == sym]
            if dims:
                where[sym] = (a, dims[0])
                break
        else:
            return None
    return expr, where


def _size_node(g: torch.fx.Graph, expr, where: dict, env: dict):
    """Graph nodes computing the size expression from the placeholders' sizes, with their SymInt values."""
    if isinstance(expr, sympy.Symbol):
        src, dim = where[expr]
        node = g.call_function(torch.ops.aten.sym_size.int, (env[src], dim))
        node.meta["val"] = src.meta["val"].shape[dim]
        return node
    if expr.is_Integer:
        return int(expr)
    if isinstance(expr, FloorDiv):
        fn, parts = operator.floordiv, expr.args
    elif isinstance(expr, (sympy.Add, sympy.Mul)):
        fn, parts = (operator.add if isinstance(expr, sympy.Add) else operator.mul), expr.args
    else:
        raise Unsupported([], f"a size computed as {expr}, which the glue cannot read off its inputs")
    value = _size_node(g, parts[0], where, env)
    for p in parts[1:]:
        right = _size_node(g, p, where, env)
        val = fn(*(x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in (value, right)))
        value = g.call_function(fn, (value, right))
        value.meta["val"] = val
    return value


def _components(nodes: list) -> list[list]:
    """`nodes` in groups connected by the values they hand each other, each in graph order: an RMSNorm of one
    product and a RoPE of another are two kernels, of two shapes. Groups over one and the same shape that read a
    common input of that shape are one group too: one kernel reads that input once (a SwiGLU's backward reads
    dh for the gradients of both the gate and the up projection; a LayerNorm's reads dy for dx and for the
    column sums of d weight and d bias)."""
    part = {n: n for n in nodes}

    def root(n):
        while part[n] is not n:
            part[n] = part[part[n]]
            n = part[n]
        return n

    apart = {n for n in nodes if _widens(n, part)}  # joined to nothing it reads
    for n in nodes:
        for a in n.all_input_nodes:
            if a in part and n not in apart:
                part[root(a)] = root(n)
    space: dict = {}  # a group's root -> the shape it runs over: that of the largest value it reads or makes
    env = shape_env_of(nodes[0].graph.owning_module) if nodes else None
    for n in nodes:
        r = root(n)
        for v in [n] + [a for a in n.all_input_nodes if not _symbolic(a)]:
            val = v.meta["val"]
            if not isinstance(val, torch.Tensor):  # an op of several results: refused by name when planned
                continue
            # compared at the traced sizes: comparing the SymInts would have the shape env prove it (and guard)
            if r not in space or _numel_hint(val, env) > _numel_hint(space[r], env):
                space[r] = val
    readers: dict = {}  # an outside input -> the groups reading it
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in part and not _symbolic(a):
                readers.setdefault(a, []).append(n)
    for a_in, group in readers.items():
        shape = str(a_in.meta["val"].shape)
        for n in group[1:]:
            a, b = root(group[0]), root(n)
            if a is not b and str(space[a].shape) == str(space[b].shape) == shape:
                part[b] = a
                space.pop(b)
    groups: dict = {}
    for n in nodes:
        groups.setdefault(root(n), []).append(n)
    return list(groups.values())


def _numel_hint(val: torch.Tensor, env) -> int:
    return hint(sympy.Mul(*(expr_of(d) for d in val.shape)), env) or 0


def _widens(n, members) -> bool:
    """A reduction of a value computed in `members` viewed with wider rows (a linear's bias gradient summed over
    (B·T, H·D) of a gradient computed per head as (B, T, H, D)): a row kernel walks rows of the value's own
    width and cannot sum across them, so the reduction is a stage of its own that reads the value from memory."""
    rule = OP_TABLE.get(op_name(n.target)) if n.op == "call_function" else None
    if rule is None or rule.kind != REDUCTION:
        return False
    v, env = n.args[0], shape_env_of(n.graph.owning_module)
    while v in members and v.op == "call_function" and OP_TABLE[op_name(v.target)].kind == VIEW:
        src = v.args[0]
        width = [hint(expr_of(x.meta["val"].shape[-1], env), env) if x.meta["val"].dim() else 1 for x in (v, src)]
        if width[0] > width[1]:
            return True
        v = src
    return False


def _size_arg(size, placeholders: list, names: dict) -> str:
    """A size (an int or SymInt) as Python source reading the inputs' sizes."""
    found = _size_source(size, placeholders)
    if found is None:
        raise Unsupported([], f"a size ({size}) the launcher cannot read off the inputs")
    expr, where = found
    return pysrc(expr, {sym: f"{names[t]}.size({d})" for sym, (t, d) in where.items()})


def _host_arg(a, names: dict, placeholders: list):
    """An argument of a view the launcher takes, as Python source: values by name, sizes read off the inputs."""
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_host_arg(x, names, placeholders) for x in a) + "]"
    if not isinstance(a, torch.fx.Node):
        return repr(a)
    if isinstance(a.meta.get("val"), torch.Tensor):
        return names[a]
    op = op_name(a.target)
    if op == "aten.sym_size.int" and a.args[0].op == "placeholder":
        return f"{names[a.args[0]]}.size({a.args[1]})"
    if op == "aten.sym_size.int":  # off a value the launcher may never hold: off the inputs
        return _size_arg(a.args[0].meta["val"].shape[a.args[1]], placeholders, names)
    if op == "aten.sym_numel.default":
        return f"{_host_arg(a.args[0], names, placeholders)}.numel()"
    if op == "torch.sym_float":
        return f"float({_host_arg(a.args[0], names, placeholders)})"
    if a.target in SYM_OPS:
        left, right = (_host_arg(x, names, placeholders) for x in a.args[:2])
        return f"({left} {SYM_OPS[a.target]} {right})"
    raise Unsupported([op], "a size computed in a way the launcher cannot read")


def operands(p) -> tuple:
    """A product node's A and B (addmm's bias comes first)."""
    return tuple(p.args[1:3]) if op_name(p.target) == "aten.addmm.default" else tuple(p.args[:2])


def _attention(name: str, p, names: dict, result_like: dict, placeholders: list) -> AttentionStage:
    region = p.meta["attention"]
    side, kinds = [names[s] for s in region.side], [side_kind(s) for s in region.side]
    sizes = {names[s]: _host_arg(s, names, placeholders) for s, kind in zip(region.side, kinds) if kind == "size"}
    attrs = sorted({str(a) for n in region.score.graph.nodes for a in n.args if type(a).__name__ == "AttrRef"})
    q, k = region.q.meta["val"], region.k.meta["val"]
    return AttentionStage(name, names[p], names[region.q], names[region.k], names[region.v], region.score, side,
                          kinds, sizes, names[region.sinks] if region.sinks is not None else None,
                          result_like.get(p), list(p.meta["val"].shape), k.shape[-2], q.shape[-1], attrs)


def _traced_attention(name: str, p, names: dict, result_like: dict, input_names: list[str]) -> AttentionStage:
    """The stage of an `opforge::attention` node or of its backward."""
    rec = p.meta["attention"]
    inputs = dict(zip(rec.inputs, input_names))  # the forward's inputs are the pass's first
    sizes = {n: _host_arg(s, inputs, rec.inputs) for n, s in rec.sizes.items()}
    q, k, v, tensors, sinks = p.args[:5]
    items = {u.args[1]: u for u in p.users if _stage_item(u)}
    side, it = [], iter(tensors)
    size_names = iter(rec.sizes)
    for kind in rec.kinds:
        side.append(next(size_names) if kind == "size" else names[next(it)])
    common = dict(q=names[q], k=names[k], v=names[v], score=rec.score, side=side, kinds=rec.kinds, sizes=sizes,
                  sinks=names[sinks] if sinks is not None else None, keys=k.meta["val"].shape[-2],
                  head_dim=q.meta["val"].shape[-1], attrs=rec.attrs)
    if op_name(p.target) == ATTENTION_OP:
        return AttentionStage(name, names[p], like=result_like.get(p), shape=list(p.meta["val"].shape), **common)
    grad, bias_grad = p.args[5:7]
    grads = [items.get(i) for i in range(5)]
    # a gradient nobody reads is still computed (the kernels write all three): named after its stage
    gname = [names[g] if g is not None else f"{name}_d{w}" for g, w in zip(grads, ("q", "k", "v", "sinks", "bias"))]
    return AttentionBackwardStage(
        name, gname[0], like=None, shape=list(q.meta["val"].shape), grad=names[grad], dk=gname[1], dv=gname[2],
        dsinks=gname[3] if sinks is not None else None,
        bias=names[tensors[bias_grad]] if bias_grad >= 0 else None, dbias=gname[4] if bias_grad >= 0 else None,
        bias_sums=bias_sums(tensors[bias_grad]) if bias_grad >= 0 else (False, False),
        grad_like={n: result_like.get(g) for n, g in zip(gname, grads) if g is not None}, **common)


def _library_dtypes(p, host: set, names: dict, result_like: dict) -> None:
    """Each computed tensor operand of library op `p` is stored in the dtype of an operand that is an input (its
    weight): eager computes it in that dtype, and the library refuses operands of mixed dtypes."""
    tensors = []
    for a in p.args:
        while isinstance(a, torch.fx.Node) and a in host:
            a = a.args[0]
        if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor):
            tensors.append(a)
    given = [a for a in tensors if a.op == "placeholder"]
    if not given:
        raise Unsupported([op_name(p.target)], "a library op with no input among its operands to take a dtype from")
    for a in tensors:
        if a.op != "placeholder":
            result_like.setdefault(a, names[given[-1]])


def _library(name: str, p, names: dict, placeholders: list) -> LibraryStage:
    op = op_name(p.target)
    args = [_host_arg(a, names, placeholders) for a in p.args]
    reads = [names[a] for a in p.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    if op == "aten.convolution.default":
        weight, transposed = p.args[1], p.args[6]
        x = p.args[0] if transposed else p  # the side whose every element sums one weight row
        writes, products = [names[p]], 1
    else:  # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, ..., output_mask)
        weight, transposed, mask = p.args[2], p.args[7], p.args[10]
        x = p.args[1] if transposed else p.args[0]
        items = {u.args[1]: u for u in p.users if _stage_item(u)}
        writes = [names[items[i]] if i in items else f"{name}_{what}" for i, what in enumerate(ITEM_NAMES[op])]
        products = int(mask[0]) + int(mask[1])
    return LibraryStage(name, op, args, list(dict.fromkeys(reads)), writes, list(x.meta["val"].shape),
                        list(weight.meta["val"].shape[1:]), products)


def _gemm(name: str, p, names: dict, result_like: dict) -> GemmStage:
    op = op_name(p.target)
    if op == "aten.addmm.default":
        bias, a, b = p.args[:3]
        beta, alpha = p.kwargs.get("beta", 1), p.kwargs.get("alpha", 1)
    else:
        (a, b), bias, beta, alpha = p.args[:2], None, 0, 1
    return GemmStage(name, names[p], names[a], names[b], names[bias] if bias is not None else None,
                     float(alpha), float(beta), op == "aten.bmm.default", list(p.meta["val"].shape),
                     a.meta["val"].shape[-1], store_product=True, like=result_like.get(p))


def _fusable(prods: list, glue_nodes: list, g_inputs: list, g_outputs: list, results: list, members: set,
             rows: bool = False):
    """The product whose glue runs in its epilogue: the glue is pointwise (one flat kernel, no reductions),
    reads this product at the product's own shape and every other full input at that shape too, and nothing
    else reads the product but the pass's output (then the epilogue stores it too). The last such product of
    the depth, so that the others are stored before it.

    rows: the glue may also reduce along the product's rows (a softmax, a norm) and return values per row: the
    product whose row work may run on its tile (`_row_tile` decides once the glue is planned). A 2-D product."""
    if not glue_nodes or not prods:
        return None
    for p in reversed(prods):
        if op_name(p.target) not in PRODUCTS or p not in g_inputs or any(
                u not in members and u.op != "output" for u in p.users):
            continue
        shape = tuple(p.meta["val"].shape)
        fine = all(_broadcasts(a.meta["val"], shape) for a in g_inputs)
        if rows:
            outs_fine = len(shape) == 2 and all(tuple(n.meta["val"].shape) in (shape, shape[:1], (shape[0], 1))
                                                for n in g_outputs)
            if fine and outs_fine and not any(_moves(n) for n in glue_nodes):
                return p
            continue
        outs_fine = all(tuple(n.meta["val"].shape) == shape for n in g_outputs)
        if fine and outs_fine and not any(_reduces(n) for n in glue_nodes):
            return p
    return None


def _row_tile(plan, product, name: str) -> bool:
    """Whether a glue plan's row work can run on the product's tile: one row kernel over the product's own rows
    and columns, reducing nothing across rows, storing whole rows or one value per row, and reading the
    product at its own columns (the tile has no others)."""
    if getattr(plan, "layout", None) != "rows" or plan.chained or plan.reduces_across_programs:
        return False
    if any(o.store not in ("full", "row") for o in plan.outputs):
        return False
    m, n = (pysrc(expr_of(d), plan.symbols) for d in product.meta["val"].shape)
    if (plan.n_rows, plan.n_cols) != (m, n):
        return False
    value = next((ph for ph in plan.gm.graph.find_nodes(op="placeholder") if ph.name == name), None)
    stack = list(value.users) if value is not None else []
    while stack:  # through views, to the ops that read it: none may move its columns
        u = stack.pop()
        kind = OP_TABLE[op_name(u.target)].kind if u.op == "call_function" else None
        if kind == SHIFT:
            return False
        if kind == VIEW:
            stack += list(u.users)
    return value is not None


PROLOGUE_VIEWS = {"aten.t.default", "aten.transpose.int", "aten.permute.default", "aten.unsqueeze.default",
                  "aten.expand.default"}  # views that take a broadcast (stride-0) tensor as they take any other


MERGE_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}
SWAPS = {"aten.t.default", "aten.transpose.int", "aten.permute.default"}  # of a 2-D operand: its two axes


def _operand_chain(value, host: set, needed: set) -> tuple | None:
    """(product, "a" or "b", views, merge) when `value` is read by nothing the pass needs but one operand of one
    product, through views the launcher takes on each prologue input, or through a view merging two dimensions
    of a 3-D value then swaps (Prologue.merge); else None."""
    views, n, merged = [], value, None
    while True:
        users = [u for u in n.users if u in needed and not _symbolic(u)]
        if len(users) != 1:
            return None
        u = users[0]
        key = op_name(u.target) if u.op == "call_function" else None
        if key in PRODUCTS:
            a, b = operands(u)
            if (n is a) == (n is b) or (merged is not None and key == "aten.bmm.default"):
                return None
            if merged is None:
                return u, "a" if n is a else "b", views, None
            swaps = sum(_swaps(v) for v in views)  # each swap moves the merged axis to the other
            return u, "a" if n is a else "b", views, (merged, merged if swaps % 2 == 0 else 1 - merged)
        if u in host and key in MERGE_VIEWS and n is value and _merged(n, u) is not None:
            merged = _merged(n, u)  # the first merged dimension, which is also the merged axis of the 2-D view
            n = u
            continue
        if u not in host or key not in (SWAPS if merged is not None else PROLOGUE_VIEWS):
            return None
        views.append(u)
        n = u


def _swaps(view) -> bool:
    """Whether a view of a 2-D tensor swaps its axes."""
    key = op_name(view.target)
    if key == "aten.t.default":
        return True
    if key == "aten.transpose.int":
        return view.args[1] % 2 != view.args[2] % 2
    return [d % 2 for d in view.args[1]] == [1, 0]


def _merged(value, view) -> int | None:
    """i when `view` makes 3-D `value` 2-D by merging its dimensions i and i+1; compared at the trace's sizes."""
    pre, post = (tuple(int(d.node.hint) if isinstance(d, torch.SymInt) else int(d) for d in t.meta["val"].shape)
                 for t in (value, view))
    if len(pre) != 3 or len(post) != 2:
        return None
    return 0 if post == (pre[0] * pre[1], pre[2]) else 1 if post == (pre[0], pre[1] * pre[2]) else None


def _split_tail(part: list, value) -> tuple[list, list] | None:
    """(head, tail) of a glue part that computes `value`: the tail is the pointwise work at value's shape that
    nothing else in the part reads (back from `value`), the head everything before it (reductions, values at
    smaller shapes). None when there is no such split or the tail reads a head value that does not broadcast
    to value's shape (a prologue reads it as a tile)."""
    members, shape = set(part), tuple(value.meta["val"].shape)
    tail: set = set()
    for n in reversed(part):
        rule = OP_TABLE.get(op_name(n.target))
        pointwise = rule is not None and rule.kind == POINTWISE and tuple(n.meta["val"].shape) == shape
        if n is value or (pointwise and all(u in tail for u in n.users if u in members)):
            tail.add(n)
    head = [n for n in part if n not in tail]
    if not head or value not in tail:
        return None
    read = {a for n in tail for a in n.all_input_nodes if a in members and a not in tail}
    if not all(_broadcasts(a.meta["val"], shape) for a in read):
        return None
    return head, [n for n in part if n in tail]


def _broadcasts(val, shape: tuple) -> bool:
    """`val` broadcasts to `shape` without growing it: a per-row or per-column vector, a scalar, the shape itself.
    The GEMM kernel reads such an input as a tile through the launcher's expand (stride 0 where it repeats)."""
    if val.dim() > len(shape):
        return False
    return all(str(d) == "1" or str(d) == str(s) for d, s in zip(val.shape[::-1], shape[::-1]))


def _moves(n) -> bool:
    """An op no row kernel on the tile runs: a view the launcher takes, or one the engine does not know."""
    return OP_TABLE.get(op_name(n.target)) is None or op_name(n.target) in HOST_VIEWS - IDENTITY_VIEWS


def _reduces(n) -> bool:
    return _moves(n) or OP_TABLE[op_name(n.target)].kind in (REDUCTION, SCAN)
