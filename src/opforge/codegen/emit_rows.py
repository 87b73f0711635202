"""Triton source for row plans (codegen/rows.py): one kernel per pass and its launch wrapper.

Values are emitted on demand, where their dependencies put them: scalars at the top, per-row values
before the column loop that needs them, tiles inside it, post-reduction values in the last program.
"""

from __future__ import annotations

import re

import sympy
import torch

from opforge.codegen.across import finish, launch_setup, meet, slot_index
from opforge.codegen.ops import (
    COLUMN,
    CONSTANT,
    INDEX_KINDS,
    OP_TABLE,
    SCAN,
    SCAN_FORMS,
    SCAN_KIND,
    SHIFT,
    SYMBOLIC,
    VIEW,
    block_reduce,
    ieee_nodes,
    is_mask,
    is_reverse_scan,
    load_value,
    op_name,
    reduce_combine,
    upstream,
)
from opforge.codegen.ops import REDUCE_IDENTITY as _IDENTITY
from opforge.codegen.plan import _literal
from opforge.codegen.rows import RowPlan
from opforge.codegen.symbolic import (
    SYM_OPS,
    atoms,
    divisibility_checks,
    graph_shapes,
    operand,
    product,
    pysrc,
    real_src,
    shape_env_of,
    shape_of,
    tidy,
)
from opforge.codegen.trace import INDEX

# The host side of column sums, once per module that has them.
COLUMN_SUMS = '''

# Column sums: the row kernel runs about one program per SM (multiprocessor, AI core), each storing one float32
# row of partials; a second kernel adds the rows, COLUMN_BLOCK columns per program, PARTIAL_ROWS rows a step.
COLUMN_BLOCK = 64
PARTIAL_ROWS = 32


def _num_sms(device: torch.device) -> int:
    props = getattr(torch.get_device_module(device), "get_device_properties", None)  # torch.cuda, torch.npu...
    n = getattr(props(device), "multi_processor_count", 0) if props else 0
    return n or 4  # nothing to count (the interpreter on a CPU): a few programs, so that they still meet
'''

_KWARGS_DROPPED = ("pin_memory", "layout", "device", "memory_format")


class _Block:
    def __init__(self, indent: int, cols: bool, loop: bool = False):
        self.lines: list[str] = []
        self.pad = "    " * indent
        self.cols = cols  # inside a column loop: `cols` is defined
        self.cache: dict = {}
        self.exprs: dict = {}
        # the body of a walk over a row's chunks: the running values its scans carry from chunk to chunk,
        # initialised before the loop
        self.carries: list[str] | None = [] if loop else None

    def add(self, line: str) -> None:
        self.lines.append(self.pad + line)


