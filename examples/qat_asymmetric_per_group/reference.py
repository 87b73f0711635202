"""Asymmetric per-group fake quantization with a learnable scale and zero point (QAT).

The weight's rows are cut into groups of `group_size` consecutive values; each group has its own scale and
offset (zero point). Values are divided by the scale, shifted by the offset, rounded half to even with a
straight-through estimator, clamped to [qmin, qmax], shifted back and rescaled. Gradients flow to the
weight (inside the clamp range), the scale and the offset, each summed over its group.
"""

import torch


def forward(weight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int = 32,
            eps: float = 1e-4, qmin: float = 0.0, qmax: float = 255.0) -> torch.Tensor:
    w = weight.view(weight.shape[0], scale.shape[1], group_size)
    s = scale.unsqueeze(-1)
    s = torch.where(s > eps, s, torch.full_like(s, eps))
    z = offset.unsqueeze(-1)
    q = w / s + z
    q = q + (torch.round(q) - q).detach()
    q = torch.clamp(q, qmin, qmax)
    return ((q - z) * s).view(weight.shape)
