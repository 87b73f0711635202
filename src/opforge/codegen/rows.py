"""The row planner: pointwise work with broadcasts, row/column/full reductions and last-dim slices in one kernel.

The kernel walks an *iteration space* of `n_rows × n_cols`: the shape of the graph's largest value, its last
dimension being the columns. Each program owns `BLOCK_R` rows and walks their columns in chunks of `BLOCK_C`.
Every graph value is classified by what it depends on:

    full  (rows and columns)  a (BLOCK_R, BLOCK_C) tile   x, x * w, exp(x - max)
    row   (rows only)         a (BLOCK_R, 1) column       a per-row scale, a row's max, mean or sum
    col   (columns only)      a (1, BLOCK_C) row          a norm's weight, a column reduction
    scalar                    one value                   a per-tensor scale, a loss

so Triton's broadcasting does the rest. Inputs are mapped onto the iteration space by their shape: the same
numel in flat order, a broadcast (right-aligned like torch), or one value per row or per column.

Row reductions (over the last dimension) close a *phase*: phase k loops over the columns to reduce values of
depth k; the final loop stores full outputs and accumulates column and full reductions. When a row fits one
chunk every loop runs once (persistent); otherwise values are recomputed chunk by chunk from the inputs
(looped). Column and full reductions meet across programs (atomics, or ordered partials when deterministic)
and the last program, found by an acq_rel ticket, finishes them: the scalar epilogue and column outputs.

Slices, concatenations and interleaves along the last dimension (rotate-half and GPT-J's pairs in RoPE, their
backward `slice_backward`) move columns: a value is emitted at a column expression (`cols + D // 2`,
`2 * (cols // 2) + 1`) by re-emitting its inputs' loads there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy
import torch

from opforge.codegen.ops import (
    COLUMN,
    CONSTANT,
    INDEX_KINDS,
    OP_TABLE,
    POINTWISE,
    REDUCE_KIND,
    REDUCTION,
    ROW_ONLY_KINDS,
    SCAN,
    SHIFT,
    SYMBOLIC,
    VIEW,
    is_reverse_scan,
    op_name,
    upstream,
)
from opforge.codegen.plan import OutArg, PlanOfParts, Unsupported, check_output
from opforge.codegen.symbolic import hint, operand, product, pysrc, same, shape_env_of, shape_of
from opforge.codegen.trace import AttrRef
from opforge.i18n import N_, Joined, Msg


class NeedsSecondPass(Unsupported):
    """A value needs finished column or full reductions (`cut`) for every row: one more kernel."""

    def __init__(self, ops: list[str], whys: list[str], cut: list, kinds: list[str]):
        super().__init__(ops, "; ".join(whys))
        self.cut = cut
        self.kinds = kinds  # "col" or "scalar": what each finished value depends on
        self.whys = whys


@dataclass
class Info:
    """What the kernel knows about one graph value."""

    dr: bool  # differs from row to row
    dc: bool  # differs from column to column
    ext: sympy.Expr | None  # number of valid columns (dc values): n_cols, or less after a slice
    level: int  # row reductions it depends on, nested
    post: str | None = None  # "scalar" | "col": only after column/full reductions, in the last program
    exact: bool = True
    scan: bool = False  # holds a scan: its value at a column depends on the row's other columns, so never moved


@dataclass
class RowInput:
    name: str
    placeholder: int
    full: bool  # read in full (rows and columns)
    layout: str  # flat | broadcast | row | col | scalar
    row_off: str  # element offset of a row, Python source over `rows` and the size symbols
    col_stride: int  # 1, or 0 when broadcast along the columns
    shape: list
    row_strided: bool = False  # rows may be evenly spaced further apart than n_cols (a slice of a wider tensor)
    col_off: str = "{c}"  # element offset within a row, Python source over the column index `{c}`


@dataclass
class RowReduction:
    node: torch.fx.Node
    kind: str  # sum | mean | max | min
    axis: str  # row | col | full
    source: torch.fx.Node
    count: str  # elements reduced per result, for mean
    slot: int = 0  # index among the kernel's col or full reductions
    online: RowReduction | None = None  # sum(exp(a - c)), c from max a: the max it rides with in one walk
    shift: torch.fx.Node | None = None  # with `online`: the c subtracted (the max itself in softmax)

    @property
    def name(self) -> str:
        return self.node.name


@dataclass
class RowPlan:
    name: str
    gm: torch.fx.GraphModule
    inputs: list[RowInput]
    outputs: list[OutArg]
    out_nodes: list
    attrs: list[str]
    info: dict
    reductions: list[RowReduction]
    n_rows: str
    n_cols: str
    symbols: dict  # graph symbol -> kernel/launcher name
    phases: int
    op_counts: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)  # graph symbol -> source reading it off an input
    input_names: list = field(default_factory=list)
    # full outputs of a walk in another order than the space's (a softmax over dim 1): name -> (row offset over
    # `rows`, column offset over `{c}`)
    stores: dict = field(default_factory=dict)
    scans: list = field(default_factory=list)  # scan nodes: each walk carries their running value chunk to chunk

    layout = "rows"

    @property
    def reverse(self) -> bool:
        """Its scans run backwards: every walk takes the row's chunks from the last one."""
        return any(is_reverse_scan(op_name(n.target)) for n in self.scans)

    @property
    def reduce_kinds(self) -> list[str]:
        return sorted({"sum" if r.kind == "mean" else r.kind for r in self.reductions if r.axis == "full"})

    @property
    def reduces_across_programs(self) -> bool:
        """Column or full reductions: programs meet through atomics or partials."""
        return bool(self.full_reductions or self.col_reductions)

    @property
    def column_sums(self) -> bool:
        """Column reductions: partial rows, then a kernel that adds them."""
        return bool(self.col_reductions)

    @property
    def kernels(self) -> list[RowPlan]:
        return [self]

    chained = False
    why = ()  # one kernel: nothing to explain

    @property
    def meets_at_ticket(self) -> bool:
        """Full reductions: the last program to take the ticket finishes them (column sums have a kernel)."""
        return bool(self.full_reductions)

    def phase_of(self, r: RowReduction) -> int:
        """The walk that reduces `r` when rows are walked in chunks: its source's depth, or its max's."""
        return self.info[(r.online or r).source].level

    @property
    def walks(self) -> int:
        """Walks over a row that does not fit one chunk: one per phase that reduces something, then the last
        one if it has tiles to store or to reduce down the columns or in full."""
        last = any(o.store == "full" for o in self.outputs) or bool(self.col_reductions) or \
            any(self.info[r.source].dc for r in self.full_reductions)
        return len({self.phase_of(r) for r in self.row_reductions}) + int(last)

    @property
    def splits_rows(self) -> bool:
        """Whether a row's columns may be shared by several programs (few long rows): its reductions all finish
        in the first walk and nothing is reduced across rows, so each program's partial row results meet in a
        first kernel's small buffer and the second walks its columns again to store."""
        return bool(self.row_reductions) and not self.full_reductions and not self.col_reductions and \
            not self.scans and not any(r.kind in INDEX_KINDS for r in self.row_reductions) and \
            all(self.phase_of(r) == 0 for r in self.row_reductions) and \
            all(o.store in ("full", "row") for o in self.outputs)

    @property
    def full_reductions(self) -> list[RowReduction]:
        return [r for r in self.reductions if r.axis == "full"]

    @property
    def col_reductions(self) -> list[RowReduction]:
        return [r for r in self.reductions if r.axis == "col"]

    @property
    def row_reductions(self) -> list[RowReduction]:
        return [r for r in self.reductions if r.axis == "row"]

    @property
    def body(self) -> list:  # statements, for summaries: every computing node
        return [n for n in self.info if n.op == "call_function" and OP_TABLE[op_name(n.target)].kind == POINTWISE]

    @property
    def epilogue(self) -> list:
        return [n for n, i in self.info.items() if i.post and n.op == "call_function"]


