"""Weight-only int8 linear: the weight is stored as int8 with one scale per output channel and dequantized
where it is used, x · (w_q · scale)ᵀ + bias."""

import torch
import torch.nn.functional as F


def forward(x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x (M, K); w_q (N, K) int8; scale and bias (N,)."""
    w = w_q.to(x.dtype) * scale[:, None]
    return F.linear(x, w, bias)
