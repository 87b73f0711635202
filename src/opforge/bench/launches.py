"""Launches and device time per call, from torch.profiler on the device (None where there is no device): every
device event counts, kernels, memsets and copies alike, since each costs a launch and a memcpy from the host also
keeps a call from being captured in a CUDA graph. The device time is those events' durations added up: a call
whose timed median is well above it spends the difference issuing work from the host (Python dispatch, launch
overhead), which a faster kernel cannot win back."""

from __future__ import annotations

from typing import Callable

import torch


def profile_calls(fn: Callable[[list], object], inputs: list, calls: int = 3) -> dict | None:
    """{"launches": device events per call, "device_ms": their summed duration per call}."""
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
    return {"launches": len(events) / calls,
            "device_ms": sum(e.time_range.elapsed_us() for e in events) / calls / 1000.0}
