"""A running sum along the last dimension, as torch.cumsum computes it; its gradient is the running sum of the
upstream gradient taken from the row's end."""

import torch


def forward(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, dim=-1)
