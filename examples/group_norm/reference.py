"""GroupNorm as torch.nn.functional.group_norm computes it: 32 groups of C/32 channels, each normalized over its
channels and pixels per sample, then scaled and shifted per channel."""

import torch
import torch.nn.functional as F


def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return F.group_norm(x, 32, weight, bias, eps)
