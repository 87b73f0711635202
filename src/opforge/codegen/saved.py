"""Per-row statistics the forward saves for the backward, when that moves fewer bytes than recomputing them.

The backward graph recomputes everything the forward computed from the inputs: an RMSNorm's mean square, a
LayerNorm's mean and variance, a softmax's max and sum of exponentials. A row that fits one chunk reads its
inputs once either way, so recomputing costs no bytes and saving would add some; a longer row is walked once
more for each such reduction, and there the forward writes the statistics (one float32 per row each) and the
backward reads them instead of walking (as Liger's norms keep rstd). The choice is made at the request's first
P0 shape and stated in DESIGN.md with its bytes.

Matrix products are saved always (as autograd saves a linear's input and output): the forward has the
product's tile in registers, so storing it costs one write, where recomputing it in the backward reads both
operands again, writes the product anyway, and redoes its 2·M·N·K flops. So are convolutions the library
computes and attentions whose output the backward reads (an output projection's weight gradient): their
output is in memory anyway, and the backward would run the attention's forward kernel again.

So are a max pooling's indices: the forward's kernel finds them anyway, and recomputing them in the backward
would read the input again (eager's pooling writes them too).

So are scans the backward reads (logcumsumexp's output, in its gradient): the backward scans backwards over a
value computed from the forward scan, and a row longer than one chunk cannot be walked both ways at once.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from opforge.codegen.attention_grad import ATTENTION_OP
from opforge.codegen.gemm import PRODUCTS, SAVED_LIBRARY
from opforge.codegen.ops import OP_TABLE, SCAN, op_name, upstream
from opforge.codegen.pooling import POOLS
from opforge.codegen.rows import RowPlan, cut_at


@dataclass
class SavedStats:
    names: list[str]  # the backward's extra inputs, the forward's extra outputs, in order
    bytes_saved: int  # at the deciding shape: recomputation's extra walks, less the stats written and read
    walks: tuple[int, int]  # the backward's looped walks: recomputing, with the stats saved
    what: str = "statistics"  # or "products", "scans"
    flops_saved: int = 0  # products: the backward's recomputing flops


# the joint graph detaches what autograd saved; the value is the same
_SAME_VALUE = {"aten.detach.default", "aten.alias.default", "aten.clone.default"}


def _key(node, memo: dict, inputs: dict):
    """A node's computation, independent of the graph it sits in: its target over its arguments' keys."""
    if node in memo:
        return memo[node]
    if node.op == "placeholder":
        k = ("input", inputs.get(node))
    elif node.op == "call_function" and str(node.target) in _SAME_VALUE:
        k = _key(node.args[0], memo, inputs)
    elif node.op == "call_function":
        def arg(a):
            if isinstance(a, torch.fx.Node):
                return _key(a, memo, inputs)
            if isinstance(a, (list, tuple)):
                return tuple(arg(x) for x in a)
            return repr(a)
        k = (str(node.target), arg(node.args), tuple(sorted((n, arg(v)) for n, v in node.kwargs.items())))
    else:
        k = (node.op, node.name)
    memo[node] = k
    return k


def _keys(gm, n_inputs: int) -> dict:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = {p: i for i, p in enumerate(placeholders[:n_inputs])}
    memo: dict = {}
    return {n: _key(n, memo, inputs) for n in gm.graph.nodes if n.op == "call_function"}


def forward_stats(fwd: RowPlan, bwd: RowPlan, fwd_gm, joint_gm, n_inputs: int) -> list[tuple]:
    """(backward node, forward node) for each row reduction the backward recomputes from the inputs alone
    and the forward's kernel also reduces per row."""
    fwd_keys = {k: n for n, k in _keys(fwd_gm, n_inputs).items()}
    fwd_rows = {r.node for r in fwd.reductions if r.axis == "row"}
    joint_keys = _keys(joint_gm, n_inputs)
    placeholders = [n for n in joint_gm.graph.nodes if n.op == "placeholder"]
    grads = set(placeholders[n_inputs:])
    out = []
    for r in bwd.reductions:
        if r.axis != "row" or upstream([r.node]) & grads:
            continue
        f = fwd_keys.get(joint_keys.get(r.node))
        if f is not None and f in fwd_rows and all(f is not g for _, g in out):  # a repeat stays recomputed
            out.append((r.node, f))
    return out


