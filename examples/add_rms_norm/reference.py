"""Residual add fused with RMSNorm: h = x + residual; y = RMSNorm(h) · weight. Returns (y, h), the
normalised activations and the new residual stream."""

import torch


def forward(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6):
    h = x + residual
    hf = h.float()
    y = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    return y, h
