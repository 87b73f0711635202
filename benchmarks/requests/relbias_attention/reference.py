import torch


def forward(q, k, v, bias):
    scores = torch.matmul(q, k.transpose(-2, -1)) / q.shape[-1] ** 0.5 + bias
    return torch.matmul(torch.softmax(scores, dim=-1), v)
