"""Composite ATen ops split into the pointwise ops and reductions the planners lower.

Softmax, log-softmax, logsumexp, GELU, SiLU, layer norm and their backward formulas are traced through
PyTorch's own decompositions (`torch._decomp`), so the graph says exactly what PyTorch computes.
Variance is rewritten here as mean((x - mean(x))²) · n / (n - correction): the decompositions lower it to
prims that carry no ATen schema, and this two-level form is the numerically safe one a kernel wants anyway.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator

import sympy
import torch
import torch.nn.functional as F
from torch._decomp import get_decompositions
from torch._guards import detect_fake_mode
from torch.overrides import TorchFunctionMode

from opforge.codegen.ops import OP_TABLE, POINTWISE, REDUCE_KIND, op_name
from opforge.codegen.symbolic import expr_of, same

aten = torch.ops.aten

DECOMPOSITIONS = get_decompositions([
    aten._softmax, aten._softmax_backward_data, aten._log_softmax, aten._log_softmax_backward_data,
    aten.logsumexp, aten.silu, aten.silu_backward, aten.gelu, aten.gelu_backward, aten.tanh_backward,
    aten.sigmoid_backward, aten.native_layer_norm, aten.native_layer_norm_backward, aten.rsub,
    aten.threshold_backward, aten.leaky_relu, aten.leaky_relu_backward, aten.hardtanh, aten.hardtanh_backward,
    aten.softplus, aten.softplus_backward, aten.elu, aten.elu_backward, aten.hardsigmoid,
    aten.hardsigmoid_backward, aten.hardswish, aten.hardswish_backward, aten.mish, aten.mish_backward,
    aten.addcmul, aten.addcdiv, aten.lerp, aten.square, aten.xlogy, aten.logit, aten.log_sigmoid_forward,
    aten.nll_loss_forward, aten.nll_loss_backward, aten._native_batch_norm_legit,
    aten._native_batch_norm_legit_no_training, aten.native_batch_norm_backward, aten.native_group_norm,
    aten.native_group_norm_backward, aten.linalg_vector_norm, aten.norm, aten.mse_loss, aten.mse_loss_backward,
    aten.smooth_l1_loss, aten.smooth_l1_loss_backward, aten.huber_loss, aten.huber_loss_backward,
    aten.soft_margin_loss, aten.soft_margin_loss_backward, aten.binary_cross_entropy,
    aten.binary_cross_entropy_backward, aten.binary_cross_entropy_with_logits,
])


def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    """Probability targets, mean over rows: torch before 2.13 divides by input.numel() read as a C++ int, which
    fixes every size of the trace; the same formula with the size kept symbolic."""
    if not (target.is_floating_point() and weight is None and size_average is None and reduce is None
            and reduction == "mean" and label_smoothing == 0.0 and input.dim() >= 2):
        return NotImplemented
    return -(torch.log_softmax(input, 1) * target).sum() / (input.numel() // input.shape[1])


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention as the product, softmax and product it computes: each backend's kernel
    traces to an opaque op, the formula to the pattern codegen/attention.py fuses. Dropout draws random numbers
    the golden cannot replay: left to fail as an op without a lowering."""
    if dropout_p != 0.0:
        return NotImplemented
    if enable_gqa and key.dim() >= 3 and query.shape[-3] != key.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key, value = (t.unsqueeze(-3).expand(*t.shape[:-2], groups, *t.shape[-2:]).flatten(-4, -3)
                      for t in (key, value))
    scores = query @ key.transpose(-2, -1) * (query.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:  # top-left aligned, as torch's: query i sees keys 0..i
        scores = scores + torch.triu(scores.new_full((query.shape[-2], key.shape[-2]), float("-inf")), diagonal=1)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
            else scores + attn_mask
    return torch.softmax(scores, dim=-1) @ value


_SQRT = math.sqrt


def _size_sqrt(x):
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        return torch.sym_float(x) ** 0.5
    return _SQRT(x)


def _instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                   momentum=0.1, eps=1e-5):
    """Instance norm from its batch statistics, per sample and channel over the other dimensions: torch's own
    path reshapes the batch into channels and repeats the weight once per sample."""
    if not use_input_stats or running_mean is not None or running_var is not None or input.dim() < 3:
        return NotImplemented
    var, mean = torch.var_mean(input, list(range(2, input.dim())), correction=0, keepdim=True)
    out = (input - mean) * torch.rsqrt(var + eps)
    channels = [1, -1] + [1] * (input.dim() - 2)
    out = out * weight.view(channels) if weight is not None else out
    return out + bias.view(channels) if bias is not None else out