class _Emitter:
    def __init__(self, plan: RowPlan):
        self.p = plan
        self.env = shape_env_of(plan.gm)
        self.inputs = {plan.gm.graph.find_nodes(op="placeholder")[i.placeholder]: i for i in plan.inputs}
        self.head = _Block(1, False)  # values without rows or columns, computed first
        self.rowvals: dict = {}  # node -> name, values without columns (computed once per program)
        self.pre: _Block = self.head
        self.shifts: dict[str, int] = {}  # moved column expressions seen, numbered for readable names
        self.held = ieee_nodes(plan.gm.graph, plan.out_nodes)  # IEEE division where outputs are held exact

    # -- operands ------------------------------------------------------------------------------------------
    def sym(self, a, real: bool = False) -> str:
        """A size expression; `real`: as a float for pointwise math (see `real_src`)."""
        src = real_src if real else pysrc
        if isinstance(a, int) and not isinstance(a, bool):
            return f"{a}.0" if real else str(a)
        if isinstance(a, torch.fx.Node):
            if a.op == "call_function" and OP_TABLE[op_name(a.target)].kind == SYMBOLIC:
                t = a.target
                if op_name(t) == "aten.sym_size.int":
                    return f"({src(shape_of(a.args[0], self.env)[a.args[1]], self.p.symbols)})"
                if op_name(t) == "aten.sym_numel.default":
                    return f"({src(product(shape_of(a.args[0], self.env)), self.p.symbols)})"
                if op_name(t) in ("torch.sym_float", "torch.sym_int"):
                    return self.sym(a.args[0], real)
                val = a.meta.get("val")
                if isinstance(val, torch.SymInt):  # torch's simplified value: numel // size is a size, not a division
                    return f"({src(val.node.expr, self.p.symbols)})"
                if op_name(t) == "operator.pow":  # a scale such as D ** -0.5: Triton has no ** on tensors
                    base, e = self.sym(a.args[0], True), a.args[1]
                    if e in (0.5, -0.5):
                        root = f"tl.sqrt_rn({base})"
                        return root if e > 0 else f"tl.div_rn(1.0, {root})"
                    return f"tl.exp2({self.sym(e, True)} * tl.log2({base}))"
                if real and SYM_OPS[t] in ("+", "-", "*"):
                    return f"({self.sym(a.args[0], True)} {SYM_OPS[t]} {self.sym(a.args[1], True)})"
                text = f"({self.sym(a.args[0])} {SYM_OPS[t]} {self.sym(a.args[1])})"
                return f"({text} * 1.0)" if real else text
            raise KeyError(a)
        if isinstance(a, (torch.SymInt, torch.SymFloat)):
            return f"({src(a.node.expr, self.p.symbols)})"
        return _literal(a)

    def render(self, a, col, blk):
        """An operand of pointwise math: sizes become floats there."""
        if isinstance(a, torch.fx.Node):
            if a.op == "call_function" and OP_TABLE[op_name(a.target)].kind == SYMBOLIC:
                return self.sym(a, real=True)
            return self.ev(a, col, blk)
        if isinstance(a, (list, tuple)):
            return a
        if isinstance(a, (torch.SymInt, torch.SymFloat)):
            return self.sym(a, real=True)
        return _literal(a)

    # -- values --------------------------------------------------------------------------------------------
    def ev(self, node, col: str, blk: _Block) -> str:
        """A name (or inline expression) holding `node` at column `col` in block `blk`: `cols` (COLS), or an
        expression of it where a slice, concatenation or interleave moved the columns."""
        i = self.p.info[node]
        if not i.dc:
            col = COLS
        if node in self.rowvals:
            return self.rowvals[node]
        key = (node, col)
        if key in blk.cache:
            return blk.cache[key]
        # values without columns live outside column loops: scalars at the top, row values before the loop
        home = self.head if not i.dr else self.pre
        if not i.dc and not i.post and blk.cols and home is not blk:
            return self.ev(node, col, home)
        name = self._emit(node, col, blk)
        if not i.dc and not i.post:
            self.rowvals[node] = name
        else:
            blk.cache[key] = name
        return name

    def _target(self, node, col) -> str:
        if col == COLS:
            return node.name
        return f"{node.name}_sh{self.shifts.setdefault(col, len(self.shifts) + 1)}"

    def _emit(self, node, col: str, blk: _Block) -> str:
        if node.op == "placeholder":
            return self._load(node, col, blk)
        key = op_name(node.target)
        rule = OP_TABLE[key]
        if rule.kind == SYMBOLIC:
            return self.sym(node)
        if rule.kind == VIEW:
            return self.ev(node.args[0], col, blk)
        if rule.kind == SHIFT:
            return self._shift(node, key, col, blk)
        if rule.kind == SCAN:
            return self._scan(node, key, col, blk)
        if rule.kind == COLUMN:  # compared with indices loaded as float32: exact below 2**24 columns
            return f"{operand(col)}.to(tl.float32)"
        if rule.kind in ("reduction",):
            raise RuntimeError(f"reduction {node.name} used before it is finished")
        # a constant's tensor argument (zeros_like(x)) only lends its shape: never evaluate it
        args = [None if rule.kind == CONSTANT and isinstance(a, torch.fx.Node)
                and isinstance(a.meta.get("val"), torch.Tensor) else self.render(a, col, blk) for a in node.args]
        kwargs = {k: self.render(v, col, blk) for k, v in node.kwargs.items() if k not in _KWARGS_DROPPED}
        if key == "aten._to_copy.default":
            kwargs["dtype"] = str(node.kwargs.get("dtype"))
        elif rule.kind == CONSTANT:
            kwargs.pop("dtype", None)
            return f"({rule.emit(*args, **kwargs)})"
        expr = rule.emit(*args, **kwargs, ieee=node in self.held)
        if expr.isidentifier():  # x ** 1: the operand itself
            return expr
        if expr in blk.exprs:
            return blk.exprs[expr]
        target = self._target(node, col)
        blk.add(f"{target} = {expr}  # {key}")
        blk.exprs[expr] = target
        return target

    def _scan(self, node, key: str, col: str, blk: _Block) -> str:
        """A scan of a chunk along its columns; past the row's end the identity, so that a backward scan starts
        from the row's last column. In a walk over chunks the chunks already walked come first: their combined
        total, carried from one chunk to the next (the walk takes them from the row's end when it runs back)."""
        if col != COLS:
            raise RuntimeError(f"scan {node.name} at moved columns")  # the planner refuses moving a scan
        identity, scan, total, combine = SCAN_FORMS[SCAN_KIND[key]]
        src = node.args[0]
        x = f"{node.name}_in"
        blk.add(f"{x} = tl.where(cols < {self.ext(self.p.info[src].ext)}, {self.ev(src, COLS, blk)}, {identity})")
        scan = scan.format(x=x, r=", reverse=True" if is_reverse_scan(key) else "")
        blk.add(f"{node.name} = {scan}  # {key}")
        if blk.carries is not None:
            carry = f"{node.name}_carry"
            rows = "BLOCK_R" if self.p.info[node].dr else "1"
            blk.carries.append(f"{blk.pad[4:]}{carry} = tl.full(({rows}, 1), {identity}, tl.float32)")
            blk.add(f"{node.name} = {combine.format(a=carry, b=node.name)}")
            blk.add(f"{carry} = {combine.format(a=carry, b=total.format(x=x))}")
        return node.name

    def _load(self, node, col: str, blk: _Block) -> str:
        m = self.inputs[node]
        i = self.p.info[node]
        if m.layout == "scalar":
            value = load_value(f"{m.name}_ptr", boolean=is_mask(node))
            self.head.add(f"{m.name} = {value}  # one value for the whole tensor")
            return m.name
        if not i.dc:
            self.pre.add(f"{m.name} = {load_value(f'{m.name}_ptr + {m.row_off}', 'rmask', is_mask(node))}")
            return m.name
        at = operand(col)
        mask = [] if not i.dr else ["rmask"]
        # a moved column can fall before the row only where the expression subtracts (cat's later parts)
        mask += [f"({at} >= 0)"] if "-" in col else []
        mask += [f"({at} < {self.ext(i.ext)})"]
        col_off = m.col_off.format(c=at)
        off = f"{m.row_off} + {col_off}" if i.dr else col_off
        target = m.name if col == COLS else self._target(node, col).replace(node.name, m.name)
        blk.add(f"{target} = {load_value(f'{m.name}_ptr + {off}', ' & '.join(mask), is_mask(node))}")
        return target

    def _bound(self, b, width: str, default: str) -> str:
        """A slice bound as a column: a negative one counts from the row's end (x[..., -3:]), a huge one is
        the end (x[..., 2:])."""
        if b is None or (isinstance(b, int) and b >= 2 ** 31):
            return default
        if isinstance(b, int) and b < 0:
            return tidy(f"{width} - {-b}")
        return self.sym(b)

    def _shift(self, node, key, col, blk) -> str:
        """`node` at column `col`: its source at the column it came from. Column expressions compose as text;
        tidy keeps `cols + D - (D // 2)` from growing with each slice."""
        at = operand(col)
        if key == "aten.slice.Tensor":  # x[..., start::step]: column start + step * c of x
            width = self.ext(self.p.info[node.args[0]].ext)
            start = self._bound(node.args[2] if len(node.args) > 2 else None, width, "0")
            step = node.args[4] if len(node.args) > 4 else 1
            return self.ev(node.args[0], tidy(f"{start} + {_times(step, at)}"), blk)
        if key == "aten.slice_backward.default":  # the gradient scattered back: zero where no column came from
            width = self.ext(self.p.info[node].ext)
            step = node.args[5] if len(node.args) > 5 else 1
            start, end = self._bound(node.args[3], width, "0"), self._bound(node.args[4], width, width)
            src = tidy(f"{at} - {operand(start)}")
            inner = self.ev(node.args[0], src if step == 1 else tidy(f"({src}) // {step}"), blk)
            hit = f"({at} >= {start}) & ({at} < {end})" + (f" & (({src}) % {step} == 0)" if step != 1 else "")
            target = self._target(node, col)
            blk.add(f"{target} = tl.where({hit}, {inner}, 0.0)  # {key}")
            return target
        if key == "aten.stack.default":  # stacked on a new last dim that a view flattens: interleaved columns
            parts = node.args[0]
            m, pair = len(parts), tidy(f"{at} // {len(parts)}")
            expr = self.ev(parts[-1], pair, blk)
            for k in range(m - 2, -1, -1):
                expr = f"tl.where({at} % {m} == {k}, {self.ev(parts[k], pair, blk)}, {expr})"
            target = self._target(node, col)
            blk.add(f"{target} = {expr}  # {key}")
            return target
        # cat: each part owns a range of columns
        parts, offset = node.args[0], "0"
        pieces = []
        for p in parts:
            width = self.ext(self.p.info[p].ext) if self.p.info[p].dc else "1"
            pieces.append((offset, width, self.ev(p, tidy(f"{at} - ({offset})") if offset != "0" else col, blk)))
            offset = width if offset == "0" else f"{offset} + {width}"
        expr = pieces[-1][2]
        for off, width, val in reversed(pieces[:-1]):
            end = width if off == "0" else f"{off} + {width}"
            expr = f"tl.where({at} < {end}, {val}, {expr})"
        target = self._target(node, col)
        blk.add(f"{target} = {expr}  # {key}")
        return target

    def ext(self, e) -> str:
        return pysrc(e, self.p.symbols) if e is not None else "n_cols"


