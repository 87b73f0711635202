"""Which fused step of a generated kernel goes wrong: its intermediates against the golden graph, node by node.

The generated kernels name every statement after the traced graph node it computes (`mul_3 = …  # aten.mul`).
Under Triton's interpreter a kernel is a Python function run once per program, so its locals can be read
when each program returns (`sys.settrace`): the block of every node, with the offsets (`offs`, or `rows` and
`cols`) that place it in the tensor. The golden graph is run in float64 on the same inputs
(`torch.fx.Interpreter`), and the first node in graph order whose kernel values leave the float64 values
while its own inputs agree is the step that diverges. This reads the kernel as it is on disk, so a bug
planted in the impl (or made by a model) is found where it is, without a special debug build.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from opforge.workspace import load_module

REL_TOL = 1e-3  # float32 compute against float64: a correct step stays orders of magnitude below this


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm, attrs: dict):
        super().__init__(gm)
        self.values: dict[str, torch.Tensor] = {}
        self.attrs = attrs

    def call_function(self, target, args, kwargs):
        def bind(a):  # the graph's run-time attributes (AttrRef) take their values
            if isinstance(a, (list, tuple)):
                return type(a)(bind(x) for x in a)
            return self.attrs[a.name] if type(a).__name__ == "AttrRef" else a
        return super().call_function(target, bind(args), {k: bind(v) for k, v in kwargs.items()})

    def run_node(self, n):
        out = super().run_node(n)
        if isinstance(out, torch.Tensor):
            self.values[n.name] = out.detach()
        return out


def golden_values(gm: torch.fx.GraphModule, args: list[torch.Tensor], attrs: dict) -> dict[str, torch.Tensor]:
    """Every node of a traced graph evaluated in float64 on `args`, with run-time attributes `attrs`."""
    rec = _Recorder(gm, attrs)
    with torch.no_grad():
        rec.run(*[a.double() for a in args])
    return rec.values


def record_kernels(impl_path: str | Path, call) -> list[tuple[str, dict]]:
    """Run `call()` and return (kernel name, locals at return) for every program of every kernel defined in
    the impl file. Only meaningful under the interpreter, where kernels are Python frames."""
    target = str(Path(impl_path).resolve())
    records: list[tuple[str, dict]] = []

    def tracer(frame, event, arg):
        code = frame.f_code
        if code.co_filename != target or not code.co_name.endswith("_kernel"):
            return None

        def local(frame, event, arg):
            if event == "return":
                records.append((code.co_name, dict(frame.f_locals)))
            return local
        return local

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(old)
    return records


def _data(v):
    h = getattr(v, "handle", None)
    data = getattr(h, "data", None)
    return None if data is None else np.asarray(data)


def _int(v) -> int:
    d = _data(v)
    return int(d.reshape(-1)[0]) if d is not None else int(v)


def _positions(loc: dict):
    """(row index, column index) arrays of this program's block, and the grid they index: a row kernel's
    (n_rows, n_cols), or a flat kernel's single row of n_elements."""
    if "rows" in loc and "cols" in loc:
        if "n_rows" not in loc or "n_cols" not in loc:  # an attention kernel's (query, key) tile: not a node grid
            return None
        return _data(loc["rows"]), _data(loc["cols"]), _int(loc["n_cols"]), _int(loc["n_rows"])
    offs = _data(loc.get("offs"))
    if offs is None or "n_elements" not in loc:
        return None
    return np.zeros((1, 1), dtype=np.int64), offs.reshape(1, -1), _int(loc["n_elements"]), 1


def _flat(golden: torch.Tensor, n_rows: int, n_cols: int) -> np.ndarray | None:
    """A golden node as an (n_rows, n_cols) grid, in the kernel's iteration order (or None if it does not
    map: a broadcast whose layout the kernel does not share)."""
    if golden.numel() == n_rows * n_cols:
        return golden.reshape(n_rows, n_cols).numpy()
    if golden.numel() == n_rows:
        return golden.reshape(n_rows, 1).numpy()
    if golden.numel() == n_cols:
        return golden.reshape(1, n_cols).numpy()
    if golden.numel() == 1:
        return golden.reshape(1, 1).numpy()
    return None


def compare_steps(records: list[tuple[str, dict]], golden: dict[str, torch.Tensor], kernel_prefix: str,
                  order: list[str]) -> list[dict]:
    """Per graph node computed by the kernel: the largest error against float64, relative to the node's scale."""
    worst: dict[str, dict] = {}
    for kname, loc in records:
        if kernel_prefix not in kname:
            continue
        pos = _positions(loc)
        if pos is None:
            continue
        rows, cols, n_cols, n_rows = pos
        for name in order:
            if name not in loc or name not in golden:
                continue
            val = _data(loc[name])
            grid = _flat(golden[name], max(n_rows, 1), n_cols)
            if val is None or grid is None:
                continue
            val = val.reshape(1, 1) if val.ndim == 0 else (val.reshape(1, -1) if val.ndim == 1 else val)
            r = rows if val.shape[0] > 1 and grid.shape[0] > 1 else np.zeros((1, 1), dtype=np.int64)
            c = cols if val.shape[1] > 1 and grid.shape[1] > 1 else np.zeros((1, 1), dtype=np.int64)
            rr, cc = np.broadcast_arrays(r, c)
            ok = (rr < grid.shape[0]) & (cc < grid.shape[1])
            if not ok.any():
                continue
            kv = np.broadcast_to(val, rr.shape)[ok].astype(np.float64)
            gv = grid[rr[ok], cc[ok]]
            fin = np.isfinite(gv) & np.isfinite(kv)
            if not fin.any():
                continue
            scale = float(np.abs(grid[np.isfinite(grid)]).max()) if np.isfinite(grid).any() else 1.0
            err = float(np.abs(kv[fin] - gv[fin]).max()) / max(scale, 1e-30)
            w = worst.setdefault(name, {"node": name, "rel_error": 0.0, "kernel": kname})
            w["rel_error"] = max(w["rel_error"], err)
    return [worst[n] for n in order if n in worst]


