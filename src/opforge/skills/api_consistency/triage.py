"""Triage: the rules that pick one of three classes, and the second pass that localises a defect.

Class 1: consistent, or a documented, expected difference. Class 2: a framework or adaptation problem found
in the first pass (a crash, dtype promotion, shape handling, composition, memory). Class 3: an operator's
numerical or determinism defect, localised to the operator and its call site in a second pass. (The field is
named `exit` in result.json; the process's exit code is another number, see command.py.)
Rules are checked in the order written; the first that fires decides.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field

import torch

from opforge.skills.api_consistency import checks as ck
from opforge.skills.api_consistency.targets import Program, Target, programs
from opforge.verify import divergence as dv
from opforge.verify.tolerance import dtype_name

RULES = [
    ("R1", 2, "crash", "The call fails on the target but runs on the CPU: a framework or adaptation problem "
                       "(missing kernel or dtype support, wrong fallback, wrapper logic). The operator in flight "
                       "and its call site are named, with the traceback."),
    ("R2", 2, "functional", "An output differs from the reference in structure, shape or dtype: dtype promotion "
                            "or shape handling. Localised to the first operator on the output's path that turns "
                            "the expected dtype into another (or the first aligned operator whose shape differs)."),
    ("R3", 3, "precision", "inf/NaN appear where the float64 reference is finite, or values leave the program "
                           "tolerance, and one operator replayed in float64 on its own recorded inputs diverges "
                           "beyond its dtype's tolerance (else: the first operator on the output's path that "
                           "overflows or flushes to zero where the float64 program does not; an opaque kernel on "
                           "the path; the custom function itself when all its operators are right): that "
                           "operator's numerical defect."),
    ("R4", 3, "determinism", "Repeated runs on the target differ bit for bit while the CPU reference does not: a "
                             "determinism defect, localised to the first operator whose output values change with "
                             "the same inputs (or the same inputs in another order)."),
    ("R5", 2, "precision", "Values leave the tolerance though every operator is right on its own inputs: the "
                           "program is composed differently on the target (decomposition, fallback, wrapper)."),
    ("R6", 2, "memory", "Peak memory on the target is above twice the reference's (scaled by element size) "
                        "plus 16 MiB: an extra copy or a fallback."),
    ("R7", 1, "expected", "An expected difference: a check the case documents (DOCUMENTED), randomness the "
                          "program owns (the CPU varies too and a fixed seed makes both repeatable), or precision "
                          "lost to rounding in low precision while every operator is within its tolerance."),
    ("R8", 1, "none", "Consistent: outputs match in structure, shape and dtype, values within tolerance of the "
                      "float64 reference, repeated runs identical, memory as expected."),
]
MEMORY_SLACK = 16 << 20


@dataclass
class Diagnosis:
    case: str
    target: str
    seed: int
    exit: int = 1
    rule: str = "R8"
    check: str = "none"
    conclusion: str = ""
    operator: dict | None = None
    evidence: list = field(default_factory=list)
    checks: dict = field(default_factory=dict)
    timeline: list = field(default_factory=list)
    traceback: str = ""
    culprit: object = None      # the OpRecord localised, for the repro script
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"case": self.case, "target": self.target, "seed": self.seed, "exit": self.exit, "rule": self.rule,
                "check": self.check, "conclusion": self.conclusion, "operator": self.operator,
                "evidence": self.evidence, "checks": self.checks, "timeline": self.timeline,
                "traceback": self.traceback, "seconds": round(self.seconds, 3),
                "rules": [{"id": r, "exit": e, "text": t, "fired": r == self.rule} for r, e, _, t in RULES]}


class _Clock:
    def __init__(self, dg: Diagnosis):
        self.dg = dg

    def step(self, what: str, fn, summary=lambda r: ""):
        t0 = time.perf_counter()
        res = fn()
        self.dg.timeline.append({"step": len(self.dg.timeline) + 1, "what": what,
                                 "seconds": round(time.perf_counter() - t0, 3), "result": summary(res)})
        return res


def _op(rec: dv.OpRecord, reason: str) -> dict:
    return {"name": rec.name, "kind": rec.kind, "index": rec.index, "reason": reason,
            "site": rec.site.to_dict() if rec.site else None, "stack": [s.to_dict() for s in rec.stack]}


def _function_op(fn, name: str, reason: str) -> dict:
    try:
        file, line = inspect.getsourcefile(fn), inspect.getsourcelines(fn)[1]
        code = inspect.getsourcelines(fn)[0][0].strip()
    except (TypeError, OSError):
        file, line, code = "?", 0, ""
    return {"name": name, "kind": "function", "index": None, "reason": reason,
            "site": {"file": file, "line": line, "function": getattr(fn, "__name__", name), "code": code},
            "stack": []}


def _set(dg: Diagnosis, rule: str, conclusion: str, op: dict | None = None, culprit=None) -> Diagnosis:
    rid, ex, check, _ = next(r for r in RULES if r[0] == rule)
    documented = dg.checks.get("documented", {})
    doc_key = {"crash": "functional"}.get(check, check)
    if ex != 1 and doc_key in documented:
        dg.evidence.append(f"rule {rule} would fire ({conclusion}) but the case documents {doc_key}: "
                           f"{documented[doc_key]}")
        rid, ex, check = "R7", 1, "expected"
        conclusion = f"documented difference in {doc_key}: {documented[doc_key]}"
    dg.rule, dg.exit, dg.check, dg.conclusion, dg.operator, dg.culprit = rid, ex, check, conclusion, op, culprit
    return dg


def _localise_numeric(dg, target: Target, progs, seed: int, bad_output: int, clock: _Clock):
    """Second pass for a value/inf difference: replay every operator of the target's run in float64."""
    trace = clock.step("second pass: record the target's run with every operator's values",
                       lambda: dv.record(lambda: (torch.manual_seed(seed), progs["dut"].call())[1]),
                       lambda t: f"{len(t.records)} operators recorded")
    checks = clock.step("second pass: replay each operator in float64 on its recorded inputs",
                        lambda: dv.local_check(trace, baseline=target.kind == "device"),
                        lambda cs: (f"{sum(c.replayed for c in cs)} replayed; first divergence: "
                                    f"{cs[-1].record.describe() if cs and not cs[-1].passed else 'none'}"))
    dg.checks["localisation"] = {"replayed": sum(c.replayed for c in checks), "recorded": len(trace.records),
                                 "first": checks[-1].to_dict() if checks and not checks[-1].passed else None}
    if checks and not checks[-1].passed:
        c = checks[-1]
        return "op", _op(c.record, c.reason), c.record
    path = dv.backward_slice(trace, bad_output) if trace.output_deps and bad_output < len(trace.output_deps) else []
    if target.kind in ("lowp", "device") and path:
        ref64 = dv.record(lambda: (torch.manual_seed(seed), progs["ref64"].call())[1])
        hit = dv.range_event(ref64, trace, path)
        if hit:
            dg.checks["localisation"]["range"] = {"op": hit[0].name, "reason": hit[1]}
            return "op", _op(hit[0], hit[1] + " in the float64 program"), hit[0]
    opaque = [r for r in path if r.kind in ("triton", "custom")]
    if opaque:
        ref_trace = dv.record(lambda: (torch.manual_seed(seed), progs["ref"].call())[1])
        r = opaque[0]
        aligned = dict((j, i) for i, j in dv.align(ref_trace, trace))
        note = "the first opaque kernel on the output's path (every replayable operator is right)"
        if r.children:
            note += "; it launches " + ", ".join(trace.records[c].name for c in r.children)
        if r.index in aligned:
            note += f"; aligned with the reference's {ref_trace.records[aligned[r.index]].name}"
        return "op", _op(r, note), r
    return "none", None, trace


