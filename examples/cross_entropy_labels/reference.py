"""Cross-entropy with integer class labels, as language-model training uses it:
loss = Σ_b [t_b ≠ -100] · (logsumexp(logits_b) − logits_b[t_b]) / #{b : t_b ≠ -100}.
Rows labelled -100 (padding) count for nothing; the loss of a batch with none counted is NaN, as in PyTorch."""

import torch
import torch.nn.functional as F


def forward(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target, ignore_index=-100)