def first_divergence(steps: list[dict], gm: torch.fx.GraphModule, tol: float = REL_TOL) -> dict | None:
    """The first node in graph order that is off while every node it reads (that the kernel holds) is not."""
    by_name = {s["node"]: s for s in steps}
    nodes = {n.name: n for n in gm.graph.nodes}
    for s in steps:
        if s["rel_error"] <= tol:
            continue
        inputs = [a.name for a in nodes[s["node"]].all_input_nodes if a.name in by_name]
        if all(by_name[i]["rel_error"] <= tol for i in inputs):
            node = nodes[s["node"]]
            return {**s, "op": str(node.target), "inputs": inputs}
    return None


def source_line(impl_path: str | Path, kernel: str, name: str) -> str | None:
    """The statement that computes `name` in `kernel`, as written in the impl."""
    inside = False
    for i, line in enumerate(Path(impl_path).read_text().splitlines(), 1):
        if line.startswith("def "):
            inside = line.startswith(f"def {kernel}(")
        if inside and line.strip().startswith(f"{name} = "):
            return f"line {i}: {line.strip()}"
    return None


def localise(ws_dir: str | Path, case_id: str, seed: int, output: str) -> dict:
    """Replay one failing case of a workspace and name the kernel step where `output` goes wrong."""
    from opforge.codegen.trace import trace_request
    from opforge.request import load_request
    from opforge.verify.cases import build_inputs, find_case, floating_pairs, grad_outputs, interpreter_blocks

    ws = Path(ws_dir)
    spec = json.loads((ws / "spec.json").read_text())
    case = find_case(json.loads((ws / "design.json").read_text()), case_id)
    op = spec["op_name"]
    golden = load_module(ws / f"{op}_golden.py", f"_{op}_golden_steps")
    impl_path = (ws / f"{op}_impl.py").resolve()
    impl = load_module(impl_path, f"_{op}_impl_steps")
    traced = trace_request(load_request(ws / "request"))
    tensors = build_inputs(golden, case, seed)
    attrs = {**golden.ATTRIBUTES, **(case.get("attrs") or {})}
    backward = output not in golden.OUTPUT_NAMES
    names, grads_of = list(golden.INPUT_NAMES), list(golden.GRAD_INPUTS)
    truth = golden.forward(*tensors, compute_dtype=torch.float64, **attrs)
    g_outs = grad_outputs([t.shape for t in truth], tensors[0].dtype, seed) if backward else []

    def call():
        ins = [t.clone().requires_grad_(backward and n in grads_of) for t, n in zip(tensors, names)]
        outs = getattr(impl, op)(*ins, **attrs)
        if backward:
            outs = outs if isinstance(outs, tuple) else (outs,)
            floats, grads = floating_pairs(outs, g_outs)
            torch.autograd.grad(floats, [t for t in ins if t.requires_grad], grads)

    with interpreter_blocks(impl, tensors):  # the blocks that the failing run ran
        records = record_kernels(impl_path, call)
    gm = traced.joint if backward else traced.forward
    gold = golden_values(gm, list(tensors) + list(g_outs), attrs)
    steps = compare_steps(records, gold, "_backward" if backward else "_forward", [n.name for n in gm.graph.nodes])
    first = first_divergence(steps, gm)
    if first:
        first["source"] = source_line(impl_path, first["kernel"], first["node"])
    return {"case": case_id, "seed": seed, "output": output, "steps_compared": len(steps), "first": first,
            "worst": sorted(steps, key=lambda s: -s["rel_error"])[:5]}


def localise_in_subprocess(ws_dir: str | Path, case_id: str, seed: int, output: str, timeout: int = 600) -> dict:
    """`localise` in a fresh interpreter that runs the kernels in Triton's interpreter on the CPU (kernels only
    have readable intermediates there), so neither a GPU context nor a broken impl can touch this process."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "opforge.verify.kernel_steps", str(ws_dir), case_id, str(seed),
                           output], capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"case": case_id, "output": output, "first": None, "error": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Name the generated kernel step where a failing case diverges.")
    ap.add_argument("workspace")
    ap.add_argument("case")
    ap.add_argument("seed", type=int)
    ap.add_argument("output")
    a = ap.parse_args()
    print(json.dumps(localise(a.workspace, a.case, a.seed, a.output), default=str))
