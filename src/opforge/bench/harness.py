"""A timing loop a kernel cannot fool: the cache flushed before each repetition, fresh input buffers between
timed calls, warm-up and repetitions sized by time, and outputs checked against a reference on fresh inputs.

The clock is pluggable: `CudaClock` records CUDA events (device time, no host sync inside the loop),
`WallClock` reads the host's monotonic clock. Both run the same loop, so the fresh-buffer rotation and the
staleness checks that guard GPU figures are exercised on a CPU as well.

Staleness: every `check_every` repetitions one input copy is refilled in place with new values (same buffers,
so a kernel that memoises by pointer is caught; the values are a spare input set rolled by a random offset, a
device-side copy rather than a new draw, so checks stay cheap at large sizes), its reference recomputed, and
the timed call's outputs compared with it; the previous checked outputs are compared again too, so a kernel
that writes every call's result into one persistent buffer is caught. A mismatch raises `StaleOutputError`;
it is never averaged away.

The check asks "are these results for these inputs", not "is this path accurate": each output's allowance is
`rel_tol` or three times the error the path showed on its first call, whichever is larger (eager bfloat16
arithmetic sums a quantizer's scale gradient 6% to 240% away from the float32 answer, a right answer all the
same). Where that allowance reaches 0.5, the reference cannot tell such a result from one for other inputs
(~1.4), and that output is left unchecked; `Timing.errors` records each output's error on the first call.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

Inputs = list  # list[torch.Tensor]


class StaleOutputError(RuntimeError):
    """A timed call returned results that belong to other inputs (cached, stale or overwritten outputs)."""


class WallClock:
    """Host time around each call; `sync` is a no-op for CPU work."""

    name = "wall clock"

    def __init__(self, flush_bytes: int = 32 * 2**20):
        self._flush = torch.empty(max(1, flush_bytes), dtype=torch.uint8)

    def flush(self) -> None:
        self._flush.zero_()

    def mark(self):
        return time.perf_counter()

    def elapsed_ms(self, start, stop) -> float:
        return (stop - start) * 1e3

    def sync(self) -> None:
        pass


class CudaClock:
    """CUDA events around each call; the L2 cache is flushed by zeroing a buffer larger than it."""

    name = "cuda events, L2 flushed"

    def __init__(self, device: str | torch.device = "cuda"):
        props = torch.cuda.get_device_properties(device)
        l2 = getattr(props, "L2_cache_size", 0) or 128 * 2**20
        self._flush = torch.empty(4 * l2, dtype=torch.uint8, device=device)

    def flush(self) -> None:
        self._flush.zero_()

    def mark(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def elapsed_ms(self, start, stop) -> float:
        return start.elapsed_time(stop)

    def sync(self) -> None:
        torch.cuda.synchronize()


def clock_for(device: str):
    return CudaClock(device) if device.startswith("cuda") else WallClock()


def _flat(outputs) -> list[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    return [o for o in outputs if isinstance(o, torch.Tensor)]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||a - e|| / ||e|| in float64 over finite positions: a few ulps for a right answer, order 1 for an answer
    to other inputs."""
    a, e = actual.detach().double(), expected.detach().double()
    if a.shape != e.shape:
        return math.inf
    both = torch.isfinite(a) & torch.isfinite(e)
    if bool((torch.isfinite(a) != torch.isfinite(e)).any()):
        return math.inf
    diff = torch.linalg.vector_norm(torch.where(both, a - e, 0.0)).item()
    scale = torch.linalg.vector_norm(torch.where(both, e, 0.0)).item()
    return diff / scale if scale > 0 else diff


# an allowance from which a result for other inputs (relative error ~1.4) can no longer be told apart
UNTELLABLE = 0.5


def outputs_mismatch(actual, expected, rel_tol: float | Sequence[float]) -> str | None:
    """The first output farther from `expected` than its allowance (one for all, or one per output), if any."""
    got, want = _flat(actual), _flat(expected)
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    tols = [rel_tol] * len(got) if isinstance(rel_tol, (int, float)) else list(rel_tol)
    for i, (a, e, tol) in enumerate(zip(got, want, tols)):
        if tol >= UNTELLABLE:
            continue
        err = relative_error(a, e)
        if not err <= tol:
            return f"output {i}: relative error {err:.3g} against the reference (allowed {tol:.3g})"
    return None