def _dims(dims, rank: int) -> list[int]:
    if dims is None or dims == []:
        return list(range(rank))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted(d % rank if rank else 0 for d in dims)


def plan_rows(name: str, gm: torch.fx.GraphModule, input_names: list[str], outputs: list[tuple[str, int]],
              output_like: dict[str, str | None], sym_names: dict) -> RowPlan:
    graph = gm.graph
    out_node = next(n for n in graph.nodes if n.op == "output")
    results = out_node.args[0] if isinstance(out_node.args[0], (tuple, list)) else (out_node.args[0],)
    wanted = [results[i] for _, i in outputs]
    bad = [op_name(n.target) for n in graph.nodes if n.op == "call_function" and op_name(n.target) not in OP_TABLE]
    if bad:
        raise Unsupported(sorted(set(bad)), "no Triton lowering for")

    p = _RowPlanner(gm, input_names, sym_names, wanted)
    if p.conflict:
        raise _conflict(p.conflict, wanted)
    p.classify()
    if p.cuts:
        raise NeedsSecondPass(sorted({_where(n) for n in p.cuts}), p.cut_why, p.cuts, p.cut_kinds)
    reductions, info = p.reductions, p.info
    for kind_ in ("col", "full"):
        for k, r in enumerate(r for r in reductions if r.axis == kind_):
            r.slot = k
    if len({is_reverse_scan(op_name(n.target)) for n in p.scans}) > 1:
        _scans_apart(p.scans)
    outs = [p.output_arg(oname, node, output_like.get(oname)) for (oname, _), node in zip(outputs, wanted)]
    attrs = _attr_names(info)
    phases = max([info[r.node].level for r in reductions if r.axis == "row"], default=0)
    _pair_online(reductions, info)
    return RowPlan(name, gm, p.inputs, outs, wanted, attrs, info, reductions, pysrc(p.R, sym_names),
                   pysrc(p.C, sym_names), sym_names, phases, p.counts, input_names=list(input_names),
                   stores=p.stores, scans=p.scans)


def _scans_apart(scans: list) -> None:
    """A row walked one way cannot also be walked the other: the scans of one direction are finished first,
    whole rows handed to the next kernel, which runs the others (cumprod's gradient: the zeros counted and the
    products taken forward, the product rule's sum backward). Those of the direction that reads nothing of the
    other's go first."""
    forward = [n for n in scans if not is_reverse_scan(op_name(n.target))]
    reverse = [n for n in scans if is_reverse_scan(op_name(n.target))]
    for first, then in ((forward, reverse), (reverse, forward)):
        if not upstream(first) & set(then):
            why = [Msg(N_("scans run forward and backward in one pass: the reverse scans first ({node})")
                         if first is reverse else
                         N_("scans run forward and backward in one pass: the scans first ({node})"), node=n.name)
                   for n in first]
            raise NeedsSecondPass([op_name(n.target) for n in first], why, first, ["row"] * len(first))
    raise Unsupported(sorted({op_name(n.target) for n in scans}), "scans forward and backward, each reading the other")


def _is_tensor(n) -> bool:
    return isinstance(n.meta.get("val"), torch.Tensor)


def _where(n) -> str:
    """What to name a node by in a refusal: its op, or its own name for an input."""
    return op_name(n.target) if n.op == "call_function" else n.name


def _sizes_only(node) -> bool:
    """An input the graph reads only the sizes of (a glue graph's weight, for its head count): no load."""
    return node.op == "placeholder" and bool(node.users) and all(
        u.op == "call_function" and op_name(u.target) == "aten.sym_size.int" for u in node.users)


def _iteration_space(graph: torch.fx.Graph, needed, env) -> list:
    """The shape of the largest needed value (most dimensions among equals); its last dim is the columns."""
    # a stack's shape is not a layout: the view that flattens it into the row is
    tensors = [n for n in graph.nodes if n in needed and _is_tensor(n) and not _sizes_only(n)
               and not (n.op == "call_function" and op_name(n.target) == "aten.stack.default")]
    big = max(tensors, key=lambda n: (_hint_numel(n, env), len(n.meta["val"].shape)))
    return shape_of(big, env) or [sympy.Integer(1)]


