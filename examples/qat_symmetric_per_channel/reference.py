"""Symmetric per-channel fake quantization with a learnable scale (QAT).

One scale per output channel (row), shape (N, 1), broadcast along the row. The scale is floored at eps; values are divided by it, rounded half to even with a straight-through
estimator (the rounding is detached, so its gradient is the identity), clamped to [qmin, qmax] and
scaled back.
"""

import torch


def forward(weight: torch.Tensor, scale: torch.Tensor, eps: float = 1e-4,
            qmin: float = -128.0, qmax: float = 127.0) -> torch.Tensor:
    s = torch.where(scale > eps, scale, torch.full_like(scale, eps))
    w = weight / s
    w_q = w + (torch.round(w) - w).detach()
    return torch.clamp(w_q, qmin, qmax) * s
