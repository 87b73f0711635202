"""Implementations under test for the examples' `custom:` targets (sibling of the cases, imported by name).

    opforge api-consistency examples/consistency/scale_shift.py \
        --target custom:kernels:scale_shift_triton_tail_bug --out out/tail
    opforge api-consistency examples/consistency/row_sum.py --target custom:kernels:row_sum_shuffled --out out/sum
"""

import numpy as np
import torch
import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def scale_shift_kernel(x_ptr, out_ptr, n, scale, shift, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * scale + shift, mask=mask)


def scale_shift_triton(x: torch.Tensor, scale: float = 2.0, shift: float = 1.0) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    scale_shift_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, scale, shift, BLOCK=BLOCK)
    return out


def scale_shift_triton_tail_bug(x: torch.Tensor, scale: float = 2.0, shift: float = 1.0) -> torch.Tensor:
    out = torch.zeros_like(x)
    n = x.numel()
    scale_shift_kernel[(n // BLOCK,)](x, out, n, scale, shift, BLOCK=BLOCK)  # floor: the last block is dropped
    return out


def row_sum_shuffled(x: torch.Tensor) -> torch.Tensor:
    """A row sum whose accumulation order changes from call to call, like atomics on a GPU."""
    order = torch.from_numpy(np.random.default_rng().permutation(x.shape[-1]))
    return x[..., order].sum(dim=-1)


def row_sum_chunked(x: torch.Tensor) -> torch.Tensor:
    """A deterministic blocked row sum: different order than the CPU, same accuracy."""
    return torch.stack([c.sum(dim=-1) for c in x.split(64, dim=-1)], dim=-1).sum(dim=-1)
