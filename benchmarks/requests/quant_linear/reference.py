import torch
import torch.nn.functional as F


def forward(x, weight, bias, scale):
    y = F.linear(x, weight, bias)
    q = torch.clamp(torch.round(y / scale), -128, 127) * scale
    return y + (q - y).detach()
