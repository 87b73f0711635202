"""What `graph diagnose` writes: result.json, analysis.md, a standalone repro.py, and each step's log under
steps/ (all written atomically)."""

from __future__ import annotations

import io
from pathlib import Path

from opforge.workspace.atomic import write_bytes_atomic, write_json_atomic, write_text_atomic

WORDS = {"clean": "runs clean", "user_code": "a user code problem", "framework_bug": "a framework bug",
         "operator": "an operator problem", "runtime": "a runtime problem", "environment": "an environment problem"}

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
    title = f"graph diagnose: {Path(result['script']).name}" if result.get("script") else \
        f"graph logs: {Path(result['source']).name}"
    lines = [f"# {title}", "",
             f"**Conclusion: {WORDS[c]}**" + (f" (`{c}`), layer `{result['layer']}`" if c != "clean" else "")
             + ("" if result.get("located") is None else f", {'located' if result['located'] else 'not located'}")
             + ".", ""]
    if c != "clean":
        ev = result["evidence"]
        lines += ["## Evidence", ""]
        if ev.get("exception"):
            at = f"at step `{ev['step']}`" if ev.get("step") else "first error"
            lines += [f"- {at}: `{ev['exception']['type']}`", "", "```", ev["exception"]["message"], "```", ""]
        if ev.get("user_line"):
            u = ev["user_line"]
            lines.append(f"- your code: `{u['file']}:{u['line']}`" + (f": `{u['code']}`" if u.get("code") else ""))
        for key, label in (("operator", "operator"), ("setting", "setting"), ("module", "module"),
                           ("guard", "the guard that fails")):
            if ev.get(key):
                lines.append(f"- {label}: `{ev[key]}`")
        for op, tests in (ev.get("opcheck") or {}).items():
            lines += [f"- opcheck on `{op}` (its first eager call's arguments):"]
            lines += [f"  - `{test}` fails: {why}" for test, why in tests.items()]
        if ev.get("bisect"):
            b = ev["bisect"]
            lines.append(f"- CompilerBisector: backend `{b['backend']}`, subsystem `{b['subsystem']}`, application "
                         f"{b['bisect_number']}: {b['debug_info']}")
        if ev.get("torch_npu_source"):
            t = ev["torch_npu_source"]
            lines.append(f"- raised in torch_npu at `{t['file']}:{t['line']}` (the learned profile)")
        if ev.get("registered_at"):
            r = ev["registered_at"]
            lines.append(f"- registered outside torch at `{r['file']}:{r['line']}`" +
                         (f": `{r['code']}`" if r.get("code") else ""))
        if ev.get("framework_frame"):
            f = ev["framework_frame"]
            lines.append(f"- where it surfaced in torch: `{f['file']}:{f['line']}` ({f['function']})")
        if result.get("rule"):
            lines.append(f"- signature: `{result['rule']}`")
        lines.append("")
        gb = result.get("graph_break")
        if gb:
            lines += [f"## Graph break {gb['id']}: {gb['type']}", "", gb["explanation"] or "", "",
                      *[f"- hint: {h.strip()}" for h in gb["hints"]], ""]
    lines += events_md(result.get("events") or {})
    lines += ["## Next action", "", result["next_action"], ""]
    if result["steps"]:
        lines += ["## The ladder", "", "| step | status | seconds | error |", "|---|---|---|---|"]
        for s in result["steps"]:
            err = s["exception"]["type"].rsplit(".", 1)[-1] if s.get("exception") else ""
            lines.append(f"| {s['step']} | {s['status']} | {s['seconds']:.1f} | {err} |")
        lines += ["", "Each step ran the script in a child process; its output is in the step's log "
                  "(`steps/`). " + ("`repro.py` reruns the failing step on its own." if c != "clean" else ""), ""]
    return "\n".join(lines)


def summary_line(result: dict) -> str:
    name = Path(result.get("script") or result["source"]).name
    if result["conclusion"] == "clean":
        return f"{name}: runs clean" + (f" ({len(result['steps'])} step)" if result["steps"] else "")
    where = result["evidence"].get("user_line")
    at = f" at {Path(where['file']).name}:{where['line']}" if where else ""
    op = f", operator {result['evidence']['operator']}" if result["evidence"].get("operator") else ""
    step = f" (step {result['failing_step']})" if result.get("failing_step") else ""
    return f"{name}: {WORDS[result['conclusion']]} in {result['layer']}{at}{op}{step}"


def events_md(ev: dict, limit: int = 10) -> list[str]:
    """The log's graph breaks and recompiles, as lists (the first `limit` of each)."""
    lines = []
    if ev.get("graph_breaks"):
        lines += [f"## Graph breaks ({len(ev['graph_breaks'])})", ""]
        lines += [f"- `{Path(b['file']).name}:{b['line']}` {b['reason']}" + (f" ({b['gb_id']})" if b["gb_id"] else "")
                  for b in ev["graph_breaks"][:limit]] + [""]
    if ev.get("recompiles") or ev.get("recompile_limits"):
        lines += [f"## Recompiles ({len(ev.get('recompiles', []))})", ""]
        lines += [f"- `{r['function']}` ({Path(r['file'] or '?').name}:{r['line']}), guard failed: `{r['guard']}`"
                  for r in ev.get("recompiles", [])[:limit]]
        lines += [f"- **{r['limit']} ({r['value']}) reached** by `{r['function']}`: it runs eagerly from then on"
                  for r in ev.get("recompile_limits", [])] + [""]
    return lines


SUMMARY_COLUMNS = ["script", "conclusion", "layer", "located", "rule", "user line", "operator or setting",
                   "graph break", "next action", "seconds", "analysis"]
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
    ws.append(SUMMARY_COLUMNS)
    for c in ws[1]:
        c.font = Font(bold=True)
    for r in rows:
        ws.append([r.get(k) for k in SUMMARY_COLUMNS])
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
