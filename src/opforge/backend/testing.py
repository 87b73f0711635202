"""What the tests of an operator adapted into a backend share: which OpInfo samples reach the adapted
overload, and samples moved to the device. Generated op-test files import these; so does op-adapt's
CHECKLIST, which reads the same samples on the CPU."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def overload_name(func) -> str:
    """An OpOverload as the CHECKLIST names it: "copysign.Tensor", "amax" for a default overload."""
    name = func._schema.name.split("::")[1]
    return name if func._overloadname == "default" else f"{name}.{func._overloadname}"


class OverloadRecorder(TorchDispatchMode):
    """Records the ATen overloads a call dispatches, in order."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(overload_name(func))
        return func(*args, **(kwargs or {}))


def samples(op, dtype, overload: str, requires_grad: bool = False):
    """The OpInfo's CPU samples whose call reaches `overload` (a sample may take another overload: a Python
    scalar `other` takes the Scalar one)."""
    for s in op.sample_inputs("cpu", dtype, requires_grad=requires_grad):
        with OverloadRecorder() as seen:
            op(s.input, *s.args, **s.kwargs)
        if overload in seen.ops:
            yield s


def to_device(device, sample):
    """`sample` with its tensors on `device`, each keeping whether it requires grad."""
    return sample.transform(lambda t: t.detach().to(device).requires_grad_(t.requires_grad)
                            if isinstance(t, torch.Tensor) else t)
