"""How fast and how right `opforge helper` is: the index of torch plus torch-npu (and opforge) built from nothing,
its size, then every question of tests/data/helper/qa*.yaml asked of it, timing each (qa_heldout*.yaml were
written blind to the helper and its knowledge cards: they measure questions it was not tuned on). Prints the
build's seconds per corpus, top-1/top-3 citation accuracy and answer accuracy per set, and the median and slowest
answer, and the whole `helper ask` command's time. Asserts nothing.

    .venv/bin/python benchmarks/bench_helper.py [--npu-wheel torch_npu-2.13.0-*.whl] [--json FILE]
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
SETS = sorted((ROOT / "tests" / "data" / "helper").glob("qa*.yaml"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npu-wheel", type=Path, help="the torch-npu wheel (default: the cached one, else downloaded)")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-helper-") as tmp:
        index = str(Path(tmp, "index.sqlite"))
        cmd = [OPFORGE, "helper", "index", "--corpus", "torch,torch-npu,opforge", "--index", index, "--json"]
        cmd += ["--npu-wheel", str(args.npu_wheel)] if args.npu_wheel else []
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(f"index: exit {proc.returncode}: {proc.stdout[-400:]}{proc.stderr[-400:]}", file=sys.stderr)
            return 1
        built = json.loads(proc.stdout)
        figures = {"index": built, "sets": {}}
        for corpus in built["corpora"]:
            print(f"{corpus['corpus']:<10} {corpus['files']:>6} files {corpus['chunks']:>7} passages "
                  f"{corpus['seconds']:>7} s")
        torch_npu = sum(c["seconds"] for c in built["corpora"] if c["corpus"] in ("torch", "torch-npu"))
        print(f"index: {built['size_mb']} MB; torch + torch-npu built in {torch_npu:.1f} s (asked: under 180 s)")
        for qa in SETS:
            proc = subprocess.run([OPFORGE, "helper", "eval", str(qa), "--index", index, "--json"],
                                  capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                print(f"{qa.name}: exit {proc.returncode}: {proc.stderr[-300:]}", file=sys.stderr)
                return 1
            r = json.loads(proc.stdout)
            figures["sets"][qa.name] = {k: v for k, v in r.items() if k != "rows"}
            print(f"{qa.name:<17} {r['questions']:>3} questions: top-1 {r['top1']:.0%}, top-3 {r['top3']:.0%}, "
                  f"answers right {r['answer']:.0%}; median {r['median_s'] * 1000:.0f} ms, slowest "
                  f"{r['max_s'] * 1000:.0f} ms (asked: under 1 s)")
        walls = []
        for _ in range(5):  # the whole command, as a user waits for it: start-up, index opened, answer printed
            start = time.perf_counter()
            subprocess.run([OPFORGE, "helper", "ask", "How do I register a kernel for my device from Python?",
                            "--index", index], capture_output=True, cwd=ROOT)
            walls.append(time.perf_counter() - start)
        figures["ask_command_s"] = sorted(walls)[2]
        print(f"`opforge helper ask` end to end: median {figures['ask_command_s']:.2f} s of 5")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
