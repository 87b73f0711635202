"""DeepSeek-V3's Multi-head Latent Attention prolog for T tokens, in the absorbed form the attention reads.

The query is projected down to a latent (x · w_dq), RMS-normalised, and projected up per head into a part
without position (w_uq) and a rotary part (w_qr); the former is then taken into the key-value latent space
by each head's w_uk (the absorbed key up-projection). The key-value latent (x · w_dkv) is RMS-normalised,
and the shared rotary key (x · w_kr) gets RoPE. DeepSeek stores w_uq|w_qr and w_dkv|w_kr as one matrix each;
here they are the column blocks they are multiplied as, so every size is a symbol of its own.
"""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def forward(x, w_dq, gamma_cq, w_uq, w_qr, w_uk, w_dkv, gamma_ckv, w_kr, cos, sin):
    tokens, heads, d_nope, d_rope = x.shape[0], w_uk.shape[0], w_uk.shape[1], cos.shape[-1]
    cq = rms_norm(x @ w_dq, gamma_cq)
    q_nope = (cq @ w_uq).view(tokens, heads, d_nope)
    q_rope = rope((cq @ w_qr).view(tokens, heads, d_rope), cos[:, None, :], sin[:, None, :])
    query = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # (tokens, heads, C)
    kv = rms_norm(x @ w_dkv, gamma_ckv)
    k_rope = rope(x @ w_kr, cos, sin)
    return query, q_rope, kv, k_rope
