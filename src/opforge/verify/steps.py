"""Truth at a rounding step: where a reference rounds (round, floor, ceil, trunc: fake quantization), an
argument that float64 puts a hair from a step may land on the other side of it in any float32 computation
(a product summed in another order), and the result moves by a whole step (a quantization scale).

The float64 reference is run twice more with every rounding argument moved by ±`rel`·|x|, `rel` the float32
error a computation of the argument may carry; where a kernel's result matches one of those runs instead of
the plain one, that run is its truth. A step farther than `rel` from the argument is still an error.
"""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


def step_rel(reduced: int) -> float:
    """How far, relative to its size, a float32 computation of a rounding argument may land from float64: the
    √K walk of a sum of `reduced` terms and a few roundings around it, doubled."""
    return 2.0 * (2.0 * math.sqrt(max(reduced, 1)) + 8.0) * torch.finfo(torch.float32).eps


def shifted_runs(run, rel: float, probe=None) -> list[dict] | None:
    """`run()` (the float64 golden: a dict of name -> tensor) with the rounding arguments moved down and up by
    rel·|x|; None when the reference rounds nothing. `probe()`, a cheaper run (the forward alone), asks first."""
    if probe is not None:
        with ShiftedSteps(rel) as mode:
            probe()
        if not mode.hit:
            return None
    runs = []
    for sign in (-1.0, 1.0):
        with ShiftedSteps(sign * rel) as mode:
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
