import torch


def forward(x, w):
    y = x @ w.t()
    g = y.view(y.shape[0], -1, 32)
    s = g.abs().amax(-1, keepdim=True).clamp(min=1e-5) / 127.0
    q = torch.clamp(torch.round(g / s), -128.0, 127.0) * s
    return (g + (q - g).detach()).view_as(y)