def _layout(graph: torch.fx.Graph, needed, space: list, env) -> tuple[tuple, int, list]:
    """The order the kernel walks the space's dimensions in, and how many of them (the first `split`) are the
    rows; the rest are the columns. Each reduction of a value at the space's shape is a row reduction when its
    dimensions are walked last (a mean over H and W, a LayerNorm over (C, H, W), a sum over dim 1 of (B, D1,
    D2)), or, a sum, a column reduction when they are walked first (a norm's weight gradient); the layout all
    of them accept with the most row reductions wins, the space's own order among equals. Inputs are read
    through their strides in that order. Slices and column indices move along the last dimension only.
    Where no layout suits every reduction, the third result lists each reduction with the layouts it accepts
    (see `_conflict`); otherwise it is empty."""
    n, one = len(space), sympy.Integer(1)
    identity = tuple(range(n))
    options = []  # per reduction (or scan): {layout: whether it is a row reduction there}
    owners = []  # the reduction (or scan) of each entry of `options`
    spreads = []  # spreads over other than trailing dimensions: their layout only where no reduction decides
    for node in graph.nodes:
        if node not in needed or node.op != "call_function":
            continue
        rule = OP_TABLE.get(op_name(node.target))
        if rule is not None and rule.kind in (SHIFT, COLUMN):
            return identity, n - 1, []
        trivial = {d for d in range(n) if same(space[d], one, env)}
        if op_name(node.target) == "aten.expand.default" and len(shape_of(node, env)) == n:
            # a per-row value spread over the dimensions a reduction took (the gradient of a mean over H and W
            # as the space lies; of a sum over dim 1 walked last, where nothing else decides)
            src = shape_of(node.args[0], env)
            ones = {d for d in range(len(src)) if same(src[d], one, env)} - trivial if len(src) == n else set()
            if ones and not set(range(n)) - trivial <= ones:
                spread = _canonical([d for d in range(n) if d not in ones], sorted(ones), trivial)
                (options if spread[0] == identity else spreads).append({spread: False})
            continue
        if rule is None or rule.kind not in (REDUCTION, SCAN) or not isinstance(node.args[0], torch.fx.Node):
            continue
        shape = shape_of(node.args[0], env)
        if rule.kind == SCAN:  # the scanned dimension alone is the columns
            if len(shape) == n and all(same(d, s, env) for d, s in zip(shape, space)) and \
                    node.args[1] % n not in trivial:
                options.append({_canonical([d for d in range(n) if d != node.args[1] % n], [node.args[1] % n],
                                           trivial): True})
                owners.append(node)
            continue
        if len(shape) != n or not all(same(d, s, env) for d, s in zip(shape, space)):
            continue
        dims = set(_dims(node.args[1] if len(node.args) > 1 else None, n)) - trivial
        if not dims or len(dims | trivial) == n:
            continue  # nothing reduced, or everything: any layout does
        kept = [d for d in range(n) if d not in dims]
        found = {_canonical(kept, sorted(dims), trivial): True}  # the reduced dimensions walked last: rows
        if REDUCE_KIND[op_name(node.target)] in ("sum", "mean"):  # or first, summed down the columns
            found.setdefault(_canonical(sorted(dims), kept, trivial), False)
        options.append(found)
        owners.append(node)
    common = set.intersection(*(set(o) for o in options or spreads)) if options or spreads else set()
    if not common:
        return identity, n - 1, list(zip(owners, options)) if len(options) > 1 else []
    # the space's own order where it does (sums down its columns spread over every program), else the one
    # with the most row reductions (a walk in one kernel, not a chain)
    return *max(sorted(common), key=lambda lay: (lay[0] == identity, sum(o[lay] for o in options or spreads))), []


class NeedsApart(Unsupported):
    """The outputs need reductions that no one walk order suits (an instance norm's input gradient reduces each
    sample's channel over H and W, its weight gradient each channel over N, H and W): each group of outputs,
    `groups` of their positions, is planned apart, its own kernels walking its own order."""

    def __init__(self, ops: list[str], why: str, groups: list[list[int]]):
        super().__init__(ops, why)
        self.groups = groups


def _conflict(reductions: list, wanted: list) -> Unsupported:
    """What to do when no walk order suits every reduction (`_layout`'s list of each reduction with the layouts
    it accepts): the reductions that feed one that is walked in other orders are finished first, by a kernel of
    their own, and handed over one value per row (an instance norm's mean and variance, which its weight gradient
    reads); failing that, the outputs are planned apart in groups whose reductions share an order."""
    ops = sorted({_where(r) for r, _ in reductions})
    first = [a for a, oa in reductions
             if any(b is not a and not set(oa) & set(ob) and a in upstream([b.args[0]]) for b, ob in reductions)]
    if first:
        return NeedsSecondPass(ops, [Msg(N_("{node} is reduced in another order than a reduction that reads it"),
                                           node=a.name) for a in first], first, ["row"] * len(first))
    groups: list = []  # [layouts the group's reductions share, positions of its outputs]
    for k, node in enumerate(wanted):
        up = upstream([node])
        mine = [set(o) for r, o in reductions if r in up]
        lays = set.intersection(*mine) if mine else None
        if lays is not None and not lays:
            return Unsupported(ops, f"{node.name} needs reductions that no one walk order suits")
        for g in groups:
            if lays is None or g[0] is None or lays & g[0]:
                g[0] = lays if g[0] is None else (g[0] if lays is None else lays & g[0])
                g[1].append(k)
                break
        else:
            groups.append([lays, [k]])
    if len(groups) < 2:
        return Unsupported(ops, "no one walk order suits every reduction")
    return NeedsApart(ops, Msg(N_("the outputs need reductions that no one walk order suits")),
                      [g[1] for g in groups])


def _canonical(rows: list, cols: list, trivial: set) -> tuple:
    """The layout walking `rows` then `cols`, each in the space's order, with the size-1 dimensions (walked by
    nobody) moved to keep the space's own order where they can: (0, 2, 1) with dimension 1 of size 1 is the
    identity."""
    rows, cols = [d for d in rows if d not in trivial], [d for d in cols if d not in trivial]
    for d in sorted(trivial):
        (rows if not cols or d < min(cols) else cols).append(d)
    rows, cols = sorted(rows), sorted(cols)
    return tuple(rows + cols), len(rows)


def _dense_strides(shape: list) -> list:
    strides, acc = [], sympy.Integer(1)
    for d in shape[::-1]:
        strides.append(acc)
        acc = acc * d
    return strides[::-1]


def _reshaped(node, env) -> list | None:
    """The shape an input is read at when nothing reads it but chains of reshapes that all end at one shape
    (a weight of C values viewed as (C, 1, 1)), which keep its flat order; else None."""
    users = [u for u in node.users if u.op == "call_function" and op_name(u.target) != "aten.sym_size.int"]
    if not users or any(op_name(u.target) not in _RESHAPES for u in users):
        return None
    ends = [_reshaped(u, env) or shape_of(u, env) for u in users]
    return ends[0] if all(len(e) == len(ends[0]) and all(same(a, b, env) for a, b in zip(e, ends[0]))
                          for e in ends) else None


