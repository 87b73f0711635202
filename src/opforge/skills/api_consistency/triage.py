"""Triage: the rules that pick one of three classes, and the second pass that localises a defect.

Class 1: consistent, or a documented, expected difference. Class 2: a framework or adaptation problem found
in the first pass (a crash, dtype promotion, shape handling, composition, memory). Class 3: an operator's
numerical or determinism defect, localised to the operator and its call site in a second pass. (The field is
named `exit` in result.json; the process's exit code is another number, see command.py.)
Rules are checked in the order written; the first that fires decides.
"""

from __future__ import annotations

import inspect
import re
import time
from dataclasses import dataclass, field

import torch

from opforge.i18n import N_, Msg
from opforge.skills.api_consistency import checks as ck
from opforge.skills.api_consistency.targets import Program, Target, programs
from opforge.verify import divergence as dv
from opforge.verify.tolerance import dtype_name

RULES = [
    ("R1", 2, "crash", N_("The call fails on the target but runs on the CPU: a framework or adaptation problem "
                          "(missing kernel or dtype support, wrong fallback, wrapper logic). The operator in flight "
                          "and its call site are named, with the traceback.")),
    ("R2", 2, "functional", N_("An output differs from the reference in structure, shape or dtype: dtype promotion "
                               "or shape handling. Localised to the first operator on the output's path that turns "
                               "the expected dtype into another (or the first aligned operator whose shape differs).")),
    ("R3", 3, "precision", N_("inf/NaN appear where the float64 reference is finite, or values leave the program "
                              "tolerance, and one operator replayed in float64 on its own recorded inputs diverges "
                              "beyond its dtype's tolerance (else: the first operator on the output's path that "
                              "overflows or flushes to zero where the float64 program does not; an opaque kernel on "
                              "the path; the custom function itself when all its operators are right): that "
                              "operator's numerical defect.")),
    ("R4", 3, "determinism", N_("Repeated runs on the target differ bit for bit while the CPU reference does not: a "
                                "determinism defect, localised to the first operator whose output values change with "
                                "the same inputs (or the same inputs in another order).")),
    ("R5", 2, "precision", N_("Values leave the tolerance though every operator is right on its own inputs: the "
                              "program is composed differently on the target (decomposition, fallback, wrapper).")),
    ("R6", 2, "memory", N_("Peak memory on the target is above twice the reference's (scaled by element size) "
                           "plus 16 MiB: an extra copy or a fallback.")),
    ("R7", 1, "expected", N_("An expected difference: a check the case documents (DOCUMENTED), randomness the "
                             "program owns (the CPU varies too and a fixed seed makes both repeatable), or precision "
                             "lost to rounding in low precision while every operator is within its tolerance.")),
    ("R8", 1, "none", N_("Consistent: outputs match in structure, shape and dtype, values within tolerance of the "
                         "float64 reference, repeated runs identical, memory as expected.")),
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
                "rules": [{"id": r, "exit": e, "text": t, "fired": r == self.rule} for r, e, _check, t in RULES]}


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


def _site(site) -> Msg | str:
    """A call site as `str(site)` says it ("file:line in function: code"), in the reader's language."""
    if not site:
        return ""
    text = Msg(N_("{file}:{line} in {function}: {code}"), file=site.file, line=site.line, function=site.function,
               code=site.code)
    return text if text == str(site) else str(site)


def _describe(rec: dv.OpRecord) -> Msg | str:
    """`rec.describe()` in the reader's language: "#index name at site"."""
    if not rec.site:
        return rec.describe()
    text = Msg(N_("#{index} {name} at {site}"), index=rec.index, name=rec.name, site=_site(rec.site))
    return text if text == rec.describe() else rec.describe()


