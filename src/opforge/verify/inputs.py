"""Seeded inputs by distribution, and the edge values that break kernels.

Every generator takes its own `torch.Generator` from a seed; the global RNG is never touched.
"""

from __future__ import annotations

import itertools
import os
import zlib

import torch

DISTRIBUTIONS = ("uniform_small", "uniform_large", "normal", "outliers")


SEED_ENV = "OPFORGE_SEED"  # pins the drawn seeds to a sequence, for a reproducible test run
_drawn = itertools.count()


def fresh_seed() -> int:
    """A seed drawn at check time, so a kernel cannot be tuned to known inputs.

    With OPFORGE_SEED set, the n-th seed a process draws is a hash of (OPFORGE_SEED, n) instead."""
    base = os.environ.get(SEED_ENV)
    if base:
        return zlib.crc32(f"{base}:{next(_drawn)}".encode()) & 0x7FFFFFFF
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def make_tensor(shape, dtype, *, seed: int, distribution: str = "normal", low=None, high=None,
                positive: bool = False) -> torch.Tensor:
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r} (expected one of {', '.join(DISTRIBUTIONS)})")
    gen = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    if distribution in ("uniform_small", "uniform_large"):
        lo, hi = (-1.0, 1.0) if distribution == "uniform_small" else (-1000.0, 1000.0)
        lo, hi = (lo if low is None else low), (hi if high is None else high)
        t = torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
    else:
        t = torch.randn(shape, generator=gen, dtype=torch.float64)
        if distribution == "outliers" and t.numel():
            pick = torch.rand(shape, generator=gen, dtype=torch.float64) < 0.01
            t = torch.where(pick, t * 1e3, t)
    if positive:
        t = t.abs() + 1e-3
    return t.to(dtype)


def make_index(shape, dtype, *, seed: int, low: int, high: int) -> torch.Tensor:
    """Integer inputs (class labels) drawn uniformly from [low, high)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(int(low), int(high), tuple(shape), generator=gen, dtype=dtype)


def edge_values(dtype) -> torch.Tensor:
    """±0, exact .5 ties, clamp edges of int8 ranges, the dtype's extreme normals and a subnormal, ±1."""
    info = torch.finfo(dtype)
    vals = [0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -128.5, 1.0, -1.0,
            info.max, -info.max, info.tiny, -info.tiny, info.tiny / 4]
    return torch.tensor(vals, dtype=torch.float64).to(dtype).to(torch.float64)


def with_edges(t: torch.Tensor, values: torch.Tensor, *, seed: int) -> torch.Tensor:
    """A copy of `t` with `values` written at seeded random flat positions."""
    out = t.clone()
    n = out.numel()
    if n == 0:
        return out
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randperm(n, generator=gen)[: min(n, len(values))]
    out.view(-1)[pos] = values[: len(pos)].to(out.dtype)
    return out
