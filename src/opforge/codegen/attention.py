"""Attention in a traced pass: softmax(score(Q·Kᵀ))·V found in the graph and replaced by one node, which the
staged planner (codegen/gemm.py) runs as a FlashAttention-style kernel (codegen/emit_attention.py) that never
writes the S×S scores.

The pattern, as make_fx traces it: a bmm of Q and Kᵀ (through views), pointwise work on the scores (a scale,
an additive bias or mask, a softcap: the *score body*), a softmax over the keys (amax, sub, exp, sum, div),
and a bmm of the probabilities with V. Attention sinks (a learned per-head logit that joins the softmax's
denominator, as in gpt-oss) appear as a column concatenated before the softmax and sliced off after it.

Q, K and V are read where they lie in memory: each operand's chain of views is traced back to a 4-D tensor
(batch, heads, positions, head dim), and replayed on an index tensor to check that batch·head `bh` of the
product is `q[b, h]` and `k[b, h // R]` (grouped-query heads: K and V expanded to R query heads each). A
triu/tril of a constant (a causal or sliding-window mask) and an arange viewed along the queries or the keys (an
ALiBi distance) are computed in the kernel from the query and key positions; other tensors the scores read are
loaded through their strides, broadcast to (B, H, Sq, Sk).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from opforge.codegen.ops import OP_TABLE, POINTWISE, SYMBOLIC, op_name
from opforge.codegen.symbolic import expr_of, hint, shape_env_of

ATTENTION = "opforge.attention"  # op_name of the node that replaces a recognised region
# views an operand's chain may hold between its tensor in memory and the product
_CHAIN = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default",
          "aten.clone.default", "aten.unsqueeze.default", "aten.transpose.int", "aten.t.default",
          "aten.permute.default", "aten.detach.default", "aten.alias.default"}
_BMM = "aten.bmm.default"
# constants the score body may build from sizes alone, and masks of them by position
CONSTANTS = {"aten.full.default", "aten.new_full.default", "aten.ones.default", "aten.zeros.default",
              "aten.scalar_tensor.default"}
_MASKS = {"aten.triu.default", "aten.tril.default"}
# positions 0..n-1 (ALiBi's and relative biases' distances): a query's or a key's index in the kernel
_POSITIONS = {"aten.arange.default"}
IN_ATTENTION = CONSTANTS | _MASKS | _POSITIONS  # lowered inside an attention kernel only
# views a score body may hold: they keep each score at its (query, key) position, or add leading dimensions
SCORE_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default",
               "aten.unsqueeze.default", "aten.clone.default", "aten.detach.default", "aten.alias.default"}


def side_kind(node: torch.fx.Node) -> str:
    """How an attention kernel reads a score body's side input: "tile" (at (b, h, query, key) through its
    strides), "scalar" (one value) or "size" (computed by the launcher)."""
    val = node.meta["val"]
    if not isinstance(val, torch.Tensor):
        return "size"
    return "scalar" if val.numel() == 1 else "tile"


def attention(*args):
    """The stand-in target of a recognised attention region (never called: the planner lowers it)."""
    raise RuntimeError("opforge.attention is planned, not run")


attention.__module__, attention.__name__ = "opforge", "attention"


@dataclass
class Region:
    """What a recognised attention computes; held in the replacing node's meta["attention"]."""

    q: torch.fx.Node  # the tensors in memory, 4-D (B, H, S, D) or 3-D (B·H, S, D)
    k: torch.fx.Node
    v: torch.fx.Node
    groups: int  # query heads per K/V head: K/V head = h // groups
    score: torch.fx.GraphModule  # scores (B, H, Sq, Sk) -> scores, with the side inputs after them
    side: list  # the score body's other inputs, in order: tensors, one-value tensors, sizes
    sinks: torch.fx.Node | None = None  # one logit per head, joining the denominator
    nodes: set = field(default_factory=set)  # the region's nodes, replaced
    bias_grad: int = -1  # which of the side tensors takes a gradient (attention_grad.fused_forward), or -1
    out: str = ""  # the name of the product with V that the region's node replaces


