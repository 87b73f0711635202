import torch
import torch.nn.functional as F


def forward(x, ln_w, ln_b, weight, bias, cos, sin):
    b, t, c = x.shape
    d = cos.shape[-1] * 2
    h = F.layer_norm(x, (c,), ln_w, ln_b, 1e-5)
    y = F.linear(h, weight, bias).view(b, t, -1, d)
    y1, y2 = y[..., 0::2], y[..., 1::2]
    cs, sn = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack([y1 * cs - y2 * sn, y1 * sn + y2 * cs], dim=-1)
    return out.flatten(-2).transpose(1, 2)