def _group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Group norm over a view with the groups apart, (N, G, C/G, ...): its statistics reduce the trailing
    dimensions of that view, and the weight, viewed (G, C/G, 1...), lines up with it. torch's own decomposition
    views the input (N, G, C/G·H·W) and the result back per channel, which no one walk order suits."""
    if input.dim() < 2:
        return NotImplemented
    n, c = input.shape[:2]
    grouped = input.view(n, num_groups, c // num_groups, *input.shape[2:])
    var, mean = torch.var_mean(grouped, list(range(2, grouped.dim())), correction=0, keepdim=True)
    out = (grouped - mean) * torch.rsqrt(var + eps)
    channels = [num_groups, -1] + [1] * (input.dim() - 2)
    out = out * weight.view(channels) if weight is not None else out
    out = out + bias.view(channels) if bias is not None else out
    return out.view(input.shape)


def _one(v, default=None):
    """A 1-D pooling argument (an int or a 1-tuple; None or () for the default) as an int."""
    if v is None or (isinstance(v, (tuple, list)) and not v):
        return default
    return v[0] if isinstance(v, (tuple, list)) else v


def _max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """1-D max pooling as 2-D pooling over a height of one: torch's composite reads the length as an int. The
    indices are the same, positions along the length."""
    k = _one(kernel_size)
    out = F.max_pool2d(input.unsqueeze(-2), (1, k), (1, _one(stride, k)), (0, _one(padding)), (1, _one(dilation)),
                       ceil_mode=ceil_mode, return_indices=True)
    values, indices = out[0].squeeze(-2), out[1].squeeze(-2)
    return (values, indices) if return_indices else values


class _CumProd(torch.autograd.Function):
    """cumprod with its gradient in tensor operations: torch's C++ formula reads the scanned length as an int.
    The same values as torch's, zeros included: before a row's first zero the product rule's reverse sum over
    the element; at the first zero the products of the elements around it; after it nothing."""

    @staticmethod
    def forward(ctx, x, dim):
        out = torch.cumprod(x, dim)
        ctx.save_for_backward(x, out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        d = ctx.dim
        zeros = torch.cumsum((x == 0).to(x.dtype), d)  # zeros up to and including each element
        before, first = zeros == 0, (x == 0) & (zeros == 1)
        # d out_j / d x_k = out_j / x_k for j >= k, where no zero comes first
        spread = (g * out).flip(d).cumsum(d).flip(d) / torch.where(before, x, 1.0)
        # at the first zero z: the product before it times sum_{j >= z} g_j * prod_{z < i <= j} x_i
        head = torch.cumprod(torch.where(before, x, 1.0), d)
        tail = torch.cumprod(torch.where((zeros > 0) & ~first, x, 1.0), d)
        at_zero = head * torch.where(zeros > 0, g * tail, 0.0).sum(d, keepdim=True)
        return torch.where(before, spread, torch.where(first, at_zero, 0.0)), None


def _cumprod(input, dim, *, dtype=None, out=None):
    if out is not None or not input.is_floating_point():
        return NotImplemented
    return _CumProd.apply(input if dtype is None else input.to(dtype), dim)


class _Prod(torch.autograd.Function):
    """prod along a dimension with its gradient in tensor operations: torch's formula asks which elements are
    zero (`nonzero`), which no trace with symbolic sizes can follow. The same values: the product over the
    element where a row has no zero; the product of the others at a row's only zero; nothing elsewhere."""

    @staticmethod
    def forward(ctx, x, dim, keepdim):
        out = torch.prod(x, dim, keepdim=True)
        ctx.save_for_backward(x, out)
        ctx.dim = dim
        return out if keepdim else out.squeeze(dim)

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        g = g if g.dim() == x.dim() else g.unsqueeze(ctx.dim)
        zero = x == 0
        zeros = zero.to(x.dtype).sum(ctx.dim, keepdim=True)
        nonzero = torch.where(zero, 1.0, x)
        lone_zero = torch.where((zeros == 1) & zero, torch.prod(nonzero, ctx.dim, keepdim=True), 0.0)
        return g * torch.where(zeros == 0, out / nonzero, lone_zero), None, None


def _prod(input, dim=None, keepdim=False, *, dtype=None, **rest):
    if rest or not isinstance(dim, int) or not input.is_floating_point():
        return NotImplemented
    return _Prod.apply(input if dtype is None else input.to(dtype), dim, keepdim)


class _BestAlong(torch.autograd.Function):
    """max or min along a dimension other than the last, values and indices, with the gradient sent to the first
    element holding each value (a NaN: the first NaN), as torch's index does. torch scatters the gradient by the
    index along that dimension, a column index the kernels have only along the last; the first holder is found
    by a running count along the dimension instead."""

    @staticmethod
    def forward(ctx, x, dim, keepdim, best):
        values, indices = best(x, dim, keepdim=True)
        ctx.save_for_backward(x, values)
        ctx.mark_non_differentiable(indices)
        ctx.dim, ctx.keepdim = dim, keepdim
        return (values, indices) if keepdim else (values.squeeze(dim), indices.squeeze(dim))

    @staticmethod
    def backward(ctx, g, _):
        x, values = ctx.saved_tensors
        g = g if ctx.keepdim else g.unsqueeze(ctx.dim)
        holds = (x == values) | ((x != x) & (values != values))
        first = holds & (torch.cumsum(holds.to(x.dtype), ctx.dim) == 1)
        return torch.where(first, g, 0.0), None, None, None


def _best_along(best, result):
    def along(input, dim=None, keepdim=False, **rest):
        if rest or not isinstance(dim, int) or not input.is_floating_point() or dim % input.dim() == input.dim() - 1:
            return NotImplemented  # a whole-tensor or elementwise max, or the last dimension (a select by column)
        return result(_BestAlong.apply(input, dim, keepdim, best))
    return along


