"""Launches per call, counted by torch.profiler on the device (None where there is no device to count): every
device event, kernels, memsets and copies alike, since each costs a launch and a memcpy from the host also
keeps a call from being captured in a CUDA graph."""

from __future__ import annotations

from typing import Callable

import torch


def launches_per_call(fn: Callable[[list], object], inputs: list, calls: int = 3) -> float | None:
    if not torch.cuda.is_available() or not any(t.is_cuda for t in inputs):
        return None
    from torch.profiler import ProfilerActivity, profile

    fn(inputs)  # compile and autotune outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(inputs)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(events) / calls
