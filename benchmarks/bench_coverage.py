"""How many problems of a problem set the engine lowers: each problem file in the common `Model` convention (an
nn.Module `Model(*get_init_inputs())` called on `get_inputs()`) is converted to a request, then planned by
`opforge op plan --no-cost`, in batches, each in its own process (memory and time limited). Prints the verdict per
problem, the share that builds, the ops that block the rest, most frequent first, and the seconds per reference.
Asserts nothing.

    .venv/bin/python benchmarks/bench_coverage.py PROBLEM_DIR [PROBLEM_DIR...] [--out DIR] [--backward] [--json F]
        [--batch K] [--workers N] [--build N]

With `--build N`, a fixed sample of N problems that lower is then built end to end (`opforge op run --quick`: the
seven stages, Level 0 at the p0 shapes scaled down) and each is checked against float64 by the precision stage:
the problems at evenly spaced places of the sweep's order among those whose fixed sizes (the module's
parameters, which the quick run cannot scale down) hold at most QUICK_ELEMENTS elements per input.

The conversion: the forward's tensor arguments, the module's parameters and its buffers are the request's inputs
(parameters learnable, buffers not); a size that a parameter or buffer also has is written as a number, every
other size of the arguments as a symbol (one per distinct value), so the trace's probes vary batch and spatial
sizes but never a size the module's construction fixed. Non-tensor arguments are attributes with their values.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import inspect
import json
import math
import re
import resource
import subprocess
import time
from pathlib import Path

import torch
import yaml
from bench_op_plan import seconds_summary  # this folder is on the path when run as a script

ROOT = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 10 << 30
# a build's compile check allocates (and never touches) the inputs and outputs at the P0 shapes: address space
BUILD_MEMORY_LIMIT = 20 << 30
TIME_LIMIT = 300
BUILD_TIME_LIMIT = 1800  # one end-to-end build in the Triton interpreter
QUICK_ELEMENTS = 1 << 16  # what a quick run scales each input down to
SYMBOLS = "NCDHWLMKPQRSTUVXYZ"
WRAPPER = '''

# -- the request's entry point: the module above, called with the request's inputs as its parameters
with torch.device("meta"):  # every parameter and floating buffer comes in through the call below
    _MODEL = Model(*get_init_inputs())
for _module in _MODEL.modules():  # the others (a batch norm's step count) stay the module's own
    _module._buffers.update({{k: torch.zeros_like(b, device="cpu") for k, b in _module._buffers.items()
                             if b is not None and not b.is_floating_point()}})


def opforge_forward({args}):
    state = {{{state}}}
    return torch.func.functional_call(_MODEL, state, ({call},))
'''


def _name(raw: str, taken: set[str]) -> str:
    name = re.sub(r"[^a-z0-9_]", "_", raw.lower()).strip("_") or "t"
    if not name[0].isalpha():
        name = f"t_{name}"
    base, i = name, 1
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def _load(path: Path) -> dict:
    scope: dict = {"__name__": f"_problem_{path.stem}"}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    return scope


def convert(path: Path, out: Path, backward: bool) -> Path:
    """Write the request folder for one problem file; raise on a file that does not follow the convention."""
    scope = _load(path)
    bounds = []  # the upper bounds torch.randint drew the integer inputs under (class labels)
    randint = torch.randint

    def recording(*a, **k):
        bounds.append(a[1] if len(a) > 1 and isinstance(a[1], int) else k.get("high", a[0]))
        return randint(*a, **k)

    torch.randint = recording
    try:
        with torch.device("meta"):  # shapes only: nothing is drawn or allocated
            args = list(scope["get_inputs"]())
            model = scope["Model"](*scope["get_init_inputs"]())
    finally:
        torch.randint = randint
    params = list(model.named_parameters())
    buffers = [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]
    fixed = {s for _, t in params + buffers for s in t.shape}
    values: dict[int, str] = {}
    taken: set[str] = set()

    def dims(t: torch.Tensor) -> list:
        out_dims = []
        for s in t.shape:
            if s in fixed or s == 1:
                out_dims.append(int(s))
            else:
                values.setdefault(int(s), SYMBOLS[len(values)] if len(values) < len(SYMBOLS) else f"S{len(values)}")
                out_dims.append(values[int(s)])
        return out_dims

    arg_names = [p for p in inspect.signature(scope["Model"].forward).parameters if p != "self"]
    inputs, attributes, fargs = {}, {}, []
    for pname, a in zip(arg_names, args):
        name = _name(pname, taken)
        if isinstance(a, torch.Tensor):
            dtype = str(a.dtype).removeprefix("torch.")
            entry = {"shape": dims(a), "dtype": [dtype] if a.is_floating_point() else dtype}
            if a.is_floating_point():
                entry["requires_grad"] = backward
            else:
                entry["range"] = [0, 2] if a.dtype == torch.bool else [0, int(bounds.pop(0)) if bounds else 2]
            inputs[name] = entry
        else:
            kind = {bool: "bool", int: "int", float: "float"}.get(type(a), "str")
            attributes[name] = {"type": kind, "default": a}
        fargs.append(name)
    call = list(fargs)  # the forward's own arguments; the module's tensors follow them
    state = []
    for pname, t in params + buffers:
        name = _name(pname, taken)
        first = next(iter(inputs), None)  # the module's tensors take the first tensor input's dtype
        inputs[name] = {"shape": [int(s) for s in t.shape], "dtype": f"like {first}" if first else ["float32"],
                        "requires_grad": backward and t.requires_grad}
        fargs.append(name)
        state.append(f"{pname!r}: {name}")
    if not inputs:
        raise ValueError("no tensor input")
    d = out / path.stem.lower()
    d.mkdir(parents=True, exist_ok=True)
    (d / "reference.py").write_text(path.read_text() + WRAPPER.format(
        args=", ".join(fargs), state=", ".join(state), call=", ".join(call)))
    doc = {"name": _name(path.stem, set()), "description": f"converted from {path.name}", "category": "other",
           "inputs": inputs, "reference": "reference.py:opforge_forward", "backward": backward,
           "shapes": {"p0": [{sym: v for v, sym in values.items()}]}}
    if attributes:
        doc["attributes"] = attributes
    (d / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


def _limit_memory(limit: int = MEMORY_LIMIT) -> None:
    # a reference traced at its own (large) sizes must not take the machine down with it
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _row(request, row: dict) -> dict:
    if "buildable" not in row:  # refused before planning: the request or the reference is at fault
        err = row.get("error", row)
        row = {"buildable": False, "error": f"{err.get('where')}: {err.get('what')}" if isinstance(err, dict) else err}
    return {**row, "request": str(request)}


def _plan(requests: list[Path]) -> list[dict]:
    """`opforge op plan --json` on a batch of requests in one process (as a sweep runs it: the imports are paid
    once), memory and time limited; a batch whose process dies is planned again one request per process, so
    that the request at fault is the only one lost."""
    cmd = [str(ROOT / ".venv" / "bin" / "opforge"), "op", "plan", *map(str, requests), "--json", "--no-cost"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=TIME_LIMIT * len(requests),
                           preexec_fn=_limit_memory)
        rows = json.loads(r.stdout)
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        if len(requests) > 1:
            return [row for req in requests for row in _plan([req])]
        why = f"over {TIME_LIMIT} s" if isinstance(exc, subprocess.TimeoutExpired) else \
            f"exit {r.returncode}: {(r.stderr.strip().splitlines() or ['no output'])[-1][:200]}"
        return [{"request": str(requests[0]), "buildable": False, "error": f"plan: {why}"}]
    return [_row(req, row) for req, row in zip(requests, rows if len(requests) > 1 else [rows])]


def build_sample(rows: list[dict], n: int) -> list[Path]:
    """N of the requests that lower, evenly spaced in the sweep's order, among those a quick run can scale down
    to QUICK_ELEMENTS per input (an input whose every size is fixed by the module cannot be scaled)."""
    def small(request: Path) -> bool:
        doc = yaml.safe_load((request / "request.yaml").read_text())
        fixed = [[d for d in spec["shape"] if isinstance(d, int)] for spec in doc["inputs"].values()]
        return all(math.prod(dims) <= QUICK_ELEMENTS for dims in fixed)

    eligible = [Path(r["request"]) for r in rows if r["buildable"] and small(Path(r["request"]))]
    if n >= len(eligible):
        return eligible
    return [eligible[round(i * (len(eligible) - 1) / max(1, n - 1))] for i in range(n)]


def build(request: Path, out: Path) -> dict:
    """`opforge op run --quick` on one request, in its own process: the terminal status and the precision
    stage's counts (its cases compare every output with the float64 golden)."""
    ws = out / "workspaces" / request.name
    cmd = [str(ROOT / ".venv" / "bin" / "opforge"), "op", "run", str(request), "--out", str(ws), "--force",
           "--quick", "--json"]
    start = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=BUILD_TIME_LIMIT,
                           preexec_fn=lambda: _limit_memory(BUILD_MEMORY_LIMIT))
        state = json.loads(r.stdout)
        status, reason = state["terminal"]["status"], state["terminal"]["reason"]
    except subprocess.TimeoutExpired:
        status, reason = "TIMEOUT", f"over {BUILD_TIME_LIMIT} s"
    except json.JSONDecodeError:
        status, reason = "ERROR", (r.stderr.strip().splitlines() or ["no output"])[-1][:200]
    precision = ws / "precision.json"
    summary = json.loads(precision.read_text())["summary"] if precision.exists() else {}
    return {"request": request.name, "seconds": round(time.perf_counter() - start, 1), "status": status,
            "reason": reason, "cases": summary.get("total"), "passed": summary.get("passed"),
            "skipped": summary.get("skipped"), "failed": summary.get("failed"),
            "matches_float64": bool(summary.get("all_passed"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="folders of problem files")
    ap.add_argument("--out", type=Path, default=Path("coverage-requests"), help="where the requests are written")
    ap.add_argument("--backward", action="store_true", help="request the backward too")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    ap.add_argument("--workers", type=int, default=2, help="processes planning at once")
    ap.add_argument("--batch", type=int, default=10, help="requests planned one after another in each process")
    ap.add_argument("--build", type=int, default=0, metavar="N",
                    help="then build a fixed sample of N lowered problems end to end (quick) against float64")
    args = ap.parse_args()
    requests, failed = [], {}
    for folder in args.dirs:
        for path in sorted(folder.glob("*.py"), key=lambda p: (len(p.stem.split("_")[0]), p.stem)):
            try:
                requests.append(convert(path, args.out / folder.name, args.backward))
            except Exception as exc:  # a problem file outside the convention is counted, not fatal
                failed[path.name] = f"{type(exc).__name__}: {exc}"
    start = time.perf_counter()
    rows, blockers = [], collections.Counter()
    batches = [requests[i:i + args.batch] for i in range(0, len(requests), args.batch)]
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        for row in (row for batch in pool.map(_plan, batches) for row in batch):  # printed in order, as they finish
            rows.append(row)
            if row["buildable"]:
                verdict = "builds"
            elif row.get("unsupported"):
                verdict = f"BLOCKED_API: {', '.join(row['unsupported'])}"
                blockers.update(set(row["unsupported"]))
            else:
                verdict = f"error: {row.get('error')}"
                blockers["(error) " + str(row.get("error")).split(": ")[-1][:70]] += 1
            print(f"{Path(row['request']).name:60.60s} {row.get('seconds', 0.0):6.2f} s  {verdict[:150]}",
                  flush=True)
    wall = time.perf_counter() - start
    for name, why in failed.items():
        print(f"{name:60.60s} not converted: {why[:120]}")
    built = sum(r["buildable"] for r in rows)
    total = len(rows) + len(failed)
    print(f"\n{built} of {total} lower ({len(failed)} not converted), {wall:.0f} s wall; blocking, most "
          "frequent first:")
    for op, n in blockers.most_common(40):
        print(f"  {n:4d}  {op}")
    times = [r["seconds"] for r in rows if "seconds" in r]
    if times:
        print(f"op plan per reference, {args.batch} to a process and {args.workers} processes at once: "
              f"{seconds_summary(times)} (each process's start, about 2.5 s of imports, not counted)")
    builds = []
    if args.build:
        sample = build_sample(rows, args.build)
        print(f"\nbuilding {len(sample)} of them end to end (op run --quick), one after another:")
        for request in sample:
            b = build(request, args.out)
            builds.append(b)
            cases = (f"{b['passed']} of {b['cases']} precision cases pass" + (f", {b['skipped']} skipped (sizes the "
                     "reference refuses)" if b["skipped"] else "")) if b["cases"] else "no precision report"
            why = "" if b["status"] == "SUCCESS" else f" ({b['reason']})"
            print(f"{b['request']:60.60s} {b['seconds']:7.1f} s  {b['status']}: {cases}{why}", flush=True)
        good = sum(b["status"] == "SUCCESS" and b["matches_float64"] for b in builds)
        print(f"{good} of {len(builds)} build end to end and match float64")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "not_converted": failed, "builds": builds}, indent=2,
                                        default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
