"""Rotary embedding for decoding with a long KV cache: positions are cast to the activations' dtype.

On the CPU in float32/float64 the positions (65500 and beyond) are exact. In float16 the largest finite
value is 65504: positions from 65520 on become inf, cos/sin of inf is NaN, and the output is NaN.

    opforge api-consistency examples/consistency/rope_fp16_overflow.py --target half --out out/rope
"""

import torch

ENTRY = "rope"
HEAD_DIM = 64
CACHE_OFFSET = 65500  # tokens already in the KV cache


def rope(q: torch.Tensor, offset: int) -> torch.Tensor:
    seq, dim = q.shape[-2], q.shape[-1]
    pos = (torch.arange(seq) + offset).to(q.dtype)  # the planted defect: float16 positions overflow
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = pos[:, None] * inv_freq.to(q.dtype)
    emb = torch.cat([freqs, freqs], dim=-1)
    q1, q2 = q.chunk(2, dim=-1)
    rotated = torch.cat([-q2, q1], dim=-1)
    return q * emb.cos() + rotated * emb.sin()


def inputs():
    return torch.randn(2, 4, 64, HEAD_DIM), CACHE_OFFSET