_RESHAPES = {"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.unsqueeze.default",
             "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.detach.default",
             "aten.alias.default", "aten.clone.default"}


def _offset_terms(shape: list, strides: list, space: list, dims: range, index: str, env, names: dict) -> list[str]:
    """An input's offset along some walked dimensions (`dims` of the walked space: the rows', or the columns'),
    as terms to add: for each run of them it does not broadcast along and holds densely (one coordinate, as
    `rows` is for a (N, G, 1) scale on (N, G, 64)), the index's coordinate there times the input's stride.
    `shape` and `strides` are the input's, in the walked order; the outermost dimension needs no modulo (the
    index stays below the product of their extents)."""
    terms, inner, one = [], sympy.Integer(1), sympy.Integer(1)
    run = None  # [inner extent below the run, the run's stride, its extent, whether it reaches the last dim]

    def close():
        if run is not None:
            low, stride, extent, outer = run
            coord = index if low == 1 else f"({index} // {operand(pysrc(low, names))})"
            coord = coord if outer else f"({coord} % {operand(pysrc(extent, names))})"
            terms.append(coord if stride == 1 else f"{coord} * {operand(pysrc(stride, names))}")

    for k in reversed(dims):
        if same(space[k], one, env):
            continue  # walked by nobody: the run goes on past it
        if same(shape[k], one, env):  # broadcast along k
            close()
            run = None
        elif run is not None and same(strides[k], run[1] * run[2], env):
            run[2] = run[2] * space[k]
        else:
            close()
            run = [inner, strides[k], space[k], False]
        inner = inner * space[k]
        if run is not None:
            run[3] = all(same(space[j], one, env) for j in dims if j < k)
    close()
    return terms


def _attr_names(info: dict) -> list[str]:
    """The graph attributes (AttrRef) the computing nodes read, in first-use order."""
    attrs = []
    for n in info:
        for a in list(n.args) + list(n.kwargs.values()) if n.op == "call_function" else []:
            for x in (a if isinstance(a, (list, tuple)) else [a]):
                if isinstance(x, AttrRef) and x.name not in attrs:
                    attrs.append(x.name)
    return attrs


def _unit(size) -> bool:
    """A dimension of size one by its expression (the trace is retaken where a derived size is 1 by chance)."""
    return sympy.sympify(size) == 1


