import torch


def forward(q, k, v, slopes):
    s = q.shape[-2]
    pos = torch.arange(s, device=q.device)
    dist = (pos[None, :] - pos[:, None]).to(q.dtype)
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + slopes[:, None, None] * dist
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=q.device), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
