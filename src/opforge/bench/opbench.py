"""One operator at one shape and dtype, timed on every path in the same run: eager, torch.compile (default and
max-autotune) and the fused kernel, forward and forward+backward, with the derived figures (speedups, GB/s
from the cost model's bytes, % of the copy ceiling, launches per call).

On a GPU every path goes through `harness.measure` (flushed, rotating fresh inputs, outputs checked against the
float32 reference). On a CPU only the reference paths are timed, with `timing.time_cpu`; the fused kernel
would run in Triton's interpreter, whose times measure Python.
"""

from __future__ import annotations

from typing import Callable

import torch

from opforge.bench.harness import StaleOutputError, clock_for, measure
from opforge.bench.launches import profile_calls
from opforge.bench.timing import time_cpu

# relative L2 error a right answer stays far below in any dtype (bfloat16 rounding is ~4e-3) and an answer for
# other inputs far above (~1.4)
STALE_REL_TOL = 0.05


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class OpCase:
    """Calls of one op on input lists: forward, forward+backward, and their float32 references."""

    def __init__(self, make_inputs: Callable[[int], list], names, grad_names, attrs: dict, dtype, device: str):
        self.names, self.grad_names, self.attrs = list(names), list(grad_names), dict(attrs)
        self.dtype, self.device = dtype, device
        self._make = make_inputs
        self._grad_outs = None
        self._drawn: dict[int, list] = {}  # seed -> tensors on the device; each caller gets its own copies

    def inputs(self, seed: int) -> list:
        if seed not in self._drawn:
            self._drawn[seed] = [t.to(self.device) for t in self._make(seed)]
        return [t.clone().requires_grad_(n in self.grad_names and t.is_floating_point())
                for t, n in zip(self._drawn[seed], self.names)]

    def grad_outputs(self, outs) -> list:
        if self._grad_outs is None:
            g = torch.Generator(device=self.device).manual_seed(12345)
            self._grad_outs = [torch.randn(o.shape, generator=g, device=self.device, dtype=o.dtype) for o in outs]
        return self._grad_outs

    def forward(self, fn):
        def call(ins):
            with torch.no_grad():
                return _as_tuple(fn(*ins, **self.attrs))
        return call

    def forward_backward(self, fn):
        def call(ins):
            outs = _as_tuple(fn(*ins, **self.attrs))
            wrt = [t for t, n in zip(ins, self.names) if n in self.grad_names]
            floats = [o for o in outs if o.is_floating_point()]  # indices take no gradient
            gos = [g.to(o.dtype) for g, o in zip(self.grad_outputs(floats), floats)]
            grads = torch.autograd.grad(floats, wrt, gos, allow_unused=True)
            return tuple(o.detach() for o in outs) + tuple(g for g in grads if g is not None)
        return call

    def reference(self, fn, backward: bool):
        """`fn` in float32 on copies of the inputs, results cast back: what every timed path is checked against."""
        def call(ins):
            up = [t.detach().float().requires_grad_(t.requires_grad) if t.is_floating_point() else t.detach()
                  for t in ins]
            run = self.forward_backward(fn) if backward else self.forward(fn)
            return tuple(o.to(self.dtype) if o.is_floating_point() else o for o in run(up))
        return call


# max-autotune without CUDA graphs: graph replays overwrite earlier outputs (the harness would rightly call that
# stale), and the fused kernel is launched without graphs too, so kernels are compared with kernels
COMPILE_MODES = {"compile_default": "default", "compile_max_autotune": "max-autotune-no-cudagraphs"}


def _variant(name: str, reference: Callable) -> Callable:
    if name == "eager":
        return reference
    # a fresh cache per variant: modes x dtypes x grad modes would pass dynamo's recompile limit and fall back
    # to eager silently
    torch._dynamo.reset()
    return torch.compile(reference, mode=COMPILE_MODES[name])


def _cpu_row(case: OpCase, baselines, reference) -> dict:
    times = {}
    ins = case.inputs(0)
    for vname in baselines:
        fn = _variant(vname, reference)
        times[f"{vname}_forward"] = time_cpu(lambda f=case.forward(fn): f(ins))
        if case.grad_names:
            times[f"{vname}_forward_backward"] = time_cpu(lambda f=case.forward_backward(fn): f(ins))
    return times


BASELINES = ("eager", "compile_default", "compile_max_autotune")


def bench_case(case: OpCase, reference: Callable, fused: Callable | None, *, rep_ms: float = 100.0,
               baselines=BASELINES, clock=None) -> dict:
    """Times of every path. On a CPU without an explicit `clock`, only the reference paths, by
    torch.utils.benchmark (`fused` is then ignored); with one, the same guarded loop as on a GPU."""
    if not case.device.startswith("cuda") and clock is None:
        return {"times": _cpu_row(case, [b for b in baselines if b != "compile_max_autotune"], reference),
                "launches": {}}
    clock = clock or clock_for(case.device)
    times, launches = {}, {}
    passes = [("forward", False)] + ([("forward_backward", True)] if case.grad_names else [])
    for vname in list(baselines) + (["fused"] if fused is not None else []):
        fn = fused if vname == "fused" else _variant(vname, reference)
        for pname, bwd in passes:
            call = case.forward_backward(fn) if bwd else case.forward(fn)
            try:
                t = measure(call, case.inputs, clock=clock, reference=case.reference(reference, bwd),
                            rel_tol=STALE_REL_TOL, rep_ms=rep_ms, warmup_ms=rep_ms / 4)
            except StaleOutputError as exc:  # which path: the report names it
                raise StaleOutputError(f"{vname} {pname.replace('_', '+')}: {exc}") from exc
            times[f"{vname}_{pname}"] = t.to_dict()
            prof = profile_calls(call, case.inputs(99))
            launches[f"{vname}_{pname}"] = prof and prof["launches"]
            if prof:
                times[f"{vname}_{pname}"]["device_ms"] = prof["device_ms"]
    return {"times": times, "launches": launches}


def figures(times: dict, cost: dict, ceiling_gbps: float | None) -> dict:
    """Speedups of the fused kernel over each baseline, achieved bandwidth and % of the copy ceiling."""
    if "fused_forward" not in times:
        return {}
    out = {}
    passes = {"forward": cost["forward"]["fused_bytes"]}
    if "fused_forward_backward" in times and "backward" in cost:
        passes["forward_backward"] = cost["forward"]["fused_bytes"] + cost["backward"]["fused_bytes"]
    for p, nbytes in passes.items():
        fused_ms = times[f"fused_{p}"]["median_ms"]
        row = {"fused_ms": fused_ms, "gbps": nbytes / (fused_ms * 1e-3) / 1e9}
        if ceiling_gbps:
            row["pct_of_copy_ceiling"] = 100 * row["gbps"] / ceiling_gbps
        for base in ("eager", "compile_default", "compile_max_autotune"):
            if f"{base}_{p}" in times:
                row[f"speedup_vs_{base}"] = times[f"{base}_{p}"]["median_ms"] / fused_ms
        out[p] = row
    if "forward_backward" in out:
        # the backward alone, as the difference of the two medians (labelled derived in reports)
        fb = {k: times[f"{k}_forward_backward"]["median_ms"] - times[f"{k}_forward"]["median_ms"]
              for k in ("eager", "compile_default", "compile_max_autotune", "fused") if f"{k}_forward" in times}
        if fb.get("fused", 0) > 0:
            out["backward_derived"] = {f"speedup_vs_{k}": v / fb["fused"] for k, v in fb.items() if k != "fused"}
    return out
