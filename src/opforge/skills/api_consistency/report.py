"""The case's record: analysis.md (conclusion and evidence), repro.md (timeline and how to rerun),
repro.py (a standalone script) with the case's source beside it, result.json, and summary.xlsx."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from string import Template

import torch

from opforge.i18n import N_, Msg, _, shown
from opforge.skills.api_consistency.text import join
from opforge.skills.api_consistency.triage import RULES, Diagnosis
from opforge.workspace.atomic import write_bytes_atomic, write_json_atomic, write_text_atomic

REPRO_TEMPLATE = Path(__file__).with_name("repro.py.tmpl")
# A case's triage class: "class N", never "exit N", which is the process's exit code (0, 1, 2) alone.
CLASS_TITLES = {1: N_("class 1: consistent or an expected difference"),
                2: N_("class 2: framework or adaptation problem"),
                3: N_("class 3: operator defect (numerical or determinism)")}
# The rows of analysis.md's table of checks, by the key result.json gives the check.
CHECK_ROWS = {"functional": N_("| functional | {result} | {detail} |"),
              "precision": N_("| precision | {result} | {detail} |"),
              "determinism": N_("| determinism | {result} | {detail} |"),
              "memory": N_("| memory | {result} | {detail} |")}
# The rows' keys, in the order of the workbook's columns; `exit` (the class, as result.json names it) is headed
# "class" there.
SUMMARY_COLUMNS = ["case", "target", "exit", "rule", "check", "operator", "call site", "conclusion",
                   "max abs error", "new inf/NaN", "deterministic", "target peak bytes", "reference peak bytes",
                   "seconds", "analysis"]
HEADINGS = {"exit": "class"}


def _site(op: dict | None) -> str:
    s = (op or {}).get("site")
    return f"{Path(s['file']).name}:{s['line']} ({s['function']})" if s else ""


def _check_row(name: str, passed: bool, detail: str) -> str:
    return _(CHECK_ROWS[name]).format(result=_("pass") if passed else _("FAIL"), detail=detail)


def analysis_md(dg: Diagnosis) -> str:
    d = dg.to_dict()
    lines = [_("# api-consistency: {case} on {target}").format(case=dg.case, target=dg.target), "",
             _("**{title}** — rule {rule}").format(title=_(CLASS_TITLES[dg.exit]), rule=dg.rule), "",
             _("Conclusion: {conclusion}.").format(conclusion=shown(dg.conclusion)), ""]
    if dg.operator:
        op = dg.operator
        lines += [_("## Localised operator"), "", _("- operator: `{name}` ({kind})").format(name=op["name"],
                                                                                             kind=op["kind"]),
                  _("- why: {reason}").format(reason=shown(op["reason"]))]
        if op.get("site"):
            s = op["site"]
            lines.append(_("- call site: `{file}:{line}` in `{function}`: `{code}`").format(**s))
        for s in op.get("stack", [])[1:]:
            lines.append(_("  - called from `{file}:{line}` in `{function}`: `{code}`").format(**s))
        lines.append("")
    if dg.evidence:
        lines += [_("## Evidence"), ""] + ["- " + shown(e) for e in dg.evidence] + [""]
    lines += [_("## Checks"), "", _("| check | result | detail |"), "|---|---|---|"]
    c = dg.checks
    f = c.get("functional", {})
    detail = shown(join([p["detail"] for p in f.get("problems", [])], "; ")) or f.get("error", "") or _("all match")
    lines.append(_check_row("functional", f.get("passed"), detail))
    if "precision" in c:
        p = c["precision"]
        det = shown(join([Msg(N_("out {output}: max abs {max_abs:.3g}, max rel {max_rel:.3g}, {mismatches} beyond "
                              "tolerance, {new_nonfinite} new inf/NaN"), output=o["output"], max_abs=o["max_abs"],
                           max_rel=o["max_rel"], mismatches=o["mismatches"], new_nonfinite=o["new_nonfinite"])
                       for o in p["outputs"]], "; "))
        lines.append(_check_row("precision", p["passed"], det))
    if "determinism" in c:
        x = c["determinism"]
        det = (_("{runs} runs compared bit for bit") if x.get("reference_repeatable", True) else
               _("{runs} runs compared bit for bit; the CPU reference varies too")).format(runs=x["runs"])
        lines.append(_check_row("determinism", x["passed"], det))
    if "memory" in c:
        m = c["memory"]
        det = _("target peak {target} B, reference {reference} B, expected at most {expected} B + 16 MiB").format(
            target=m.get("target_peak_bytes"), reference=m.get("reference_peak_bytes"),
            expected=2 * m.get("expected_peak_bytes", 0))
        lines.append(_check_row("memory", m.get("passed", True), det))
    lines += ["", _("## Rules (first that fires decides)"), "", _("| rule | class | fired | rule |"),
              "|---|---|---|---|"]
    for r in d["rules"]:
        lines.append("| {id} | {exit} | {fired} | {text} |".format(
            id=r["id"], exit=r["exit"], fired=_("**yes**") if r["fired"] else "", text=_(r["text"])))
    if dg.traceback:
        lines += ["", _("## Traceback on the target"), "", "```", dg.traceback.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def repro_md(dg: Diagnosis, has_culprit: bool) -> str:
    lines = [_("# Reproduction: {case} on {target}").format(case=dg.case, target=dg.target), "", _("## Timeline"), "",
             _("| step | what | seconds | result |"), "|---|---|---|---|"]
    for t in dg.timeline:
        lines.append("| {step} | {what} | {seconds} | {result} |".format(step=t["step"], what=shown(t["what"]),
                                                                          seconds=t["seconds"],
                                                                          result=shown(t["result"])))
    custom = dg.target.startswith("custom:")
    if has_culprit and custom:
        how = _("`repro.py` needs only torch and the files beside it (`case_source.py`, the custom implementation). "
                "It builds the inputs with seed {seed}, runs the float64 reference and the target, compares them, "
                "repeats the target to test determinism, then runs the localised operator `{operator}` alone on the "
                "inputs it received (saved in `culprit.pt`) against float64.")
    elif has_culprit:
        how = _("`repro.py` needs only torch and the files beside it (`case_source.py`). It builds the inputs with "
                "seed {seed}, runs the float64 reference and the target, compares them, repeats the target to test "
                "determinism, then runs the localised operator `{operator}` alone on the inputs it received (saved "
                "in `culprit.pt`) against float64.")
    elif custom:
        how = _("`repro.py` needs only torch and the files beside it (`case_source.py`, the custom implementation). "
                "It builds the inputs with seed {seed}, runs the float64 reference and the target, compares them, "
                "repeats the target to test determinism.")
    else:
        how = _("`repro.py` needs only torch and the files beside it (`case_source.py`). It builds the inputs with "
                "seed {seed}, runs the float64 reference and the target, compares them, repeats the target to test "
                "determinism.")
    lines += ["", _("## Rerun"), "", "```bash", "python repro.py   # exit 1 when the finding reproduces", "```", "",
              how.format(seed=dg.seed, operator=dg.operator["name"] if has_culprit else "")]
    return "\n".join(lines) + "\n"


def _repro_script(dg: Diagnosis, case, target, has_culprit: bool, custom_file: str | None) -> str:
    bad = next((o for o in dg.checks.get("precision", {}).get("outputs", []) if not o.get("passed")), None)
    thr = (bad["max_abs"] / 2 if bad and bad["max_abs"] > 0 else 0.0) if dg.rule == "R3" else float("inf")
    custom = None
    if target.kind == "custom":
        mod, _colon, fn = target.impl_name.rpartition(":")
        custom = (custom_file or mod, fn)
    lowp = {torch.float16: "torch.float16", torch.bfloat16: "torch.bfloat16"}.get(target.dtype, "None")
    return Template(REPRO_TEMPLATE.read_text()).substitute(
        case=dg.case, target=dg.target, conclusion_short=dg.conclusion[:100].replace('"""', "'''"), seed=dg.seed,
        target_repr=repr(dg.target), kind_repr=repr(target.kind), lowp=lowp, device_repr=repr(target.device),
        entry_repr=repr(tuple(case.entry_path) or (case.fn_name,)),
        is_test=repr(case.is_test), test_params=repr(tuple(case.pytest_params)),
        custom_repr=repr(custom), culprit_repr=repr(dg.operator["name"] if has_culprit else None),
        err_threshold=repr(thr) if thr != float("inf") else 'float("inf")',
        check_determinism=repr(dg.rule == "R4"), check_dtype=repr(dg.rule == "R2"))


