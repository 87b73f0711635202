import torch


def forward(x, weight):
    y = x @ weight.t()
    scale = y.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5) / 127.0
    q = torch.clamp(torch.round(y / scale), -127, 127) * scale
    return y + (q - y).detach()
