"""Softmax over the last dimension."""

import torch


def forward(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)