def forward_products(fwd_gm, joint_gm, n_inputs: int, n_outputs: int) -> list[tuple]:
    """(backward node, forward node) for each matrix product the backward computes again from the inputs to
    find its gradients (the joint graph's outputs after the forward's `n_outputs`)."""
    return _recomputed(fwd_gm, joint_gm, n_inputs, n_outputs, PRODUCTS | SAVED_LIBRARY)


def forward_scans(fwd_gm, joint_gm, n_inputs: int, n_outputs: int) -> list[tuple]:
    """(backward node, forward node) for each scan the backward computes again from the inputs."""
    scans = {k for k, rule in OP_TABLE.items() if rule.kind == SCAN}
    return _recomputed(fwd_gm, joint_gm, n_inputs, n_outputs, scans)


def _recomputed(fwd_gm, joint_gm, n_inputs: int, n_outputs: int, kept: set) -> list[tuple]:
    fwd_keys = {k: n for n, k in _keys(fwd_gm, n_inputs).items() if op_name(n.target) in kept}
    needed, grads = _backward_reach(joint_gm, n_inputs, n_outputs)
    out = []
    for n, k in _keys(joint_gm, n_inputs).items():
        recomputed = op_name(n.target) in kept and n in needed and not (upstream([n]) & grads)
        f = fwd_keys.get(k) if recomputed else None
        if f is not None and all(f is not g for _, g in out):
            out.append((n, f))
    return out


def forward_attentions(fwd_gm, regions: list, joint_gm, n_inputs: int, n_outputs: int) -> list[tuple]:
    """(backward node, forward node, region) for each attention whose output the backward computes again (an
    output projection's weight gradient reads it): the joint's `opforge::attention` node, and the forward's
    product with V that the region replaces there. `regions` are the forward's (attention.regions_of), in the
    order the joint numbers them."""
    by_name = {n.name: n for n in fwd_gm.graph.nodes}
    needed, grads = _backward_reach(joint_gm, n_inputs, n_outputs)
    out = []
    for n in joint_gm.graph.nodes:
        # a size read off it is read off the inputs: the output itself must be read
        read = any(u in needed and isinstance(u.meta.get("val"), torch.Tensor) for u in n.users)
        if n.op == "call_function" and op_name(n.target) == ATTENTION_OP and read and not (upstream([n]) & grads):
            region = regions[n.args[-1]]
            out.append((n, by_name[region.out], region))
    return out


def forward_pool_indices(fwd_gm, joint_gm, n_inputs: int, n_outputs: int) -> list[tuple]:
    """(backward node, (forward node, 1)) for each max pooling whose indices the backward computes again to
    route its gradient: the forward's pooling writes them instead (as eager's does), so the backward gathers
    from the gradient and the indices without reading the input."""
    pools = {k for k, (kind, _, backward, _) in POOLS.items() if kind == "max" and not backward}
    out = []
    for b, f in _recomputed(fwd_gm, joint_gm, n_inputs, n_outputs, pools):
        index = next((u for u in b.users if u.target is operator.getitem and u.args[1] == 1), None)
        if index is not None:
            out.append((index, (f, 1)))
    return out


def _backward_reach(joint_gm, n_inputs: int, n_outputs: int) -> tuple[set, set]:
    """What the joint's gradient outputs (those after the forward's `n_outputs`) depend on, and the upstream
    gradients among its inputs: a node needed and independent of them is the forward computed again."""
    grads = set([n for n in joint_gm.graph.nodes if n.op == "placeholder"][n_inputs:])
    return upstream(joint_gm.graph.find_nodes(op="output")[0].args[0][n_outputs:]), grads


def add_outputs(gm: torch.fx.GraphModule, nodes: list) -> torch.fx.GraphModule:
    """The same graph returning `nodes` after its own outputs; a (node, k) is the k-th value of a node that
    returns several (a max pooling's indices, which the forward may not have read)."""
    g = torch.fx.Graph()
    env: dict = {}
    out = g.graph_copy(gm.graph, env)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    extra = []
    for n in nodes:
        if isinstance(n, tuple):
            src, k = n
            item = next((u for u in env[src].users if u.target is operator.getitem and u.args[1] == k), None)
            if item is None:
                item = g.call_function(operator.getitem, (env[src], k))
                item.meta["val"] = src.meta["val"][k]
            n = item
        else:
            n = env[n]
        extra.append(n)
    g.output((*outs, *extra))
    return torch.fx.GraphModule(gm, g)


def read_instead(joint_gm, nodes: list, names: list[str]) -> torch.fx.GraphModule:
    """The backward graph reading `nodes` from new inputs instead of recomputing them."""
    return cut_at(joint_gm, nodes, names, ["row"] * len(nodes))
