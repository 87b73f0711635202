import torch.nn.functional as F


def forward(x, weight, bias, residual, ln_w, ln_b):
    h = F.linear(x, weight, bias) + residual
    return F.layer_norm(h, (h.shape[-1],), ln_w, ln_b, 1e-5)