class SizeSafeFunctionals(TorchFunctionMode):
    """While tracing, functionals whose C++ composite reads sizes as ints in some torch versions, or that reach
    a backend's opaque kernel, are replaced by the same formula in tensor operations, so that every supported
    torch traces one symbolic graph of ops the engine lowers."""

    TABLE = {F.cross_entropy: _cross_entropy, F.scaled_dot_product_attention: _sdpa,
             F.instance_norm: _instance_norm, F.group_norm: _group_norm, F.max_pool1d: _max_pool1d,
             F.max_pool1d_with_indices: functools.partial(_max_pool1d, return_indices=True),
             torch.cumprod: _cumprod, torch.Tensor.cumprod: _cumprod, torch.prod: _prod, torch.Tensor.prod: _prod,
             torch.max: _best_along(torch.max, torch.return_types.max),
             torch.Tensor.max: _best_along(torch.max, torch.return_types.max),
             torch.min: _best_along(torch.min, torch.return_types.min),
             torch.Tensor.min: _best_along(torch.min, torch.return_types.min)}

    def __init__(self):
        super().__init__()
        self.einsums: list[str] = []  # equations, for stage 2 to name an einsum it cannot fuse

    def __enter__(self):
        # math.sqrt(q.shape[-1]) would fix the head dimension at the probe size (a SymInt taken as a float): the
        # trace takes it as size arithmetic instead, a power of 1/2 that the kernels compute from their sizes
        math.sqrt = _size_sqrt
        return super().__enter__()

    def __exit__(self, *exc):
        math.sqrt = _SQRT
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.einsum and args and isinstance(args[0], str):
            self.einsums.append(args[0])
        rewrite = self.TABLE.get(func)
        if rewrite is not None:
            out = rewrite(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


def _one_per_row(x, dim, index, src=None) -> bool:
    """An index of one element per row along the last dimension (and a source shaped like it)."""
    last = dim % x.dim() == x.dim() - 1 and index.dim() == x.dim() and index.shape[-1] == 1
    return last and (src is None or src.shape == index.shape)


def _one_hot_last(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(index == column) over the last dimension of x: a gather or scatter of one element per row as a select."""
    return torch.arange(x.shape[-1], device=x.device) == index


def _gather(x, dim, index, sparse_grad=False):
    """x.gather(-1, index): the row's sum of x where the column is the index. Exact, since every other term
    is zero, and a row reduction the row planner fuses."""
    if not _one_per_row(x, dim, index):
        return NotImplemented
    return torch.where(_one_hot_last(x, index), x, 0.0).sum(-1, keepdim=True)


def _scatter(x, dim, index, value):
    """x.scatter(-1, index, value) of a scalar, or of a source shaped like the index: a select by column."""
    if not _one_per_row(x, dim, index, value if isinstance(value, torch.Tensor) else None):
        return NotImplemented
    return torch.where(_one_hot_last(x, index), value, x)


def _scatter_add(x, dim, index, src):
    """The backward of a gather: src added at each row's index."""
    if not _one_per_row(x, dim, index, src):
        return NotImplemented
    return x + torch.where(_one_hot_last(x, index), src, 0.0)


DECOMPOSITIONS[aten.gather.default] = _gather
DECOMPOSITIONS[aten.scatter_add.default] = _scatter_add
DECOMPOSITIONS[aten.scatter.value] = _scatter
DECOMPOSITIONS[aten.scatter.src] = _scatter



def _as_strided(input, size, stride, storage_offset=None):
    """An as_strided that lays a contiguous value out with its own contiguous strides is a view (group norm's
    decomposition takes its per-channel scale this way)."""
    dense = [1]
    for d in reversed(list(size)[1:]):
        dense.insert(0, dense[0] * d)
    if storage_offset or list(stride) != dense or not input.is_contiguous() or input.numel() != math.prod(size):
        return NotImplemented
    return input.view(size)


DECOMPOSITIONS[aten.as_strided.default] = _as_strided


def _layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    """LayerNorm's input gradient as rstd · (g - mean(g) - x̂ · mean(g · x̂)), g = grad · weight.

    PyTorch's own decomposition scales by N before subtracting sums (N·g - Σg - …), which overflows float32
    for large g where its CPU kernel and this form do not; the math is the same."""
    axis = input.dim() - len(normalized_shape)
    dims, outer = list(range(axis, input.dim())), list(range(axis))
    x_hat = (input - mean) * rstd
    g = grad_out * weight if weight is not None else grad_out
    d_input = rstd * (g - g.mean(dims, keepdim=True) - x_hat * (g * x_hat).mean(dims, keepdim=True)) \
        if output_mask[0] else None
    d_weight = (grad_out * x_hat).sum(outer) if output_mask[1] and weight is not None else None
    d_bias = grad_out.sum(outer) if output_mask[2] and bias is not None else None
    return d_input, d_weight, d_bias


DECOMPOSITIONS[aten.native_layer_norm_backward.default] = _layer_norm_backward

_VAR = (aten.var.correction, aten.var_mean.correction, aten.std.correction)


def rewrite_variance(gm: torch.fx.GraphModule) -> None:
    """Replace var / var_mean / std nodes by means (and a square root), in place."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _VAR:
            continue
        x = node.args[0]
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        correction = node.kwargs.get("correction", 1)
        correction = 1 if correction is None else correction
        keepdim = node.kwargs.get("keepdim", False)
        xv = x.meta["val"]
        dims = list(range(xv.dim())) if dims is None else list(dims)

        def add(target, args, node=node):
            return _insert(graph, node, target, args)

        mean_k = add(aten.mean.dim, (x, dims, True))
        diff = add(aten.sub.Tensor, (x, mean_k))
        if node.target == aten.std.correction:
            # std = s · sqrt(mean((d / s)²)), s = max |d|: finite whenever the deviation is, as PyTorch's (which
            # accumulates in float64) is; the plain square of a deviation past 1.8e19 overflows float32
            scale = add(aten.clamp_min.default, (add(aten.amax.default, (add(aten.abs.default, (diff,)), dims, True)),
                                                 torch.finfo(torch.float32).tiny))
            diff = add(aten.div.Tensor, (diff, scale))
        sq = add(aten.mul.Tensor, (diff, diff))
        var = add(aten.mean.dim, (sq, dims, keepdim))
        if correction:  # n / (n - correction), from size nodes so the kernel reads n at run time
            n = None
            for d in dims:
                size = add(aten.sym_size.int, (x, d))
                n = size if n is None else add(operator.mul, (n, size))
            var = add(aten.mul.Tensor, (var, add(operator.truediv, (n, add(operator.sub, (n, correction))))))
        if node.target == aten.std.correction:
            tiny = torch.finfo(torch.float32).tiny
            dev = add(aten.abs.default, (add(aten.sub.Tensor, (x, mean_k)),))
            out_scale = scale if keepdim else add(aten.clamp_min.default, (add(aten.amax.default, (dev, dims, False)),
                                                                          tiny))
            node.replace_all_uses_with(add(aten.mul.Tensor, (add(aten.sqrt.default, (var,)), out_scale)))
        elif node.target == aten.var.correction:
            node.replace_all_uses_with(var)
        else:
            mean = mean_k if keepdim else add(aten.mean.dim, (x, dims, False))
            for user in list(node.users):
                if user.target is operator.getitem:
                    user.replace_all_uses_with(var if user.args[1] == 0 else mean)
                    graph.erase_node(user)
        graph.erase_node(node)
    graph.lint()
    gm.recompile()


def rewrite_inplace(gm: torch.fx.GraphModule) -> None:
    """In-place ops that decompositions emit on a temporary (softplus' backward fills a mask in place) become
    their pure twin, when nothing reads the temporary after the write. Otherwise they stay, and stage 2
    names them."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        name = getattr(node.target, "_schema", None) and node.target._schema.name
        if node.op != "call_function" or not name or not name.endswith("_") or not node.args:
            continue
        pure = getattr(getattr(aten, name.split("::")[-1][:-1], None), node.target._overloadname, None)
        target = node.args[0]
        later = [u for u in target.users if u is not node and order[u] > order[node]]
        if pure is None or later:
            continue
        node.target = pure
    gm.graph.lint()
    gm.recompile()


def negated_sizes(gm: torch.fx.GraphModule) -> None:
    """A size negated in Python (huber loss' gradient takes -1/numel) as a product with -1, the size arithmetic
    the kernels write."""
    for node in gm.graph.find_nodes(op="call_function", target=operator.neg):
        node.target, node.args = operator.mul, (node.args[0], -1)
    gm.graph.lint()
    gm.recompile()


def lifted_scalars(gm: torch.fx.GraphModule) -> None:
    """A number made a tensor in the reference (`torch.min(x, torch.tensor(c))`) is traced as a copy of a tensor
    constant: a literal, as `scalar_tensor` of its value and dtype."""
    graph = gm.graph
    for node in graph.find_nodes(op="call_function", target=aten.lift_fresh_copy.default):
        src = node.args[0]
        const = getattr(gm, src.target, None) if src.op == "get_attr" else None
        if not isinstance(const, torch.Tensor) or const.dim() != 0 or const.is_complex():
            continue
        with graph.inserting_before(node):
            lit = graph.call_function(aten.scalar_tensor.default, (const.item(),), {"dtype": const.dtype})
        lit.meta = dict(node.meta)
        node.replace_all_uses_with(lit)
        graph.erase_node(node)
        if not src.users:
            graph.erase_node(src)
    graph.lint()
    gm.recompile()


_LIKE = (aten.zeros_like.default, aten.ones_like.default, aten.full_like.default, aten.empty_like.default)


def shape_only_selects(gm: torch.fx.GraphModule) -> None:
    """`zeros_like(x.select(d, i).unsqueeze(d))` reads nothing of x but the shape of one slice along d (an
    exclusive scan's leading zero): the same shape as the width-one slice x[..., i:i+1, ...], which the planners
    take where they refuse a select."""
    graph = gm.graph
    for node in [n for t in _LIKE for n in graph.find_nodes(op="call_function", target=t)]:
        up = node.args[0]
        if up.target != aten.unsqueeze.default or up.args[0].target != aten.select.int:
            continue
        x, dim, index = up.args[0].args
        if up.args[1] != dim or not isinstance(index, int) or index < 0:
            continue
        with graph.inserting_before(node):
            part = graph.call_function(aten.slice.Tensor, (x, dim, index, index + 1))
        part.meta = dict(up.meta)
        node.replace_input_with(up, part)
        for dead in (up, up.args[0]):
            if not dead.users:
                graph.erase_node(dead)
    graph.lint()
    gm.recompile()


def drop_full_slices(gm: torch.fx.GraphModule) -> None:
    """A slice that keeps a whole dimension (`x[:, None]` traces one for the `:`) is its source, and its
    gradient (slice_backward of the same slice) is the gradient itself: no planner has to tell them from real
    ones."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.slice.Tensor, aten.slice_backward.default):
            continue
        if node.target == aten.slice_backward.default:  # its gradient: (grad, sizes, dim, start, end, step)
            src, _, dim, start, end, step = node.args
        else:
            src, dim, start, end, step = (list(node.args) + [0, None, None, 1][len(node.args) - 1:])[:5]
        if (start or 0) != 0 or step != 1 or str(node.meta["val"].shape) != str(src.meta["val"].shape):
            continue
        node.replace_all_uses_with(src)
        graph.erase_node(node)
    graph.lint()
    gm.recompile()


_VALUE_INDEX = {aten.max.dim: (aten.amax.default, aten.argmax.default),
                aten.min.dim: (aten.amin.default, aten.argmin.default)}


def split_value_index(gm: torch.fx.GraphModule) -> None:
    """max.dim and min.dim return the values and their indices together: each becomes its own reduction, amax
    and argmax (amin and argmin), which the row kernel finds in the same walk."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _VALUE_INDEX:
            continue
        x, dim, keepdim = (list(node.args) + [False])[:3]
        for user in list(node.users):
            if user.target is not operator.getitem:
                break
            value, index = _VALUE_INDEX[node.target]
            with graph.inserting_before(user):
                new = graph.create_node("call_function", value, (x, [dim], keepdim), name=f"{node.name}_values") \
                    if user.args[1] == 0 else \
                    graph.create_node("call_function", index, (x, dim, keepdim), name=f"{node.name}_indices")
            new.meta["val"] = user.meta["val"]
            user.replace_all_uses_with(new)
            graph.erase_node(user)
        if not node.users:
            graph.erase_node(node)
    graph.lint()
    gm.recompile()


_UNIT_REDUCTIONS = {aten.amax.default, aten.amin.default, aten.sum.dim_IntList, aten.mean.dim,
                    aten.argmax.default, aten.argmin.default}


def unit_reductions(gm: torch.fx.GraphModule) -> None:
    """A reduction over dimensions of size one (a max over the dimension a keepdim sum left) is its input,
    squeezed unless keepdim, and an index over them is zero; an arange over one element is a zero. No kernel is
    then asked to walk a row of one column."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in (aten.arange.default, aten.arange.start) and list(node.args) in ([1], [0, 1]):
            with graph.inserting_before(node):
                new = graph.call_function(aten.full.default, ([1], 0), {"dtype": node.meta["val"].dtype})
            new.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            continue
        if node.target not in _UNIT_REDUCTIONS or len(node.args) < 2 or node.args[1] is None:
            continue
        x, dims = node.args[0], node.args[1]
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        val, shape = node.meta["val"], x.meta["val"].shape
        dims = sorted({d % len(shape) for d in ([dims] if isinstance(dims, int) else dims)}) if shape else []
        if not dims or any(not isinstance(shape[d], int) or shape[d] != 1 for d in dims) or node.kwargs.get("dtype"):
            continue
        index = node.target in (aten.argmax.default, aten.argmin.default)
        if not index and val.dtype != x.meta["val"].dtype:
            continue
        with graph.inserting_before(node):
            new = x
            if index:
                new = graph.call_function(aten.zeros_like.default, (x,), {"dtype": val.dtype})
                new.meta["val"] = val if keepdim else torch.zeros_like(x.meta["val"], dtype=val.dtype)
            if not keepdim:
                new = graph.call_function(aten.squeeze.dims, (new, dims))
                new.meta["val"] = val
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    graph.lint()
    gm.recompile()


_REVERSED = {aten.cumsum.default: torch.ops.opforge.reverse_cumsum.default,
             aten.logcumsumexp.default: torch.ops.opforge.reverse_logcumsumexp.default}


def reverse_scans(gm: torch.fx.GraphModule) -> None:
    """flip(flip(x)) is x, and flip(scan(flip(x))) along one dimension is the scan run backwards (how the
    gradients of cumsum and logcumsumexp are written): a kernel then scans a row from its end, and reads no
    column back to front."""
    graph = gm.graph

    def flipped(n, dim=None):  # the flip's source when n flips one dimension (that one, when given)
        if n.op != "call_function" or n.target != aten.flip.default or len(n.args[1]) != 1:
            return None
        rank = n.meta["val"].dim()
        return n.args[0] if dim is None or n.args[1][0] % rank == dim % rank else None

    for node in list(graph.nodes):
        src = flipped(node)
        if src is None:
            continue
        dim = node.args[1][0]
        inner = flipped(src, dim)
        if inner is not None:
            node.replace_all_uses_with(inner)
        elif src.op == "call_function" and src.target in _REVERSED and len(src.users) == 1 and \
                src.args[1] % node.meta["val"].dim() == dim % node.meta["val"].dim():
            x = flipped(src.args[0], dim)
            if x is None:
                continue
            with graph.inserting_before(node):
                rev = graph.create_node("call_function", _REVERSED[src.target], (x, src.args[1]),
                                        name=f"reverse_{src.name}")
            rev.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(rev)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()


RESHAPES = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_REORDERS = RESHAPES | {aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.permute.default}


def fold_reshapes(gm: torch.fx.GraphModule) -> None:
    """A reshape at the end of a chain of views, unsqueezes and permutes that leaves the elements in their order
    (what einsum traces: size-1 dimensions added, moved about and viewed away) is a reshape of the chain's start:
    the planners then see one view where a product's operand or result is only regrouped."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in RESHAPES or not _contiguous(node):
            continue
        start, src = None, node.args[0]
        while isinstance(src, torch.fx.Node) and src.op == "call_function" and src.target in _REORDERS:
            src = src.args[0]
            if _contiguous(src):
                start = src
        if start is not None and start is not node.args[0]:
            node.args = (start, *node.args[1:])
    for node in list(graph.nodes):  # a size read off a reshape is its argument: the reshape may go then
        if node.op == "call_function" and node.target == aten.sym_size.int and node.args[0].target in RESHAPES:
            size = node.args[0].args[1][node.args[1]]
            if isinstance(size, torch.fx.Node) or (isinstance(size, int) and size >= 0):
                node.replace_all_uses_with(size)
                graph.erase_node(node)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()


SLICE_TO_END = 2**63 - 1  # the end make_fx writes for `x[a:]`: the slice runs to the dimension's end


def split_to_slices(gm: torch.fx.GraphModule) -> None:
    """Each piece of a split (`qkv.split(E, -1)`, `x.chunk(2, -1)`) is a slice of the tensor: planners know
    slices (a launcher view before an attention, columns of a row kernel), not tuples of pieces."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.split.Tensor, aten.split_with_sizes.default):
            continue
        x, sizes, dim = (list(node.args) + [0])[:3]
        pieces = len(node.meta["val"])
        starts, ends = [0], []
        for i in range(pieces):  # piece i is [starts[i], ends[i]): equal sizes, or the sizes given
            size = sizes if node.target == aten.split.Tensor else sizes[i]
            last = i == pieces - 1 and node.target == aten.split.Tensor  # a split's last piece may be shorter
            end = SLICE_TO_END if last else size if starts[i] == 0 else _insert(
                graph, node, operator.add, (starts[i], size))
            ends.append(end)
            starts.append(end)
        for user in list(node.users):
            if user.target is not operator.getitem:
                break
            i = user.args[1]
            piece = _insert(graph, user, aten.slice.Tensor, (x, dim, starts[i], ends[i]))
            user.replace_all_uses_with(piece)
            graph.erase_node(user)
        else:
            graph.erase_node(node)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()


def pairs_to_strided_slices(gm: torch.fx.GraphModule) -> None:
    """Element k of each group of m after the last dimension is viewed as (E, m) — `x.view(..., -1, 2)[..., 0]`,
    `x.unflatten(-1, (-1, 2)).unbind(-1)`, the backward of a stack that was flattened — is the strided slice
    `x[..., k::m]`: a row kernel reads it as columns k, k + m, ... of the row it already walks."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.select.int, aten.unbind.int):
            continue
        view, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
        if not (isinstance(view, torch.fx.Node) and view.op == "call_function" and view.target in RESHAPES):
            continue
        src = view.args[0]
        split, whole = view.meta["val"].shape, src.meta["val"].shape
        m = view.args[1][-1] if len(split) >= 2 else None  # as written: the fake size may be a symbol's quotient
        # the leading dims kept, so the view splits the last one into (E, m)
        if dim % len(split) != len(split) - 1 or not isinstance(m, int) or m < 1 or len(whole) != len(split) - 1 \
                or not all(same(expr_of(a), expr_of(b), None) for a, b in zip(split[:-2], whole[:-1])):
            continue
        picks = [(node, node.args[2] % m)] if node.target == aten.select.int else \
            [(u, u.args[1]) for u in node.users if u.target is operator.getitem]
        if node.target == aten.unbind.int and len(picks) != len(node.users):
            continue
        for pick, k in picks:
            strided = _insert(graph, pick, aten.slice.Tensor, (src, len(whole) - 1, k, SLICE_TO_END, m))
            pick.replace_all_uses_with(strided)
            graph.erase_node(pick)
        if node.users == {} and node in graph.nodes:
            graph.erase_node(node)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()


def sum_terms(n) -> list | None:
    """The terms of the sum whose last add is `n` (adds of two terms, no alpha, each read only by the next);
    None when `n` is not the root of one: not such an add, or one that another add reads."""
    def plain_add(x) -> bool:
        return isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target == aten.add.Tensor \
            and len(x.args) == 2 and not x.kwargs

    if not plain_add(n) or any(u.target == aten.add.Tensor for u in n.users):
        return None
    terms, todo = [], [n]
    while todo:
        x = todo.pop()
        if plain_add(x) and (x is n or len(x.users) == 1):
            todo += list(x.args)
        else:
            terms.append(x)
    return terms


def interleaved_gradients(gm: torch.fx.GraphModule) -> None:
    """The gradient of pieces that together take every column in turn — strided slices `x[..., 0::2]` and
    `x[..., 1::2]`, or the pair elements `x.view(..., -1, 2)[..., k]` — is traced as a sum of slice_backwards
    (select_backwards), each into zeros. It is the pieces' gradients interleaved: a stack along a new last
    dimension (viewed back to the row for slices), which a row kernel writes once per column."""
    graph = gm.graph
    for n in list(graph.nodes):
        leaves = sum_terms(n)
        if leaves is None:
            continue
        kind = leaves[0].target if isinstance(leaves[0], torch.fx.Node) else None
        if kind not in (aten.slice_backward.default, aten.select_backward.default) or not all(
                isinstance(x, torch.fx.Node) and x.target == kind for x in leaves):
            continue
        m, sizes = len(leaves), list(leaves[0].args[1])
        rank = len(sizes)
        if kind == aten.slice_backward.default:  # (grad, sizes, dim, start, end, step): every m-th column from k
            at = {x.args[3]: x for x in leaves if len(x.args) == 6 and x.args[5] == m
                  and isinstance(x.args[4], int) and x.args[4] >= SLICE_TO_END}
        else:  # (grad, sizes, dim, index) into a last dimension of m
            at = {x.args[3] % m: x for x in leaves if sizes[-1] == m}
        if sorted(at, key=str) != list(range(m)) or any(
                list(x.args[1]) != sizes or x.args[2] % rank != rank - 1 for x in leaves):
            continue
        stack = _insert(graph, n, aten.stack.default, ([at[k].args[0] for k in range(m)], -1))
        n.replace_all_uses_with(stack if kind == aten.select_backward.default else
                                _insert(graph, n, aten.view.default, (stack, sizes)))
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()


PRODUCTS_2D = {aten.mm.default, aten.addmm.default}


def views_onto_inputs(gm: torch.fx.GraphModule) -> None:
    """A per-channel vector computed elementwise from an input and then viewed to broadcast (batch norm in
    evaluation: running_var + eps, its square root's reciprocal, then viewed (C, 1, 1)): the view moves onto the
    input, above the elementwise ops, so that the row planner reads the input at the viewed shape; the ops, which
    keep the shape, run on the view instead."""
    graph = gm.graph
    for view in list(graph.nodes):
        if view.op != "call_function" or view.target not in (*RESHAPES, aten.unsqueeze.default):
            continue
        chain, src = [], view.args[0]
        while (src.op == "call_function" and len(src.users) == 1 and OP_TABLE.get(op_name(src.target)) and
               OP_TABLE[op_name(src.target)].kind == POINTWISE and len(src.all_input_nodes) == 1 and
               isinstance(src.args[0], torch.fx.Node)):
            chain.append(src)
            src = src.args[0]
        if not chain or src.op != "placeholder":
            continue
        with graph.inserting_before(chain[-1]):
            top = graph.call_function(view.target, (src, *view.args[1:]))
        top.meta["val"] = _fake(view.target, (src, *view.args[1:]))
        below = top
        for op in reversed(chain):  # the elementwise ops again, on the viewed input, in their order
            op.args = (below, *op.args[1:])
            op.meta["val"] = _fake(op.target, op.args, op.kwargs)
            below = op
        view.replace_all_uses_with(chain[0])
        graph.erase_node(view)
    graph.lint()
    gm.recompile()


def sink_row_views(gm: torch.fx.GraphModule) -> None:
    """F.linear of a (B, S, E) input traces the product as (B·S, N) viewed (B, S, N), so the bias, activation
    and residual after it run on the view. Each pointwise op on such a view runs on the product's rows instead,
    its other inputs viewed (B·S, ·) too where they have the rows, and the view moves below it: the staged
    planner then fuses that work into the GEMM's epilogue."""
    graph = gm.graph
    rows_of = {n for n in graph.nodes if n.op == "call_function" and n.target in PRODUCTS_2D}  # (rows, N) values
    moved = True
    while moved:
        moved = False
        for view in list(graph.nodes):
            if view.op != "call_function" or view.target not in RESHAPES or not _row_view(view, rows_of):
                continue
            for op in list(view.users):
                args = _on_rows(op, view, rows_of, graph)
                if args is None:
                    continue
                readers, val = list(op.users), op.meta["val"]
                op.args = args  # the op keeps its name: the kernels' variables stay the reference's
                op.meta["val"] = _fake(op.target, args, op.kwargs)
                rows_of.add(op)
                with graph.inserting_after(op):
                    back = graph.call_function(view.target, (op, view.args[1]))
                back.meta["val"] = val
                for r in readers:
                    r.replace_input_with(op, back)
                moved = True
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()


def _row_view(view, rows_of: set) -> bool:
    """A view of a product's (rows, N), or of work on them, as (..., N): leading dimensions that split the rows."""
    src, val = view.args[0], view.meta.get("val")
    return src in rows_of and isinstance(val, torch.Tensor) and val.dim() > 2 and \
        str(val.shape[-1]) == str(src.meta["val"].shape[-1])


def _pointwise(node) -> bool:
    rule = OP_TABLE.get(op_name(node.target)) if node.op == "call_function" else None
    return rule is not None and rule.kind == POINTWISE


def _on_rows(op, view, rows_of: set, graph):
    """`op`'s arguments on the product's rows, or None when `op` is no pointwise op of the view and inputs that
    have its rows, broadcast along them, or are one value."""
    if not _pointwise(op) or str(op.meta["val"].shape) != str(view.meta["val"].shape):
        return None
    shape, lead = view.meta["val"].shape, str(list(view.meta["val"].shape[:-1]))
    out = []
    for a in op.args:
        if isinstance(a, torch.fx.Node) and a.op == "call_function" and a.target in RESHAPES and \
                str(a.meta["val"].shape) == str(shape) and _row_view(a, rows_of):
            out.append(a.args[0])  # this view, or another of rows: the rows themselves
        elif not isinstance(a, torch.fx.Node):
            out.append(a)
        elif not isinstance(a.meta.get("val"), torch.Tensor):
            return None
        elif a.meta["val"].dim() <= 1 or (a.meta["val"].dim() == 2 and str(a.meta["val"].shape[0]) == "1"):
            out.append(a)  # a per-column vector, or one value: broadcasts along the rows as it is
        elif a.meta["val"].dim() == len(shape) and str(list(a.meta["val"].shape[:-1])) == lead:
            last = a.meta["val"].shape[-1]
            sizes = [-1, last if isinstance(last, int) else _insert(graph, op, aten.sym_size.int, (a, len(shape) - 1))]
            out.append(_insert(graph, op, aten.reshape.default, (a, sizes)))  # (B, S, N) or (B, S, 1) by rows
        else:
            return None
    return tuple(out)


def _channel_split(view, back: bool = False) -> bool:
    """A view of (N, C, ...) as (N, G, C/G, ...): a group norm's groups apart, the channels split in two; with
    `back`, the view back."""
    if view.op != "call_function" or view.target not in RESHAPES or not isinstance(view.args[0], torch.fx.Node):
        return False
    flat, grouped = view.args[0].meta.get("val"), view.meta.get("val")
    flat, grouped = (grouped, flat) if back else (flat, grouped)
    if not (isinstance(flat, torch.Tensor) and isinstance(grouped, torch.Tensor) and flat.dim() >= 2 and
            grouped.dim() == flat.dim() + 1):
        return False
    if str(flat.shape[0]) != str(grouped.shape[0]) or str(list(flat.shape[2:])) != str(list(grouped.shape[3:])):
        return False
    return sympy.expand(expr_of(grouped.shape[1]) * expr_of(grouped.shape[2]) - expr_of(flat.shape[1])) == 0


def _grouped_operands(op, full, grouped_sizes: list, graph, before) -> tuple | None:
    """`op`'s arguments in the grouped shape: a value of the full (N, C, ...) shape viewed `grouped_sizes`, one
    value per channel ([C, 1, 1], [1, C, 1, 1]) viewed (G, C/G, 1, ...), one value as it is. None when another
    operand does not line up with the channels."""
    shape = full.meta["val"].shape
    out = []
    for a in op.args:
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if not isinstance(a, torch.fx.Node) or (isinstance(val, torch.Tensor) and all(str(d) == "1" for d in
                                                                                        val.shape)):
            out.append(a)
            continue
        if not isinstance(val, torch.Tensor) or val.dim() > len(shape):
            return None
        padded = [1] * (len(shape) - val.dim()) + list(val.shape)
        if str(padded) == str(list(shape)):
            sizes = grouped_sizes
        elif str(padded[1]) == str(shape[1]) and all(str(d) == "1" for i, d in enumerate(padded) if i != 1):
            sizes = [1] * (val.dim() - len(shape) + 1) + grouped_sizes[1:3] + [1] * (len(shape) - 2)
        else:
            return None
        out.append(_insert(graph, before, aten.view.default, (a, sizes)))
    return tuple(out)


def group_channel_views(gm: torch.fx.GraphModule) -> None:
    """Per-channel work around a group norm (a convolution's bias and scale before it, an affine after it) runs
    on the grouped view (N, G, C/G, ...) the norm reduces over: the view moves above each pointwise op before it,
    and the view back below each one after it, their per-channel operands viewed (G, C/G, 1, ...). The row
    planner's walk over the groups then reads every operand in its order; in the (N, C, ...) shape a channel's
    vector lines up with no walk over groups."""
    graph = gm.graph
    moved = True
    while moved:
        moved = False
        for view in list(graph.nodes):
            if _channel_split(view):  # the split of op(...)'s result: op on the split operands instead
                op = view.args[0]
                if not _pointwise(op):
                    continue
                after = view.next
                args = _grouped_operands(op, op, list(view.args[1]), graph, after)
                if args is None:
                    continue
                view.replace_all_uses_with(_insert(graph, after, op.target, args, op.kwargs))
                graph.erase_node(view)
                moved = True
            elif _channel_split(view, back=True):
                src = view.args[0]
                for op in list(view.users):  # op(view back, ...) on the grouped values, viewed back after it
                    if not _pointwise(op) or str(op.meta["val"].shape) != str(view.meta["val"].shape):
                        continue
                    sizes = [d if isinstance(d, int) else _insert(graph, op, aten.sym_size.int, (src, i))
                             for i, d in enumerate(src.meta["val"].shape)]
                    args = _grouped_operands(op, view, sizes, graph, op)
                    if args is None:
                        continue
                    grouped = _insert(graph, op, op.target, args, op.kwargs)
                    back = _insert(graph, op, view.target, (grouped, view.args[1]))
                    op.replace_all_uses_with(back)
                    graph.erase_node(op)
                    moved = True
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()


def _contiguous(node) -> bool:
    """Whether a node's value lies in row-major order (size-1 dimensions' strides aside), as far as its
    symbolic strides tell."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    expected = 1
    for size, stride in reversed(list(zip(val.shape, val.stride()))):
        if str(size) != "1" and str(stride) != str(expected):
            return False
        expected = expected * size
    return True


def factor_column_sums(gm: torch.fx.GraphModule) -> None:
    """sum over leading dims of (f · t), f constant along them and computed from an earlier reduction, becomes
    f · sum(t), in place (so for neg and a scalar factor). Then the sum no longer waits for f: a batch norm's
    backward sums everything it needs in one kernel instead of finishing f in one and summing in the next.
    Sums along the last dimension are left as traced: they never split a kernel."""
    graph = gm.graph
    _sink_expands(graph)
    reduced: set = set()  # values computed from a reduction
    for node in graph.nodes:
        if node.op == "call_function" and (op_name(node.target) in REDUCE_KIND or
                                           any(a in reduced for a in node.all_input_nodes)):
            reduced.add(node)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten.sum.dim_IntList:
            continue
        src, rank = node.args[0], node.args[0].meta["val"].dim()
        dims = sorted(d % rank for d in node.args[1] or range(rank)) if rank else []  # None: every dimension
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if not dims or rank - 1 in dims:
            continue
        outer, factor, inner = [], None, src  # sum(outer(factor · inner)) with outer a chain of neg / · scalar
        while inner.op == "call_function":
            if inner.target in (aten.neg.default, aten.mul.Scalar):
                outer.append(inner)
                inner = inner.args[0]
                continue
            if inner.target == aten.mul.Tensor and all(isinstance(a, torch.fx.Node) for a in inner.args[:2]):
                for f, t in (inner.args[:2], inner.args[1::-1]):
                    f = f.args[0] if f.target == aten.expand.default else f  # a broadcast factor, unexpanded
                    shape = [1] * (rank - f.meta["val"].dim()) + list(f.meta["val"].shape)
                    if f in reduced and all(shape[d] == 1 for d in dims):
                        factor, inner = f, t
                        break
            break
        if factor is None:
            continue

        def add(target, args, node=node):
            return _insert(graph, node, target, args)

        value = add(aten.mul.Tensor, (factor, add(aten.sum.dim_IntList, (inner, dims, True))))
        for op in reversed(outer):
            value = add(op.target, (value, *op.args[1:]))
        if not keep:
            value = add(aten.squeeze.dims, (value, dims))
        node.replace_all_uses_with(value)
        graph.erase_node(node)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()


_SCALAR_ARITH = (aten.div.Scalar, aten.mul.Scalar, aten.add.Scalar, aten.sub.Scalar, aten.neg.default)


def _sink_expands(graph: torch.fx.Graph) -> None:
    """op(expand(x), scalar) becomes expand(op(x, scalar)): the mean's backward divides after expanding, which
    would hide that the quotient is one value per column."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _SCALAR_ARITH:
            continue
        src = node.args[0]
        if not (isinstance(src, torch.fx.Node) and src.target == aten.expand.default) or \
                any(isinstance(_val(a), torch.Tensor) for a in node.args[1:]):
            continue
        op = _insert(graph, node, node.target, (src.args[0], *node.args[1:]))
        node.replace_all_uses_with(_insert(graph, node, aten.expand.default, (op, src.args[1])))
        graph.erase_node(node)


def _val(a):
    """A node's (fake) value; lists of sizes element by element."""
    if isinstance(a, (list, tuple)):
        return type(a)(_val(x) for x in a)
    return a.meta["val"] if isinstance(a, torch.fx.Node) else a


def _insert(graph: torch.fx.Graph, before, target, args, kwargs=None) -> torch.fx.Node:
    """A new node computing target(*args, **kwargs) before `before`, with its fake value for the planners."""
    with graph.inserting_before(before):
        new = graph.call_function(target, args, kwargs)
    new.meta["val"] = _fake(target, args, kwargs)
    return new


def _fake(target, args, kwargs=None):
    """The fake value target(*args, **kwargs) would have, args being nodes (their values), sizes and constants."""
    vals = [_val(a) for a in args]
    with detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)]) or contextlib.nullcontext():  # sizes
        return target(*vals, **{k: _val(v) for k, v in (kwargs or {}).items()})