def write_case(out: Path, dg: Diagnosis, case, target) -> Path:
    """Everything about one case under out/<case>__<target>/; returns that folder."""
    folder = out / f"{dg.case}__{dg.target.replace(':', '_').replace('/', '_')}"
    folder.mkdir(parents=True, exist_ok=True)
    rec = dg.culprit
    has_culprit = bool(rec is not None and getattr(rec, "kind", "") in ("aten", "custom") and rec.kept
                       and rec.func is not None)
    if has_culprit:
        buf = io.BytesIO()
        torch.save({"op": rec.name, "args": rec.args, "kwargs": rec.kwargs}, buf)
        write_bytes_atomic(folder / "culprit.pt", buf.getvalue())
    write_text_atomic(folder / "case_source.py", case.path.read_text())
    custom_file = None
    if target.kind == "custom":
        src = Path(target.impl_file)
        if target.impl_file and src.is_file():
            custom_file = "custom_impl.py"
            shutil.copyfile(src, folder / ".custom_impl.py.tmp")
            (folder / ".custom_impl.py.tmp").replace(folder / custom_file)
    write_text_atomic(folder / "analysis.md", analysis_md(dg))
    write_text_atomic(folder / "repro.md", repro_md(dg, has_culprit))
    write_text_atomic(folder / "repro.py", _repro_script(dg, case, target, has_culprit, custom_file))
    write_json_atomic(folder / "result.json", dg.to_dict())
    return folder


