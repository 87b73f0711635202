"""GEGLU gate with the tanh approximation of GELU: gelu_tanh(a) · b."""

import torch
import torch.nn.functional as F


def forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(a, approximate="tanh") * b
