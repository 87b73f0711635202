"""Golden reference for {op}: float64 truth, the float32 compute path, gradients by autograd.

It runs the request's own PyTorch reference ({reference}) and imports no kernel.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_{op}_reference", _HERE / "request" / {ref_file!r})
_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_reference)
REFERENCE = getattr(_reference, {ref_func!r})

INPUTS = {inputs!r}
INPUT_NAMES = [i["name"] for i in INPUTS]
OUTPUT_NAMES = {outputs!r}
GRAD_INPUTS = {grad_inputs!r}
ATTRIBUTES = {attributes!r}


def _as_tuple(result):
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def forward(*tensors: torch.Tensor, compute_dtype: torch.dtype = torch.float32, **attrs):
    """The reference computed in `compute_dtype`; results cast back to the inputs' dtype unless float64."""
    dtype = tensors[0].dtype
    ins = [t.detach().to(compute_dtype) for t in tensors]
    with torch.no_grad():
        outs = _as_tuple(REFERENCE(*ins, **{{**ATTRIBUTES, **attrs}}))
    return tuple(o if compute_dtype == torch.float64 else o.to(dtype) for o in outs)


def backward(tensors, grad_outputs, compute_dtype: torch.dtype = torch.float32, **attrs):
    """Gradients of GRAD_INPUTS by autograd of the reference, computed in `compute_dtype`."""
    dtype = tensors[0].dtype
    ins = [t.detach().to(compute_dtype).requires_grad_(n in GRAD_INPUTS) for t, n in zip(tensors, INPUT_NAMES)]
    outs = _as_tuple(REFERENCE(*ins, **{{**ATTRIBUTES, **attrs}}))
    wrt = [t for t, n in zip(ins, INPUT_NAMES) if n in GRAD_INPUTS]
    grads = torch.autograd.grad(outs, wrt, [g.to(compute_dtype) for g in grad_outputs], allow_unused=True)
    grads = [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wrt)]
    return tuple(g if compute_dtype == torch.float64 else g.to(dtype) for g in grads)


def make_inputs(binding: dict, dtype: torch.dtype, seed: int, distribution: str = "normal"):
    """Seeded inputs for a shape binding: an input's declared range if it has one, else the distribution."""
    from opforge.verify.inputs import make_tensor

    tensors = []
    for k, spec in enumerate(INPUTS):
        shape = tuple(binding[d] if isinstance(d, str) else d for d in spec["shape"])
        low, high = spec.get("range") or (None, None)
        dist = "uniform_small" if spec.get("range") else distribution
        tensors.append(make_tensor(shape, dtype, seed=seed + 7919 * k, distribution=dist, low=low, high=high))
    return tensors