class _RowPlanner:
    """One walk over the needed nodes of a graph, in order: what the row kernel knows of each value (`info`),
    the inputs it reads, the reductions it runs, and the finished values a later kernel must be handed (`cuts`)."""

    def __init__(self, gm: torch.fx.GraphModule, input_names: list[str], sym_names: dict, wanted: list):
        self.graph = gm.graph
        self.env = shape_env_of(gm)
        self.input_names = input_names
        self.sym_names = sym_names
        self.wanted = wanted  # the outputs' nodes, in order
        self.needed = upstream(wanted)
        self.placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        self.space = _iteration_space(self.graph, self.needed, self.env)
        self.perm, self.split, self.conflict = _layout(self.graph, self.needed, self.space, self.env)
        self.walked = [self.space[j] for j in self.perm]  # the space in the order the kernel walks it
        self.R, self.C = product(self.walked[:self.split]), product(self.walked[self.split:])
        self.stores: dict = {}  # full outputs of a reordered walk: name -> (row offset, column offset)
        self.info: dict = {}
        self.inputs: list[RowInput] = []
        self.reductions: list[RowReduction] = []
        self.scans: list = []
        self.read_reshaped: set = set()  # inputs mapped at the shape their reshapes give them
        self.counts: dict = {}  # op -> how many nodes call it
        self.cuts: list = []  # finished values a later kernel must be handed, with what they depend on
        self.cut_kinds: list[str] = []
        self.cut_why: list[str] = []

    def classify(self) -> None:
        for node in self.graph.nodes:
            if node not in self.needed:
                continue
            if node.op == "placeholder" and not _sizes_only(node):
                self.add_input(node)
            elif node.op == "call_function":
                self.info[node] = self.call_info(node)

    # inputs

    def add_input(self, node) -> None:
        pname = self.input_names[self.placeholders.index(node)]
        if not _is_tensor(node):
            raise Unsupported([], f"input {pname} is not a tensor")
        m = self.map_input(node, pname)
        dc = m.col_stride == 1
        narrow = dc and m.layout != "flat" and (self.perm, self.split) == (tuple(range(len(self.space))),
                                                                           len(self.space) - 1) and \
            not same(m.shape[-1], self.C, self.env)
        self.info[node] = Info(m.layout in ("flat", "broadcast", "row"), dc,
                               (m.shape[-1] if narrow else self.C) if dc else None, 0)
        self.inputs.append(replace(m, shape=shape_of(node, self.env)))  # the launcher checks its own shape

    def map_input(self, node, pname: str) -> RowInput:
        """How an input lies on the iteration space: one value, a broadcast, or by its numel in flat order."""
        env, space, R, C = self.env, self.space, self.R, self.C
        own = shape_of(node, env)
        shape = _reshaped(node, env) or own
        if shape is not own:
            self.read_reshaped.add(node)
        viewed = len(shape) != len(own) or not all(same(a, b, env) for a, b in zip(shape, own))
        numel = product(shape)
        i = self.placeholders.index(node)
        if same(numel, sympy.Integer(1), env):
            return RowInput(pname, i, False, "scalar", "0", 0, shape)
        # right-aligned broadcast, as torch does it
        if len(shape) <= len(space) and all(same(d, s, env) or same(d, sympy.Integer(1), env)
                                            for d, s in zip(shape[::-1], space[::-1])):
            return self.broadcast_input(pname, i, shape, viewed)
        if self.perm != tuple(range(len(space))):
            walked = [self.walked[:self.split], self.walked[self.split:]]
            for layout, part in (("row", walked[0]), ("col", walked[1])):  # one value per row, or per column
                part = [d for d in part if not same(d, sympy.Integer(1), env)]
                if [str(d) for d in shape if not same(d, sympy.Integer(1), env)] == [str(d) for d in part]:
                    return RowInput(pname, i, False, layout, "rows" if layout == "row" else "0", int(layout == "col"),
                                    shape)
            raise Unsupported([], f"input {pname} of shape {[str(d) for d in shape]} does not broadcast onto the "
                                  f"space {[str(d) for d in space]}, which the kernel walks in another order")
        if same(numel, R * C, env):
            return RowInput(pname, i, True, "flat", "rows * n_cols", 1, shape)
        if same(numel, R, env):
            return RowInput(pname, i, False, "row", "rows", 0, shape)
        if same(numel, C, env):
            return RowInput(pname, i, False, "col", "0", 1, shape)
        fits = [same(d, s, env) or same(d, sympy.Integer(1), env) for d, s in zip(shape[::-1], space[::-1])]
        if shape and len(shape) <= len(space) and self.split == len(space) - 1 and all(fits[1:]):
            # narrower rows that broadcast onto the space (cos and sin of GPT-J's pairs, each half the row):
            # read only at the columns a slice or an interleave moves them to
            return self.broadcast_input(pname, i, shape)
        rows = space[:self.split]
        if len(shape) <= len(rows) and all(same(d, s, env) or same(d, sympy.Integer(1), env)
                                           for d, s in zip(shape[::-1], rows[::-1])):
            # a broadcast onto the rows alone (a per-channel scale of a mean over H and W): one value per row
            return self.broadcast_input(pname, i, shape + [sympy.Integer(1)] * (len(space) - self.split))
        raise Unsupported([], f"input {pname} of shape {[str(d) for d in shape]} does not map onto the iteration "
                              f"space {[str(d) for d in space]} (not a broadcast, nor one value per row or column)")

    def broadcast_input(self, pname: str, i: int, shape: list, viewed: bool = False) -> RowInput:
        """An input that broadcasts onto the space: it differs by row where its row offset has terms, by column
        where its column offset has. `viewed`: `shape` is a reshape of the input's own (rows of another stride)."""
        env, n, split = self.env, len(self.space), self.split
        row_off, col_off = self.offsets(shape)
        dr, col = row_off != "0", col_off != "0"
        whole = len(shape) == n and all(same(d, s, env) for d, s in zip(shape, self.space))
        if whole and split == n - 1 and self.perm == tuple(range(n)) and not viewed:
            # the iteration space itself: rows one stride apart, so a row-strided view needs no copy
            return RowInput(pname, i, True, "flat", f"rows * {pname}_row_stride", 1, shape, True)
        layout = "flat" if whole else "broadcast" if dr and col else ("row" if dr else ("col" if col else "scalar"))
        return RowInput(pname, i, dr and col, layout, row_off, int(col), shape, col_off=col_off)

    def offsets(self, shape: list) -> tuple[str, str]:
        """(row offset over `rows`, column offset over `{c}`) of a dense tensor of `shape`, right-aligned on the
        space as torch broadcasts it."""
        n = len(self.space)
        full = [sympy.Integer(1)] * (n - len(shape)) + list(shape)
        strides = _dense_strides(full)
        walked, strides = [full[j] for j in self.perm], [strides[j] for j in self.perm]
        rows = _offset_terms(walked, strides, self.walked, range(self.split), "rows", self.env, self.sym_names)
        cols = _offset_terms(walked, strides, self.walked, range(self.split, n), "{c}", self.env, self.sym_names)
        return " + ".join(rows) or "0", " + ".join(cols) or "0"

    # computed values

    def call_info(self, node) -> Info:
        key = op_name(node.target)
        rule = OP_TABLE[key]
        self.counts[key] = self.counts.get(key, 0) + 1
        if rule.kind in (SYMBOLIC, CONSTANT):
            return Info(False, False, None, 0)
        if rule.kind == COLUMN:
            return self.column_index(node, key)
        if rule.kind == VIEW:
            # views keep the flat order, so a value stays at its (row, column); slices and reductions of a
            # view whose last dimensions no longer span one row are refused where they happen. A walk in
            # another order has no flat order: only what is not a whole tile may be viewed
            src = self.info[node.args[0]]
            if src.dr and src.dc and self.perm != tuple(range(len(self.space))) and \
                    shape_of(node, self.env) != shape_of(node.args[0], self.env) and \
                    _unviewed(node) not in self.read_reshaped:  # an input's reshape: it is read at that shape
                raise Unsupported([key], f"{node.name} reshapes a value the kernel walks in another order")
            return src
        if rule.kind == SHIFT:
            for src in [s for s in node.all_input_nodes if s in self.info and self.info[s].scan]:
                # a scan's column is known only where the walk is: a later kernel reads it moved, from memory
                self.cut(src, "row", Msg(N_("{node} moves the columns of a scan"), node=node.name))
                self.info[src].scan = False
            return _shift_info(node, key, self.info, self.env, self.combine)
        if rule.kind == REDUCTION:
            return self.reduction(node, key)
        if rule.kind == SCAN:
            return self.scan(node, key)
        return self.combine(node, [s for s in node.all_input_nodes if s in self.info], rule.exact)

    def scan(self, node, key: str) -> Info:
        """A running sum, product or log-sum-exp along the columns: computed chunk by chunk in the row's order,
        each chunk starting from the combined total of the chunks before it."""
        src = node.args[0]
        si = self.info[src]
        shape = shape_of(src, self.env)
        dim = node.args[1] % len(shape)
        cdims = [d for d in self.col_dims(src)[0] if not _unit(shape[d])]
        if not si.dc or si.post or cdims != [dim]:
            raise Unsupported([key], f"{node.name} scans along dimension {dim}, which is not alone the row the "
                                     "kernel walks")
        self.scans.append(node)
        return replace(si, exact=False, scan=True)

    def column_index(self, node, key: str) -> Info:
        """arange over a row: the column index."""
        start = node.args[0] if key == "aten.arange.start" else 0
        width = shape_of(node, self.env)[-1]
        widths = (self.C, *[i.ext for i in self.info.values() if i.dc])
        if start != 0 or not any(same(width, e, self.env) for e in widths):
            raise Unsupported([key], f"{node.name} is not the column index of a row (arange from 0 over it)")
        return Info(False, True, width, 0)

    def combine(self, node, srcs, exact=True, same_width=True) -> Info:
        """A value computed elementwise from `srcs`: it differs by row or column where any of them does."""
        info = self.info
        dr = any(info[s].dr for s in srcs)
        dc = any(info[s].dc for s in srcs)
        exts = [info[s].ext for s in srcs if info[s].dc]
        for e in exts[1:] if same_width else []:
            if not same(e, exts[0], self.env):
                raise Unsupported([_where(node)], f"{node.name} combines values of {exts[0]} and {e} columns")
        if dr:  # finished values needed for every row: hand them to a later kernel, as if inputs of it
            for s in srcs:
                if info[s].post:
                    self.hand_over(s, node, Msg(N_("{node} needs a finished column or full reduction for every row"),
                                                  node=node.name))
        posts = [info[s].post for s in srcs if info[s].post]
        post = None
        if posts:
            post = "col" if dc else "scalar"
        return Info(dr, dc, exts[0] if exts else None, max((info[s].level for s in srcs), default=0), post,
                    exact and all(info[s].exact for s in srcs), any(info[s].scan for s in srcs))

    # reductions

    def reduction(self, node, key: str) -> Info:
        """A sum, mean, max or min: along the rows' columns (one more phase), down the columns, or in full."""
        src = node.args[0]
        si = self.info[src]
        shape = shape_of(src, self.env)
        try:
            dims, red_r, red_c = self.reduced_dims(node, key, src, shape)
        except Unsupported:
            if si.dr and not si.dc:  # per-row values reduced across some of the rows: another walk's work
                raise self.across_rows(node, key, src) from None
            raise
        if si.post:
            self.hand_over(src, node, Msg(N_("{node} reduces a value that needs a finished reduction"),
                                            node=node.name))
        kind = REDUCE_KIND[key]
        if not dims:  # nothing non-trivial reduced: a view
            return si
        if kind in ROW_ONLY_KINDS and not (red_c and not red_r and si.dr):
            what = "indices are found" if kind in INDEX_KINDS else "products are taken"
            raise Unsupported([key], f"{node.name}: {what} along the rows only")
        if red_c and not red_r and si.dr:  # an index is exact where its values are
            axis, new = "row", Info(True, False, None, si.level + 1, None, kind in INDEX_KINDS and si.exact)
        elif red_r and not red_c and si.dc:
            if kind not in ("sum", "mean"):
                raise Unsupported([key], f"{node.name}: column reductions are sums or means")
            axis, new = "col", Info(False, True, si.ext, si.level, "col", False)
        else:
            axis, new = "full", Info(False, False, None, si.level, "scalar", kind in ("max", "min") and si.exact)
        count = pysrc(product([shape[d] for d in dims]), self.sym_names)
        self.reductions.append(RowReduction(node, kind, axis, src, count))
        return new

    def across_rows(self, node, key: str, src) -> Unsupported:
        """`node` reduces per-row values across rows (a per-channel weight's gradient after a mean over H and W
        sums them over the samples): the row reductions they come from are finished first and handed over,
        one value per row; then the outputs that need `node` are planned apart, over the space of those
        values, where the sum runs down their columns."""
        rows = [r.node for r in self.reductions if r.axis == "row" and r.node in upstream([src])]
        if rows:
            return NeedsSecondPass([key], [Msg(N_("{node} reduces per-row values across rows ({reduction})"),
                                                 node=node.name, reduction=r.name) for r in rows],
                                   rows, ["row"] * len(rows))
        mine = [k for k, o in enumerate(self.wanted) if node in upstream([o])]
        rest = [k for k in range(len(self.wanted)) if k not in mine]
        if rest:
            return NeedsApart([key], Msg(N_("{node} reduces per-row values across rows"), node=node.name),
                              [rest, mine])
        return Unsupported([key], f"{node.name} reduces per-row values across only some of their rows")

    def reduced_dims(self, node, key: str, src, shape: list) -> tuple[list[int], bool, bool]:
        """The non-trivial dims `node` reduces, and whether they include the rows' and the columns' dims."""
        cdims, rdims = self.col_dims(src)
        dims = _dims(node.args[1] if len(node.args) > 1 else None, len(shape))
        dims = [d for d in dims if not _unit(shape[d])]
        red_c = bool(set(dims) & set(cdims))
        red_r = bool(set(dims) & set(rdims))
        if (red_c and not set(cdims) <= set(dims)) or (red_r and not set(rdims) <= set(dims)) or \
                not set(dims) <= set(cdims) | set(rdims):
            raise Unsupported([key], f"{node.name} reduces only some of the dimensions of its rows or columns "
                                     "(whole rows, whole columns or everything fuse)")
        return dims, red_r, red_c

    def col_dims(self, node) -> tuple[list[int], list[int]]:
        """Dims of a value's shape that run along the columns, and the non-trivial ones along the rows."""
        shape = shape_of(node, self.env)
        i = self.info[node]
        pad = len(self.space) - len(shape)
        if self.perm != tuple(range(len(self.space))) and pad >= 0:  # right-aligned on the space, walked in order
            cdims = sorted(j - pad for j in self.perm[self.split:] if j >= pad) if i.dc else []
            rdims = [j - pad for j in self.perm[:self.split] if j >= pad and not _unit(shape[j - pad])]
            return cdims, rdims if i.dr else []
        split = len(shape)
        if i.dc:
            split = None
            for k in range(len(shape) - 1, -1, -1):
                if same(product(shape[k:]), i.ext, self.env):
                    split = k
                    break
            if split is None:
                raise Unsupported([_where(node)], f"{node.name}: its last dimensions do not line up with the rows")
        rdims = [k for k in range(split) if not _unit(shape[k])] if i.dr else []
        return list(range(split, len(shape))), rdims

    # finished values a later kernel needs

    def hand_over(self, src, user, why: str) -> None:
        info = self.info
        root = self.unviewed(src)
        self.cut(root, info[root].post, why)
        info[src].post = None  # shared by the views of root: from here on it reads like an input
        info[root].post = None
        info[src].level = info[root].level = 0

    def cut(self, node, kind: str, why: str) -> None:
        """Hand `node` to a later kernel, finished (`kind`: what it depends on, and the shape it is handed in)."""
        if node not in self.cuts:
            self.cuts.append(node)
            self.cut_kinds.append(kind)
            self.cut_why.append(Msg(N_("{why} ({node})"), why=why, node=node.name))

    def unviewed(self, n):
        """A finished value before the views that broadcast it: what a later kernel should be handed."""
        while n.op == "call_function" and OP_TABLE[op_name(n.target)].kind == VIEW and self.info[n.args[0]].post:
            n = n.args[0]
        return n

    # outputs

    def output_arg(self, oname: str, node, like: str | None) -> OutArg:
        """How an output is stored: one value, a row of columns, one value per row, or in full."""
        check_output(oname, node)
        env, R, C = self.env, self.R, self.C
        i = self.info[node]
        shape = shape_of(node, env)
        numel = product(shape)
        if i.post == "scalar" or (not i.dr and not i.dc and same(numel, sympy.Integer(1), env)):
            store = "scalar"
        elif i.post == "col" or (not i.dr and same(numel, C, env)):
            store = "col"
        elif i.dc and i.dr and same(numel, R * i.ext, env):
            store = "full"
        elif same(numel, R * C, env):
            store = "full"
        elif i.dr and not i.dc and same(numel, R, env):
            store = "row"
        else:
            raise Unsupported([], f"output {oname} of shape {[str(d) for d in shape]} does not map onto the "
                                  f"iteration space {[str(d) for d in self.space]}")
        if store == "full" and self.perm != tuple(range(len(self.space))):
            self.stores[oname] = self.offsets(shape)
        return OutArg(oname, node.name, store == "full", store in ("scalar", "col") and bool(i.post),
                      shape, like, i.exact, True, store)


