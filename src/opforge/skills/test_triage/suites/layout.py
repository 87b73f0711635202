"""Tensors laid out on the device the way a test means them, shared by the suites."""
import torch


def strided(device, t):
    """`t` on the device with every other element of its last dimension skipped: `Tensor.to` would make a
    non-contiguous CPU tensor contiguous again, and the device must see the strides."""
    if t.dim() == 0 or t.numel() == 0:
        return t.detach().to(device).requires_grad_(t.requires_grad)
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=device)
    view = wide[..., ::2]
    view.copy_(t.detach())
    return view.requires_grad_(t.requires_grad)
