"""RMSNorm over the last dimension: x / sqrt(mean(x²) + eps) · weight, computed in float32."""

import torch


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    rms = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rms).to(x.dtype) * weight