def _chain(node) -> tuple[torch.fx.Node, list]:
    """The tensor under a chain of views, and the views from it to `node` in order."""
    views = []
    while node.op == "call_function" and op_name(node.target) in _CHAIN:
        views.append(node)
        node = node.args[0]
    return node, views[::-1]


def _concrete(a, env):
    """A view's argument at the trace's example sizes."""
    if isinstance(a, (list, tuple)):
        return type(a)(_concrete(x, env) for x in a)
    if isinstance(a, torch.fx.Node):
        return hint(expr_of(a.meta["val"], env), env)
    return a


def _replay(base: torch.Tensor, views: list, env) -> torch.Tensor:
    x = base
    for v in views:
        x = v.target(x, *_concrete(v.args[1:], env), **v.kwargs)
    return x


def _example(node, env) -> torch.Tensor:
    """An index tensor of the node's example shape: every element tells where it came from."""
    shape = [hint(expr_of(d, env), env) for d in node.meta["val"].shape]
    return torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape)


def _operand(node, env, transposed: bool):
    """(tensor in memory, groups) when batch bh of the 3-D operand is base[b, h // groups] (its last two
    dimensions swapped when `transposed`), else None. The base is the value under the operand's views, or the
    first view on the way that is (B, H, S, D) (heads of a projection: view, transpose of a slice of it)."""
    base, views = _chain(node)
    for k in range(len(views) + 1):
        found = _operand_at(base if k == 0 else views[k - 1], views[k:], env, transposed)
        if found is not None:
            return found
    return None


