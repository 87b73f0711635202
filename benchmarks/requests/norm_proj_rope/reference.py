import torch


def forward(x, norm_w, weight, cos, sin, eps: float = 1e-6):
    t = x.shape[0]
    d = cos.shape[-1]
    xf = x.float()
    h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * norm_w
    y = (h @ weight.t()).view(t, -1, d)
    x1, x2 = y[..., : d // 2], y[..., d // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return y * cos[:, None, :] + rot * sin[:, None, :]
