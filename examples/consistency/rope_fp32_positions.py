"""The same rotary embedding with the angles computed in float32 and only cos/sin cast down: the fix.

    opforge api-consistency examples/consistency/rope_fp32_positions.py --target half --out out/rope_ok
"""

import torch

ENTRY = "rope"
HEAD_DIM = 64
CACHE_OFFSET = 65500


def rope(q: torch.Tensor, offset: int) -> torch.Tensor:
    seq, dim = q.shape[-2], q.shape[-1]
    compute = torch.promote_types(q.dtype, torch.float32)  # float64 stays float64 for the reference
    pos = (torch.arange(seq) + offset).to(compute)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=compute) / dim))
    freqs = pos[:, None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
    q1, q2 = q.chunk(2, dim=-1)
    rotated = torch.cat([-q2, q1], dim=-1)
    return q * cos + rotated * sin


def inputs():
    return torch.randn(2, 4, 64, HEAD_DIM), CACHE_OFFSET
