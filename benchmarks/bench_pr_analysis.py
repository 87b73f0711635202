"""Throughput of `opforge pr-analysis` on a synthetic PyTorch-shaped window.

Builds a repository of N commits (real native_functions.yaml and derivatives.yaml; a third of the commits edit
them, far more than upstream's few percent), then times the analysis alone and the full command (analysis plus
xlsx, JSON and Markdown) for each profile. Prints commits per minute and the grading accuracy.

    .venv/bin/python benchmarks/bench_pr_analysis.py [--commits 500] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from opforge.skills.pr_analysis import analyze_window, load_profile
from opforge.skills.pr_analysis.report_text import write_json, write_markdown
from opforge.skills.pr_analysis.report_xlsx import write_xlsx
from opforge.skills.pr_analysis.synthrepo import BASE_TIME, build_repo

OP_PLUGIN = Path(__file__).resolve().parents[2] / "shared" / "data" / "op_plugin_functions.yaml"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    profiles = {"generic": load_profile(None)}
    if OP_PLUGIN.is_file():
        profiles["op_plugin"] = load_profile(str(OP_PLUGIN))
    implemented = profiles.get("op_plugin", profiles["generic"]).operators
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "pytorch"
        t0 = time.perf_counter()
        expected = build_repo(repo, args.commits, implemented)
        print(f"built {args.commits} commits in {time.perf_counter() - t0:.2f} s")
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(BASE_TIME + 60))  # after the base import
        for name, prof in profiles.items():
            times, full = [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                rep = analyze_window(repo, prof, since=since)
                times.append(time.perf_counter() - t0)
                write_xlsx(rep, Path(tmp) / "r.xlsx")
                write_json(rep, Path(tmp) / "r.json")
                write_markdown(rep, Path(tmp) / "r.md")
                full.append(time.perf_counter() - t0)
            n = rep["summary"]["commits"]
            rows = {r["title"]: r["impact"] for r in rep["rows"]}
            right = sum(rows.get(e["title"]) == e["expected"][name] for e in expected)
            med, med_full = statistics.median(times), statistics.median(full)
            print(f"{name:9s} {n} commits: analysis {med:.2f} s ({n / med * 60:,.0f} commits/min), "
                  f"with reports {med_full:.2f} s ({n / med_full * 60:,.0f} commits/min); "
                  f"right grade {right}/{len(expected)} ({100 * right / len(expected):.1f}%)")


if __name__ == "__main__":
    main()
