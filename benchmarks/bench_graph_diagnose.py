"""How right and how fast `opforge graph diagnose` is on the planted problems of examples/graph/: each script
diagnosed by the CLI in its own process (the options and environment examples/graph/expected.yaml gives it),
then one log-only case (`graph logs` on a TORCH_LOGS text of the data-dependent branch). Prints each case's
seconds, its conclusion, layer and rule against the expected ones, and the count right. Asserts nothing.

    .venv/bin/python benchmarks/bench_graph_diagnose.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "examples" / "graph"
BUDGET_S = 180.0  # what one diagnosis is asked to take on a 2-core machine
OPFORGE = str(ROOT / ".venv" / "bin" / "opforge")


def run(cmd: list[str], env: dict) -> tuple[float, dict]:
    start = time.perf_counter()
    subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, cwd=ROOT)
    return time.perf_counter() - start, json.loads(Path(cmd[cmd.index("--out") + 1], "result.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the rows here too")
    args = ap.parse_args()
    expected = yaml.safe_load((CASES / "expected.yaml").read_text())
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-graph-") as tmp:
        for name, want in expected.items():
            env = {k: (str(Path(tmp, f"{name}-{k.lower()}")) if v == "fresh" else v)
                   for k, v in (want.get("env") or {}).items()}
            cmd = [OPFORGE, "graph", "diagnose", str(CASES / f"{name}.py"), "--out", str(Path(tmp, name)),
                   *want.get("options", [])]
            seconds, r = run(cmd, env)
            rows.append({"case": name, "seconds": round(seconds, 1),
                         **{k: r.get(k) for k in ("conclusion", "layer", "rule")},
                         "right": all(r.get(k) == want.get(k) for k in ("conclusion", "layer", "rule"))})
        # the log-only case: the data-dependent branch's TORCH_LOGS text, read back without the script
        log = Path(tmp, "branch.log")
        done = subprocess.run([sys.executable, str(CASES / "branch.py")], capture_output=True, text=True,
                              env={**os.environ, "TORCH_LOGS": "graph_breaks,recompiles"})
        log.write_text(done.stdout + done.stderr)
        seconds, r = run([OPFORGE, "graph", "logs", str(log), "--out", str(Path(tmp, "log-only"))], {})
        want = expected["branch"]
        rows.append({"case": "log-only (branch)", "seconds": round(seconds, 1),
                     **{k: r.get(k) for k in ("conclusion", "layer", "rule")},
                     "right": all(r.get(k) == want.get(k) for k in ("conclusion", "layer", "rule"))})
    for row in rows:
        print(f"{row['case']:22s} {row['seconds']:6.1f} s  {'right' if row['right'] else 'WRONG':5s}  "
              f"{row['conclusion']} / {row['layer']} / {row['rule']}")
    slowest = max(r["seconds"] for r in rows)
    print(f"{sum(r['right'] for r in rows)} of {len(rows)} right; slowest {slowest:.1f} s, "
          f"{sum(r['seconds'] > BUDGET_S for r in rows)} over {BUDGET_S:g} s ({sys.platform}, {os.cpu_count()} cores)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
