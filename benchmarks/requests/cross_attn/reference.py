import torch


def forward(q, k, v):
    s = torch.matmul(q, k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.matmul(torch.softmax(s, dim=-1), v)
