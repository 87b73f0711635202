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

from opforge.workspace.atomic import write_bytes_atomic, write_json_atomic, write_text_atomic

CATEGORY_ORDER = ("missing_dispatch", "behaviour_mismatch", "memory", "environment", "upstream", "test_expectation")


def summary(result: dict) -> dict:
    """triage.json: the run without its per-test records."""
    by_category: dict[str, int] = {}
    for c in result["clusters"]:
        by_category[c["category"]] = by_category.get(c["category"], 0) + 1
    keep = ("device", "imports", "suite", "file", "ops", "dtypes", "executor", "workers", "reruns", "tests",
            "counts", "failed", "wall_s", "phases_s", "shards", "python")
    return {**{k: result[k] for k in keep}, "clusters_by_category": by_category, "clusters": result["clusters"]}


def _n(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def markdown(result: dict) -> str:
    counts = ", ".join(f"{n} {k}" for k, n in sorted(result["counts"].items(), key=lambda kv: -kv[1]))
    lines = [f"# Test triage: {result['device']}", "",
             f"{result['tests']} tests of `{Path(result['file']).name}` on `{result['device']}` ({counts}), "
             f"run in {_n(len(result['shards']), 'shard')} by the {result['executor']} executor with "
             f"{_n(result['workers'], 'worker')} in {result['wall_s']} s. {_n(result['failed'], 'failure')} in "
             f"{_n(len(result['clusters']), 'cluster')}" + (f"; up to five tests of each were rerun "
                                                             f"{_n(result['reruns'], 'time')}" if result["reruns"]
                                                             and result["clusters"] else "") + ".", ""]
    crashed = [s for s in result["shards"] if s.get("error") or len(s["processes"]) > 1]
    for s in crashed:
        what = s["error"]["error"] if s.get("error") else \
            f"{len(s['processes'])} processes, each in turn: " + "; ".join(s["processes"])
        lines.append(f"- shard {s['index']}: {what} ({_n(s['tests'], 'result')} kept)")
    if crashed:
        lines.append("")
    lines += ["| cluster | category | operator | tests | dtypes | flaky | signature |", "|---|---|---|---|---|---|---|"]
    for c in result["clusters"]:
        sig = c["signature"].replace("|", "\\|")[:120]
        lines.append(f"| [{c['id']}](#{c['id'].lower()}) | {c['category']} | {c['operator'] or ''} | {c['size']} | "
                     f"{' '.join(c['dtypes'])} | {'yes' if c['flaky'] else ''} | {sig} |")
    for c in result["clusters"]:
        lines += ["", f"## {c['id']}", "",
                  f"**{c['category']}** (rule `{c['rule']}`): {c['why']}.", "",
                  f"- signature: `{c['signature']}`"]
        if c["causal_frame"]:
            lines.append(f"- causal frame: `{c['causal_frame']}`")
        lines.append(f"- tests: {c['size']}, over {', '.join(c['generics']) or 'its file'}"
                     + (f"; dtypes {', '.join(c['dtypes'])}" if c["dtypes"] else ""))
        if c["reruns"]:
            lines.append(f"- reruns: {c['passed_on_rerun']} of {c['reruns']} passed"
                         + (" (flaky: it fails only some of the time)" if c["flaky"] else ""))
        if c["cpu_twins"]:
            twins = ", ".join(f"{n} {o}" for o, n in c["cpu_twins"].items())
            lines.append(f"- the same tests on the CPU, without the backend: {twins}")
        lines += [f"- tests: `clusters/{c['id']}/tests.txt`", "", "```", c["message"].strip()[:600], "```"]
    return "\n".join(lines) + "\n"


def xlsx(result: dict) -> bytes:
    from openpyxl import Workbook
    from openpyxl.styles import Font

    wb = Workbook()
    ws = wb.active
    ws.title = "clusters"
    head = ["cluster", "category", "rule", "operator", "tests", "dtypes", "generic tests", "flaky",
            "reruns passed", "cpu twins", "signature", "causal frame", "tests file"]
    ws.append(head)
    for cell in ws[1]:
        cell.font = Font(bold=True)
    for c in result["clusters"]:
        ws.append([c["id"], c["category"], c["rule"], c["operator"], c["size"], " ".join(c["dtypes"]),
                   " ".join(c["generics"]), "yes" if c["flaky"] else "", f"{c['passed_on_rerun']}/{c['reruns']}",
                   ", ".join(f"{n} {o}" for o, n in c["cpu_twins"].items()), c["signature"], c["causal_frame"],
                   f"clusters/{c['id']}/tests.txt"])
        link = ws.cell(row=ws.max_row, column=len(head))
        link.hyperlink = f"clusters/{c['id']}/tests.txt"
        link.font = Font(color="0563C1", underline="single")
    for col, width in zip("ABCDEFGHIJKLM", (9, 20, 18, 22, 7, 30, 40, 6, 10, 14, 80, 50, 28)):
        ws.column_dimensions[col].width = width
    ws.freeze_panes = "A2"
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


def write(out: Path, result: dict) -> None:
    (out / "junit").mkdir(parents=True, exist_ok=True)
    for i, xml in enumerate(result["junit"]):
        write_text_atomic(out / "junit" / f"shard-{i:03d}.xml", xml)
    for c in result["clusters"]:
        (out / "clusters" / c["id"]).mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "clusters" / c["id"] / "tests.txt", "\n".join(c["tests"]) + "\n")
    write_text_atomic(out / "results.jsonl", "".join(
        json.dumps({**r, **{k: v for k, v in result["infos"].get(r["test"], {}).items() if k != "test"}}) + "\n"
        for r in result["results"]))
    write_bytes_atomic(out / "summary.xlsx", xlsx(result))
    write_text_atomic(out / "triage.md", markdown(result))
    write_json_atomic(out / "triage.json", summary(result))


def summary_line(result: dict) -> str:
    by = summary(result)["clusters_by_category"]
    parts = ", ".join(f"{by[k]} {k}" for k in CATEGORY_ORDER if k in by)
    return (f"{result['device']}: {result['tests']} tests, {result['failed']} failed in "
            f"{len(result['clusters'])} clusters" + (f" ({parts})" if parts else "") + f", {result['wall_s']} s")
