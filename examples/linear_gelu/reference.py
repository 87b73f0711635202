"""GELU (tanh approximation) of a linear layer: gelu(x · weightᵀ + bias), as in GPT-style MLPs."""

import torch
import torch.nn.functional as F


def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")
