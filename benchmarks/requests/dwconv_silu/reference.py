import torch.nn.functional as F


def forward(x, weight, bias):
    y = F.conv1d(x, weight, bias, padding=3, groups=x.shape[1])
    return F.silu(y[..., : x.shape[-1]])
