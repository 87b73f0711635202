"""Requests of the product-and-attention class that no test or catalog entry is built from, each taken through
all seven stages as a first run does (`opforge op run --quick`), one after another: whether it builds, where it
stops and why, the precision cases passed, and how long it took. Prints a table; asserts nothing.
`benchmarks/requests/` holds them (an ALiBi with learned slopes, a softcap, a relative bias, grouped heads by
repeat_interleave in einsums, cross attention, a causal self-attention block from a fused QKV projection to the
output projection, multi-query attention broadcast by matmul, a linear with a static, a dynamic and a per-group
quantizing epilogue, two products sharing their input, a low-rank adapter, norm-projection-rotary chains with
rotate-half and with GPT-J's interleaved pairs, a fused latent-and-rotary projection declared "L+R*2", a linear
with a residual LayerNorm, a log-softmax head, a GELU MLP, a Mamba-style depthwise convolution then SiLU, a
transposed convolution).

    .venv/bin/python benchmarks/bench_requests.py [NAME ...] [--json FILE]
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
REQUESTS = Path(__file__).resolve().parent / "requests"


def _run(request: Path, ws: Path) -> dict:
    cmd = [str(ROOT / ".venv" / "bin" / "opforge"), "op", "run", str(request), "--out", str(ws), "--force",
           "--quick", "--json"]
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    took = round(time.perf_counter() - start, 1)
    row = {"request": request.name, "rc": r.returncode, "seconds": took}
    try:
        state = json.loads(r.stdout)
        row["status"] = (state.get("terminal") or {}).get("status")
    except json.JSONDecodeError:
        row["status"] = None
    if r.returncode:
        row["why"] = (r.stderr.strip().splitlines() or [""])[-1][:160]
    precision = ws / "precision.json"
    if precision.exists():
        summary = json.loads(precision.read_text()).get("summary", {})
        row["cases"] = f"{summary.get('passed', '?')}/{summary.get('total', '?')}"
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="requests under benchmarks/requests (default: all)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    names = args.names or sorted(p.name for p in REQUESTS.iterdir() if (p / "request.yaml").exists())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            rows.append(_run(REQUESTS / name, Path(tmp) / name))
            r = rows[-1]
            print(f"{r['request']:<28} {r['status'] or '?':<16} {r['seconds']:>7}s  cases {r.get('cases', '-'):<7} "
                  f"{r.get('why', '')}", flush=True)
    built = sum(r["rc"] == 0 for r in rows)
    print(f"built end to end: {built} of {len(rows)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