def summary_row(dg: Diagnosis | dict, folder: str) -> dict:
    d = dg.to_dict() if isinstance(dg, Diagnosis) else dg
    prec = d.get("checks", {}).get("precision", {}).get("outputs", [])
    mem = d.get("checks", {}).get("memory", {})
    det = d.get("checks", {}).get("determinism", {})
    return {"case": d["case"], "target": d["target"], "exit": d["exit"], "rule": d["rule"], "check": d["check"],
            "operator": (d.get("operator") or {}).get("name", ""), "call site": _site(d.get("operator")),
            "conclusion": d["conclusion"], "max abs error": max((o["max_abs"] for o in prec), default=None),
            "new inf/NaN": sum(o["new_nonfinite"] for o in prec) if prec else None,
            "deterministic": det.get("passed"), "target peak bytes": mem.get("target_peak_bytes"),
            "reference peak bytes": mem.get("reference_peak_bytes"), "seconds": d.get("seconds"),
            "analysis": f"{folder}/analysis.md" if folder else ""}


def write_summary(out: Path, rows: list[dict]) -> None:
    from openpyxl import Workbook
    from openpyxl.styles import Font, PatternFill

    wb = Workbook()
    ws = wb.active
    ws.title = "cases"
    ws.append([HEADINGS.get(k, k) for k in SUMMARY_COLUMNS])
    for c in ws[1]:
        c.font = Font(bold=True)
    fills = {1: "C6EFCE", 2: "FFEB9C", 3: "FFC7CE"}
    for r in rows:
        ws.append([shown(r.get(k)) for k in SUMMARY_COLUMNS])  # the conclusion in the reader's language
        row = ws.max_row
        if r.get("exit") in fills:
            ws.cell(row, 3).fill = PatternFill("solid", fgColor=fills[r["exit"]])
        if r.get("analysis"):
            cell = ws.cell(row, len(SUMMARY_COLUMNS))
            cell.hyperlink = r["analysis"]
            cell.font = Font(color="0563C1", underline="single")
    widths = {"case": 28, "target": 22, "operator": 28, "call site": 30, "conclusion": 80, "analysis": 40}
    for i, k in enumerate(SUMMARY_COLUMNS, 1):
        ws.column_dimensions[ws.cell(1, i).column_letter].width = widths.get(k, 14)
    ws.freeze_panes = "A2"
    rules = wb.create_sheet("rules")
    rules.append(["rule", "class", "check", "text"])
    for rid, cls, check, text in RULES:
        rules.append([rid, cls, check, _(text)])
    buf = io.BytesIO()
    wb.save(buf)
    write_bytes_atomic(out / "summary.xlsx", buf.getvalue())
    write_json_atomic(out / "summary.json", rows)
