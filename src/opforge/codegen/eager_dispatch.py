"""What eager PyTorch runs for a request: the ATen kernels it dispatches, forward and backward, and the bytes
each one moves.

The traced graphs are decomposed (softmax becomes amax, sub, exp, sum, div), so counting their nodes counts
kernels eager never launches. Here the reference runs as eager runs it, under a TorchDispatchMode that sees
each ATen call after autograd and before any backend: softmax is one `aten._softmax`, layer norm one
`aten.native_layer_norm`. Inputs are meta tensors, so the request's real sizes cost no memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from opforge.codegen.trace import example_inputs, run_reference
from opforge.request import Request

# Calls that launch no kernel. Views (view, _unsafe_view, _reshape_alias, expand, t, transpose, permute,
# unsqueeze, squeeze, alias, detach, as_strided, slice, select, split, unbind, narrow, diagonal, unfold) only
# write new sizes and strides over the same storage; allocations (empty*, new_empty*, resize_) reserve memory
# without writing it; lift_fresh hands back a constant that already exists; sym_* and is_same_size read
# metadata; _local_scalar_dense (.item()) is a device-to-host copy of one value. Ops whose schema marks their
# result an alias of an input (OpOverload.is_view) are views too, which covers the rarer ones this list leaves
# out; _unsafe_view is listed because its schema does not say so.
NO_KERNEL = frozenset(f"aten::{n}" for n in (
    "view", "_unsafe_view", "_reshape_alias", "reshape", "view_as", "expand", "expand_as", "t", "transpose",
    "permute", "unsqueeze", "squeeze", "alias", "detach", "as_strided", "slice", "select", "split",
    "split_with_sizes", "unbind", "narrow", "diagonal", "unfold", "movedim", "view_as_real", "view_as_complex",
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided", "resize_",
    "lift_fresh", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "is_same_size",
))


@dataclass(frozen=True)
class EagerKernel:
    op: str  # the overload, e.g. "aten._softmax.default"
    bytes: int  # inputs read + outputs written


def launches_kernel(func) -> bool:
    return func._schema.name not in NO_KERNEL and not func.is_view


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel touches in `t`: each stored element once, so a broadcast (stride-0) dimension, which
    re-reads the same elements, counts once."""
    if t.numel() == 0:
        return 0
    if t.layout != torch.strided:
        return t.numel() * t.element_size()
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        n *= size if stride != 0 else 1
    return n * t.element_size()


def _unique_tensors(xs) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for x in tree_flatten(xs)[0]:
        if isinstance(x, torch.Tensor):
            seen.setdefault(id(x), x)  # mul(x, x) reads x once
    return list(seen.values())


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kernels: list[EagerKernel] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if launches_kernel(func):
            # an out= buffer is written, not read: it is counted once, with the results
            reads = _unique_tensors((args, {k: v for k, v in kwargs.items() if k != "out"}))
            writes = _unique_tensors(out)
            self.kernels.append(EagerKernel(str(func), sum(map(tensor_bytes, reads + writes))))
        return out


def dispatched_kernels(fn: Callable[[], object]) -> list[EagerKernel]:
    """The kernels eager runs for `fn()`, in order, with the bytes each moves."""
    with _Recorder() as rec:
        fn()
    return rec.kernels


def _inputs(req: Request, binding: dict, dtype: str, device: str) -> list[torch.Tensor]:
    if device == "cpu":  # real values, for references a meta tensor cannot run (data-dependent ops)
        return example_inputs(req, binding, getattr(torch, dtype))
    return [torch.empty(req.input_shape(s, binding), device="meta",
                        dtype=getattr(torch, s.dtypes[0] if s.index else dtype)) for s in req.inputs]


def _passes(req: Request, fn, binding: dict, dtype: str, device: str) -> dict[str, list[EagerKernel]]:
    attrs = req.attr_defaults
    ts = _inputs(req, binding, dtype, device)
    passes = {"forward": dispatched_kernels(lambda: run_reference(req, fn, ts, attrs))}
    if not req.backward:
        return passes
    # the backward alone: the forward that builds the autograd graph and the upstream gradients it is handed
    # are not part of it
    ts = [t.detach().requires_grad_(s.requires_grad) for t, s in zip(ts, req.inputs)]
    wanted = [t for t in ts if t.requires_grad]
    outs = [o for o in run_reference(req, fn, ts, attrs) if o.requires_grad]
    grads = [torch.ones_like(o) for o in outs]
    passes["backward"] = dispatched_kernels(
        lambda: torch.autograd.grad(outs, wanted, grads, allow_unused=True)) if outs and wanted else []
    return passes


def eager_cost(req: Request, binding: dict, dtype: str, fn=None) -> dict[str, dict]:
    """Per pass ("forward", and "backward" when the request has one): kernels, bytes and the ops in order, as
    eager runs the reference at `binding` in `dtype`."""
    fn = fn or req.load_reference()
    try:
        passes = _passes(req, fn, binding, dtype, "meta")
    except Exception:  # an op without a meta kernel, or one that reads values
        passes = _passes(req, fn, binding, dtype, "cpu")
    return {p: {"kernels": len(ks), "bytes": sum(k.bytes for k in ks), "ops": [k.op for k in ks]}
            for p, ks in passes.items()}