COLS = "cols"  # a value at its own columns


def _times(step: int, col: str) -> str:
    return col if step == 1 else f"{step} * {col}"


def _mask(e: _Emitter, i) -> str:
    parts = (["rmask"] if i.dr else []) + ([f"(cols < {e.ext(i.ext)})"] if i.dc else [])
    return " & ".join(parts) or "True"


def _section(plan: RowPlan, persistent: bool, ind: int, split: str | None = None,
             given: str | None = None) -> tuple[_Emitter, list]:
    """The work of one program on its rows, at indentation `ind`.

    persistent: the row fits one chunk, so every value is loaded and computed once and reductions reduce
    registers. Otherwise each phase walks the row in chunks, accumulating, and values are recomputed from
    the inputs in every walk that needs them.
    split (a plan that `splits_rows`; SPLIT programs share a row, each walking its SPAN columns c_lo..c_hi):
    "stats" walks once and stores the program's partial row results; "main" loads the SPLIT partials of its
    rows in place of the walk's column accumulators, so that the walk's own finish combines them, then walks
    its columns again to store.
    given (persistent only): the input already held as a whole-row tile (a GEMM's product), never loaded.
    """
    e = _Emitter(plan)
    pad = "    " * ind
    e.head = _Block(ind, False)
    blocks: list = [e.head]
    one = _Block(ind, True) if persistent else None
    if persistent:
        e.pre = one
        blocks.append([f"{pad}cols = tl.arange(0, BLOCK_C)[None, :]  # the whole row"])
        blocks.append(one)
        one.cache.update({(node, COLS): given for node, m in e.inputs.items() if m.name == given})

    def walk(inits, body, after):
        blocks.append(inits)
        blocks.append(body.carries)
        chunk = "(tl.cdiv(n_cols, BLOCK_C) * BLOCK_C - BLOCK_C - c0)" if plan.reverse else "c0"
        blocks.append([f"{pad}# the chunks from the row's end: its scans run backwards"] if plan.reverse else [])
        blocks.append([f"{pad}for c0 in range({'c_lo, c_hi' if split else '0, n_cols'}, BLOCK_C):",
                       f"{pad}    cols = {chunk} + tl.arange(0, BLOCK_C)[None, :]  # a chunk of the row"])
        blocks.append(body)
        blocks.append(after)

    # phases: the row reductions of depth k (walked: a sum of exp(a - max a) rides with its max, online)
    riders = {r.online.name for r in plan.row_reductions if r.online} if not persistent else set()
    for k in range(plan.phases):
        todo = [r for r in plan.row_reductions
                if (plan.info[r.source].level if persistent else plan.phase_of(r)) == k]
        if not todo and not persistent:
            continue
        if not persistent:
            e.pre = _Block(ind, False)
            blocks.append(e.pre)
        body = one or _Block(ind + 1, True, loop=True)
        inits, after = [], []
        parts = []  # split: (accumulator, this program's partial row result, identity) per reduction
        for r in todo:
            si = plan.info[r.source]
            if r.online and not persistent:
                mx, inf = f"{r.online.name}_acc", "float('inf')"
                ninf = _online_sum(e, plan, r, body, inits, [] if split == "stats" else after, pad)
                if split == "stats":  # the columns' sums rescaled to this program's max, as the finish rescales
                    after.append(f"{pad}{r.name} = tl.sum(tl.where(({mx} > -{inf}) & ({mx} < {inf}), {r.name}_acc * "
                                 f"tl.exp({mx} - {r.online.name}), 0.0), axis=1)[:, None]")
                parts.append((f"{r.name}_acc", r.name, "0.0"))
                if ninf:
                    parts.append((f"{r.name}_ninf", f"tl.max({r.name}_ninf, axis=1)[:, None].to(tl.float32)", "0"))
                continue
            mask, v = _mask(e, si), e.ev(r.source, COLS, body)
            if r.kind in INDEX_KINDS:  # the first column of the row's best value (int32)
                is_max = int(r.kind == "argmax")
                if persistent:
                    body.add(f"_, {r.name} = _arg_best({v}, cols, {mask}, {is_max})  # {op_name(r.node.target)}")
                else:
                    inits += [f"{pad}{r.name}_best = tl.full((BLOCK_R, 1), {_IDENTITY[r.kind[3:]]}, tl.float32)",
                              f"{pad}{r.name} = tl.zeros((BLOCK_R, 1), tl.int32)"]
                    body.add(f"{r.name}_best, {r.name} = _arg_take({r.name}_best, {r.name}, *_arg_best({v}, cols, "
                             f"{mask}, {is_max}), {is_max})  # {op_name(r.node.target)}")
                e.rowvals[r.node] = r.name
                continue
            parts.append((f"{r.name}_acc", r.name, "0.0" if r.kind in ("sum", "mean") else _IDENTITY[r.kind]))
            if r.kind == "mean":  # sum x / n, not (sum x) / n: a row of huge values must not overflow its sum
                v = f"{v} * (1.0 / ({r.count}))"
            where = f"tl.where({mask}, {v}, {_IDENTITY[r.kind]})"
            finish = [] if persistent else after
            if r.kind == "prod":  # padding columns multiply by one
                if persistent:
                    body.add(f"{r.name} = tl.reduce({where}, 1, _mul)[:, None]  # {op_name(r.node.target)}")
                else:
                    inits.append(f"{pad}{r.name}_acc = tl.full((BLOCK_R, BLOCK_C), 1.0, tl.float32)")
                    body.add(f"{r.name}_acc *= {where}")
                    after.append(f"{pad}{r.name} = tl.reduce({r.name}_acc, 1, _mul)[:, None]  "
                                 f"# {op_name(r.node.target)}")
            elif r.kind in ("sum", "mean"):
                if persistent:
                    body.add(f"{r.name} = tl.sum({where}, axis=1)[:, None]  # {op_name(r.node.target)}")
                else:
                    inits.append(f"{pad}{r.name}_acc = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)")
                    body.add(f"{r.name}_acc += {where}")
                    after.append(f"{pad}{r.name} = tl.sum({r.name}_acc, axis=1)[:, None]  # {op_name(r.node.target)}")
            else:
                fn, cmp = ("tl.max", ">") if r.kind == "max" else ("tl.min", "<")
                if persistent:
                    body.add(f"{r.name}_acc = {where}")
                else:
                    inits.append(f"{pad}{r.name}_acc = tl.full((BLOCK_R, BLOCK_C), {_IDENTITY[r.kind]}, tl.float32)")
                    if r.name in riders:
                        body.add(f"{r.name}_prev = {r.name}_acc")
                    body.add(f"{r.name}_acc = tl.where({mask} & (({v} {cmp} {r.name}_acc) | ({v} != {v})), {v}, "
                             f"{r.name}_acc)  # NaN wins, as in torch")
                lines = [f"{r.name} = {fn}({r.name}_acc, axis=1)[:, None]  # {op_name(r.node.target)}",
                         f"{r.name} = tl.where(tl.sum(({r.name}_acc != {r.name}_acc).to(tl.int32), axis=1)[:, None] "
                         f"> 0, float('nan'), {r.name})"]
                if persistent:
                    for line in lines:
                        body.add(line)
                else:
                    finish += [pad + line for line in lines]
            e.rowvals[r.node] = r.name
        if split == "main":
            blocks.append([f"{pad}splits = tl.arange(0, SPLIT)[None, :]  # the programs that share these rows"])
            blocks.append([f"{pad}{acc} = tl.load(parts_ptr + ({i} * n_rows + rows) * SPLIT + splits, mask=rmask, "
                           f"other={other})" for i, (acc, _, other) in enumerate(parts)])
            blocks.append(after)
        elif not persistent:
            walk(inits, body, after)
        if split == "stats":
            blocks.append([f"{pad}tl.store(parts_ptr + ({i} * n_rows + rows) * SPLIT + split_id, {v}, mask=rmask)"
                           for i, (_, v, _) in enumerate(parts)])
            return e, blocks

    # the last walk: full outputs, column partials, full-reduction partials; row outputs after it
    if not persistent:
        e.pre = _Block(ind, False)
        blocks.append(e.pre)
    body = one or _Block(ind + 1, True, loop=True)
    inits, after = [], []
    n_col = len(plan.col_reductions)
    split_stores: list[str] = []  # row values, stored by one of the programs that share the row
    for o, node in zip(plan.outputs, plan.out_nodes):
        i = plan.info[node]
        if o.store == "full":
            v = e.ev(node, COLS, body)
            ext = e.ext(i.ext if i.dc else None)
            val = v if (i.dr and i.dc) else f"{v} + tl.zeros((BLOCK_R, BLOCK_C), tl.float32)"
            row_off, col_off = plan.stores.get(o.name, (f"rows * {operand(ext)}", "{c}"))
            body.add(f"tl.store({o.name}_ptr + {row_off} + {col_off.format(c='cols')}, _to_dtype({val}, "
                     f"{o.name}_ptr.dtype.element_ty), mask=rmask & (cols < {ext}))")
        elif o.store == "row":
            v = e.ev(node, COLS, e.pre)
            v = f"{v}.to(tl.int64)" if o.like == INDEX else f"_to_dtype({v}, {o.name}_ptr.dtype.element_ty)"
            store = f"tl.store({o.name}_ptr + rows, {v}, mask=rmask)"
            if split:
                split_stores.append(f"{pad}    {store}")
            else:
                after.append(pad + store)
        elif o.store == "scalar" and not o.in_epilogue:
            v = e.ev(node, COLS, e.head)
            after += [f"{pad}if pid == 0:", f"{pad}    tl.store({o.name}_ptr, _to_dtype({v}, "
                                                 f"{o.name}_ptr.dtype.element_ty))"]
    if split_stores:
        after += [f"{pad}if split_id == 0:", *split_stores]
    for r in plan.col_reductions:
        si = plan.info[r.source]
        v = e.ev(r.source, COLS, body)
        body.add(f"{r.name}_part = tl.sum(tl.where({_mask(e, si)}, {v}, 0.0), axis=0)[None, :]  "
                 f"# {op_name(r.node.target)}: this row block")
        if persistent:  # the whole row is one chunk: the program's row blocks add up in registers
            body.add(f"{r.name}_run += {r.name}_part")
            continue
        # the program's own row of partials (zeroed at launch), added to by each of its row blocks in turn
        body.add(f"slot = colpart_ptr + {_colpart('pid.to(tl.int64)', n_col, r.slot)} + cols")
        body.add(f"tl.store(slot, tl.load(slot, mask=cols < n_cols, other=0.0) + {r.name}_part, mask=cols < n_cols)")
    for r in plan.full_reductions:
        si = plan.info[r.source]
        kind = "sum" if r.kind == "mean" else r.kind
        combine = reduce_combine(kind, f"{r.name}_run", f"{r.name}_part")
        if si.dc:
            v = e.ev(r.source, COLS, body)
            where = f"tl.where({_mask(e, si)}, {v}, {_IDENTITY[kind]})"
            if persistent:
                body.add(f"{r.name}_part = {block_reduce(kind, where)}  # {op_name(r.node.target)}")
                body.add(f"{r.name}_run = {combine}")
                continue
            inits.append(f"{pad}{r.name}_acc = tl.full((BLOCK_R, BLOCK_C), {_IDENTITY[kind]}, tl.float32)")
            body.add(f"{r.name}_acc = {reduce_combine(kind, f'{r.name}_acc', where)}")
            after.append(f"{pad}{r.name}_part = {block_reduce(kind, r.name + '_acc')}  # {op_name(r.node.target)}")
        else:
            v = e.ev(r.source, COLS, e.pre if si.dr else e.head)
            mask = "rmask" if si.dr else "rb == 0"  # a value with no rows counts once, in the first row block
            rows_v = f"tl.where({mask}, {v} + tl.zeros((BLOCK_R, 1), tl.float32), {_IDENTITY[kind]})"
            after.append(f"{pad}{r.name}_part = {block_reduce(kind, rows_v)}  # {op_name(r.node.target)}")
        after.append(f"{pad}{r.name}_run = {combine}")
    if persistent:
        blocks.append(after)
    elif body.lines:
        walk(inits, body, after)
    else:
        blocks += [inits, after]
    return e, blocks


