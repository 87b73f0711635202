"""What `test-triage run` writes in its folder:

  triage.json     the run: selection, counts, shards, clusters with their evidence (results.jsonl has each test)
  triage.md       the clusters in order of size, each with its category, why, evidence and tests
  summary.xlsx    a row per cluster, linked to its folder
  results.jsonl   every test's outcome, exception, message and frames
  junit/          each shard process's JUnit XML, for CI tools
  clusters/CNNN/  tests.txt: the cluster's node ids (`pytest` reruns them)
"""
from __future__ import annotations

import io
import json
from pathlib import Path

from opforge.i18n import N_, _, ngettext
from opforge.workspace.atomic import write_bytes_atomic, write_json_atomic, write_text_atomic

CATEGORY_ORDER = ("missing_dispatch", "behaviour_mismatch", "memory", "environment", "upstream", "test_expectation")
# summary.xlsx's headers (its sheet keeps the name `clusters`)
XLSX_HEAD = (N_("cluster"), N_("category"), N_("rule"), N_("operator"), N_("tests"), N_("dtypes"), N_("generic tests"),
             N_("flaky"), N_("reruns passed"), N_("cpu twins"), N_("signature"), N_("causal frame"), N_("tests file"),
             N_("repro"), N_("log"))


def summary(result: dict) -> dict:
    """triage.json: the run without its per-test records."""
    by_category: dict[str, int] = {}
    for c in result["clusters"]:
        by_category[c["category"]] = by_category.get(c["category"], 0) + 1
    keep = ("device", "imports", "suite", "file", "ops", "dtypes", "executor", "workers", "reruns", "tests",
            "counts", "failed", "wall_s", "phases_s", "shards", "python")
    return {**{k: result[k] for k in keep}, "clusters_by_category": by_category, "clusters": result["clusters"]}


def markdown(result: dict) -> str:
    counts = ", ".join(f"{n} {k}" for k, n in sorted(result["counts"].items(), key=lambda kv: -kv[1]))
    ran = _("{tests} tests of `{file}` on `{device}` ({counts}), run in {shards} by the {executor} executor with "
            "{workers} in {seconds} s.").format(
        tests=result["tests"], file=Path(result["file"]).name, device=result["device"], counts=counts,
        shards=ngettext("{n} shard", "{n} shards", len(result["shards"])).format(n=len(result["shards"])),
        executor=result["executor"], workers=ngettext("{n} worker", "{n} workers", result["workers"]).format(
            n=result["workers"]), seconds=result["wall_s"])
    failures = ngettext("{n} failure", "{n} failures", result["failed"]).format(n=result["failed"])
    clusters = ngettext("{n} cluster", "{n} clusters", len(result["clusters"])).format(n=len(result["clusters"]))
    if result["reruns"] and result["clusters"]:
        found = _("{failures} in {clusters}; up to five tests of each were rerun {times}.").format(
            failures=failures, clusters=clusters,
            times=ngettext("{n} time", "{n} times", result["reruns"]).format(n=result["reruns"]))
    else:
        found = _("{failures} in {clusters}.").format(failures=failures, clusters=clusters)
    lines = ["# " + _("Test triage: {device}").format(device=result["device"]), "", ran + " " + found, ""]
    crashed = [s for s in result["shards"] if s.get("error") or len(s["processes"]) > 1]
    for s in crashed:
        what = s["error"]["error"] if s.get("error") else \
            _("{n} processes, each in turn: {processes}").format(n=len(s["processes"]),
                                                                 processes="; ".join(s["processes"]))
        lines.append("- " + _("shard {index}: {what} ({kept} kept)").format(
            index=s["index"], what=what, kept=ngettext("{n} result", "{n} results", s["tests"]).format(n=s["tests"])))
    if crashed:
        lines.append("")
    lines += [_("| cluster | category | operator | tests | dtypes | flaky | signature |"),
              "|---|---|---|---|---|---|---|"]
    yes = _("yes")
    for c in result["clusters"]:
        sig = c["signature"].replace("|", "\\|")[:120]
        lines.append(f"| [{c['id']}](#{c['id'].lower()}) | {c['category']} | {c['operator'] or ''} | {c['size']} | "
                     f"{' '.join(c['dtypes'])} | {yes if c['flaky'] else ''} | {sig} |")
    for c in result["clusters"]:
        lines += ["", f"## {c['id']}", "",
                  _("**{category}** (rule `{rule}`): {why}.").format(category=c["category"], rule=c["rule"],
                                                                      why=_(c["why"])), "",
                  "- " + _("signature: `{signature}`").format(signature=c["signature"])]
        if c["causal_frame"]:
            lines.append("- " + _("causal frame: `{frame}`").format(frame=c["causal_frame"]))
        generics, dtypes = ", ".join(c["generics"]), ", ".join(c["dtypes"])
        if generics:
            over = _("tests: {n}, over {generics}; dtypes {dtypes}") if dtypes else _("tests: {n}, over {generics}")
        else:
            over = _("tests: {n}, over its file; dtypes {dtypes}") if dtypes else _("tests: {n}, over its file")
        lines.append("- " + over.format(n=c["size"], generics=generics, dtypes=dtypes))
        if c["reruns"]:
            said = _("reruns: {passed} of {reruns} passed (flaky: it fails only some of the time)") if c["flaky"] \
                else _("reruns: {passed} of {reruns} passed")
            lines.append("- " + said.format(passed=c["passed_on_rerun"], reruns=c["reruns"]))
        if c["cpu_twins"]:
            twins = ", ".join(f"{n} {o}" for o, n in c["cpu_twins"].items())
            lines.append("- " + _("the same tests on the CPU, without the backend: {twins}").format(twins=twins))
        lines += ["- " + _("tests: `{path}`").format(path=f"clusters/{c['id']}/tests.txt"), "", "```",
                  c["message"].strip()[:600], "```"]
    return "\n".join(lines) + "\n"