# The reasons opforge.verify.divergence gives, so that a report can show them in the reader's language.
_REASONS = [(re.compile(pattern), template) for pattern, template in [
    (r"(?P<kind>\S+) operator: no float64 replay", N_("{kind} operator: no float64 replay")),
    (r"values not kept \(recording budget\)", N_("values not kept (recording budget)")),
    (r"uninitialised or random output", N_("uninitialised or random output")),
    (r"a view of its input: exact by construction", N_("a view of its input: exact by construction")),
    (r"not replayable", N_("not replayable")),
    (r"no tensor output", N_("no tensor output")),
    (r"float64 replay failed: (?P<error>.+)", N_("float64 replay failed: {error}")),
    (r"(?P<n>\d+) outputs, the replay gives (?P<ref>\d+)", N_("{n} outputs, the replay gives {ref}")),
    (r"output (?P<i>\d+): shape (?P<shape>.+), replay (?P<ref>.+)", N_("output {i}: shape {shape}, replay {ref}")),
    (r"output (?P<i>\d+): (?P<bad>\d+) of (?P<numel>\d+) values differ exactly",
     N_("output {i}: {bad} of {numel} values differ exactly")),
    (r"output (?P<i>\d+): (?P<n>\d+) inf/NaN where the float64 replay is finite \(e\.g\. flat index (?P<index>\d+): "
     r"(?P<value>\S+) vs (?P<ref>\S+)\)",
     N_("output {i}: {n} inf/NaN where the float64 replay is finite (e.g. flat index {index}: {value} vs {ref})")),
    (r"output (?P<i>\d+): (?P<bad>\d+) of (?P<numel>\d+) elements beyond tolerance \(max abs error (?P<max_abs>\S+)\)",
     N_("output {i}: {bad} of {numel} elements beyond tolerance (max abs error {max_abs})")),
    (r"(?P<n>\d+) element\(s\) overflow to (?P<value>\S+) where the reference holds (?P<ref>\S+)",
     N_("{n} element(s) overflow to {value} where the reference holds {ref}")),
    (r"(?P<n>\d+) element\(s\) underflow to 0 where the reference holds (?P<ref>\S+) \(below the smallest normal "
     r"(?P<tiny>\S+)\)", N_("{n} element(s) underflow to 0 where the reference holds {ref} (below the smallest normal "
                            "{tiny})")),
]]


def _reason(text: str) -> Msg | str:
    """A reason from the divergence checker, unchanged in English, translatable where its wording is known."""
    for pattern, template in _REASONS:
        m = pattern.fullmatch(text)
        if m:
            msg = Msg(template, **m.groupdict())
            if msg == text:
                return msg
    return text


_WHAT = {"structure": N_("structure"), "shape": N_("shape"), "dtype": N_("dtype"), "value": N_("value")}


def _set(dg: Diagnosis, rule: str, conclusion: str, op: dict | None = None, culprit=None) -> Diagnosis:
    rid, ex, check, _text = next(r for r in RULES if r[0] == rule)
    documented = dg.checks.get("documented", {})
    doc_key = {"crash": "functional"}.get(check, check)
    if ex != 1 and doc_key in documented:
        dg.evidence.append(Msg(N_("rule {rule} would fire ({conclusion}) but the case documents {check}: {text}"),
                               rule=rule, conclusion=conclusion, check=doc_key, text=documented[doc_key]))
        rid, ex, check = "R7", 1, "expected"
        conclusion = Msg(N_("documented difference in {check}: {text}"), check=doc_key, text=documented[doc_key])
    dg.rule, dg.exit, dg.check, dg.conclusion, dg.operator, dg.culprit = rid, ex, check, conclusion, op, culprit
    return dg


def _localise_numeric(dg, target: Target, progs, seed: int, bad_output: int, clock: _Clock):
    """Second pass for a value/inf difference: replay every operator of the target's run in float64."""
    trace = clock.step(Msg(N_("second pass: record the target's run with every operator's values")),
                       lambda: dv.record(lambda: (torch.manual_seed(seed), progs["dut"].call())[1]),
                       lambda t: Msg(N_("{n} operators recorded"), n=len(t.records)))
    checks = clock.step(Msg(N_("second pass: replay each operator in float64 on its recorded inputs")),
                        lambda: dv.local_check(trace, baseline=target.kind == "device"),
                        lambda cs: Msg(N_("{n} replayed; first divergence: {first}"),
                                       n=sum(c.replayed for c in cs),
                                       first=_describe(cs[-1].record) if cs and not cs[-1].passed else Msg(N_("none"))))
    dg.checks["localisation"] = {"replayed": sum(c.replayed for c in checks), "recorded": len(trace.records),
                                 "first": checks[-1].to_dict() if checks and not checks[-1].passed else None}
    if checks and not checks[-1].passed:
        c = checks[-1]
        return "op", _op(c.record, _reason(c.reason)), c.record
    path = dv.backward_slice(trace, bad_output) if trace.output_deps and bad_output < len(trace.output_deps) else []
    if target.kind in ("lowp", "device") and path:
        ref64 = dv.record(lambda: (torch.manual_seed(seed), progs["ref64"].call())[1])
        hit = dv.range_event(ref64, trace, path)
        if hit:
            dg.checks["localisation"]["range"] = {"op": hit[0].name, "reason": hit[1]}
            return "op", _op(hit[0], Msg(N_("{reason} in the float64 program"), reason=_reason(hit[1]))), hit[0]
    opaque = [r for r in path if r.kind in ("triton", "custom")]
    if opaque:
        ref_trace = dv.record(lambda: (torch.manual_seed(seed), progs["ref"].call())[1])
        r = opaque[0]
        aligned = dict((j, i) for i, j in dv.align(ref_trace, trace))
        note = Msg(N_("the first opaque kernel on the output's path (every replayable operator is right)"))
        if r.children:
            note = Msg(N_("{note}; it launches {ops}"), note=note,
                       ops=", ".join(trace.records[c].name for c in r.children))
        if r.index in aligned:
            note = Msg(N_("{note}; aligned with the reference's {op}"), note=note,
                       op=ref_trace.records[aligned[r.index]].name)
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
            dg.evidence.append(Msg(N_("torch.compile(backend={backend}) is the first layer whose output diverges"),
                                   backend=repr(backend)))
            return {"layer": backend, "detail": Msg(N_("values leave the tolerance"))}
        dg.evidence.append(Msg(N_("torch.compile(backend={backend}) agrees with eager"), backend=repr(backend)))
    return None