@dataclass
class Timing:
    median_ms: float
    iqr_ms: float
    min_ms: float
    max_ms: float
    reps: int
    warmup: int
    copies: int
    checks: int
    timer: str
    errors: list | None = None  # each output's relative error against the reference on the first call


    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _quartiles(times: Sequence[float]) -> tuple[float, float]:
    if len(times) < 4:
        return min(times), max(times)
    q = statistics.quantiles(times, n=4)
    return q[0], q[2]


def measure(fn: Callable[[Inputs], object], make_inputs: Callable[[int], Inputs], *, clock=None,
            reference: Callable[[Inputs], object] | None = None, rel_tol: float = 0.02, copies: int = 3,
            check_every: int = 10, warmup_ms: float = 25.0, rep_ms: float = 100.0, min_reps: int = 5,
            max_reps: int = 1000, seed: int = 1) -> Timing:
    """Time `fn(inputs)` with the cache flushed before each call, rotating through `copies` input sets.

    `make_inputs(seed)` builds one input set (tensors on the timing device). With a `reference`, the outputs
    of every `check_every`-th call are checked on freshly refilled inputs (see the module docstring).
    """
    clock = clock or WallClock()
    sets = [make_inputs(seed + k) for k in range(max(1, copies))]
    spare = make_inputs(seed + len(sets)) if reference is not None else None
    shifts = torch.Generator().manual_seed(seed)

    first = _flat(fn(sets[0]))  # compiles, autotunes, allocates: never part of an estimate
    errors, tols = None, rel_tol
    if reference is not None:  # the path's own accuracy sets what a check may allow (module docstring)
        clock.sync()
        errors = [relative_error(a, e) for a, e in zip(first, _flat(reference(sets[0])))]
        tols = [max(rel_tol, 3 * e) for e in errors]
    # estimate one call from a few, then size warm-up and repetitions by time, as do_bench does
    clock.sync()
    start = clock.mark()
    for k in range(3):
        fn(sets[k % len(sets)])
    stop = clock.mark()
    clock.sync()
    est = max(clock.elapsed_ms(start, stop) / 3, 1e-4)
    n_warm = max(1, min(max_reps, int(warmup_ms / est)))
    n_rep = max(min_reps, min(max_reps, int(rep_ms / est)))
    for k in range(n_warm):
        fn(sets[k % len(sets)])

    marks = []
    checks = 0
    previous = None  # (outputs, expected) of the last checked call
    for r in range(n_rep):
        i = r % len(sets)
        checking = reference is not None and r % max(1, check_every) == 0
        expected = None
        if checking:
            with torch.no_grad():
                for buf, new in zip(sets[i], spare):
                    flat = new.reshape(-1)
                    k = int(torch.randint(1, max(2, flat.numel()), (1,), generator=shifts))
                    buf.copy_(flat.roll(k).view_as(buf))
            expected = reference(sets[i])
        clock.flush()
        a = clock.mark()
        out = fn(sets[i])
        b = clock.mark()
        marks.append((a, b))
        if checking:
            clock.sync()
            bad = outputs_mismatch(out, expected, tols)
            if bad:
                raise StaleOutputError(f"repetition {r} on input copy {i} (refilled with new values): {bad}; "
                                       "the call returned results for other inputs")
            if previous is not None:
                bad = outputs_mismatch(*previous, tols)
                if bad:
                    raise StaleOutputError(f"repetition {r}: the outputs of an earlier call changed under a later "
                                           f"call ({bad}); the kernel reuses one output buffer across calls")
            previous = (_flat(out), expected)
            checks += 1
    clock.sync()
    times = [clock.elapsed_ms(a, b) for a, b in marks]
    q1, q3 = _quartiles(times)
    return Timing(statistics.median(times), q3 - q1, min(times), max(times), len(times), n_warm, len(sets), checks,
                  clock.name, errors)


def copy_ceiling(device: str, nbytes: int | None = None, clock=None, rep_ms: float = 100.0) -> dict:
    """Device-to-device copy bandwidth measured with the same loop: the memory-bound kernels' ceiling."""
    clock = clock or clock_for(device)
    nbytes = nbytes or (2**30 if device.startswith("cuda") else 64 * 2**20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    t = measure(lambda ins: dst.copy_(ins[0]), lambda s: [src], clock=clock, copies=1, rep_ms=rep_ms)
    return {"bytes": 2 * nbytes, "median_ms": t.median_ms, "gbps": 2 * nbytes / (t.median_ms * 1e-3) / 1e9,
            "timer": t.timer}