def xlsx(result: dict) -> bytes:
    from openpyxl import Workbook
    from openpyxl.styles import Font

    wb = Workbook()
    ws = wb.active
    ws.title = "clusters"
    head = [_(h) for h in XLSX_HEAD]
    ws.append(head)
    for cell in ws[1]:
        cell.font = Font(bold=True)
    for c in result["clusters"]:
        ws.append([c["id"], c["category"], c["rule"], c["operator"], c["size"], " ".join(c["dtypes"]),
                   " ".join(c["generics"]), _("yes") if c["flaky"] else "", f"{c['passed_on_rerun']}/{c['reruns']}",
                   ", ".join(f"{n} {o}" for o, n in c["cpu_twins"].items()), c["signature"], c["causal_frame"],
                   *(f"clusters/{c['id']}/{name}" for name in ("tests.txt", "repro.py", "log.txt"))])
        for column in range(len(head) - 2, len(head) + 1):
            link = ws.cell(row=ws.max_row, column=column)
            link.hyperlink = link.value
            link.font = Font(color="0563C1", underline="single")
    for col, width in zip("ABCDEFGHIJKLMNO", (9, 20, 18, 22, 7, 30, 40, 6, 10, 14, 80, 50, 28, 26, 24)):
        ws.column_dimensions[col].width = width
    ws.freeze_panes = "A2"
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


def repro_source(run: dict, test: str, result: dict) -> str:
    """A script that runs one test of the run alone, through unittest, with the run's selection."""
    file, cls, name = Path(run["file"]), test.split("::")[-2], test.split("::")[-1]
    env = {"OPFORGE_TRIAGE_DEVICE": run["device"], "OPFORGE_TRIAGE_OPS": result.get("op") or run["ops"],
           "OPFORGE_TRIAGE_DTYPES": result.get("dtype") or run["dtypes"]}
    sample = f" (OpInfo sample {result['sample']})" if "sample" in result else ""
    imports = "".join(f"import {m}  # the backend under test\n" for m in run["imports"])
    return f'''"""Reproduces {test}{sample}: {result.get("exception", "")}: {result.get("message", "")[:200]!r}.
Exit 1 while it fails. OPDEV_ROOT (or your backend's own setting) selects the backend's tree, as in the run."""
import importlib
import os
import sys
import unittest

os.environ.update({env!r})
{imports}
sys.path.insert(0, {str(file.parent)!r})
suite = importlib.import_module({file.stem!r})  # by its name: a multi-process test's ranks import it again
result = unittest.TextTestRunner(verbosity=2).run(suite.{cls}({name!r}))
sys.exit(0 if result.wasSuccessful() else 1)
'''


def write(out: Path, result: dict) -> None:
    (out / "junit").mkdir(parents=True, exist_ok=True)
    for i, xml in enumerate(result["junit"]):
        write_text_atomic(out / "junit" / f"shard-{i:03d}.xml", xml)
    records = {r["test"]: {**r, **{k: v for k, v in result["infos"].get(r["test"], {}).items() if k != "test"}}
               for r in result["results"]}
    for c in result["clusters"]:
        folder = out / "clusters" / c["id"]
        folder.mkdir(parents=True, exist_ok=True)
        first = records.get(c["tests"][0], {})
        write_text_atomic(folder / "tests.txt", "\n".join(c["tests"]) + "\n")
        write_text_atomic(folder / "repro.py", repro_source(result, c["tests"][0], first))
        write_text_atomic(folder / "log.txt", f"{c['tests'][0]}\n{first.get('exception', '')}: "
                                              f"{first.get('message', '')}\n\n{first.get('text', '')}\n")
    write_text_atomic(out / "results.jsonl", "".join(json.dumps(r) + "\n" for r in records.values()))
    write_bytes_atomic(out / "summary.xlsx", xlsx(result))
    write_text_atomic(out / "triage.md", markdown(result))
    write_json_atomic(out / "triage.json", summary(result))


def summary_line(result: dict) -> str:
    by = summary(result)["clusters_by_category"]
    parts = ", ".join(f"{by[k]} {k}" for k in CATEGORY_ORDER if k in by)
    said = _("{device}: {tests} tests, {failed} failed in {clusters} clusters ({parts}), {seconds} s") if parts \
        else _("{device}: {tests} tests, {failed} failed in {clusters} clusters, {seconds} s")
    return said.format(device=result["device"], tests=result["tests"], failed=result["failed"],
                       clusters=len(result["clusters"]), parts=parts, seconds=result["wall_s"])