def _ok(run) -> Msg | str:
    """A step's result: "ok", or the error it raised."""
    return Msg(N_("ok")) if run.ok else run.error


def diagnose(case, target: Target, *, seed: int = 0, runs: int = 3) -> Diagnosis:
    t_start = time.perf_counter()
    dg = Diagnosis(case.name, target.label, seed)
    dg.checks["documented"] = dict(case.documented)
    clock = _Clock(dg)
    args, kwargs = case.build_inputs(seed)
    progs = programs(case, target, args, kwargs)
    lowp = target.dtype if target.kind == "lowp" else None

    ref64 = clock.step(Msg(N_("reference in float64 on the CPU")), lambda: ck.execute(progs["ref64"], seed=seed),
                       _ok)
    ref = ref64 if lowp else clock.step(Msg(N_("reference on the CPU at the case's dtypes")),
                                        lambda: ck.execute(progs["ref"], seed=seed), _ok)
    if not ref.ok:
        from opforge.errors import InputError

        raise InputError(f"{case.path}::{case.fn_name}", f"fails on the CPU reference: {ref.error}")
    if not ref64.ok:  # float64 is not meaningful for this program: the CPU at its own dtype is the truth
        dg.evidence.append(Msg(N_("the float64 reference fails ({error}); the CPU at the case's dtype is used"),
                               error=ref64.error))
        ref64 = ref
    dut = clock.step(Msg(N_("target {target}: first run"), target=target.label),
                     lambda: ck.execute(progs["dut"], seed=seed), _ok)

    # R1: a crash on the target
    if not dut.ok:
        dg.traceback = dut.tb
        dg.checks["functional"] = {"passed": False, "error": dut.error}
        rec = dut.trace.failed_op
        if rec is None and isinstance(dut.trace.error, AssertionError) and progs["dut"].traceable:
            # a test's own check failed: if an operator is wrong on its inputs, that is the finding
            kind, op, culprit = _localise_numeric(dg, target, progs, seed, 0, clock)
            if kind == "op":
                if getattr(culprit, "site", None):
                    text = Msg(N_("the case's assertion fails on {target} ({error}); localised to {op} at {site}"),
                               target=target.label, error=dut.error, op=op["name"], site=_site(culprit.site))
                else:
                    text = Msg(N_("the case's assertion fails on {target} ({error}); localised to {op}"),
                               target=target.label, error=dut.error, op=op["name"])
                return _done(dg, t_start, "R3", text, op, culprit)
        op = _op(rec, Msg(N_("raised {error}"), error=dut.error)) if rec else None
        if rec and rec.site:
            text = Msg(N_("the call fails on {target} in {op} at {site}: {error}"), target=target.label, op=rec.name,
                       site=_site(rec.site), error=dut.error)
        else:
            text = Msg(N_("the call fails on {target}: {error}"), target=target.label, error=dut.error)
        return _done(dg, t_start, "R1", text, op, rec)

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
                op = _op(rec, Msg(N_("turns {expected} into {dtypes}"), expected=p["expected"],
                                  dtypes=", ".join(sorted({str(o.dtype).replace("torch.", "") for o in rec.outputs}))))
        elif p["what"] == "shape":
            pair = dv.first_aligned_mismatch(ref.trace, dut.trace, "shape")
            if pair:
                rec = pair[1]
                op = _op(rec, Msg(N_("output shape {shape} where the reference's {op} gives {ref}"),
                                  shape=[list(o.shape) for o in rec.outputs], op=pair[0].name,
                                  ref=[list(o.shape) for o in pair[0].outputs]))
        dg.evidence += [q["detail"] for q in probs]
        what = Msg(_WHAT[p["what"]]) if p["what"] in _WHAT else p["what"]
        if op and rec and rec.site:
            text = Msg(N_("{what} differs: {detail} at {op} ({site})"), what=what, detail=p["detail"], op=op["name"],
                       site=_site(rec.site))
        else:
            text = Msg(N_("{what} differs: {detail}"), what=what, detail=p["detail"])
        return _done(dg, t_start, "R2", text, op, rec)

    # precision
    prec = ck.precision(dut, ref64, None if lowp or ref is ref64 else ref, lowp=lowp is not None)
    dg.checks["precision"] = {"passed": all(p["passed"] for p in prec), "outputs": prec}
    bad = next((p for p in prec if not p["passed"]), None)

    # determinism
    same, k = clock.step(Msg(N_("target {target}: {n} more runs, compared bit for bit"), target=target.label,
                             n=runs - 1),
                         lambda: ck.repeat(progs["dut"], dut, runs, seed=seed, reseed=False),
                         lambda r: Msg(N_("identical")) if r[0] else Msg(N_("run {k} differs"), k=r[1] + 1))
    det = {"passed": same, "runs": runs}
    if not same:
        ref_same, _k = clock.step(Msg(N_("CPU reference repeated")),
                                  lambda: ck.repeat(progs["ref"], ref, runs, seed=seed, reseed=False),
                                  lambda r: Msg(N_("identical")) if r[0] else Msg(N_("differs too")))
        det["reference_repeatable"] = ref_same
        det["repeatable_with_seed"] = clock.step(
            Msg(N_("target {target}: repeated with the seed fixed before each run"), target=target.label),
            lambda: ck.repeat(progs["dut"], ck.execute(progs["dut"], seed=seed), runs, seed=seed, reseed=True)[0],
            lambda r: Msg(N_("identical")) if r else Msg(N_("differs")))
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
        desc = (Msg(N_("output {i}: {n} inf/NaN where float64 is finite"), i=i, n=bad["new_nonfinite"])
                if bad["new_nonfinite"] else
                Msg(N_("output {i}: {bad} of {numel} elements beyond tolerance (max abs error {max_abs:.3g}, "
                       "atol {atol:.3g}, rtol {rtol:.3g})"), i=i, bad=bad["mismatches"], numel=bad["numel"],
                    max_abs=bad["max_abs"], atol=bad["atol"], rtol=bad["rtol"]))
        dg.evidence.append(desc)
        tail = ck.tail_pattern(bad["numel"], bad.get("bad_span"), bad["mismatches"])
        if tail:
            dg.evidence.append(tail)
        if target.kind == "compile":
            layer = clock.step(Msg(N_("second pass: compile layer by layer")),
                               lambda: _layer_bisect(case, progs, seed, dg),
                               lambda r: Msg(N_("first diverging layer: {layer}"), layer=r["layer"]) if r
                               else Msg(N_("none")))
            if layer:
                op = {"name": f"torch.compile backend {layer['layer']}", "kind": "compiler", "index": None,
                      "reason": layer["detail"], "site": None, "stack": []}
                ex_rule = "R3" if layer["layer"] == "inductor" else "R5"
                return _done(dg, t_start, ex_rule, Msg(N_("{desc}; the {layer} layer of torch.compile diverges"),
                                                       desc=desc, layer=layer["layer"]), op)
        kind, op, rec = _localise_numeric(dg, target, progs, seed, i, clock)
        if kind == "op":
            if getattr(rec, "site", None):
                text = Msg(N_("{desc}; localised to {op} at {site}"), desc=desc, op=op["name"], site=_site(rec.site))
            else:
                text = Msg(N_("{desc}; localised to {op}"), desc=desc, op=op["name"])
            return _done(dg, t_start, "R3", text, op, rec)
        narrow = _narrowing(ref.trace, rec, i) if lowp is None and rec is not None else None
        if narrow is not None:
            r, dt, floor = narrow
            text = Msg(N_("{desc}; every operator is right on its inputs, but {op} at {site} computes in {dtype} "
                          "where the reference never goes below {floor}"), desc=desc, op=r.name, site=_site(r.site),
                       dtype=dt, floor=floor)
            why = (Msg(N_("computes in {dtype} (the reference computes in {floor})"), dtype=dt, floor=floor)
                   if floor == "integer" else
                   Msg(N_("computes in {dtype} (the reference computes in {floor} or wider)"), dtype=dt, floor=floor))
            return _done(dg, t_start, "R2", text, _op(r, why), r)
        if target.kind == "custom":
            op = _function_op(target.impl, target.impl_name,
                              Msg(N_("every ATen operator inside is right on its inputs: the defect is in how the "
                                     "function composes them")))
            return _done(dg, t_start, "R3", Msg(N_("{desc}; localised to the custom function {function}"), desc=desc,
                                                function=target.impl_name), op)
        if lowp is not None and not bad["new_nonfinite"]:
            dg.evidence.append(Msg(N_("every operator is within its dtype's tolerance on its own inputs")))
            return _done(dg, t_start, "R7", Msg(N_("{desc}: rounding in {dtype} accumulated across the program, no "
                                                   "operator beyond its tolerance"), desc=desc,
                                                dtype=str(lowp).replace("torch.", "")))
        return _done(dg, t_start, "R5", Msg(N_("{desc}; no single operator diverges on its own inputs"), desc=desc))

    # R4: determinism
    if not same:
        a = clock.step(Msg(N_("second pass: record runs of the target until two differ")),
                       lambda: _two_differing_runs(progs["dut"], seed),
                       lambda r: Msg(N_("{first} and {second} operators"), first=len(r[0].records),
                                     second=len(r[1].records)))
        hit = dv.run_to_run(*a)
        dg.checks["determinism"]["localisation"] = hit.to_dict() if hit else None
        seeded = det["repeatable_with_seed"]
        if seeded and ((hit and hit.record.random) or (not hit and not det["reference_repeatable"])):
            if hit:
                dg.evidence.append(Msg(N_("the differences start at random numbers drawn by {op} at {site}; with the "
                                          "seed fixed before each run the target repeats bit for bit"),
                                       op=hit.record.name, site=_site(hit.record.site) or str(hit.record.site)))
            else:
                dg.evidence.append(Msg(N_("the differences start at random numbers; with the seed fixed before each "
                                          "run the target repeats bit for bit")))
            return _done(dg, t_start, "R7", Msg(N_("the program's own randomness, repeatable under a fixed seed")))
        if hit:
            how = (Msg(N_("its output changes between runs with the same inputs")) if hit.inputs == "same" else
                   Msg(N_("its output changes between runs with the same input values in another order: an "
                          "order-dependent accumulation")) if hit.inputs == "permuted" else
                   Msg(N_("the first operator whose output changes between runs (its inputs differ too)")))
            dg.evidence.append(Msg(N_("{op}: {how}; max difference {max_abs:.3g}"), op=hit.record.name, how=how,
                                   max_abs=hit.max_abs))
            if hit.record.site:
                text = Msg(N_("repeated runs differ; the first operator to change is {op} at {site}"),
                           op=hit.record.name, site=_site(hit.record.site))
            else:
                text = Msg(N_("repeated runs differ; the first operator to change is {op}"), op=hit.record.name)
            return _done(dg, t_start, "R4", text, _op(hit.record, how), hit.record)
        if target.kind == "custom":
            return _done(dg, t_start, "R4",
                         Msg(N_("repeated runs differ inside {function}"), function=target.impl_name),
                         _function_op(target.impl, target.impl_name,
                                      Msg(N_("no recorded operator changes between runs"))))
        return _done(dg, t_start, "R4", Msg(N_("repeated runs differ; no recorded operator changes between runs")))

    # R6: memory
    if mem.get("passed") is False:
        return _done(dg, t_start, "R6", Msg(N_("peak memory {peak} bytes against an expected {expected}"),
                                            peak=dut.peak_bytes, expected=mem["expected_peak_bytes"]))
    return _done(dg, t_start, "R8", Msg(N_("consistent with the CPU reference")))


def _two_differing_runs(prog, seed: int, attempts: int = 10) -> tuple:
    """A non-deterministic result can repeat by chance: record until a run differs from the first."""
    first = dv.record(lambda: (torch.manual_seed(seed), prog.call())[1])
    other = first
    for _attempt in range(attempts):
        other = dv.record(prog.call)
        if len(other.outputs) != len(first.outputs) or not all(
                dv.bits_equal(x, y) for x, y in zip(first.outputs, other.outputs)):
            break
    return first, other


def _done(dg: Diagnosis, t_start: float, rule: str, conclusion: str, op=None, rec=None) -> Diagnosis:
    _set(dg, rule, conclusion, op, rec)
    dg.seconds = time.perf_counter() - t_start
    return dg
