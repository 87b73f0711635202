import torch.nn.functional as F


def forward(x, w, a, b, scale: float = 0.5):
    return F.linear(x, w) + scale * F.linear(F.linear(x, a), b)
