"""Stage 6, precision debug: runs only when stage 5's precision failed.

It localises each failing output: the worst elements with their inputs (from the case records), the ops
on that output's path in the traced graph, inexact ones first, and the fused step of the kernel that
diverges: the first failing case is replayed with the kernel's intermediates read in the interpreter and
compared, node by node, with the golden graph in float64 (verify/kernel_steps.py). The
deterministic engine has no second lowering to try, so a failure here ends the run as BLOCKED_ACCURACY;
an LLM engine would take the localisation as the summary of its next attempt.
"""

from __future__ import annotations

import json

from opforge.codegen.ops import OP_TABLE, op_name
from opforge.codegen.trace import trace_request
from opforge.i18n import _
from opforge.request import Request
from opforge.verify.kernel_steps import localise_in_subprocess
from opforge.workspace import StageOutcome, Workspace
from opforge.workspace.atomic import write_json_atomic, write_text_atomic


def _path_ops(gm, index: int) -> list[dict]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    results = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    seen, stack, ops = set(), [results[index]], []
    while stack:
        n = stack.pop()
        if n in seen or not hasattr(n, "op"):
            continue
        seen.add(n)
        if n.op == "call_function":
            rule = OP_TABLE.get(op_name(n.target))
            ops.append({"node": n.name, "op": op_name(n.target), "exact": bool(rule and rule.exact)})
        stack.extend(n.all_input_nodes)
    return sorted(ops, key=lambda o: o["exact"])


def render_localisation(report: dict) -> str:
    """PRECISION.md's stage 6 section from precision.json's "localisation", in the current language."""
    s, localisation = report["summary"], report.get("localisation") or {}
    md = "\n" + _("## Localisation (stage 6)") + "\n\n"
    for name, loc in localisation.items():
        suspects = ", ".join(f"`{o['node']}` ({o['op']})" for o in loc["ops_on_path"] if not o["exact"]) or _("none")
        md += _("- **{name}**: failing in {n}+ case(s); inexact ops on its path: {suspects}.").format(
            name=name, n=len(loc["cases"]), suspects=suspects) + "\n"
        first = (loc.get("fused_step") or {}).get("first")
        if first:
            md += "  " + _("- diverging fused step: `{node}` ({op}) in `{kernel}`, {source}; its inputs {inputs} agree "
                    "with float64, it is off by {rel_error:.3g} of its scale (case {case}).").format(
                node=first["node"], op=first["op"], kernel=first["kernel"],
                source=first.get("source") or _("source line not found"),
                inputs=", ".join(f"`{i}`" for i in first["inputs"]) or _("(loads)"),
                rel_error=first["rel_error"], case=loc["fused_step"]["case"]) + "\n"
        else:
            why = (loc.get("fused_step") or {}).get("error") or _("every step the kernel holds agrees with float64")
            md += "  " + _("- no single fused step diverges: {why}.").format(why=why) + "\n"
    if not localisation:
        md += _("- no output failed its comparison; the test run itself failed: `{pytest}`").format(
            pytest=s["pytest"]) + "\n"
        md += "".join(f"  - `{t}`\n" for t in s.get("failed_tests", []))
    return md


def run(ws: Workspace, req: Request, state) -> StageOutcome:
    report = json.loads(ws.path("precision.json").read_text())
    s = report["summary"]
    if s["all_passed"]:
        return StageOutcome("skipped", f"stage 5 precision passed at once: {s['passed']}/{s['total']} cases")
    traced = trace_request(req)
    names = traced.output_names + [f"grad_{g}" for g in traced.grad_inputs]
    failing: dict[str, list] = {}
    for r in report["cases"]:
        for o in r["outputs"]:
            if not o["passed"] and o["name"] in names:
                failing.setdefault(o["name"], []).append({"case": r["case"], "seed": r["seed"],
                                                          "worst": o.get("worst", [])[:3]})
    localisation = {}
    for name, cases in failing.items():
        idx = names.index(name)
        gm = traced.forward if idx < len(traced.output_names) else traced.joint
        # replay the first failing case and read the kernel's own intermediates against the float64 graph
        step = localise_in_subprocess(ws.root, cases[0]["case"], cases[0]["seed"], name)
        localisation[name] = {"cases": cases[:5], "ops_on_path": _path_ops(gm, idx), "fused_step": step}
    report["localisation"] = localisation
    write_json_atomic(ws.path("precision.json"), report)
    write_text_atomic(ws.path("PRECISION.md"), ws.path("PRECISION.md").read_text() + render_localisation(report))
    first = f"; first: {s['failed_tests'][0]}" if s.get("failed_tests") else ""
    return StageOutcome("failed", f"precision failed ({s['failed']} of {s['total']} cases; {s['pytest']}{first}); "
                                  "the deterministic engine has no other lowering to try",
                        artifacts=["PRECISION.md", "precision.json"], retryable=False)
