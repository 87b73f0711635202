"""A host sync (.item()) inside the compiled function: the graph breaks there on every call."""

import torch


@torch.compile(backend="eager")
def f(x):
    y = x.sin()
    if y.sum().item() > 0:
        y = y * 2
    return y.cos()


for _ in range(2):
    f(torch.randn(16))