def _unviewed(n):
    while isinstance(n, torch.fx.Node) and n.op == "call_function" and OP_TABLE[op_name(n.target)].kind == VIEW:
        n = n.args[0]
    return n


def _pair_online(reductions: list[RowReduction], info: dict) -> None:
    """Mark each row sum of exp(a - c) with max(a) when the shift c is the max or follows from it through
    per-row elementwise ops (logsumexp's where(|max| == inf, 0, max)): a looped row then accumulates both in
    one walk, rescaling the running sum by exp(old max - new max) (online softmax), and meets c after it."""
    maxes = {r.node: r for r in reductions if r.axis == "row" and r.kind == "max"}
    for r in reductions:
        if r.axis != "row" or r.kind != "sum":
            continue
        e = _unviewed(r.source)
        if not (e.op == "call_function" and op_name(e.target) == "aten.exp.default"):
            continue
        t = _unviewed(e.args[0])
        if not (t.op == "call_function" and op_name(t.target) == "aten.sub.Tensor" and len(t.args) == 2
                and isinstance(t.args[1], torch.fx.Node)):
            continue
        m = _max_behind(t.args[1], maxes, info)
        if m is not None and _unviewed(m.source) is _unviewed(t.args[0]):
            r.online, r.shift = m, t.args[1]


