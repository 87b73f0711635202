"""Timing of reference paths: eager PyTorch and torch.compile, on the CPU or a GPU.

CPU figures come from `torch.utils.benchmark.Timer.blocked_autorange` (median and IQR over blocks of
calls, sized to amortise timer overhead; bounded in time, unlike adaptive_autorange on tiny calls).
On a GPU `triton.testing.do_bench` gives the median of CUDA-event timings with
the L2 cache flushed before each repetition. Kernels under the Triton interpreter are never timed: the
interpreter measures Python, not the kernel.
"""

from __future__ import annotations

import statistics
from typing import Callable

import torch
import torch.utils.benchmark as tbench


def time_cpu(fn: Callable[[], object], min_run_time: float = 0.3) -> dict:
    fn()  # warm-up: first calls compile or allocate
    m = tbench.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time)
    return {"median_ms": m.median * 1e3, "iqr_ms": m.iqr * 1e3, "runs": len(m.times), "timer": "cpu"}


def time_gpu(fn: Callable[[], object], rep_ms: int = 100) -> dict:
    import triton.testing

    times = triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="all")
    q = statistics.quantiles(times, n=4) if len(times) >= 4 else [times[0], times[0], times[0]]
    return {"median_ms": statistics.median(times), "iqr_ms": q[2] - q[0], "runs": len(times),
            "timer": "cuda-events, L2 flushed"}


def timer_for(device: str):
    return time_gpu if device == "cuda" else time_cpu


def device_name() -> str:
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"
