"""The first pass: run the programs and compare them (functional, precision, determinism, memory)."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten

from opforge.i18n import N_, Msg
from opforge.verify.divergence import Trace, bits_equal, record
from opforge.verify.tolerance import tolerance_for

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass
class Run:
    side: str
    outputs: list = field(default_factory=list)   # CPU copies of the returned tensors
    others: list = field(default_factory=list)    # returned non-tensor leaves
    error: str = ""                               # "Type: message" when the call raised
    tb: str = ""
    seconds: float = 0.0
    peak_bytes: int | None = None
    trace: Trace | None = None

    @property
    def ok(self) -> bool:
        return not self.error


def _device_peak(device: str):
    mod = {"cuda": getattr(torch, "cuda", None), "npu": getattr(torch, "npu", None)}.get(device.split(":")[0])
    return mod if mod is not None and hasattr(mod, "max_memory_allocated") else None


def _sync(device: str) -> None:
    mod = _device_peak(device)
    if mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize()


def execute(prog, *, seed: int, reseed: bool = True, values: bool = False) -> Run:
    """One call of the program under the recorder (metadata only unless `values`)."""
    if reseed:
        torch.manual_seed(seed)
    mem = _device_peak(prog.device) if prog.device != "cpu" else None
    base = 0
    if mem is not None:
        _sync(prog.device)
        mem.reset_peak_memory_stats()
        base = mem.memory_allocated()
    t0 = time.perf_counter()
    trace = record(prog.call, values=values) if prog.traceable else _plain(prog.call)
    _sync(prog.device)
    run = Run(prog.side, seconds=time.perf_counter() - t0, trace=trace)
    if trace.error is not None:
        msg = str(trace.error).strip()
        run.error = f"{type(trace.error).__name__}: {msg.splitlines()[0] if msg else ''}"
        run.tb = "".join(traceback.format_exception(type(trace.error), trace.error, trace.error.__traceback__))
        return run
    run.outputs = trace.outputs
    run.others = [x for x in tree_flatten(trace.result)[0] if not isinstance(x, torch.Tensor)]
    if mem is not None:
        run.peak_bytes = mem.max_memory_allocated() - base
    elif prog.traceable:  # compiled code allocates outside the dispatcher: not measured on the CPU
        run.peak_bytes = trace.peak_bytes
    return run


def _plain(fn) -> Trace:
    trace = Trace(records=[])
    try:
        trace.result = fn()
    except Exception as exc:
        trace.error = exc
        return trace
    trace.outputs = [o.detach().to("cpu", copy=True) for o in tree_flatten(trace.result)[0]
                     if isinstance(o, torch.Tensor)]
    return trace


def expected_dtype(ref_dtype: torch.dtype, lowp: torch.dtype | None) -> torch.dtype:
    """The dtype the device under test should return: the reference's, or for a low-precision run the
    low dtype where the float64 reference returns float64."""
    return lowp if lowp is not None and ref_dtype == torch.float64 else ref_dtype


def functional(dut: Run, ref: Run, lowp: torch.dtype | None) -> list[dict]:
    """Structure, shape and dtype of every output; one entry per problem (empty when all agree)."""
    probs = []
    if len(dut.outputs) != len(ref.outputs):
        return [{"what": "structure", "detail": Msg(N_("{n} tensor outputs, the reference returns {ref}"),
                                                    n=len(dut.outputs), ref=len(ref.outputs))}]
    for i, (d, r) in enumerate(zip(dut.outputs, ref.outputs)):
        if tuple(d.shape) != tuple(r.shape):
            probs.append({"what": "shape", "output": i, "detail": Msg(N_("output {i}: shape {shape}, reference {ref}"),
                                                                       i=i, shape=list(d.shape), ref=list(r.shape))})
        want = expected_dtype(r.dtype, lowp)
        if d.dtype != want:
            probs.append({"what": "dtype", "output": i, "expected": str(want).replace("torch.", ""),
                          "detail": Msg(N_("output {i}: dtype {dtype}, expected {expected}"), i=i,
                                        dtype=str(d.dtype).replace("torch.", ""),
                                        expected=str(want).replace("torch.", ""))})
    if len(dut.others) == len(ref.others):
        for k, (a, b) in enumerate(zip(dut.others, ref.others)):
            if type(a) is not type(b) or (not isinstance(a, float) and a != b):
                probs.append({"what": "value", "detail": Msg(N_("non-tensor result {k}: {value}, reference {ref}"),
                                                             k=k, value=repr(a), ref=repr(b))})
    return probs


def program_tolerance(dtype: torch.dtype, scale: float, lowp: bool) -> tuple[float, float]:
    """atol, rtol for a whole program's output: the dtype's policy, widened by a few roundings of the
    output's own scale (a program rounds many times; an output near zero after cancellation is judged
    against the magnitudes it came from)."""
    if dtype not in _FLOATS:
        return 0.0, 0.0
    eps = torch.finfo(dtype).eps
    tol = tolerance_for(dtype)
    k = 8 if lowp else 4
    return tol.atol + k * eps * scale, max(tol.rtol, k * eps)


def precision(dut: Run, ref64: Run, ref: Run | None, *, lowp: bool) -> list[dict]:
    """Per output: error against float64, new inf/NaN, and whether it is within the program tolerance.

    A device is allowed twice the CPU's own error at the same dtype on top of the tolerance: being as
    accurate as the CPU is never a finding."""
    out = []
    for i, d in enumerate(dut.outputs):
        if i >= len(ref64.outputs) or tuple(ref64.outputs[i].shape) != tuple(d.shape):
            continue
        t = ref64.outputs[i]
        entry = {"output": i, "shape": list(d.shape), "dtype": str(d.dtype).replace("torch.", ""), "numel": d.numel()}
        if not (d.is_floating_point() and t.is_floating_point()):  # integers and booleans: exactly
            bad = (d.double() != t.double()).reshape(-1) if d.dtype != torch.bool else (d != t.bool()).reshape(-1)
            idx = bad.nonzero().reshape(-1)
            out.append({**entry, "passed": not bool(bad.any()), "new_nonfinite": 0, "atol": 0.0, "rtol": 0.0,
                        "max_abs": float((d.double() - t.double()).abs().max()) if d.numel() else 0.0,
                        "max_rel": 0.0, "mismatches": int(bad.sum()), "mismatch_ratio": float(bad.float().mean())
                        if d.numel() else 0.0, "first_bad": [int(i) for i in idx[:5]],
                        "bad_span": [int(idx.min()), int(idx.max())] if idx.numel() else None})
            continue
        dd, tt = d.double(), t.double()
        fin_t = torch.isfinite(tt)
        scale = float(tt[fin_t].abs().max()) if fin_t.any() else 0.0
        atol, rtol = program_tolerance(d.dtype, scale, lowp)
        both = fin_t & torch.isfinite(dd)
        err = torch.where(both, (dd - tt).abs(), torch.zeros_like(dd))
        allowed = atol + rtol * tt.abs()
        cpu = ref.outputs[i] if ref is not None and i < len(ref.outputs) else None
        if cpu is not None and cpu.shape == d.shape and cpu.is_floating_point():
            allowed = allowed + 2 * (cpu.double() - tt).abs().nan_to_num(0.0, 0.0, 0.0)
        new_nf = fin_t & ~torch.isfinite(dd)
        nf_bad = (~fin_t) & ~((dd == tt) | (torch.isnan(dd) & torch.isnan(tt)))
        bad = (both & (err > allowed)) | new_nf | nf_bad
        rel = err[both] / tt[both].abs().clamp_min(1e-300) if both.any() else torch.zeros(0)
        flat_bad = bad.reshape(-1).nonzero().reshape(-1)
        entry.update({
            "passed": not bool(bad.any()), "mismatches": int(bad.sum()),
            "mismatch_ratio": float(bad.sum()) / max(1, d.numel()),
            "new_nonfinite": int(new_nf.sum()), "max_abs": float(err.max()) if err.numel() else 0.0,
            "max_rel": float(torch.where(tt[both] == 0, err[both], rel).max()) if both.any() else 0.0,
            "atol": atol, "rtol": rtol,
            "first_bad": [int(i) for i in flat_bad[:5]],
            "bad_span": [int(flat_bad.min()), int(flat_bad.max())] if flat_bad.numel() else None,
        })
        if flat_bad.numel():
            k = int(flat_bad[0])
            entry["example"] = {"flat_index": k, "target": float(dd.reshape(-1)[k]),
                                "float64": float(tt.reshape(-1)[k])}
        out.append(entry)
    return out


def same_bits(a: Run, b: Run) -> bool:
    return len(a.outputs) == len(b.outputs) and all(bits_equal(x, y) for x, y in zip(a.outputs, b.outputs)) \
        and a.others == b.others


def repeat(prog, first: Run, runs: int, *, seed: int, reseed: bool) -> tuple[bool, int]:
    """Run again runs-1 times; (all bit-identical to the first, index of the first differing run)."""
    for k in range(1, runs):
        again = execute(prog, seed=seed, reseed=reseed)
        if not again.ok or not same_bits(first, again):
            return False, k
    return True, -1


def tail_pattern(numel: int, span: list | None, mismatches: int) -> str:
    """Says when all the bad elements sit at the end of the flattened output (a last-block defect)."""
    if not span or numel < 2:
        return ""
    lo, hi = span
    if hi == numel - 1 and lo >= numel // 2 and (hi - lo + 1) <= max(1, numel // 4):
        return Msg(N_("all {n} bad elements lie in the last {last} of {numel} (flat indices {lo}..{hi}): the pattern "
                      "of a last-block or boundary defect"), n=mismatches, last=numel - lo, numel=numel, lo=lo, hi=hi)
    return ""
