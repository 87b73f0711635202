import math

import torch


def forward(q, k, v):
    r = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(r, dim=1)
    v = v.repeat_interleave(r, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    n = s.shape[-1]
    causal = torch.tril(torch.ones(n, n, device=q.device, dtype=torch.bool))
    s = s.masked_fill(~causal, float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)