def _narrowing(ref_trace, dut_trace, output: int):
    """The first operator on the output's path that produces a floating dtype less precise than any the
    reference computes in (a cast down, or a promotion the target skipped), or any float at all where the
    reference computes in integers."""
    ref_floats = {o.dtype for r in ref_trace.records for o in r.outputs if o.is_floating_point()}
    ref_floats |= {o.dtype for o in ref_trace.outputs if o.is_floating_point()}
    if output >= len(dut_trace.output_deps):
        return None
    if not ref_floats:  # the reference is exact integer arithmetic: any float on the path is the departure
        for r in dv.backward_slice(dut_trace, output):
            f = next((o for o in r.outputs if o.is_floating_point()), None)
            if f is not None:
                return r, dtype_name(f.dtype), "integer"
        return None
    floor = max(ref_floats, key=lambda d: torch.finfo(d).eps)  # the least precise dtype the reference uses
    for r in dv.backward_slice(dut_trace, output):
        for o in r.outputs:
            if o.is_floating_point() and torch.finfo(o.dtype).eps > torch.finfo(floor).eps:
                return r, dtype_name(o.dtype), dtype_name(floor)
    return None


def _layer_bisect(case, progs, seed: int, dg: Diagnosis) -> dict | None:
    """torch.compile: which layer first diverges (Dynamo alone, + AOTAutograd, + Inductor)."""
    ref64 = ck.execute(progs["ref64"], seed=seed)
    ref = ck.execute(progs["ref"], seed=seed)
    for backend in ("eager", "aot_eager", "inductor"):
        torch._dynamo.reset()
        run = ck.execute(Program("dut", torch.compile(case.fn, backend=backend), progs["dut"].args,
                                 progs["dut"].kwargs, "cpu", traceable=False), seed=seed)
        if not run.ok:
            return {"layer": backend, "detail": run.error}
        prec = ck.precision(run, ref64, ref, lowp=False)
        if any(not p["passed"] for p in prec):
            dg.evidence.append(f"torch.compile(backend={backend!r}) is the first layer whose output diverges")
            return {"layer": backend, "detail": "values leave the tolerance"}
        dg.evidence.append(f"torch.compile(backend={backend!r}) agrees with eager")
    return None


