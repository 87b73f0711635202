"""A Python string that changes every call: Dynamo recompiles until its limit, then runs eagerly."""

import torch


@torch.compile(backend="eager")
def f(x, name):
    return x.sum(dim=0) * len(name)


for i in range(12):
    f(torch.randn(8, 3), "a" * i)
