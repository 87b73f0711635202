import torch


def forward(x, w_kv, g, cos, sin):
    kv = x @ w_kv.t()
    latent, pe = kv.split([g.shape[0], cos.shape[-1] * 2], dim=-1)
    lf = latent.float()
    latent = (lf * torch.rsqrt(lf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * g
    pairs = pe.unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    pe = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return latent, pe
