"""Plain Inductor on the CPU: it needs a working C++ compiler (the benchmark points CXX at none)."""

import torch


@torch.compile
def f(x):
    return torch.nn.functional.gelu(x) * 2


print(f(torch.randn(64)).sum())
