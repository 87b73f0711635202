"""Stage 7's autotuning on an accelerator: the impl's knobs searched on each P0 shape (first dtype), every
candidate re-verified against the golden (level-0 cases on the device) before its time counts, rounds recorded
in the state's perf record, and the best config written back into the impl file for the sizes it was tuned at."""

from __future__ import annotations

from opforge.bench.harness import clock_for, measure
from opforge.bench.opbench import STALE_REL_TOL
from opforge.bench.tuning import autotune, launch_keys, tuned_entry, write_back, write_tuned
from opforge.verify.cases import check_case, level0_cases


class OnDevice:
    """The impl seen through CPU tensors: inputs moved to the device, results back (autograd flows through),
    so `check_case` verifies the kernel as it runs on the accelerator."""

    def __init__(self, impl, device: str):
        self._impl, self._device = impl, device

    def __getattr__(self, name):
        fn = getattr(self._impl, name)

        def call(*tensors, **attrs):
            outs = fn(*(t.to(self._device) for t in tensors), **attrs)
            if isinstance(outs, (tuple, list)):
                return tuple(o.cpu() for o in outs)
            return outs.cpu()
        return call


def tune(ws, req, spec: dict, impl, golden, binding: dict, case, eager_ms: float, state, progress=None) -> dict:
    """Tune the impl's knobs on one case. A generated impl keeps a table of tuned configs per launch size
    (TUNED): the search then changes only the entries of the sizes this case launches, and writes those."""
    fused = getattr(impl, req.name)
    bwd = bool(case.grad_names)
    call = case.forward_backward(fused) if bwd else case.forward(fused)
    ref = case.reference(golden.REFERENCE, bwd)
    clock = clock_for(case.device)
    cases = level0_cases(spec["supported_dtypes"], spec["p0_shapes"])
    checked = OnDevice(impl, case.device)
    keys = launch_keys(impl, lambda: call(case.inputs(0)))

    def timed() -> float:
        return measure(call, case.inputs, clock=clock, reference=ref, rel_tol=STALE_REL_TOL).median_ms

    def verify() -> str | None:
        for c in cases:
            r = check_case(checked, golden, c, spec, with_eager=False)  # a verdict per round, nothing more
            if not r["passed"]:
                bad = next(o for o in r["outputs"] if not o["passed"])
                return f"precision: {c['id']} {bad['name']} failed"
        return None

    target = spec.get("perf_target", {}).get("speedup_vs_eager")
    perf = state.perf

    def on_round(rec):
        rec["binding"] = binding
        perf["rounds"] += 1
        perf["history"].append(rec)
        if rec.get("improved"):
            perf["best"] = rec["config"]
            perf["last_improvement"] = perf["rounds"]
            perf["rounds_without_gain"] = 0
        else:
            perf["rounds_without_gain"] += 1
        if progress:
            progress(f"tuning {binding} round {rec['round']}: {rec['status']} {rec.get('ms', '')}")

    clock.sync()
    result = autotune(impl, timed, verify, keys=keys, target_ms=eager_ms / target if target else None,
                      on_round=on_round)
    result.update(binding=binding, keys=[list(k) for k in keys],
                  objective="fused forward+backward" if bwd else "fused forward")
    # the interpreter's knob values are not the accelerator's: only a compiled run writes back
    written = not getattr(impl, "INTERPRET", False) and result["history"]
    path = ws.path(f"{req.name}_impl.py")
    if not written:
        result["written"] = []
    elif keys:
        result["written"] = write_tuned(path, {k: tuned_entry(impl, result["best"], k) for k in keys})
    else:  # an impl without a per-size table: its module values, for every size
        result["written"] = write_back(path, result["best"])
    return result
