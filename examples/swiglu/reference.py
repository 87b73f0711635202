"""SwiGLU gate: silu(a) · b."""

import torch
import torch.nn.functional as F


def forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b