def _online_sum(e: _Emitter, plan: RowPlan, r, body, inits: list, after: list, pad: str) -> bool:
    """sum(exp(a - c)) in the walk that finds m = max(a), c following from m per row (m itself in softmax):
    each column's running sum is rescaled by exp(old max - new max) as its max grows; after the walk c is
    computed and the columns meet as sum(acc * exp(column max - c)). Where m or c is not finite the row
    takes the two-walk form's value outright: exp(inf - inf) and exp(-inf + inf) are NaN, exp(inf - c) inf.
    Returns whether the walk also keeps `<sum>_ninf`, a flag per column that it met -inf."""
    m, n, inf, nan = r.online, r.name, "float('inf')", "float('nan')"
    v, mask, mx = e.ev(m.source, COLS, body), _mask(e, plan.info[m.source]), f"{m.name}_acc"
    inits.append(f"{pad}{n}_acc = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)")
    body.add(f"{n}_rescale = tl.where({mx} == -{inf}, 1.0, tl.exp({m.name}_prev - {mx}))")
    body.add(f"{n}_acc = {n}_acc * {n}_rescale + tl.where({mask} & ({mx} != -{inf}), tl.exp({v} - {mx}), 0.0)")
    shift = _Block(len(pad) // 4, False)  # c after the walk, from the finished max
    c = e.ev(r.shift, COLS, shift)
    c = c if c.isidentifier() else f"({c})"
    after += shift.lines
    after.append(f"{pad}{n} = tl.sum(tl.where(({mx} > -{inf}) & ({mx} < {inf}), {n}_acc * tl.exp({mx} - {c}), "
                 f"0.0), axis=1)[:, None]  # {op_name(r.node.target)}: online, with {m.name}")
    if c == m.name:  # c = m: a row whose max is not finite sums some exp(inf - inf) or exp(-inf + inf)
        after.append(f"{pad}{n} = tl.where(({m.name} > -{inf}) & ({m.name} < {inf}), {n}, {nan})")
    else:  # c = -inf sums NaN for each -inf element, inf for the others: whether the row has one is kept
        inits.append(f"{pad}{n}_ninf = tl.zeros((BLOCK_R, BLOCK_C), tl.int32)")
        body.add(f"{n}_ninf = tl.where({mask} & ({v} == -{inf}), 1, {n}_ninf)")
        # otherwise m = +inf gives inf, and c = +inf or -inf leaves the finite columns summing 0 or inf
        after.append(f"{pad}{n} = tl.where(({m.name} != {m.name}) | ({c} != {c}) | (({c} == {inf}) & ({m.name} == "
                     f"{inf})) | (({c} == -{inf}) & (tl.max({n}_ninf, axis=1)[:, None] > 0)), {nan}, "
                     f"tl.where({m.name} == {inf}, {inf}, {n}))")
    e.rowvals[r.node] = r.name
    return c != m.name


def emit_row_kernel(op: str, plan: RowPlan, kname: str) -> str:
    cross, full, n_col = plan.reduces_across_programs, plan.full_reductions, len(plan.col_reductions)
    params = [f"{a.name}_ptr" for a in plan.inputs] + [f"{o.name}_ptr" for o in plan.outputs if o.store != "col"]
    params += [f"{a.name}_row_stride" for a in plan.inputs if a.row_strided]
    params += ["colpart_ptr"] if n_col else []
    params += ["acc_ptr", "partials_ptr", "ticket_ptr"] if full else []
    params += atoms(plan.symbols) + plan.attrs
    params += ["BLOCK_R: tl.constexpr", "BLOCK_C: tl.constexpr", "PERSISTENT: tl.constexpr"]
    if full:
        params += ["RBLOCK: tl.constexpr", "DETERMINISTIC: tl.constexpr"]
    reads = ", ".join(a.name for a in plan.inputs)
    writes = ", ".join(o.name for o in plan.outputs if o.store != "col")
    writes += f"{', ' if writes else ''}partial column sums" if n_col else ""
    lines = ["@triton.jit", f"def {kname}(", *[f"    {p}," for p in params], "):",
             f'    """{plan.name}: reads {reads}; writes {writes}.',
             "",
             f"    {plan.phases} row reduction phase(s). PERSISTENT (a row fits one chunk): each input is read once",
             f"    and reduced in registers. Otherwise the row is walked in chunks, {plan.walks} time(s).",
             '    """',
             f"    n_rows = {plan.n_rows}",
             f"    n_cols = {plan.n_cols}",
             "    pid = tl.program_id(0)"]
    if not cross:
        lines += ["    # this program's BLOCK_R rows, int64 so that row * n_cols cannot wrap past 2**31 elements",
                  "    rows = (pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R))[:, None]",
                  "    rmask = rows < n_rows  # the last program's rows run past the end"]
        _, persistent = _section(plan, True, 2)
        _, looped = _section(plan, False, 2)
        lines += ["    if PERSISTENT:", *_flatten(persistent), "    else:", *_flatten(looped)]
        return "\n".join(lines) + "\n" + ("\n\n" + _split_kernels(plan, kname) if plan.splits_rows else "")
    # Fewer programs than row blocks, each walking row blocks pid, pid + num_programs, ...: what is reduced
    # across programs is combined in registers first, so partials scale with the grid, not the rows.
    lines += ["    # this program's results reduced across its row blocks"]
    lines += [f"    {r.name}_run = tl.zeros((1, BLOCK_C), tl.float32)" for r in plan.col_reductions]
    lines += [f"    {r.name}_run = {_IDENTITY[r.kind]}" for r in full]
    lines += ["    for rb in range(pid, tl.cdiv(n_rows, BLOCK_R), tl.num_programs(0)):",
              "        # BLOCK_R rows, int64 so that row * n_cols cannot wrap past 2**31 elements",
              "        rows = (rb * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None]",
              "        rmask = rows < n_rows  # the last row block runs past the end"]
    _, persistent = _section(plan, True, 3)
    _, looped = _section(plan, False, 3)
    lines += ["        if PERSISTENT:", *_flatten(persistent), "        else:", *_flatten(looped)]
    if n_col:
        lines += ["    if PERSISTENT:  # looped rows stored their partials chunk by chunk",
                  "        cols = tl.arange(0, BLOCK_C)[None, :]"]
        lines += [f"        tl.store(colpart_ptr + {_colpart('pid.to(tl.int64)', n_col, r.slot)} + cols, "
                  f"{r.name}_run, mask=cols < n_cols)" for r in plan.col_reductions]
    if full:
        lines += [f"    {r.name}_part = {r.name}_run" for r in full]
        lines += _cross_program(plan)
    src = "\n".join(lines) + "\n"
    return src + ("\n\n" + _column_kernel(plan, kname)[0] if n_col else "")


def emit_row_tile(plan: RowPlan, fname: str, value: str) -> tuple[str, list[str]]:
    """A row plan's persistent work as a function a GEMM kernel calls on its tile when the tile holds whole
    rows: `value` (one of the plan's inputs, the product) is the tile itself, the other inputs are loaded by
    row as the row kernel loads them, and the outputs are stored as it stores them. A function of its own, so
    that the plan's names (its sizes among them) never meet the GEMM kernel's. Returns its source and its
    parameters (the pointers, row strides, sizes and attributes the caller passes after the tile and rows)."""
    _, blocks = _section(plan, True, 1, given=value)
    params = [f"{a.name}_ptr" for a in plan.inputs if a.name != value] + [f"{o.name}_ptr" for o in plan.outputs]
    params += [f"{a.name}_row_stride" for a in plan.inputs if a.row_strided and a.name != value]
    params += atoms(plan.symbols) + plan.attrs
    reads = ", ".join(a.name for a in plan.inputs)
    src = "\n".join(["@triton.jit", f"def {fname}(", f"    {value},", "    rows,", *[f"    {p}," for p in params],
                     "    BLOCK_R: tl.constexpr,", "    BLOCK_C: tl.constexpr,", "):",
                     f'    """{plan.name} on a tile of whole rows: reads {reads}; writes '
                     f'{", ".join(o.name for o in plan.outputs)}."""',
                     f"    n_rows = {plan.n_rows}",
                     f"    n_cols = {plan.n_cols}",
                     "    rmask = rows < n_rows  # the last tile's rows run past the end",
                     *_flatten(blocks)]) + "\n"
    return src, params


def split_kernel_names(kname: str) -> tuple[str, str]:
    base = kname.removesuffix("_kernel")
    return f"{base}_split_stats_kernel", f"{base}_split_kernel"


def _split_kernels(plan: RowPlan, kname: str) -> str:
    """The pass for few long rows: SPLIT programs share each row block, each walking SPAN columns of it. The
    first kernel stores each program's partial row results (sums, maxima, an online sum with its maximum) in
    `parts`; the second combines a row's SPLIT partials, then walks its columns again to store."""
    ins = [f"{a.name}_ptr" for a in plan.inputs]
    outs = [f"{o.name}_ptr" for o in plan.outputs]
    tail = [f"{a.name}_row_stride" for a in plan.inputs if a.row_strided] + atoms(plan.symbols) + plan.attrs
    tail += ["SPAN", "BLOCK_R: tl.constexpr", "BLOCK_C: tl.constexpr", "SPLIT: tl.constexpr"]
    head = [f"    n_rows = {plan.n_rows}",
            f"    n_cols = {plan.n_cols}",
            "    pid = tl.program_id(0)",
            "    split_id = tl.program_id(1)  # which SPAN columns of the rows this program walks",
            "    rows = (pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R))[:, None]",
            "    rmask = rows < n_rows",
            "    c_lo = split_id * SPAN",
            "    c_hi = tl.minimum(c_lo + SPAN, n_cols)"]
    reads = ", ".join(a.name for a in plan.inputs)
    stats, main = split_kernel_names(kname)
    out = []
    for name, params, mode, doc in (
            (stats, ins + ["parts_ptr"] + tail, "stats",
             f"{plan.name}, rows shared by SPLIT programs: reads {reads}; writes each program's partial row results."),
            (main, ins + outs + ["parts_ptr"] + tail, "main",
             f"{plan.name}, rows shared by SPLIT programs: combines the partials; writes "
             f"{', '.join(o.name for o in plan.outputs)}.")):
        _, blocks = _section(plan, False, 1, mode)
        out.append("\n".join(["@triton.jit", f"def {name}(", *[f"    {p}," for p in params], "):",
                              f'    """{doc}"""', *head, *_flatten(blocks)]) + "\n")
    return "\n\n".join(out)


def column_kernel_name(kname: str) -> str:
    return f"{kname.removesuffix('_kernel')}_column_sums"


def _column_kernel(plan: RowPlan, kname: str) -> tuple[str, list[str]]:
    """The second kernel of a plan with column reductions: each program owns COLUMN_BLOCK columns and adds the
    row kernel's programs' partial rows in program order (the same bits every run, no atomics), then computes
    and stores the column outputs. Returns its source and its launcher's arguments."""
    col = plan.col_reductions
    full = {r.node for r in plan.full_reductions}
    col_outs = [(o, n) for o, n in zip(plan.outputs, plan.out_nodes) if o.store == "col"]
    if full & upstream(n for _, n in col_outs):
        raise NotImplementedError(f"{plan.name}: a column output that depends on a full reduction")
    e = _Emitter(plan)
    e.head = e.pre = head = _Block(1, False)
    body = _Block(1, True)
    # BLOCK_P partial rows a step, each column's sum then finished by one tl.sum: a fixed order, so the same
    # bits every run, and few dependent steps (one row a step would make ~one load per SM a step)
    for r in col:
        body.add(f"{r.name}_acc = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)")
    body.add("for p0 in range(0, n_parts, BLOCK_P):")
    body.add("    parts = (p0 + tl.arange(0, BLOCK_P)).to(tl.int64)[:, None]  # int64: parts * n_cols may pass 2**31")
    body.add("    pmask = (parts < n_parts) & (cols < n_cols)")
    for r in col:
        body.add(f"    {r.name}_acc += tl.load(colpart_ptr + {_colpart('parts', len(col), r.slot)} + cols, "
                 "mask=pmask, other=0.0)")
    for r in col:
        body.add(f"{r.name} = tl.sum({r.name}_acc, axis=0)[None, :]")
    for r in col:
        if r.kind == "mean":
            body.add(f"{r.name} = tl.div_rn({r.name}, ({r.count}) * 1.0)")
        body.cache[(r.node, COLS)] = r.name
    for o, node in col_outs:
        v = e.ev(node, COLS, body)
        i = plan.info[node]
        val = v if i.dc else f"{v} + tl.zeros((1, BLOCK_C), tl.float32)"
        width = e.ext(i.ext) if i.dc else "n_cols"  # a sum over a slice or a cat's part is narrower than a row
        body.add(f"tl.store({o.name}_ptr + cols, _to_dtype({val}, {o.name}_ptr.dtype.element_ty), "
                 f"mask=cols < {width})")
    text = "\n".join(head.lines + body.lines)
    params = ["colpart_ptr"] + [f"{o.name}_ptr" for o, _ in col_outs]
    params += [f"{a.name}_ptr" for a in plan.inputs if re.search(rf"\b{a.name}_ptr\b", text)]
    params += ["n_parts"] + [s for s in atoms(plan.symbols) + plan.attrs
                             if re.search(rf"\b{s}\b", text + " " + str(plan.n_cols))]
    outs = ", ".join(o.name for o, _ in col_outs)
    src = "\n".join(["@triton.jit", f"def {column_kernel_name(kname)}(", *[f"    {p}," for p in params],
                      "    BLOCK_P: tl.constexpr,", "    BLOCK_C: tl.constexpr,", "):",
                      f'    """{plan.name}: {outs}, summed over the partial rows of the row kernel\'s n_parts '
                      'programs."""',
                      f"    n_cols = {plan.n_cols}",
                      "    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]",
                      *head.lines, *body.lines]) + "\n"
    return src, [p.removesuffix("_ptr") for p in params]


def _colpart(index: str, n: int, slot: int) -> str:
    """Where program `index` keeps column sum `slot` of `n`: one row of n_cols floats each."""
    s = slot_index(index, n, slot)
    return f"{s if ' ' not in s else f'({s})'} * n_cols"


def _flatten(blocks) -> list[str]:
    out = []
    for b in blocks:
        out += b.lines if isinstance(b, _Block) else b
    return out


def _cross_program(plan: RowPlan) -> list[str]:
    """The last program finishes the full reductions and computes what depends on them."""
    full = plan.full_reductions
    e = _Emitter(plan)
    epi = _Block(2, False)
    e.head = e.pre = epi  # scalars are recomputed here: they may not have been needed before
    out = meet(full, "    ") + finish(full, "        ", lambda r: f"({r.count}) * 1.0")
    for r in full:
        e.rowvals[r.node] = r.name
    stores = []
    for o, node in zip(plan.outputs, plan.out_nodes):
        if o.store == "scalar" and o.in_epilogue:
            v = e.ev(node, COLS, epi)
            stores.append(f"        tl.store({o.name}_ptr, _to_dtype({v}, {o.name}_ptr.dtype.element_ty))")
    return out + epi.lines + stores


def _size_sources(names: dict, dims: dict) -> dict:
    """Each size argument -> where the launcher reads it: an input's dimension, or one divided by a constant
    when the size only appears in a product or a sum ('G*32': G = weight.shape[1] // 32; 'L+R*2': R =
    (w.shape[0] - L) // 2)."""
    out = {}
    for s, v in sorted(names.items(), key=lambda kv: str(kv[1])):
        if isinstance(v, str) and s in dims:
            out.setdefault(v, dims[s])
    # a size that appears only in a product or a sum ('H*D' with D known, 'L+R*2' with L known): solved for it
    # once the others are read
    pending = [(s, v) for s, v in names.items() if isinstance(v, sympy.Basic) and s in dims]
    while pending:
        left = []
        for s, v in pending:
            unknown = [f for f in sorted(v.free_symbols, key=str) if str(f) not in out]
            coeff = sympy.expand(v).coeff(unknown[0]) if len(unknown) == 1 else None
            rest = sympy.expand(v - coeff * unknown[0]) if coeff is not None else None
            if coeff is not None and coeff != 0 and unknown[0] not in coeff.free_symbols | rest.free_symbols:
                src = dims[s] if rest == 0 else f"({dims[s]} - {operand(str(rest))})"
                out[str(unknown[0])] = src if coeff == 1 else f"{src} // {operand(str(coeff))}"
            elif unknown:
                left.append((s, v))
        if len(left) == len(pending):
            break
        pending = left
    return out


def _split_launch(plan: RowPlan, kname: str, args: list[str], dev: str) -> list[str]:
    """The launcher's branch for few long rows (ROW_SPLIT programs per row block, a tuned knob)."""
    stats, main = split_kernel_names(kname)
    n_parts = len(_section(plan, False, 1, "stats")[1][-1])  # the stats kernel's stores
    n_ins, n_outs = len(plan.inputs), len(plan.outputs)
    consts = ["SPAN=span", "BLOCK_R=BLOCK_R", "BLOCK_C=BLOCK_C", "SPLIT=split",
              "**_row_launch(BLOCK_R * BLOCK_C, knobs)"]
    stats_args = ", ".join(args[:n_ins] + ["parts"] + args[n_ins + n_outs:] + consts)
    main_args = ", ".join(args[:n_ins + n_outs] + ["parts"] + args[n_ins + n_outs:] + consts)
    return [
        '    split = knobs["ROW_SPLIT"]',
        "    if split > 1 and n_cols >= split:  # each row's columns shared by `split` programs",
        "        BLOCK_C = min(triton.next_power_of_2(triton.cdiv(n_cols, split)), knobs[\"MAX_BLOCK_C\"])",
        "        span = triton.cdiv(triton.cdiv(n_cols, split), BLOCK_C) * BLOCK_C  # whole chunks per program",
        "        BLOCK_R = max(1, min(triton.next_power_of_2(max(n_rows, 1)), knobs[\"TILE\"] // BLOCK_C))",
        "        grid = (max(1, triton.cdiv(n_rows, BLOCK_R)), split)",
        f"        parts = torch.empty(({n_parts}, n_rows, split), dtype=torch.float32, device={dev})",
        f"        {stats}[grid]({stats_args})",
        f"        {main}[grid]({main_args})",
        f"        return ({''.join(o.name + ', ' for o in plan.outputs).rstrip()})"]


def launcher_signature(tensor_args: list[str], attrs: list[str]) -> str:
    """Every launcher takes all the operator's tensors and run-time attributes, so both passes share one."""
    return ", ".join([f"{t}: torch.Tensor" for t in tensor_args] + [f"{a}: float" for a in attrs] +
                     ["deterministic: bool = False"])


def row_inputs_and_outputs(plan: RowPlan, dims: dict, given: str | None = None, device: str | None = None,
                           pad: str = "    ") -> list[str]:
    """Launcher lines: the inputs made dense (or their row stride read), the sizes read off them and checked,
    the outputs allocated on `device` (the first input's). `given`: an input the launcher does not hold (a
    product still in the GEMM's tile)."""
    out = []
    b = out.append
    ins = [a for a in plan.inputs if a.name != given]
    for a in ins:
        if not a.row_strided:
            b(f"{pad}{a.name} = {a.name}.contiguous()")
    for a in ins:
        if a.row_strided:
            b(f"{pad}{a.name}, {a.name}_row_stride = _rows_of({a.name})  # no copy for spaced-out rows")
    names = plan.symbols
    for name, src in _size_sources(names, {s: d for s, d in dims.items() if not d.startswith(f"{given}.")}).items():
        b(f"{pad}{name} = {src}")
    for a in ins:
        b(f"{pad}_expect_shape({a.name!r}, {a.name}, ({''.join(pysrc(d, names) + ', ' for d in a.shape)}))")
    out += divisibility_checks(graph_shapes(plan.gm), names, pad)
    for o in plan.outputs:
        shape = "".join(pysrc(sympy.sympify(d), names) + ", " for d in o.shape)
        b(f"{pad}{o.name} = torch.empty(({shape}), dtype={o.dtype}, device={device or ins[0].name + '.device'})")
    return out


def emit_row_launcher(op: str, plan: RowPlan, kname: str, dims: dict, fn_name: str, tensor_args: list[str],
                      runtime_attrs: list[str]) -> str:
    """Allocates outputs and launches the kernel; torch does no math here. `dims`: graph symbol -> source."""
    sig = launcher_signature(tensor_args, runtime_attrs)
    out = [f"def {fn_name}({sig}):"] + row_inputs_and_outputs(plan, dims)
    b = out.append
    names = plan.symbols
    dev = f"{plan.inputs[0].name}.device"
    b(f"    n_rows, n_cols = {plan.n_rows}, {plan.n_cols}")
    b("    knobs = _knobs(n_rows, n_cols)  # tuned for these sizes, or the defaults")
    b('    BLOCK_C = min(triton.next_power_of_2(max(n_cols, 1)), knobs["MAX_BLOCK_C"])')
    b('    BLOCK_R = max(1, min(triton.next_power_of_2(max(n_rows, 1)), knobs["TILE"] // BLOCK_C))')
    full, n_col = plan.full_reductions, len(plan.col_reductions)
    blocks = "triton.cdiv(n_rows, BLOCK_R)"
    # column sums: about one program per SM, each writing one row of partials per column reduction
    out += launch_setup(blocks, full, dev, f"_num_sms({dev})" if n_col else 'knobs["MAX_PROGRAMS"]' if full else None)
    if n_col:
        rows_of_parts = f"grid[0] * {n_col}" if n_col > 1 else "grid[0]"
        b("    # persistent rows store their partial rows once; looped ones add to them chunk by chunk, from zero")
        b(f"    colpart = (torch.empty if BLOCK_C >= n_cols else torch.zeros)({rows_of_parts} * n_cols, "
          f"dtype=torch.float32, device={dev})")
    args = [a.name for a in plan.inputs] + [o.name for o in plan.outputs if o.store != "col"]
    args += [f"{a.name}_row_stride" for a in plan.inputs if a.row_strided]
    args += ["colpart"] if n_col else []
    args += ["acc", "partials", "ticket"] if full else []  # the kernel's parameter order
    args += atoms(names) + plan.attrs
    extra = ", RBLOCK=RBLOCK, DETERMINISTIC=ordered" if full else ""
    if plan.splits_rows:
        out += _split_launch(plan, kname, args, dev)
    b(f"    {kname}[grid]({', '.join(args)}, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, PERSISTENT=BLOCK_C >= n_cols{extra}, "
      "**_row_launch(BLOCK_R * BLOCK_C, knobs))")
    if n_col:
        args = _column_kernel(plan, kname)[1]
        b("    # the column sums: the partial rows of the programs that had rows, added in program order")
        b(f"    n_parts = min(grid[0], {blocks})")
        b("    col_grid = (max(1, triton.cdiv(n_cols, COLUMN_BLOCK)),)")
        b(f"    {column_kernel_name(kname)}[col_grid]({', '.join(args)}, BLOCK_P=PARTIAL_ROWS, "
          "BLOCK_C=COLUMN_BLOCK, **_LAUNCH)")
    b(f"    return ({''.join(o.name + ', ' for o in plan.outputs).rstrip()})")
    return "\n".join(out) + "\n"
