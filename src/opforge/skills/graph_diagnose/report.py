"""What `graph diagnose` writes: result.json, analysis.md, a standalone repro.py, and each step's log under
steps/ (all written atomically)."""

from __future__ import annotations

import io
from pathlib import Path

from opforge.i18n import N_, _, shown
from opforge.workspace.atomic import write_bytes_atomic, write_json_atomic, write_text_atomic

# the conclusion in words: English in repro.py, the chosen language in analysis.md and the summary line
WORDS = {"clean": N_("runs clean"), "user_code": N_("a user code problem"), "framework_bug": N_("a framework bug"),
         "operator": N_("an operator problem"), "runtime": N_("a runtime problem"),
         "environment": N_("an environment problem")}
# the conclusion's sentence: (a finding, located)
CONCLUSION = {
    (False, None): N_("**Conclusion: {words}**."),
    (False, True): N_("**Conclusion: {words}**, located."),
    (False, False): N_("**Conclusion: {words}**, not located."),
    (True, None): N_("**Conclusion: {words}** (`{conclusion}`), layer `{layer}`."),
    (True, True): N_("**Conclusion: {words}** (`{conclusion}`), layer `{layer}`, located."),
    (True, False): N_("**Conclusion: {words}** (`{conclusion}`), layer `{layer}`, not located."),
}
EVIDENCE = (("operator", N_("operator: `{value}`")), ("setting", N_("setting: `{value}`")),
            ("module", N_("module: `{value}`")), ("guard", N_("the guard that fails: `{value}`")))
# the summary line of a finding: (at a user line, naming an operator, at a step)
FINDING = {
    (False, False, False): N_("{name}: {words} in {layer}"),
    (True, False, False): N_("{name}: {words} in {layer} at {where}"),
    (False, True, False): N_("{name}: {words} in {layer}, operator {operator}"),
    (True, True, False): N_("{name}: {words} in {layer} at {where}, operator {operator}"),
    (False, False, True): N_("{name}: {words} in {layer} (step {step})"),
    (True, False, True): N_("{name}: {words} in {layer} at {where} (step {step})"),
    (False, True, True): N_("{name}: {words} in {layer}, operator {operator} (step {step})"),
    (True, True, True): N_("{name}: {words} in {layer} at {where}, operator {operator} (step {step})"),
}

REPRO_HEADER = '''"""Reproduces what `opforge graph diagnose` found: {conclusion} at step {step}.
Run it as the original was run: python repro.py {args}
"""
import os

os.environ.setdefault("TORCH_LOGS", "graph_breaks,recompiles")  # read when torch is imported
import torch  # noqa: E402

{swap}
# ---- the original script, {script} ----
'''
SWAP_BACKEND = '''_compile = torch.compile


def _with_backend(model=None, **kwargs):  # every torch.compile of the script below runs with this backend
    kwargs["backend"] = {backend!r}
    kwargs.pop("mode", None)
    kwargs.pop("options", None)
    return _compile(model, **kwargs) if model is not None else _compile(**kwargs)


torch.compile = _with_backend
'''


def write_result(out: Path, result: dict) -> None:
    steps = out / "steps"
    if result["steps"]:
        steps.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(result["steps"], 1):
        write_text_atomic(steps / f"{i:02d}_{s['step']}.log", s["log"])
    slim = {**result, "steps": [{k: v for k, v in s.items() if k != "log"} | {"log": f"steps/{i:02d}_{s['step']}.log"}
                                for i, s in enumerate(result["steps"], 1)]}
    write_json_atomic(out / "result.json", slim)
    write_text_atomic(out / "analysis.md", analysis_md(slim))
    if result["conclusion"] != "clean" and result.get("script"):
        write_text_atomic(out / "repro.py", repro_py(result))


def repro_py(result: dict) -> str:
    script = Path(result["script"])
    step = result["failing_step"]
    swap = {"as-is": "", "no-compile": "torch.compiler.set_stance('force_eager')\n"}.get(step) \
        if step in ("as-is", "no-compile") else SWAP_BACKEND.format(backend=step)
    header = REPRO_HEADER.format(conclusion=WORDS[result["conclusion"]], step=step, args=" ".join(result["args"]),
                                 swap=swap, script=script.name)
    return header + script.read_text()