_ROW_KINDS = (POINTWISE, VIEW, CONSTANT, SYMBOLIC)


def _max_behind(c, maxes: dict, info: dict) -> RowReduction | None:
    """The row max that per-row value `c` is computed from, if c needs nothing else a walk finds: no other
    reduction, nothing that differs by column, so c is known as soon as the max's walk ends."""
    found, seen, todo = None, set(), [c]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in maxes:
            if found is not None and found is not maxes[n]:
                return None
            found = maxes[n]
            continue
        i = info.get(n)
        if i is None or i.dc or i.post:
            return None
        if n.op == "call_function":
            if OP_TABLE[op_name(n.target)].kind not in _ROW_KINDS:
                return None
            todo += n.all_input_nodes
        elif n.op != "placeholder":
            return None
    return found


def _hint_numel(node, env) -> int:
    return hint(product(shape_of(node, env)), env) or 0


def _shift_info(node, key, info, env, combine) -> Info:
    """slice / cat / slice_backward / stack along the last dimension: the same rows, other columns."""
    rank = len(node.meta["val"].shape)
    if key == "aten.cat.default":
        parts, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
        # a part the same at every column takes one (an exclusive scan's leading zero)
        if dim % rank != rank - 1 or not all(info[p].dc or same(shape_of(p, env)[-1], 1, env) for p in parts):
            raise Unsupported([key], f"{node.name} concatenates along a dimension other than the last")
        i = combine(node, parts, same_width=False)  # parts differ in width by design
        i.ext = product(shape_of(node, env)[-1:])
        return i
    if key == "aten.stack.default":
        return _interleave_info(node, key, info, env, combine)
    src = node.args[0]
    dim = node.args[2 if key == "aten.slice_backward.default" else 1] if len(node.args) > 1 else 0
    step = node.args[5] if key == "aten.slice_backward.default" and len(node.args) > 5 else \
        (node.args[4] if len(node.args) > 4 else 1)
    if dim % rank != rank - 1 or not isinstance(step, int) or not info[src].dc:
        raise Unsupported([key], f"{node.name} slices a dimension other than the last, or by a size-dependent step")
    old = shape_of(src, env)
    if not same(old[-1], info[src].ext, env):
        raise Unsupported([key], f"{node.name} slices a value whose last dimension is not its row")
    i = combine(node, [src])
    i.ext = shape_of(node, env)[-1]
    return i


def _interleave_info(node, key, info, env, combine) -> Info:
    """stack(parts, -1) flattened into the row by its views (GPT-J's rotary pairs): column c of the row is
    column c // m of part c % m, so the row is m times as wide as each part."""
    parts, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
    shape = shape_of(node, env)
    rank = len(shape)
    flat = [*shape[:-2], shape[-2] * shape[-1]]

    def flattens(u) -> bool:  # an output is stored in flat order, which is the flattened row's
        return u.op == "output" or OP_TABLE[op_name(u.target)].kind == VIEW and len(shape_of(u, env)) == rank - 1 \
            and all(same(a, b, env) for a, b in zip(shape_of(u, env), flat))

    if dim % rank != rank - 1 or not all(info[p].dc for p in parts) or not all(map(flattens, node.users)):
        raise Unsupported([key], f"{node.name} stacks along a dimension other than a new last one that a view "
                                 "flattens into the row")
    i = combine(node, parts)
    i.ext = flat[-1]
    return i


