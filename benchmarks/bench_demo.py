"""How long a newcomer waits: the demo operator built through all seven stages, as `scripts/demo.sh` runs it
(--quick) and with the full matrix (--full), each timed alone after set-up, with the time of each stage from the
workspace's event log; with --setup, also `scripts/setup.sh` in a fresh checkout (a new .venv, the registry's
wheels). Prints figures; asserts nothing. Run it on an otherwise idle machine.

    .venv/bin/python benchmarks/bench_demo.py [--full] [--setup] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "qat_symmetric_per_tensor"


def _stage_seconds(ws: Path) -> dict[str, float]:
    """Seconds from each stage's start to its end, read off events.jsonl."""
    started, took = {}, {}
    for line in (ws / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        at = datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()
        if e.get("kind") == "stage_started":
            started[e["stage"]] = at
        elif e.get("kind") in ("stage_completed", "stage_skipped", "stage_failed") and e["stage"] in started:
            took[str(e["stage"])] = round(at - started[e["stage"]], 1)
    return took


def _demo(tmp: Path, quick: bool) -> dict:
    ws = tmp / ("quick" if quick else "full")
    cmd = [str(ROOT / ".venv" / "bin" / "opforge"), "op", "run", str(DEMO), "--out", str(ws), "--force"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd + (["--quick"] if quick else []), capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"bench_demo: the demo run failed ({r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    return {"mode": "quick" if quick else "full", "seconds": round(seconds, 1), "stages": _stage_seconds(ws)}


def _setup(tmp: Path) -> dict:
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    t0 = time.perf_counter()
    subprocess.run(["bash", "scripts/setup.sh"], cwd=clone, check=True, capture_output=True)
    return {"mode": "setup", "seconds": round(time.perf_counter() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="also time the full matrix")
    ap.add_argument("--setup", action="store_true", help="also time scripts/setup.sh in a fresh clone")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.setup:
            rows.append(_setup(tmp))
        rows.append(_demo(tmp, quick=True))
        if args.full:
            rows.append(_demo(tmp, quick=False))
        shutil.rmtree(tmp / "clone", ignore_errors=True)
    for r in rows:
        stages = ", ".join(f"{k}: {v} s" for k, v in r.get("stages", {}).items())
        print(f"{r['mode']:6s} {r['seconds']:7.1f} s" + (f"   (stages {stages})" if stages else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