def _operand_at(base, views: list, env, transposed: bool):
    if base.meta["val"].dim() not in (3, 4):
        return None
    x = _example(base, env)
    got = _replay(x, views, env)
    if x.dim() == 3:  # (batch·heads, S, D): one batch of that many heads
        x = x[None]
    b, hb = x.shape[:2]
    if got.dim() != 3 or got.shape[0] % b:
        return None
    heads = got.shape[0] // b
    if heads % hb:
        return None
    groups = heads // hb
    want = x[:, torch.arange(heads) // groups].reshape(b * heads, *x.shape[2:])
    want = want.transpose(1, 2) if transposed else want
    return (base, groups) if got.shape == want.shape and torch.equal(got, want) else None


def _softmax_input(div):
    """x for div = exp(x - amax(x)) / sum(exp(x - amax(x))) over the last dimension, else None."""
    if op_name(div.target) != "aten.div.Tensor":
        return None
    e, s = div.args[:2]
    if not (isinstance(e, torch.fx.Node) and isinstance(s, torch.fx.Node)):
        return None
    if op_name(e.target) != "aten.exp.default" or op_name(s.target) != "aten.sum.dim_IntList" or s.args[0] is not e:
        return None
    sub = e.args[0]
    if op_name(sub.target) != "aten.sub.Tensor":
        return None
    x, m = sub.args[:2]
    if op_name(getattr(m, "target", None)) != "aten.amax.default" or m.args[0] is not x:
        return None
    rank = x.meta["val"].dim()
    for r in (m, s):
        if [d % rank for d in r.args[1]] != [rank - 1] or not (len(r.args) > 2 and r.args[2]):
            return None
    return x, {div, e, s, sub, m}


def _last_dim_slice(node, size, env) -> torch.fx.Node | None:
    """The sliced value when `node` keeps the first `size` columns of it, else None."""
    if op_name(node.target) != "aten.slice.Tensor":
        return None
    src = node.args[0]
    rank = src.meta["val"].dim()
    dim, start, end = (list(node.args[1:4]) + [None] * 3)[:3]
    step = node.args[4] if len(node.args) > 4 else 1
    width = hint(expr_of(node.meta["val"].shape[-1], env), env)
    if dim % rank != rank - 1 or (start or 0) != 0 or step != 1 or width != hint(expr_of(size, env), env):
        return None
    return src


def _sinks(col, env) -> torch.fx.Node | None:
    """The per-head tensor in memory when `col` (B, H, Sq, 1) is it broadcast by views, else None."""
    base, views = _chain(col)
    if base.meta["val"].dim() != 1:
        return None
    x = _example(base, env)
    got = _replay(x, views, env)
    if got.dim() != 4 or got.shape[-1] != 1 or got.shape[1] != x.shape[0]:
        return None
    return base if torch.equal(got, x[None, :, None, None].expand_as(got)) else None


def _score_nodes(out, scores) -> tuple[list, list] | None:
    """The score body from `scores` (the first product, viewed 4-D) to `out`: its nodes in graph order and its
    side inputs (what it reads that does not come from the scores). None when it holds anything but pointwise
    ops, views, sizes and position masks of constants."""
    body, side, seen = [], [], set()
    stack = [out]
    while stack:
        n = stack.pop()
        if n in seen or n is scores:
            continue
        seen.add(n)
        if n.op != "call_function":
            side.append(n)
            continue
        key = op_name(n.target)
        rule = OP_TABLE.get(key)
        if not isinstance(n.meta.get("val"), torch.Tensor):  # a size, or arithmetic on sizes
            side.append(n)
            continue
        if key in CONSTANTS or key in _POSITIONS:  # made from sizes alone: what it reads is its shape and dtype
            body.append(n)
            continue
        if key in _MASKS:
            body.append(n)
            stack += [a for a in n.all_input_nodes]
            continue
        if key in _CHAIN or (rule is not None and rule.kind == POINTWISE):
            base = _chain(n)[0]
            made = base.op == "call_function" and op_name(base.target) in CONSTANTS | _POSITIONS
            if _reads(n, scores) or key not in _CHAIN or made:  # a view of positions is positions
                body.append(n)
                stack += list(n.all_input_nodes)
            else:
                side.append(n)  # a view of a tensor in memory: loaded through its strides
            continue
        return None
    order = {n: i for i, n in enumerate(out.graph.nodes)}
    return sorted(body, key=order.get), sorted(set(side), key=order.get)


def _reads(n, target) -> bool:
    stack, seen = [n], set()
    while stack:
        x = stack.pop()
        if x is target:
            return True
        if x not in seen:
            seen.add(x)
            stack += list(x.all_input_nodes)
    return False


def _match(p2, env) -> Region | None:
    a, v3 = p2.args[:2]
    probs, p_views = _chain(a)
    sinks = None
    sliced = _last_dim_slice(probs, probs.meta["val"].shape[-1], env)
    soft = _softmax_input(sliced if sliced is not None else probs)
    if soft is None:
        return None
    x, soft_nodes = soft
    nodes = set(p_views) | soft_nodes | ({probs} if sliced is not None else set())
    if sliced is not None:  # sinks: the scores with one more column, the same for every query of a head
        if op_name(x.target) != "aten.cat.default" or len(x.args[0]) != 2:
            return None
        out, col = x.args[0]
        sinks = _sinks(col, env)
        if sinks is None:
            return None
        nodes |= {x} | set(_chain(col)[1])
    else:
        out = x
    # the scores: the first product, somewhere under the score body
    p1 = next((n for n in _upstream_products(out)), None)
    if p1 is None:
        return None
    if len(p1.users) != 1:
        return None
    scores = next(iter(p1.users))  # the product viewed (B, H, Sq, Sk), or itself when the operands are 3-D
    scores = scores if op_name(scores.target) in _CHAIN and scores.meta["val"].dim() == 4 else p1
    found = _score_nodes(out, scores)
    if found is None:
        return None
    body, side = found
    q = _operand(p1.args[0], env, transposed=False)
    k = _operand(p1.args[1], env, transposed=True)
    vv = _operand(v3, env, transposed=False)
    if not (q and k and vv) or q[1] != 1 or k[1] != vv[1] or k[0].meta["val"].shape[1] != vv[0].meta["val"].shape[1]:
        return None
    if len({t[0].meta["val"].dim() for t in (q, k, vv)}) != 1:  # 3-D and 4-D operands would disagree on b
        return None
    nodes |= {p1, scores} | set(body)
    nodes |= set(_chain(p2.args[0])[1]) | set(_chain(p1.args[0])[1]) | set(_chain(p1.args[1])[1]) | set(
        _chain(v3)[1])
    nodes.add(p2)
    # nothing outside reads inside (sizes aside: they are read off the inputs): the scores and probabilities
    # exist only in the kernel
    if any(u not in nodes and not _size(u) for n in nodes - {p2} for u in n.users):
        return None
    return Region(q[0], k[0], vv[0], k[1], _score_graph(body, scores, side, out), side, sinks, nodes)


def _size(n) -> bool:
    rule = OP_TABLE.get(op_name(n.target)) if n.op == "call_function" else None
    return rule is not None and rule.kind == SYMBOLIC


def _upstream_products(n):
    stack, seen = [n], set()
    while stack:
        x = stack.pop()
        if x in seen or x.op != "call_function":
            continue
        seen.add(x)
        if op_name(x.target) == _BMM:
            yield x
            continue
        stack += list(x.all_input_nodes)


def _score_graph(body: list, scores, side: list, out) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    env = {scores: g.placeholder("scores")}
    env[scores].meta = dict(scores.meta)
    for s in side:
        env[s] = g.placeholder(s.name)
        env[s].meta = dict(s.meta)
    for n in body:  # a constant keeps only its value: the sizes and tensor it was shaped after stay behind
        env[n] = g.node_copy(n, lambda a: env.get(a))
    g.output(env[out])
    return torch.fx.GraphModule(torch.nn.Module(), g)


def masked_band(score: torch.fx.GraphModule) -> tuple[int | None, int | None]:
    """(lo, hi): the score body's result is -inf wherever cols - rows < lo or > hi (None: no such bound), as a
    causal mask (an added triu of -inf) or a sliding window (an added tril of -inf) makes it. Keys outside the
    band take no weight, so the kernels skip their blocks. Only what provably keeps -inf counts: adding
    another value, scaling by a positive constant or size, views; a softcap or a where loses the bound."""
    band: dict = {}
    for n in score.graph.nodes:
        key = op_name(n.target) if n.op == "call_function" else None
        ins = [band.get(a, (None, None)) for a in n.args if isinstance(a, torch.fx.Node)]
        if key in _MASKS and _minus_inf(n.args[0]):
            d = n.args[1] if len(n.args) > 1 else 0
            band[n] = (None, d - 1) if key == "aten.triu.default" else (d + 1, None)
        elif key == "aten.add.Tensor" and ins:
            band[n] = (max((b[0] for b in ins if b[0] is not None), default=None),
                       min((b[1] for b in ins if b[1] is not None), default=None))
        elif key in ("aten.mul.Tensor", "aten.div.Tensor") and isinstance(n.args[0], torch.fx.Node) and _positive(
                n.args[1]):
            band[n] = band.get(n.args[0], (None, None))
        elif key == "aten.sub.Tensor" and not isinstance(n.args[1], torch.fx.Node):
            band[n] = band.get(n.args[0], (None, None))
        elif key in _CHAIN:
            band[n] = band.get(n.args[0], (None, None))
    return band.get(score.graph.find_nodes(op="output")[0].args[0], (None, None))


def _minus_inf(n) -> bool:
    """A constant made of -inf (full, new_full)."""
    key = op_name(n.target) if isinstance(n, torch.fx.Node) and n.op == "call_function" else None
    value = {"aten.full.default": 1, "aten.new_full.default": 2}.get(key)
    return value is not None and n.args[value] == float("-inf")


def _positive(a) -> bool:
    """A positive number, or a size input whose expression is positive for every size (D ** -0.5)."""
    if isinstance(a, torch.fx.Node):
        expr = getattr(getattr(a.meta.get("val"), "node", None), "expr", None)
        return a.op == "placeholder" and expr is not None and bool(expr.is_positive)
    return isinstance(a, (int, float)) and a > 0


def regions_of(gm: torch.fx.GraphModule) -> list[Region]:
    """The regions `fuse_attention` finds in `gm`, found in a copy: `gm` stays as it is. Their nodes carry the
    names of `gm`'s nodes (values that exist only inside an attention kernel)."""
    g = torch.fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    return fuse_attention(torch.fx.GraphModule(gm, g))


def fuse_attention(gm: torch.fx.GraphModule) -> list[Region]:
    """Replace each recognised attention region of `gm` by one node (in place); the regions found."""
    env = shape_env_of(gm)
    found = []
    for p2 in [n for n in gm.graph.nodes if n.op == "call_function" and op_name(n.target) == _BMM]:
        if p2.graph is not gm.graph or not p2.users:
            continue
        try:
            region = _match(p2, env)
        except (RuntimeError, TypeError, ValueError, IndexError):  # a view chain the replay cannot take
            region = None
        if region is None:
            continue
        args = (region.q, region.k, region.v, *region.side, *([region.sinks] if region.sinks is not None else []))
        with gm.graph.inserting_before(p2):
            node = gm.graph.call_function(attention, args)
        node.meta = {"val": p2.meta["val"], "attention": region}
        region.out = p2.name
        p2.replace_all_uses_with(node)
        for n in sorted(region.nodes, key=lambda n: -list(gm.graph.nodes).index(n)):
            if not n.users:
                gm.graph.erase_node(n)
        found.append(region)
    if found:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return found


@dataclass
class AttentionStage:
    """One attention region run as a FlashAttention-style kernel; its values named as in the pass."""

    name: str  # names the kernel: _{op}_{name}_kernel
    node: str  # the output, (B·H, Sq, Dv)
    q: str
    k: str
    v: str
    score: torch.fx.GraphModule  # the score body (Region.score)
    side: list[str]  # the score body's other inputs, in order
    kinds: list[str]  # of each: "tile" (read at (b, h, query, key) through its strides), "scalar", "size"
    sizes: dict  # a size input -> Python source computing it in the launcher
    sinks: str | None
    like: str | None  # input whose dtype the output takes
    shape: list  # the output's shape (symbolic)
    keys: object  # Sk (symbolic)
    head_dim: object  # D (symbolic)
    attrs: list[str] = field(default_factory=list)  # run-time float attributes the score body reads

    @property
    def writes(self) -> list[str]:
        return [self.node]

    @property
    def launches(self) -> int:
        return 1

    @property
    def reads(self) -> list[str]:
        return [self.q, self.k, self.v] + [n for n, k in zip(self.side, self.kinds) if k != "size"] + (
            [self.sinks] if self.sinks else [])

    def pairs(self, numel) -> int:
        """(query, key) pairs per head that a mask leaves finite (masked_band), of Sq·Sk."""
        sq, sk = numel(self.shape[-2:-1]), numel([self.keys])
        lo, hi = masked_band(self.score)
        lo, hi = (-sq if lo is None else lo), (sk if hi is None else hi)
        return sum(max(0, min(sk - 1, r + hi) - max(0, r + lo) + 1) for r in range(sq))

    def flops(self, numel) -> int:
        """2·D per score and 2 per output element, for each (query, key) pair the mask keeps: `numel` evaluates a
        symbolic shape."""
        heads = numel(self.shape) // max(1, numel(self.shape[-2:]))
        d, dv = numel([self.head_dim]), numel(self.shape[-1:])
        return heads * self.pairs(numel) * (2 * d + 2 * dv)
