"""A wrong decomposition registered into Inductor's table: compiled results differ from eager."""

import torch
from torch._inductor import decomposition


def sigmoid(x):
    return 1 / (1 + torch.exp(x))  # exp(x) where exp(-x) belongs


decomposition.decompositions[torch.ops.aten.sigmoid.default] = sigmoid


@torch.compile
def f(x):
    return torch.sigmoid(x) * x


print(f(torch.randn(64)).sum())
