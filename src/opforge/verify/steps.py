"""Truth at a rounding step: where a reference rounds (round, floor, ceil, trunc: fake quantization), an
argument that float64 puts a hair from a step may land on the other side of it in any float32 computation
(a product summed in another order), and the result moves by a whole step (a quantization scale).

The float64 reference is run twice more with every rounding argument moved by ±`rel`·|x|, `rel` the float32
error a computation of the argument may carry; where a kernel's result matches one of those runs instead of
the plain one, that run is its truth. A step farther than `rel` from the argument is still an error.

Truth after a library call: a 16-bit operator's convolution comes back from the vendor library rounded to the
dtype (as eager's does), and the work after it starts from that rounded value, which an ill-conditioned step
amplifies (SiLU's derivative near its zero at -1.28 turns half a bfloat16 ulp of its argument into 8% of its
value). The float64 reference is run with every library result moved by ±u·|y|, u the dtype's unit roundoff;
a kernel's result inside the span of the three runs is as true as float64 can say, one outside is held to the
nearer end.
"""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

_STEPS = {torch.ops.aten.round.default, torch.ops.aten.round.decimals, torch.ops.aten.floor.default,
          torch.ops.aten.ceil.default, torch.ops.aten.trunc.default}


class ShiftedSteps(TorchDispatchMode):
    """Within it, each rounding op's floating argument x is replaced by x + rel·|x|; `hit` says whether any ran."""

    def __init__(self, rel: float):
        super().__init__()
        self.rel, self.hit = rel, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _STEPS and args[0].is_floating_point():
            self.hit = True
            x = args[0]
            args = (x + self.rel * x.abs(),) + tuple(args[1:])
        return func(*args, **kwargs)


# what the delivered op calls the vendor library for (codegen/gemm.py LIBRARY): results in the op's dtype
_LIBRARY = {torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default}


class ShiftedLibrary(TorchDispatchMode):
    """Within it, each library call's floating results y are replaced by y + rel·|y|; `hit` says whether any ran."""

    def __init__(self, rel: float):
        super().__init__()
        self.rel, self.hit = rel, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func not in _LIBRARY:
            return out
        self.hit = True
        return tree_map(lambda y: y + self.rel * y.abs() if isinstance(y, torch.Tensor) and y.is_floating_point()
                        else y, out)


def library_rel(dtype: torch.dtype) -> float:
    """Half an ulp, relative: how far a library result rounded to a 16-bit `dtype` lies from its exact value;
    0 for float32 and wider, whose rounding the dtype tolerance already covers."""
    return torch.finfo(dtype).eps / 2 if dtype.itemsize == 2 else 0.0


def step_rel(reduced: int) -> float:
    """How far, relative to its size, a float32 computation of a rounding argument may land from float64: the
    √K walk of a sum of `reduced` terms and a few roundings around it, doubled."""
    return 2.0 * (2.0 * math.sqrt(max(reduced, 1)) + 8.0) * torch.finfo(torch.float32).eps


def shifted_runs(run, rel: float, probe=None, shift=ShiftedSteps) -> list[dict] | None:
    """`run()` (the float64 golden: a dict of name -> tensor) with the rounding arguments (or, with
    shift=ShiftedLibrary, the library results) moved down and up by rel·|x|; None when the reference has none.
    `probe()`, a cheaper run (the forward alone), asks first."""
    if probe is not None:
        with shift(rel) as mode:
            probe()
        if not mode.hit:
            return None
    runs = []
    for sign in (-1.0, 1.0):
        with shift(sign * rel) as mode:
            out = run()
        if not mode.hit:
            return None
        runs.append(out)
    return runs


def step_truth(actual: torch.Tensor, t64: torch.Tensor, shifted: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """The truth per element: the plain float64 value, or a shifted run's where the kernel lies nearer to it;
    and how many elements took a shifted run's."""
    a = actual.detach().cpu().double()
    truth, moved = t64, torch.zeros(t64.shape, dtype=torch.bool)
    for other in shifted:
        other = other.double()
        nearer = (a - other).abs() < (a - truth).abs()  # False where either is NaN
        truth, moved = torch.where(nearer, other, truth), moved | nearer
    return truth, int(moved.sum())


def library_truth(actual: torch.Tensor, t64: torch.Tensor, shifted: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """The truth per element after a library call: the kernel's own value where it lies within the span of the
    plain and the shifted float64 runs, else the nearer end of that span; and how many elements lay within it
    but off the plain run's value."""
    a = actual.detach().cpu().double()
    runs = torch.stack([t64.double()] + [s.double() for s in shifted])
    lo, hi = runs.amin(0), runs.amax(0)  # NaN where any run is NaN: then the plain value stands
    inside = (a >= lo) & (a <= hi) & (a != t64)
    truth = torch.where(torch.isnan(lo) | torch.isnan(hi), t64, torch.minimum(torch.maximum(a, lo), hi))
    return torch.where(torch.isnan(a), t64, truth), int(inside.sum())
