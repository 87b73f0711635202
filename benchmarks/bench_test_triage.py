"""How `opforge test-triage run` scales with its executors, on the reference backend as it ships: the same
selection run by the local executor with one worker, then two, then by the Ray executor (a local Ray the
command starts) with two. Prints each run's seconds, its phases, its tests and clusters, the ratio to the
one-worker run, and whether its clusters are the one-worker run's (the same operators, rules and tests).
Asserts nothing; the ratios hold within this one run of the script only.

    .venv/bin/python benchmarks/bench_test_triage.py [--ops abs,add,sum] [--dtypes float32] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPFORGE = str(ROOT / ".venv" / "bin" / "opforge")
RUNS = [("local", 1), ("local", 2), ("ray", 2)]


def clusters(result: dict) -> list[tuple]:
    return sorted((c["operator"], c["rule"], tuple(sorted(c["tests"]))) for c in result["clusters"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="", help="OpInfo names (default: those the reference backend registers)")
    ap.add_argument("--dtypes", default="")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-triage-") as tmp:
        for executor, workers in RUNS:
            out = Path(tmp, f"{executor}-{workers}")
            cmd = [OPFORGE, "test-triage", "run", "--device", "opdev", "--import", "opforge.backend.device",
                   "--executor", executor, "--workers", str(workers), "--reruns", "1", "--out", str(out), "--json"]
            cmd += ["--ops", args.ops] if args.ops else []
            cmd += ["--dtypes", args.dtypes] if args.dtypes else []
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            wall = time.perf_counter() - start
            if proc.returncode not in (0, 1):
                print(f"{executor} x{workers}: exit {proc.returncode}: {proc.stdout[-300:]}{proc.stderr[-300:]}",
                      file=sys.stderr)
                return 1
            result = json.loads((out / "triage.json").read_text())
            rows.append({"executor": executor, "workers": workers, "wall_s": round(wall, 1),
                         "phases_s": result.get("phases_s"), "tests": result["tests"], "failed": result["failed"],
                         "clusters": len(result["clusters"]), "_clusters": clusters(result)})
    base, base_clusters = rows[0], rows[0]["_clusters"]
    print(f"{'executor':<8} {'workers':>7} {'wall s':>8} {'vs x1':>6} {'tests':>6} {'failed':>6} {'clusters':>8} "
          f"{'same clusters':>13}  phases s")
    for r in rows:
        r["ratio"] = round(r["wall_s"] / base["wall_s"], 2)
        r["same_clusters"] = r.pop("_clusters") == base_clusters
        print(f"{r['executor']:<8} {r['workers']:>7} {r['wall_s']:>8} {r['ratio']:>6} {r['tests']:>6} "
              f"{r['failed']:>6} {r['clusters']:>8} {str(r['same_clusters']):>13}  {r['phases_s']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