def analysis_md(result: dict) -> str:
    c = result["conclusion"]
    title = _("graph diagnose: {script}").format(script=Path(result["script"]).name) if result.get("script") else \
        _("graph logs: {source}").format(source=Path(result["source"]).name)
    head = _(CONCLUSION[(c != "clean", result.get("located"))]).format(words=_(WORDS[c]), conclusion=c,
                                                                       layer=result["layer"])
    lines = [f"# {title}", "", head, ""]
    if c != "clean":
        ev = result["evidence"]
        lines += ["## " + _("Evidence"), ""]
        if ev.get("exception"):
            at = _("at step `{step}`: `{type}`") if ev.get("step") else _("first error: `{type}`")
            lines += ["- " + at.format(step=ev.get("step"), type=ev["exception"]["type"]), "", "```",
                      ev["exception"]["message"], "```", ""]
        if ev.get("user_line"):
            u = ev["user_line"]
            where = f"{u['file']}:{u['line']}"
            lines.append("- " + (_("your code: `{where}`: `{code}`") if u.get("code") else _("your code: `{where}`"))
                         .format(where=where, code=u.get("code")))
        for key, label in EVIDENCE:
            if ev.get(key):
                lines.append("- " + _(label).format(value=ev[key]))
        for op, tests in (ev.get("opcheck") or {}).items():
            lines += ["- " + _("opcheck on `{operator}` (its first eager call's arguments):").format(operator=op)]
            lines += ["  - " + _("`{test}` fails: {why}").format(test=test, why=why) for test, why in tests.items()]
        if ev.get("bisect"):
            b = ev["bisect"]
            lines.append("- " + _("CompilerBisector: backend `{backend}`, subsystem `{subsystem}`, application "
                                  "{number}: {info}").format(backend=b["backend"], subsystem=b["subsystem"],
                                                             number=b["bisect_number"], info=b["debug_info"]))
        if ev.get("torch_npu_source"):
            t = ev["torch_npu_source"]
            lines.append("- " + _("raised in torch_npu at `{where}` (the learned profile)").format(
                where=f"{t['file']}:{t['line']}"))
        if ev.get("registered_at"):
            r = ev["registered_at"]
            said = _("registered outside torch at `{where}`: `{code}`") if r.get("code") else \
                _("registered outside torch at `{where}`")
            lines.append("- " + said.format(where=f"{r['file']}:{r['line']}", code=r.get("code")))
        if ev.get("framework_frame"):
            f = ev["framework_frame"]
            lines.append("- " + _("where it surfaced in torch: `{where}` ({function})").format(
                where=f"{f['file']}:{f['line']}", function=f["function"]))
        if result.get("rule"):
            lines.append("- " + _("signature: `{rule}`").format(rule=result["rule"]))
        lines.append("")
        gb = result.get("graph_break")
        if gb:
            lines += ["## " + _("Graph break {id}: {type}").format(id=gb["id"], type=gb["type"]), "",
                      gb["explanation"] or "", "",
                      *["- " + _("hint: {hint}").format(hint=h.strip()) for h in gb["hints"]], ""]
    lines += events_md(result.get("events") or {})
    lines += ["## " + _("Next action"), "", shown(result["next_action"]), ""]
    if result["steps"]:
        lines += ["## " + _("The ladder"), "", _("| step | status | seconds | error |"), "|---|---|---|---|"]
        for s in result["steps"]:
            err = s["exception"]["type"].rsplit(".", 1)[-1] if s.get("exception") else ""
            lines.append(f"| {s['step']} | {s['status']} | {s['seconds']:.1f} | {err} |")
        lines += ["", _("Each step ran the script in a child process; its output is in the step's log (`steps/`).")
                  + " " + (_("`repro.py` reruns the failing step on its own.") if c != "clean" else ""), ""]
    return "\n".join(lines)


def summary_line(result: dict) -> str:
    name = Path(result.get("script") or result["source"]).name
    if result["conclusion"] == "clean":
        if result["steps"]:
            return _("{name}: runs clean ({n} step)").format(name=name, n=len(result["steps"]))
        return _("{name}: runs clean").format(name=name)
    where = result["evidence"].get("user_line")
    operator = result["evidence"].get("operator")
    step = result.get("failing_step")
    return _(FINDING[(bool(where), bool(operator), bool(step))]).format(
        name=name, words=_(WORDS[result["conclusion"]]), layer=result["layer"], operator=operator, step=step,
        where=f"{Path(where['file']).name}:{where['line']}" if where else None)


