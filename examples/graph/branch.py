"""A data-dependent branch under fullgraph=True: Dynamo cannot put `if tensor:` in a graph."""

import torch


@torch.compile(fullgraph=True)
def f(x):
    if x.sum() > 0:
        return x * 2
    return x - 1


print(f(torch.randn(8)))
