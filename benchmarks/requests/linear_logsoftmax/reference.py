import torch


def forward(x, w):
    return torch.log_softmax(x @ w.t(), dim=-1)
