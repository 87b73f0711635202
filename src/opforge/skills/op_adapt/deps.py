"""What an operator's output dtype follows and which operators its backward runs, both observed on the CPU.

The dtype rule is read off the operator itself: it is called on small integer and float CPU tensors and its
result's dtype compared with theirs. The backward's operators are recorded by a dispatch mode while the
CPU autograd graph runs backward, so the CHECKLIST can say which of them the backend still lacks.
"""
from __future__ import annotations

import torch

from opforge.backend.cpp import native_functions, out_overloads
from opforge.backend.testing import OverloadRecorder


def _aten(overload: str):
    name, _, ov = overload.partition(".")
    return getattr(getattr(torch.ops.aten, name), ov or "default")


def _probe_args(func, dtype: torch.dtype) -> tuple[list, dict] | None:
    """Arguments of the schema for a probe call: tensors of `dtype`, defaults or ones elsewhere."""
    args, kwargs = [], {}
    for a in list(func.arguments.flat_positional) + list(func.arguments.flat_kwarg_only):
        t = str(a.type)
        if t.startswith("Tensor"):
            value = torch.ones(2, 3, dtype=dtype)
        elif a.default is not None:
            continue
        elif t.startswith("Scalar"):
            value = 1
        elif t.startswith(("int", "SymInt")) and "[" not in t:
            value = 1
        elif t.startswith("float"):
            value = 1.0
        elif t.startswith("bool"):
            value = False
        elif t.endswith("?"):
            value = None
        else:
            return None
        if a in func.arguments.flat_kwarg_only:
            kwargs[a.name] = value
        else:
            args.append(value)
    return args, kwargs


def dtype_rule(overload: str) -> str:
    """"bool" (comparisons), "int_to_float" (true division, most math), else "result_type"."""
    func = native_functions()[overload].func
    results = {}
    for dtype in (torch.int64, torch.float32):
        probe = _probe_args(func, dtype)
        if probe is None:
            return "meta"
        try:
            results[dtype] = _aten(overload)(*probe[0], **probe[1]).dtype
        except (RuntimeError, NotImplementedError):  # a dtype the operator refuses tells nothing
            results[dtype] = None
    if results[torch.float32] == torch.bool or results[torch.int64] == torch.bool and results[torch.float32] is None:
        return "bool"
    if results[torch.int64] is not None and results[torch.int64].is_floating_point:
        return "int_to_float"
    return "result_type"


def reaches(info, sample, overload: str) -> bool:
    """Whether the OpInfo's call on `sample` reaches `overload` (a sample may take another overload)."""
    with OverloadRecorder() as seen:
        try:
            info.op(sample.input, *sample.args, **sample.kwargs)
        except (RuntimeError, NotImplementedError, TypeError):
            return False
    return overload in seen.ops


def backward_ops(info, overload: str) -> list[str]:
    """The ATen overloads the CPU backward of `overload` runs, over every OpInfo sample that reaches it
    (broadcasting samples add the reductions that sum gradients back to an input's shape)."""
    if info is None or not info.supports_autograd or torch.float32 not in info.supported_dtypes("cpu"):
        return []
    ops: set[str] = set()
    for sample in info.sample_inputs("cpu", torch.float32, requires_grad=True):
        if not reaches(info, sample, overload):
            continue
        result = info.op(sample.input, *sample.args, **sample.kwargs)
        if not isinstance(result, torch.Tensor) or not result.requires_grad:
            continue
        with OverloadRecorder() as seen:
            result.backward(torch.ones_like(result))
        ops |= set(seen.ops)
    return sorted(ops)


def reachable(overload: str, supported: set[str]) -> bool:
    """Whether `overload` runs on a backend whose yaml registers `supported`: itself or its out= sibling is
    registered (torchgen derives the in-place and out= forms), or torch decomposes it into other operators."""
    f = native_functions().get(overload)
    if f is None:
        return False
    if overload in supported:
        return True
    group = out_overloads().get(overload)
    if group is not None and any(out_overloads().get(s) == group for s in supported):
        return True
    return (f.has_composite_implicit_autograd_kernel or f.has_composite_explicit_autograd_kernel
            or f.has_composite_explicit_autograd_non_functional_kernel)
