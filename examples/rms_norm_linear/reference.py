"""RMSNorm followed by a linear projection, as before every attention and MLP block of a Llama layer."""

import torch
import torch.nn.functional as F


def forward(x: torch.Tensor, gamma: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * gamma
    return F.linear(normed, weight)
