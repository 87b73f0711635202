"""gpt-oss attention: causal, grouped-query heads, a learned sink logit per head that joins each softmax's
denominator, and an optional sliding window."""

import torch


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor,
            sliding_window: int = 0) -> torch.Tensor:
    """q (B, H, S, D); k and v (B, G, S, D), each K/V head read by H / G query heads; sinks (H,).
    Returns (B·H, S, D)."""
    b, h, s, d = q.shape
    g = k.shape[1]
    k = k[:, :, None].expand(b, g, h // g, s, d).reshape(b, h, s, d)
    v = v[:, :, None].expand(b, g, h // g, s, d).reshape(b, h, s, d)
    scores = q @ k.transpose(-1, -2) * d ** -0.5
    mask = torch.triu(q.new_full((s, s), float("-inf")), diagonal=1)
    if sliding_window > 0:  # keys more than sliding_window positions back are out of reach too
        mask = mask + torch.tril(q.new_full((s, s), float("-inf")), diagonal=-sliding_window)
    logits = torch.cat([scores + mask, sinks[None, :, None, None].expand(b, h, s, 1)], dim=-1)
    probs = torch.softmax(logits, dim=-1)[..., :-1]
    return (probs @ v).reshape(b * h, s, d)
