import torch


def forward(q, k, v, softcap: float = 50.0):
    s = q.shape[-2]
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    scores = torch.tanh(scores / softcap) * softcap
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v