def diagnose(case, target: Target, *, seed: int = 0, runs: int = 3) -> Diagnosis:
    t_start = time.perf_counter()
    dg = Diagnosis(case.name, target.label, seed)
    dg.checks["documented"] = dict(case.documented)
    clock = _Clock(dg)
    args, kwargs = case.build_inputs(seed)
    progs = programs(case, target, args, kwargs)
    lowp = target.dtype if target.kind == "lowp" else None

    ref64 = clock.step("reference in float64 on the CPU", lambda: ck.execute(progs["ref64"], seed=seed),
                       lambda r: "ok" if r.ok else r.error)
    ref = ref64 if lowp else clock.step("reference on the CPU at the case's dtypes",
                                        lambda: ck.execute(progs["ref"], seed=seed),
                                        lambda r: "ok" if r.ok else r.error)
    if not ref.ok:
        from opforge.errors import InputError

        raise InputError(f"{case.path}::{case.fn_name}", f"fails on the CPU reference: {ref.error}")
    if not ref64.ok:  # float64 is not meaningful for this program: the CPU at its own dtype is the truth
        dg.evidence.append(f"the float64 reference fails ({ref64.error}); the CPU at the case's dtype is used")
        ref64 = ref
    dut = clock.step(f"target {target.label}: first run", lambda: ck.execute(progs["dut"], seed=seed),
                     lambda r: "ok" if r.ok else r.error)

    # R1: a crash on the target
    if not dut.ok:
        dg.traceback = dut.tb
        dg.checks["functional"] = {"passed": False, "error": dut.error}
        rec = dut.trace.failed_op
        if rec is None and isinstance(dut.trace.error, AssertionError) and progs["dut"].traceable:
            # a test's own check failed: if an operator is wrong on its inputs, that is the finding
            kind, op, culprit = _localise_numeric(dg, target, progs, seed, 0, clock)
            if kind == "op":
                return _done(dg, t_start, "R3", f"the case's assertion fails on {target.label} ({dut.error}); "
                                                f"localised to {op['name']}"
                             + (f" at {culprit.site}" if getattr(culprit, "site", None) else ""), op, culprit)
        op = _op(rec, f"raised {dut.error}") if rec else None
        where = f" in {rec.name} at {rec.site}" if rec and rec.site else ""
        return _done(dg, t_start, "R1", f"the call fails on {target.label}{where}: {dut.error}", op, rec)

    # R2: structure, shape, dtype
    probs = ck.functional(dut, ref, lowp)
    dg.checks["functional"] = {"passed": not probs, "problems": probs}
    if probs:
        p = probs[0]
        op, rec = None, None
        if p["what"] == "dtype":
            from opforge.verify.tolerance import parse_dtype

            rec = dv.promotion_point(dut.trace, p["output"], parse_dtype(p["expected"]))
            if rec:
                op = _op(rec, f"turns {p['expected']} into "
                              f"{', '.join(sorted({str(o.dtype).replace('torch.', '') for o in rec.outputs}))}")
        elif p["what"] == "shape":
            pair = dv.first_aligned_mismatch(ref.trace, dut.trace, "shape")
            if pair:
                rec = pair[1]
                op = _op(rec, f"output shape {[list(o.shape) for o in rec.outputs]} where the reference's "
                              f"{pair[0].name} gives {[list(o.shape) for o in pair[0].outputs]}")
        where = f" at {op['name']} ({rec.site})" if op and rec and rec.site else ""
        dg.evidence += [q["detail"] for q in probs]
        return _done(dg, t_start, "R2", f"{p['what']} differs: {p['detail']}{where}", op, rec)

    # precision
    prec = ck.precision(dut, ref64, None if lowp or ref is ref64 else ref, lowp=lowp is not None)
    dg.checks["precision"] = {"passed": all(p["passed"] for p in prec), "outputs": prec}
    bad = next((p for p in prec if not p["passed"]), None)

    # determinism
    same, k = clock.step(f"target {target.label}: {runs - 1} more runs, compared bit for bit",
                         lambda: ck.repeat(progs["dut"], dut, runs, seed=seed, reseed=False),
                         lambda r: "identical" if r[0] else f"run {r[1] + 1} differs")
    det = {"passed": same, "runs": runs}
    if not same:
        ref_same, _ = clock.step("CPU reference repeated", lambda: ck.repeat(progs["ref"], ref, runs, seed=seed,
                                                                               reseed=False),
                                 lambda r: "identical" if r[0] else "differs too")
        det["reference_repeatable"] = ref_same
        det["repeatable_with_seed"] = clock.step(
            f"target {target.label}: repeated with the seed fixed before each run",
            lambda: ck.repeat(progs["dut"], ck.execute(progs["dut"], seed=seed), runs, seed=seed, reseed=True)[0],
            lambda r: "identical" if r else "differs")
    dg.checks["determinism"] = det

    # memory
    mem = {"reference_peak_bytes": ref.peak_bytes, "target_peak_bytes": dut.peak_bytes}
    if ref.peak_bytes is not None and dut.peak_bytes is not None:
        scale = 1.0
        if lowp is not None:
            scale = torch.finfo(lowp).bits / 64
        expected = ref.peak_bytes * scale
        mem["expected_peak_bytes"] = int(expected)
        mem["passed"] = dut.peak_bytes <= 2 * expected + MEMORY_SLACK
    dg.checks["memory"] = mem

    # R3: values
    if bad is not None:
        i = bad["output"]
        desc = (f"output {i}: {bad['new_nonfinite']} inf/NaN where float64 is finite" if bad["new_nonfinite"]
                else f"output {i}: {bad['mismatches']} of {bad['numel']} elements beyond tolerance "
                     f"(max abs error {bad['max_abs']:.3g}, atol {bad['atol']:.3g}, rtol {bad['rtol']:.3g})")
        dg.evidence.append(desc)
        tail = ck.tail_pattern(bad["numel"], bad.get("bad_span"), bad["mismatches"])
        if tail:
            dg.evidence.append(tail)
        if target.kind == "compile":
            layer = clock.step("second pass: compile layer by layer", lambda: _layer_bisect(case, progs, seed, dg),
                               lambda r: f"first diverging layer: {r['layer']}" if r else "none")
            if layer:
                op = {"name": f"torch.compile backend {layer['layer']}", "kind": "compiler", "index": None,
                      "reason": layer["detail"], "site": None, "stack": []}
                ex_rule = "R3" if layer["layer"] == "inductor" else "R5"
                return _done(dg, t_start, ex_rule, f"{desc}; the {layer['layer']} layer of torch.compile diverges",
                             op)
        kind, op, rec = _localise_numeric(dg, target, progs, seed, i, clock)
        if kind == "op":
            return _done(dg, t_start, "R3", f"{desc}; localised to {op['name']}"
                         + (f" at {rec.site}" if getattr(rec, "site", None) else ""), op, rec)
        narrow = _narrowing(ref.trace, rec, i) if lowp is None and rec is not None else None
        if narrow is not None:
            r, dt, floor = narrow
            return _done(dg, t_start, "R2", f"{desc}; every operator is right on its inputs, but {r.name} at "
                         f"{r.site} computes in {dt} where the reference never goes below {floor}",
                         _op(r, f"computes in {dt} (the reference computes in {floor}"
                                + (")" if floor == "integer" else " or wider)")), r)
        if target.kind == "custom":
            op = _function_op(target.impl, target.impl_name, "every ATen operator inside is right on its inputs: "
                                                             "the defect is in how the function composes them")
            return _done(dg, t_start, "R3", f"{desc}; localised to the custom function {target.impl_name}", op)
        if lowp is not None and not bad["new_nonfinite"]:
            dg.evidence.append("every operator is within its dtype's tolerance on its own inputs")
            return _done(dg, t_start, "R7", f"{desc}: rounding in {str(lowp).replace('torch.', '')} accumulated "
                                            "across the program, no operator beyond its tolerance")
        return _done(dg, t_start, "R5", f"{desc}; no single operator diverges on its own inputs")

    # R4: determinism
    if not same:
        a = clock.step("second pass: record runs of the target until two differ",
                       lambda: _two_differing_runs(progs["dut"], seed),
                       lambda r: f"{len(r[0].records)} and {len(r[1].records)} operators")
        hit = dv.run_to_run(*a)
        dg.checks["determinism"]["localisation"] = hit.to_dict() if hit else None
        seeded = det["repeatable_with_seed"]
        if seeded and ((hit and hit.record.random) or (not hit and not det["reference_repeatable"])):
            src = f" drawn by {hit.record.name} at {hit.record.site}" if hit else ""
            dg.evidence.append(f"the differences start at random numbers{src}; with the seed fixed before each "
                               "run the target repeats bit for bit")
            return _done(dg, t_start, "R7", "the program's own randomness, repeatable under a fixed seed")
        if hit:
            how = ("its output changes between runs with the same inputs" if hit.inputs == "same" else
                   "its output changes between runs with the same input values in another order: an "
                   "order-dependent accumulation" if hit.inputs == "permuted" else
                   "the first operator whose output changes between runs (its inputs differ too)")
            dg.evidence.append(f"{hit.record.name}: {how}; max difference {hit.max_abs:.3g}")
            return _done(dg, t_start, "R4", f"repeated runs differ; the first operator to change is {hit.record.name}"
                         + (f" at {hit.record.site}" if hit.record.site else ""), _op(hit.record, how), hit.record)
        if target.kind == "custom":
            return _done(dg, t_start, "R4", f"repeated runs differ inside {target.impl_name}",
                         _function_op(target.impl, target.impl_name, "no recorded operator changes between runs"))
        return _done(dg, t_start, "R4", "repeated runs differ; no recorded operator changes between runs")

    # R6: memory
    if mem.get("passed") is False:
        return _done(dg, t_start, "R6", f"peak memory {dut.peak_bytes} bytes against an expected "
                                        f"{mem['expected_peak_bytes']}")
    return _done(dg, t_start, "R8", "consistent with the CPU reference")


def _two_differing_runs(prog, seed: int, attempts: int = 10) -> tuple:
    """A non-deterministic result can repeat by chance: record until a run differs from the first."""
    first = dv.record(lambda: (torch.manual_seed(seed), prog.call())[1])
    other = first
    for _ in range(attempts):
        other = dv.record(prog.call)
        if len(other.outputs) != len(first.outputs) or not all(
                dv.bits_equal(x, y) for x, y in zip(first.outputs, other.outputs)):
            break
    return first, other


def _done(dg: Diagnosis, t_start: float, rule: str, conclusion: str, op=None, rec=None) -> Diagnosis:
    _set(dg, rule, conclusion, op, rec)
    dg.seconds = time.perf_counter() - t_start
    return dg
