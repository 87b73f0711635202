"""Stage 5 when the kernel comes from a model (or from a host's developer): the same tests, the same precision
records and reports as the deterministic stage, run on the impl in a child process under a time limit.

The impl is checked before it runs with the stage 5 separation gates: the same rules, from the same definitions,
that the runner applies after the stage to every engine's impl, template kernels included. So an impl that
reaches for the golden, opforge's own checker or a process never runs at all, and one that passes from one
engine passes from any.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from opforge.bench.aot import default_arch
from opforge.i18n import language
from opforge.llm.sandbox import run_python
from opforge.orchestrator.gates import check_impl_compiles, run_gates
from opforge.skills.op_develop.stage import (
    compile_args,
    precision_report,
    render_precision,
    render_readme,
    render_tests,
)
from opforge.verify.cases import RECORD_ENV, read_records
from opforge.workspace import Workspace
from opforge.workspace.atomic import write_json_atomic, write_text_atomic

RECORDS = ".precision_records.jsonl"
IMPL_GATES = ("G5-IMPL-SEPARATE", "G5-IMPL-TRITON-ONLY", "G5-IMPL-IMPORTS")


@dataclass
class Verdict:
    passed: bool
    kind: str  # "gate" | "precision" | "tests" | "missing" | "ok"
    summary: str
    gates: list[dict] | None = None
    report: dict | None = None


def static_check(ws: Workspace, state) -> Verdict | None:
    """None when the impl may run; else why not (the gate that caught it named first)."""
    path = ws.path(ws.impl)
    if not path.exists():
        return Verdict(False, "missing", f"{ws.impl} was not written")
    gates = [g for g in run_gates(ws, 5, state) if g["id"] in IMPL_GATES]
    bad = [g for g in gates if not g["passed"]]
    if bad:
        return Verdict(False, "gate", "; ".join(f"gate {g['id']}: {g['message']}" for g in bad), gates=gates)
    return None


def write_tests(ws: Workspace) -> None:
    spec = json.loads(ws.path("spec.json").read_text())
    design = json.loads(ws.path("design.json").read_text())
    write_text_atomic(ws.path(ws.test), render_tests(ws, spec, design))
    write_text_atomic(ws.path("conftest.py"), 'collect_ignore = ["history_version", "request"]\n')


def _has_accelerator() -> bool:
    import torch

    npu = getattr(torch, "npu", None)
    return torch.cuda.is_available() or bool(npu is not None and npu.is_available())


def run_tests(ws: Workspace, timeout_s: float, *, level0_only: bool = False, drop_env: tuple[str, ...] = ()):
    """(pytest exit code, its last line, records, the first error lines) from a child process."""
    rec = ws.path(RECORDS)
    rec.unlink(missing_ok=True)
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--maxfail=3", "--no-header", "-o", "addopts=", ws.test]
    if level0_only:
        args += ["-k", "test_level0"]
    env = {RECORD_ENV: str(rec)}
    if not _has_accelerator():  # the harness, not the model, decides where kernels run
        env["TRITON_INTERPRET"] = "1"
    res = run_python(args, ws.root, timeout_s, env, drop_env)
    records = read_records(rec)
    rec.unlink(missing_ok=True)
    errors = [ln.strip() for ln in res.output.splitlines() if ln.startswith("E ")][:6]
    line = res.last_line if not res.timed_out else f"tests killed after {timeout_s:g} s"
    return (res.returncode if not res.timed_out else -9), line, records, errors


def failure_summary(report: dict, errors: list[str]) -> str:
    s = report["summary"]
    parts = [f"{s['failed']} of {s['total']} cases failed ({s['pytest']})"]
    for r in [r for r in report["cases"] if not r["passed"]][:3]:
        for o in [o for o in r["outputs"] if not o["passed"]][:2]:
            worst = [{k: w.get(k) for k in ("index", "actual", "expected") if k in w} for w in o.get("worst", [])[:2]]
            parts.append(f"{r['case']} {o['name']}: max_abs={o.get('max_abs')} mismatches={o.get('mismatches')} "
                         f"worst={worst}")
    if errors and (not report["cases"] or s["failed"] == 0):
        parts.append("errors: " + " | ".join(errors[:4]))
    return "; ".join(parts)[:1500]


def compile_check(ws: Workspace, state, timeout_s: float, drop_env: tuple[str, ...] = ()) -> str | None:
    """Every kernel of the impl compiled for the GPU target in a child process (compile.json, COMPILE.md); None,
    or what does not compile."""
    arch = default_arch()
    res = run_python(compile_args(ws, arch), ws.root, timeout_s, {"TRITON_INTERPRET": "0", "OPFORGE_LANG": language()},
                     drop_env)  # COMPILE.md in the run's language
    if res.timed_out:
        return f"compiling for {arch} took over {timeout_s:g} s"
    return res.last_line if res.returncode not in (0, 1) else check_impl_compiles(ws, state)


def verify(ws: Workspace, req, state, timeout_s: float, drop_env: tuple[str, ...] = ()) -> Verdict:
    """Static checks, then the stage 5 tests; writes PRECISION.md, precision.json and README.md as stage 5 does."""
    bad = static_check(ws, state)
    if bad:
        return bad
    trouble = compile_check(ws, state, timeout_s, drop_env)
    if trouble:  # the interpreter would accept what the GPU compiler refuses: said before any test runs
        return Verdict(False, "gate", f"G5-IMPL-COMPILES: {trouble}")
    rc, line, records, errors = run_tests(ws, timeout_s, drop_env=drop_env)
    report = precision_report(records, rc, line)
    spec = json.loads(ws.path("spec.json").read_text())
    write_json_atomic(ws.path("precision.json"), report)
    write_text_atomic(ws.path("PRECISION.md"), render_precision(req.name, report))
    write_text_atomic(ws.path("README.md"), render_readme(req, spec, report))
    if report["summary"]["all_passed"]:
        return Verdict(True, "ok", f"tests: {line}", report=report)
    kind = "precision" if records and any(not r["passed"] for r in records) else "tests"
    return Verdict(False, kind, failure_summary(report, errors), report=report)