def events_md(ev: dict, limit: int = 10) -> list[str]:
    """The log's graph breaks and recompiles, as lists (the first `limit` of each)."""
    lines = []
    if ev.get("graph_breaks"):
        lines += ["## " + _("Graph breaks ({n})").format(n=len(ev["graph_breaks"])), ""]
        lines += [f"- `{Path(b['file']).name}:{b['line']}` {b['reason']}" + (f" ({b['gb_id']})" if b["gb_id"] else "")
                  for b in ev["graph_breaks"][:limit]] + [""]
    if ev.get("recompiles") or ev.get("recompile_limits"):
        lines += ["## " + _("Recompiles ({n})").format(n=len(ev.get("recompiles", []))), ""]
        lines += ["- " + _("`{function}` ({where}), guard failed: `{guard}`").format(
            function=r["function"], where=f"{Path(r['file'] or '?').name}:{r['line']}", guard=r["guard"])
            for r in ev.get("recompiles", [])[:limit]]
        lines += ["- " + _("**{limit} ({value}) reached** by `{function}`: it runs eagerly from then on").format(
            limit=r["limit"], value=r["value"], function=r["function"])
            for r in ev.get("recompile_limits", [])] + [""]
    return lines


# summary.json's keys, and summary.xlsx's headers in the chosen language
SUMMARY_COLUMNS = [N_("script"), N_("conclusion"), N_("layer"), N_("located"), N_("rule"), N_("user line"),
                   N_("operator or setting"), N_("graph break"), N_("next action"), N_("seconds"), N_("analysis")]
FILLS = {"clean": "C6EFCE", "user_code": "FFEB9C", "framework_bug": "FFC7CE", "operator": "FFC7CE",
         "runtime": "FCE4D6", "environment": "DDEBF7"}


def summary_row(result: dict, folder: str) -> dict:
    ev = result.get("evidence") or {}
    where = ev.get("user_line")
    return {"script": Path(result["script"]).name, "conclusion": result["conclusion"], "layer": result["layer"],
            "located": result.get("located"), "rule": result.get("rule"),
            "user line": f"{Path(where['file']).name}:{where['line']}" if where else None,
            "operator or setting": ev.get("operator") or ev.get("setting") or ev.get("guard"),
            "graph break": (result.get("graph_break") or {}).get("id"), "next action": result["next_action"],
            "seconds": round(sum(s["seconds"] for s in result["steps"]), 1), "analysis": f"{folder}/analysis.md"}


def write_summary(out: Path, rows: list[dict]) -> None:
    """summary.xlsx (a row per script, its conclusion coloured, a link to its analysis) and summary.json."""
    from openpyxl import Workbook
    from openpyxl.styles import Font, PatternFill

    wb = Workbook()
    ws = wb.active
    ws.title = "scripts"
    ws.append([_(k) for k in SUMMARY_COLUMNS])
    for c in ws[1]:
        c.font = Font(bold=True)
    for r in rows:
        ws.append([shown(r.get(k)) for k in SUMMARY_COLUMNS])
        row = ws.max_row
        if r["conclusion"] in FILLS:
            ws.cell(row, 2).fill = PatternFill("solid", fgColor=FILLS[r["conclusion"]])
        if r.get("analysis"):
            cell = ws.cell(row, len(SUMMARY_COLUMNS))
            cell.hyperlink = r["analysis"]
            cell.font = Font(color="0563C1", underline="single")
    widths = {"script": 28, "rule": 22, "user line": 22, "operator or setting": 30, "next action": 90,
              "analysis": 36}
    for i, k in enumerate(SUMMARY_COLUMNS, 1):
        ws.column_dimensions[ws.cell(1, i).column_letter].width = widths.get(k, 14)
    ws.freeze_panes = "A2"
    buf = io.BytesIO()
    wb.save(buf)
    write_bytes_atomic(out / "summary.xlsx", buf.getvalue())
    write_json_atomic(out / "summary.json", rows)
