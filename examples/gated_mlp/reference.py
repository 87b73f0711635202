"""A SwiGLU feed-forward block as in Llama: w_down · (silu(w_gate · x) ⊙ (w_up · x))."""

import torch
import torch.nn.functional as F


def forward(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)
