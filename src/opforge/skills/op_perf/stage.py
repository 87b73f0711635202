"""Stage 7, performance: the reference paths timed in one run (eager in the op's dtype, torch.compile), the
cost model's bytes and launches for eager against fused, PERF.md, perf.json and perf.png.

On a CPU the fused kernel is not timed (the Triton interpreter measures Python), and the report says so;
the GPU harness and autotuning plug in at `_time_kernel` and the `perf` record of the state.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import torch

from opforge.bench.timing import device_name, timer_for
from opforge.orchestrator.atomic import write_json_atomic, write_text_atomic
from opforge.orchestrator.workspace import StageOutcome, Workspace
from opforge.request import Request
from opforge.skills.op_develop.stage import render_readme
from opforge.verify.tolerance import parse_dtype

NO_KERNEL_TIMING = ("kernel timing needs an accelerator: on this CPU the fused kernel runs in Triton's "
                    "interpreter, whose times measure Python, so only the reference paths are timed")


def _load(ws: Workspace, name: str):
    spec = importlib.util.spec_from_file_location(name, ws.path(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _passes(fn, tensors, attrs, grad_names, names):
    """Callables for forward-only and forward+backward of `fn` on fixed inputs."""
    ins = [t.detach().clone().requires_grad_(n in grad_names) for t, n in zip(tensors, names)]
    with torch.no_grad():
        outs = _as_tuple(fn(*ins, **attrs))
    grads = [torch.randn_like(o) for o in outs]

    def forward():
        with torch.no_grad():
            return fn(*ins, **attrs)

    def forward_backward():
        o = _as_tuple(fn(*ins, **attrs))
        torch.autograd.backward(o, grads)
        for t in ins:
            t.grad = None
    return forward, (forward_backward if grad_names else None)


def run(ws: Workspace, req: Request, state, progress=None) -> StageOutcome:
    spec = json.loads(ws.path("spec.json").read_text())
    api = json.loads(ws.path("api_report.json").read_text())
    device = device_name()
    timer = timer_for(device)
    golden = _load(ws, f"{req.name}_golden")
    ref = golden.REFERENCE
    attrs = dict(golden.ATTRIBUTES)
    grad_names = list(golden.GRAD_INPUTS) if spec["backward"] else []
    rows = []
    for binding in spec["p0_shapes"]:
        for dt in spec["supported_dtypes"]:
            dtype = parse_dtype(dt)
            tensors = [t.to(device) for t in golden.make_inputs(binding, dtype, seed=0)]
            row = {"binding": binding, "dtype": dt, "device": device, "times": {}}
            variants = {"eager": ref, "compile_default": torch.compile(ref)}
            for vname, fn in variants.items():
                fwd, fwdbwd = _passes(fn, tensors, attrs, grad_names, golden.INPUT_NAMES)
                row["times"][f"{vname}_forward"] = timer(fwd)
                if fwdbwd:
                    row["times"][f"{vname}_forward_backward"] = timer(fwdbwd)
            cost = next(c for c in api["cost"] if c["binding"] == binding and c["dtype"] == dt)
            row["cost"] = cost
            rows.append(row)
            if progress:
                progress(f"timed {dt} {binding}")
    headline = _headline(rows)
    perf = {"op_name": req.name, "device": device, "torch": torch.__version__,
            "kernel_timing": None if device == "cuda" else NO_KERNEL_TIMING,
            "baselines": ["eager", "compile_default"] + (["compile_max_autotune"] if device == "cuda" else []),
            "rows": rows, "tuning": {"rounds": 0, "history": [],
                                     "reason": "autotuning runs on an accelerator" if device != "cuda" else ""},
            "headline": headline}
    write_json_atomic(ws.path("perf.json"), perf)
    _plot(ws, rows)
    write_text_atomic(ws.path("PERF.md"), _md(req, perf))
    precision = json.loads(ws.path("precision.json").read_text()) if ws.path("precision.json").exists() else None
    write_text_atomic(ws.path("README.md"), render_readme(req, spec, precision, perf))
    state.perf["rounds"] = 0
    state.perf["history"] = []
    return StageOutcome("completed", headline, artifacts=["PERF.md", "perf.json", "perf.png", "README.md"])


def _headline(rows) -> str:
    r = rows[0]
    f = r["cost"]["forward"]
    text = (f"fused forward moves {f['fused_bytes'] / f['eager_bytes']:.0%} of eager's bytes in 1 launch instead "
            f"of {f['eager_kernels']} ({r['dtype']}, {r['binding']})")
    if "backward" in r["cost"]:
        b = r["cost"]["backward"]
        text += f"; backward {b['fused_bytes'] / b['eager_bytes']:.0%} in 1 launch instead of {b['eager_kernels']}"
    return text


def _md(req: Request, perf: dict) -> str:
    lines = [f"# Performance: {req.name}", "", f"Device: {perf['device']}; torch {perf['torch']}.", ""]
    if perf["kernel_timing"]:
        lines += [f"**Note:** {perf['kernel_timing']}.", ""]
    lines += ["## Reference paths (median, IQR)", "", "| shape | dtype | path | forward ms | forward+backward ms |",
              "|---|---|---|---|---|"]
    for r in perf["rows"]:
        for v in ("eager", "compile_default"):
            f = r["times"].get(f"{v}_forward")
            fb = r["times"].get(f"{v}_forward_backward")
            fb_s = f"{fb['median_ms']:.3f} ± {fb['iqr_ms']:.3f}" if fb else "—"
            lines.append(f"| {r['binding']} | {r['dtype']} | {v} | {f['median_ms']:.3f} ± {f['iqr_ms']:.3f} | {fb_s} |")
    lines += ["", "## Bytes and launches: eager against fused (cost model, API_REPORT.md)", "",
              "| shape | dtype | pass | eager launches | fused launches | eager bytes | fused bytes | ratio |",
              "|---|---|---|---|---|---|---|---|"]
    for r in perf["rows"]:
        for p in ("forward", "backward"):
            c = r["cost"].get(p)
            if c:
                lines.append(f"| {r['binding']} | {r['dtype']} | {p} | {c['eager_kernels']} | {c['fused_kernels']} | "
                             f"{c['eager_bytes']:,} | {c['fused_bytes']:,} | "
                             f"{c['eager_bytes'] / c['fused_bytes']:.1f}× |")
    lines += ["", "For memory-bound kernels the byte ratio bounds the speedup over eager from above once "
                  "launch overhead is amortised.", "", "## Tuning history", "",
              f"{perf['tuning']['rounds']} rounds. {perf['tuning']['reason']}", "", "![perf](perf.png)", ""]
    return "\n".join(lines)


def _plot(ws: Workspace, rows) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{r['dtype']}\n{'x'.join(str(v) for v in r['binding'].values())}" for r in rows]
    xs = range(len(rows))
    width = 0.2
    series = [k for k in rows[0]["times"]]
    for i, k in enumerate(series):
        ax1.bar([x + (i - len(series) / 2) * width for x in xs], [r["times"][k]["median_ms"] for r in rows],
                width, label=k.replace("_", " "))
    ax1.set_xticks(list(xs), labels, fontsize=7)
    ax1.set_ylabel("ms (median)")
    ax1.set_title(f"reference paths on {rows[0]['device']}")
    ax1.legend(fontsize=7)
    passes = [p for p in ("forward", "backward") if p in rows[0]["cost"]]
    for i, p in enumerate(passes):
        ax2.bar([x + (i - 1) * width * 2 for x in xs], [r["cost"][p]["eager_bytes"] / 2**20 for r in rows],
                width, label=f"{p} eager")
        ax2.bar([x + (i - 1) * width * 2 + width for x in xs], [r["cost"][p]["fused_bytes"] / 2**20 for r in rows],
                width, label=f"{p} fused")
    ax2.set_xticks(list(xs), labels, fontsize=7)
    ax2.set_ylabel("MiB moved")
    ax2.set_title("bytes per call: eager vs fused (cost model)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    tmp = ws.path("perf.png.tmp")
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    tmp.replace(ws.path("perf.png"))
