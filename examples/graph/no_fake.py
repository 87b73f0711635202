"""A custom op without a fake kernel: torch.compile cannot learn its output's shape without running it."""

import torch


@torch.library.custom_op("diag::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x.clone() * 2


@torch.compile(fullgraph=True, backend="aot_eager")
def f(x):
    return twice(x).sin()


print(f(torch.randn(8)).sum())
