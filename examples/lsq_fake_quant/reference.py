"""LSQ fake quantization (Esser et al., Learned Step Size Quantization) with a learnable step size.

The step's gradient is scaled by g = 1 / sqrt(N · Qp), N the number of quantized values, through the
usual forward-identity trick; rounding is a straight-through estimator.
"""

import torch


def forward(x: torch.Tensor, step: torch.Tensor, bits: int = 8) -> torch.Tensor:
    qn, qp = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    g = torch.full((), x.numel() * qp, dtype=x.dtype, device=x.device).rsqrt()
    s = step * g + (step - step * g).detach()  # value of step, gradient scaled by g
    q = torch.clamp(x / s, qn, qp)
    q = q + (torch.round(q) - q).detach()
    return q * s
