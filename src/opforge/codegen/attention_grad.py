"""The backward of a recognised attention without the S×S matrices.

Autograd's backward of softmax(score(Q·Kᵀ))·V reads the probabilities, so in a joint graph traced from the
reference the region is no longer self-contained. The joint is traced a second time from the forward graph
with each region replaced by `opforge::attention`, a custom op that returns the output and each query's
log-sum-exp and whose autograd formula is `opforge::attention_backward`: the joint then holds the two as
nodes, which the staged planner runs as FlashAttention-2 kernels (codegen/emit_attention.py):

    Δ = rowsum(dO ∘ O)                   per query
    P = exp(s − lse),   s = score(Q·Kᵀ)   recomputed tile by tile from the saved log-sum-exp
    dV = Pᵀ·dO,   dS = P ∘ (dO·Vᵀ − Δ)
    dscores = dS ∘ score′,   dQ = dscores·K,   dK = dscoresᵀ·Q
    d(sink) = −Σ exp(sink − lse)·Δ      a sink's column is sliced off, so its own dP is 0
    d(bias) = Σ dS ∘ ∂score/∂bias       over what a broadcast bias serves (batches, heads, queries, keys):
                                        a kernel of its own

The score body's derivative is taken rule by rule (SCORE_VJP); a body with an op outside the rules, or more
than one side input (a bias) that needs a gradient, or one with more than a value per (query, key), keeps the
joint as traced: GEMM and glue stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from opforge.codegen.attention import CONSTANTS, SCORE_VIEWS, AttentionStage, fuse_attention, side_kind
from opforge.codegen.ops import op_name

ATTENTION_OP = "opforge.attention.default"
ATTENTION_BACKWARD = "opforge.attention_backward.default"


# `bias_grad`: the index in `side` of the tensor that takes a gradient, or -1
@torch.library.custom_op("opforge::attention", mutates_args=())
def _attention(q: Tensor, k: Tensor, v: Tensor, side: list[Tensor], sinks: Optional[Tensor], bias_grad: int,
               region: int) -> Tensor:
    raise RuntimeError("opforge::attention stands in for a region while tracing; it is planned, not run")


@_attention.register_fake
def _(q, k, v, side, sinks, bias_grad, region):
    bh = q.shape[0] * q.shape[1] if q.dim() == 4 else q.shape[0]
    return q.new_empty((bh, q.shape[-2], v.shape[-1]))


@torch.library.custom_op("opforge::attention_backward", mutates_args=())
def _attention_backward(q: Tensor, k: Tensor, v: Tensor, side: list[Tensor], sinks: Optional[Tensor], grad: Tensor,
                        bias_grad: int, region: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    raise RuntimeError("opforge::attention_backward stands in for a region while tracing; it is planned, not run")


@_attention_backward.register_fake
def _(q, k, v, side, sinks, grad, bias_grad, region):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            torch.empty_like(sinks) if sinks is not None else q.new_empty(0),
            torch.empty_like(side[bias_grad]) if bias_grad >= 0 else q.new_empty(0))


def _setup(ctx, inputs, output):
    q, k, v, side, sinks, bias_grad, region = inputs
    ctx.save_for_backward(q, k, v, *side, *([sinks] if sinks is not None else []))
    ctx.n_side, ctx.sinks, ctx.bias_grad, ctx.region = len(side), sinks is not None, bias_grad, region


def _backward(ctx, grad):
    q, k, v, *rest = ctx.saved_tensors
    side, sinks = rest[:ctx.n_side], (rest[ctx.n_side] if ctx.sinks else None)
    dq, dk, dv, dsinks, dbias = torch.ops.opforge.attention_backward(q, k, v, side, sinks, grad, ctx.bias_grad,
                                                                     ctx.region)
    dside = [dbias if i == ctx.bias_grad else None for i in range(ctx.n_side)]
    return dq, dk, dv, dside, (dsinks if ctx.sinks else None), None, None


_attention.register_autograd(_backward, setup_context=_setup)


# d(input) of each score-body op from the gradient `g` of its output `y`; args rendered as Triton source.
# None: no gradient flows to that argument (a condition, a fill value).
SCORE_VJP = {
    "aten.add.Tensor": lambda a, y, g, alpha="1": [g, g if alpha in ("1", "1.0") else f"{g} * {alpha}"],
    "aten.sub.Tensor": lambda a, y, g, alpha="1": [g, f"-{g}" if alpha in ("1", "1.0") else f"-{g} * {alpha}"],
    "aten.mul.Tensor": lambda a, y, g: [f"{g} * {a[1]}", f"{g} * {a[0]}"],
    "aten.div.Tensor": lambda a, y, g: [f"{g} / {a[1]}", f"-{g} * {a[0]} / ({a[1]} * {a[1]})"],
    "aten.neg.default": lambda a, y, g: [f"-{g}"],
    "aten.tanh.default": lambda a, y, g: [f"{g} * (1.0 - {y} * {y})"],
    "aten.exp.default": lambda a, y, g: [f"{g} * {y}"],
    "aten.sigmoid.default": lambda a, y, g: [f"{g} * {y} * (1.0 - {y})"],
    "aten.where.self": lambda a, y, g: [None, f"tl.where({a[0]}, {g}, 0.0)", f"tl.where({a[0]}, 0.0, {g})"],
    "aten.masked_fill.Scalar": lambda a, y, g: [f"tl.where({a[1]}, 0.0, {g})", None, None],
    "aten.masked_fill.Tensor": lambda a, y, g: [f"tl.where({a[1]}, 0.0, {g})", None, None],
    "aten._to_copy.default": lambda a, y, g: [g],  # the tile stays float32 in the kernel
}

def score_reading(score: torch.fx.GraphModule, wrt: torch.fx.Node | None = None) -> list:
    """The score body's nodes whose value depends on the scores (its first input), or on input `wrt`, in graph
    order."""
    nodes = list(score.graph.nodes)
    reading = {wrt if wrt is not None else nodes[0]}
    for n in nodes[1:]:  # a constant shaped like the scores (scores.new_full) reads only their size
        if n.op == "call_function" and op_name(n.target) not in CONSTANTS and any(
                a in reading for a in n.all_input_nodes):
            reading.add(n)
    return [n for n in nodes if n in reading and n.op == "call_function"]


def differentiable(score: torch.fx.GraphModule, wrt: torch.fx.Node | None = None) -> bool:
    """Every op the scores (or input `wrt`) flow through has a rule in SCORE_VJP (or passes the gradient
    through)."""
    return all(op_name(n.target) in SCORE_VJP or op_name(n.target) in SCORE_VIEWS
               for n in score_reading(score, wrt))


@dataclass
class TracedAttention:
    """What the planner needs of a region the joint holds as `opforge::attention` nodes: the score body and
    how to read its side inputs (the node's tensors in order; the sizes computed in the launcher)."""

    score: torch.fx.GraphModule
    kinds: list[str]  # of each side input of the score body: "tile", "scalar" or "size"
    sizes: dict  # name of a size input -> its node in the forward graph, read off that graph's inputs
    inputs: list  # the forward graph's placeholders: the op's inputs, in order
    attrs: list[str] = field(default_factory=list)


def fused_forward(gm: torch.fx.GraphModule, grad_inputs: list[int]) -> tuple[torch.fx.GraphModule, list] | None:
    """A copy of the forward graph with its attention regions as single nodes, and the regions; None when
    there is none or a region's score body cannot be differentiated here (a side input that needs a gradient,
    an op without a rule)."""
    g = torch.fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    copy = torch.fx.GraphModule(gm, g)
    regions = fuse_attention(copy)
    if not regions:
        return None
    placeholders = copy.graph.find_nodes(op="placeholder")
    needs_grad = {placeholders[i] for i in grad_inputs}
    for r in regions:
        tensors = [s for s in r.side if isinstance(s.meta.get("val"), torch.Tensor)]
        learned = [i for i, t in enumerate(tensors) if _upstream(t) & needs_grad]
        if not differentiable(r.score) or len(learned) > 1:
            return None
        if learned:
            r.bias_grad = learned[0]
            if not _whole_tile(r, tensors[r.bias_grad]):
                return None
    return copy, regions


def _whole_tile(region, bias) -> bool:
    """A bias the kernels can differentiate: read by ops with rules, at most one value per (query, key) of the
    scores: a per-head relative bias, a batch's own, or one broadcast along the queries or the keys (ALiBi's
    per-head slopes), whose gradient the kernel sums along them."""
    shape, scores = bias.meta["val"].shape, region.score.graph.find_nodes(op="placeholder")[0].meta["val"].shape
    tail = ((1, 1) + tuple(shape))[-2:]
    if side_kind(bias) != "tile" or any(not summed and n != s for summed, n, s in
                                        zip(bias_sums(bias), tail, tuple(scores)[-2:])):
        return False
    placeholder = region.score.graph.find_nodes(op="placeholder")[1 + region.side.index(bias)]
    return differentiable(region.score, placeholder)


def bias_sums(bias: torch.fx.Node) -> tuple[bool, bool]:
    """Whether a learned bias is broadcast along the queries, and along the keys (a 1 in its last two dimensions,
    right-aligned): its gradient is summed there."""
    tail = ((1, 1) + tuple(bias.meta["val"].shape))[-2:]
    return tuple(isinstance(n, int) and n == 1 for n in tail)


def _upstream(n) -> set:
    seen, stack = set(), [n]
    while stack:
        x = stack.pop()
        if x not in seen:
            seen.add(x)
            stack += list(x.all_input_nodes)
    return seen


class RunFused(torch.fx.Interpreter):
    """Runs a `fused_forward` graph with each region as `opforge::attention` (region k: the k-th found)."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.keys = {n: k for k, n in enumerate(n for n in gm.graph.nodes if "attention" in n.meta)}

    def run_node(self, n):
        if n not in self.keys:
            return super().run_node(n)
        region = n.meta["attention"]
        args = [self.env[a] if isinstance(a, torch.fx.Node) else a for a in n.args]
        q, k, v, rest = args[0], args[1], args[2], args[3:]
        side = rest[:len(region.side)]
        sinks = rest[len(region.side)] if region.sinks is not None else None
        tensors = [s for s in side if isinstance(s, torch.Tensor)]
        return torch.ops.opforge.attention(q, k, v, tensors, sinks, region.bias_grad, self.keys[n])


def prepare_joint(gm: torch.fx.GraphModule, records: list[TracedAttention]) -> None:
    """Tidy a joint traced through `RunFused` (in place): detaches dropped (the op's output is read as it is),
    dead code removed, each attention node's record in its meta."""
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and op_name(n.target) == "aten.detach.default":
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)
    gm.graph.eliminate_dead_code()
    for n in gm.graph.nodes:
        if n.op == "call_function" and op_name(n.target) in (ATTENTION_OP, ATTENTION_BACKWARD):
            n.meta["attention"] = records[n.args[-1]]
    gm.recompile()


@dataclass
class AttentionBackwardStage(AttentionStage):
    """dQ, dK, dV (and the sinks' and a bias's gradients) of one attention from its inputs and dO; `node` is dQ."""

    grad: str = ""
    dk: str = ""
    dv: str = ""
    dsinks: str | None = None
    bias: str | None = None  # the side tile that takes a gradient, and its gradient
    dbias: str | None = None
    bias_sums: tuple = (False, False)  # the bias is broadcast along the queries, the keys (bias_sums)
    grad_like: dict = field(default_factory=dict)  # each gradient -> input whose dtype it takes (else float32)

    @property
    def writes(self) -> list[str]:
        return [self.node, self.dk, self.dv] + ([self.dsinks] if self.dsinks else []) + (
            [self.dbias] if self.dbias else [])

    @property
    def reads(self) -> list[str]:
        return super().reads + [self.grad]

    @property
    def launches(self) -> int:
        """dQ over query blocks (with lse and Δ), dK and dV over key blocks, the sinks' sums, the bias's tiles
        (and the sum of their slots, for a bias broadcast along the queries or keys)."""
        return 2 + bool(self.dsinks) + bool(self.dbias) + any(self.bias_sums)

    def flops(self, numel) -> int:
        """Q·Kᵀ and dO·Vᵀ in three walks, then Pᵀ·dO, dscoresᵀ·Q and dscores·K: 18·D per (query, key) pair the
        mask keeps (D = Dv); a bias's gradient computes Q·Kᵀ and dO·Vᵀ once more, 4·D."""
        heads, d = numel(self.shape) // max(1, numel(self.shape[-2:])), numel([self.head_dim])
        return heads * self.pairs(numel) * (18 + 4 * bool(self.dbias)) * d
