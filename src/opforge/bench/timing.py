"""CPU timing of reference paths, and which device the figures come from.

CPU figures come from `torch.utils.benchmark.Timer.blocked_autorange` (median and IQR over blocks of calls,
sized to amortise timer overhead; bounded in time, unlike adaptive_autorange on tiny calls). GPU timing is
`harness.measure` with `CudaClock`. Kernels under the Triton interpreter are never timed as figures: the
interpreter measures Python, not the kernel.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.utils.benchmark as tbench


def time_cpu(fn: Callable[[], object], min_run_time: float = 0.3) -> dict:
    fn()  # warm-up: first calls compile or allocate
    m = tbench.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time)
    return {"median_ms": m.median * 1e3, "iqr_ms": m.iqr * 1e3, "runs": len(m.times), "timer": "cpu"}


def device_name() -> str:
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"
