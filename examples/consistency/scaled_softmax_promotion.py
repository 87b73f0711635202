"""Attention scores scaled by a per-head temperature kept in float32: in float16 the product is
promoted to float32, so the API returns float32 for float16 inputs.

    opforge api-consistency examples/consistency/scaled_softmax_promotion.py --target half --out out/softmax
"""

import torch

ENTRY = "scaled_softmax"


def scaled_softmax(scores: torch.Tensor) -> torch.Tensor:
    heads = scores.shape[1]
    temperature = torch.linspace(0.5, 1.5, heads).view(1, heads, 1, 1)  # float32 whatever the scores are
    return torch.softmax(scores * temperature, dim=-1)


def inputs():
    return (torch.randn(2, 8, 16, 16),)
