"""A wrong decomposition that looks like torch's own (no function of this file behind it): sigmoid(x) becomes
x - 1 in the decompositions that aot_eager_decomp_partition and Inductor apply. CompilerBisector finds it."""

import functools

import torch
from torch._inductor import decomposition

decomposition.decompositions[torch.ops.aten.sigmoid.default] = functools.partial(torch.ops.aten.sub.Tensor, other=1)


@torch.compile
def f(x):
    return torch.sigmoid(x) * x


print(f(torch.randn(64)).sum())