@dataclass
class ChainPlan(PlanOfParts):
    """Several row kernels for one pass: each earlier kernel finishes reductions a later one needs for every
    row, and hands them over in float32 buffers (`temps`)."""

    name: str
    kernels: list[RowPlan]
    why: list[str]
    temps: list[str]
    dims: dict = field(default_factory=dict)
    results: list[str] | None = None  # the pass's outputs in order, where kernels other than the last store some

    layout = "rows"
    chained = True

    @property
    def walks(self) -> int:
        return sum(k.walks for k in self.kernels)

    @property
    def inputs(self):
        seen, out = set(), []
        for k in self.kernels:
            for a in k.inputs:
                if a.name not in seen and a.name not in self.temps:
                    seen.add(a.name)
                    out.append(a)
        return out

    @property
    def outputs(self):
        if self.results is None:
            return self.kernels[-1].outputs
        stored = {o.name: o for k in self.kernels for o in k.outputs}
        return [stored[r] for r in self.results]

    @property
    def attrs(self):
        return list(dict.fromkeys(a for k in self.kernels for a in k.attrs))

    @property
    def reductions(self):
        return [r for k in self.kernels for r in k.reductions]

    @property
    def body(self):
        return [n for k in self.kernels for n in k.body]

    @property
    def epilogue(self):
        return [n for k in self.kernels for n in k.epilogue]

    def _parts(self) -> list:
        return self.kernels


def _copy_graph(gm: torch.fx.GraphModule):
    g = torch.fx.Graph()
    env: dict = {}
    out = g.graph_copy(gm.graph, env)
    return g, env, out


def with_outputs(gm: torch.fx.GraphModule, nodes: list) -> torch.fx.GraphModule:
    """The same graph computing only `nodes`."""
    g, env, _ = _copy_graph(gm)  # graph_copy leaves the output node out
    g.output(tuple(env[n] for n in nodes))
    g.eliminate_dead_code()
    return torch.fx.GraphModule(gm, g)


def _handed_shape(shape, kind: str) -> list:
    """The shape a finished value is handed over in: one row of columns, one value per row (a saved
    statistic), or one value (broadcast later)."""
    shape = list(shape)
    if kind == "row":
        return shape
    return [1] * (len(shape) - 1) + shape[-1:] if kind == "col" and shape else [1] * len(shape)


def cut_at(gm: torch.fx.GraphModule, nodes: list, names: list[str], kinds: list[str]) -> torch.fx.GraphModule:
    """The same graph with `nodes` read from new inputs (after the existing ones) instead of computed."""
    g, env, out = _copy_graph(gm)
    g.output(out)
    last = [n for n in g.nodes if n.op == "placeholder"][-1]
    for node, name, kind in zip(nodes, names, kinds):
        with g.inserting_after(last):
            p = g.placeholder(name)
        val = node.meta["val"]
        p.meta = {"val": val.new_empty(_handed_shape(val.shape, kind))}
        env[node].replace_all_uses_with(p)
        last = p
    g.eliminate_dead_code()
    return torch.fx.GraphModule(gm, g)


MAX_CHAIN_DEPTH = 8  # each split hands over at least one finished value, so chains are short; this bounds a bug


def plan_chain(name: str, gm, input_names: list[str], outputs: list[tuple[str, int]], output_like: dict,
               sym_names: dict, depth: int = 0) -> RowPlan | ChainPlan:
    """One row kernel when it can be; otherwise the fewest kernels that respect the reductions: the values a
    later kernel needs finished are computed first, to float32 buffers."""
    try:
        return plan_rows(name, gm, input_names, outputs, output_like, sym_names)
    except NeedsApart as exc:
        if depth >= MAX_CHAIN_DEPTH:
            raise Unsupported(exc.ops, f"{exc.why}, {MAX_CHAIN_DEPTH} splits deep") from None
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        results = out_node.args[0] if isinstance(out_node.args[0], (tuple, list)) else (out_node.args[0],)
        parts = []
        for g, group in enumerate(exc.groups):
            mine = [outputs[k] for k in group]
            parts.append(plan_chain(f"{name}_{'abcdefgh'[g]}", with_outputs(gm, [results[i] for _, i in mine]),
                                    input_names, [(o, j) for j, (o, _) in enumerate(mine)], output_like, sym_names,
                                    depth + 1))
        why = [Msg(N_("{why}: {outputs} by kernel(s) {kernels}"), why=exc.why,
                     outputs=", ".join(o.name for o in p.outputs), kernels=", ".join(k.name for k in p.kernels))
               for p in parts]
        return ChainPlan(name, [k for p in parts for k in p.kernels], why + [w for p in parts for w in p.why],
                         [t for p in parts if p.chained for t in p.temps], results=[o for o, _ in outputs])
    except NeedsSecondPass as exc:
        if depth >= MAX_CHAIN_DEPTH:
            raise Unsupported(exc.ops, f"{exc.why}, {MAX_CHAIN_DEPTH} splits deep") from None
        # hand over every cut at once when one kernel can finish them all (a batch norm's column sums feed
        # each other only through finished values); otherwise first what needs no other handed-over value,
        # and the rest follows in a later split
        ready, first = list(range(len(exc.cut))), None
        try:
            first = plan_rows(f"{name}_a", with_outputs(gm, exc.cut), input_names,
                              [(f"{name}_r{i}", i) for i in ready], {}, sym_names)
        except Unsupported:
            ready = [i for i, c in enumerate(exc.cut) if not (upstream(c.all_input_nodes) & (set(exc.cut) - {c}))]
        exc.cut, exc.kinds = [exc.cut[i] for i in ready], [exc.kinds[i] for i in ready]
        reason = Joined("; ", (exc.whys[i] for i in ready))
        temps = [f"{name}_r{i}" for i in range(len(exc.cut))]
        if first is None:  # the ready cuts may need splits of their own
            first = plan_chain(f"{name}_a", with_outputs(gm, exc.cut), input_names,
                               list(zip(temps, range(len(temps)))), {}, sym_names, depth + 1)
        last_k = first.kernels[-1]
        for o, kind in zip(last_k.outputs, exc.kinds):  # allocated as handed over, not at the broadcast shape
            o.shape = _handed_shape(o.shape, kind)
        rest = plan_chain(f"{name}_b", cut_at(gm, exc.cut, temps, exc.kinds), input_names + temps, outputs,
                          output_like, sym_names, depth + 1)
        parts = [first, rest]
        kernels = [k for p in parts for k in p.kernels]
        why = [w for p in parts for w in p.why]
        why.insert(0, Msg(N_("{why}: kernel {first} finishes it, then {rest} reads {temps}") if len(exc.cut) == 1
                            else N_("{why}: kernel {first} finishes them, then {rest} reads {temps}"),
                            why=reason, first=first.name, rest=rest.name, temps=", ".join(temps)))
        subtemps = [t for p in parts if p.chained for t in p.temps]
        return ChainPlan(name, kernels, why, temps + subtemps, results=rest.results if rest.chained else None)
