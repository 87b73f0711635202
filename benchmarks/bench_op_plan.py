"""How fast `opforge op plan` answers, per reference: every request of the catalog (examples/) and of
benchmarks/requests/ planned in one process (`op plan --no-cost --json`, stages 1-2 in memory), as a sweep over
hundreds of references would run it. Prints each reference's seconds and verdict, then the median, the slowest
and the count over 3 s. Asserts nothing.

    .venv/bin/python benchmarks/bench_op_plan.py [--cost] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 3.0  # what `op plan` is asked to answer in, per reference


def seconds_summary(times: list[float]) -> str:
    """The per-reference figures both plan benchmarks print: median, slowest and the count over the budget."""
    over = sum(t > BUDGET_S for t in times)
    return (f"median {statistics.median(times):.2f} s, slowest {max(times):.2f} s, {over} of {len(times)} over "
            f"{BUDGET_S:g} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost", action="store_true", help="with the cost model (runs each reference eagerly)")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    args = ap.parse_args()
    requests = sorted(p.parent for root in (ROOT / "examples", ROOT / "benchmarks" / "requests")
                      for p in root.glob("*/request.yaml"))
    cmd = [str(ROOT / ".venv" / "bin" / "opforge"), "op", "plan", *map(str, requests), "--json",
           "--cost" if args.cost else "--no-cost"]
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    rows = json.loads(r.stdout)
    for row in rows:
        verdict = "builds" if row["buildable"] else row.get("error") or f"BLOCKED_API: {', '.join(row['unsupported'])}"
        print(f"{row.get('op', row['request']):32s} {row.get('seconds', 0.0):6.2f} s  {verdict}")
    times = [row["seconds"] for row in rows if "seconds" in row]
    print(f"{len(rows)} references in one process: {wall:.1f} s wall (imports included); per reference "
          f"{seconds_summary(times)} ({sys.platform}, {args.cost and 'with' or 'without'} the cost model)")
    if args.json:
        args.json.write_text(json.dumps({"wall_s": wall, "rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
