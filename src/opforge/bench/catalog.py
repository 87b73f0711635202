"""The catalog on the current device: every example operator at a size where launch overhead does not dominate,
forward and forward+backward, built straight from its request (the deterministic engine's kernel).

On a GPU each operator runs every path through the guarded harness and gets the derived figures; on a CPU only
the eager reference is timed (torch.utils.benchmark), the cost model is reported, and the report says what was
not measured.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import tempfile
from pathlib import Path

import torch

from opforge.bench.aot import shape_label
from opforge.bench.harness import StaleOutputError, copy_ceiling
from opforge.bench.opbench import BASELINES, COMPILE_MODES, OpCase, bench_case, figures
from opforge.bench.timing import device_name
from opforge.errors import InputError
from opforge.request import Request, load_request
from opforge.verify.inputs import make_tensor
from opforge.verify.tolerance import parse_dtype
from opforge.workspace import load_module

GPU_ELEMENTS = 64 * 2**20  # per largest input: pointwise kernels are bandwidth-bound well before this
NOT_MEASURED_CPU = ("fused kernels were not timed: without an accelerator they run in Triton's interpreter, whose "
                    "times measure Python; not measured: fused times, speedups, GB/s, % of the copy ceiling, "
                    "launches per call, torch.compile max-autotune; `opforge bench compile` gives the compiler's "
                    "registers, spills and occupancy for a GPU target without one")


def catalog_names(examples: Path) -> list[str]:
    return sorted(p.parent.name for p in examples.glob("*/request.yaml"))


def select(examples: Path, ops: list[str] | None) -> list[str]:
    known = catalog_names(examples)
    for name in ops or []:
        if name not in known:
            raise InputError("--ops", f"unknown operator {name!r} (known: {', '.join(known)})")
    return list(ops) if ops else known


def scaled_binding(req: Request, elements: int | None) -> dict:
    """The first P0 binding, its leading symbol (rows, batch) scaled so the largest input holds ~`elements`."""
    binding = dict(req.p0[0])
    if not elements:
        return binding
    n0 = max(math.prod(req.input_shape(s, binding)) for s in req.inputs)
    lead = next(iter(binding))
    binding[lead] = max(1, round(binding[lead] * elements / max(1, n0)))
    return binding


def _load_impl(req: Request, directory: Path):
    from opforge.codegen.build import generate_impl, plan_request

    path = directory / f"{req.name}_impl.py"
    path.write_text(generate_impl(req, plan_request(req)))
    return load_module(path, f"opforge_bench_{req.name}_impl")


def _op_case(req: Request, binding: dict, dtype, grad_names, device: str) -> OpCase:
    def make(seed: int):
        out = []
        for k, s in enumerate(req.inputs):
            shape, low, high = req.input_shape(s, binding), *(req.input_range(s, binding) or (None, None))
            if s.index:  # class labels: integers from their range, drawn where they are used
                g = torch.Generator(device=device).manual_seed(seed + 7919 * k)
                out.append(torch.randint(low, high, shape, generator=g, device=device,
                                         dtype=getattr(torch, s.dtypes[0])))
                continue
            if device == "cpu":
                out.append(make_tensor(shape, dtype, seed=seed + 7919 * k,
                                       distribution="uniform_small" if s.range else "normal", low=low, high=high))
                continue
            # drawn on the device: a CPU float64 draw of 64M elements per input would dominate the run
            g = torch.Generator(device=device).manual_seed(seed + 7919 * k)
            if s.range:
                t = torch.rand(shape, generator=g, device=device) * (high - low) + low
            else:
                t = torch.randn(shape, generator=g, device=device)
            out.append(t.to(dtype))
        return out
    return OpCase(make, [s.name for s in req.inputs], grad_names, req.attr_defaults, dtype, device)


def bench_op(req: Request, device: str, dtype: str, elements: int | None, baselines, ceiling, workdir: Path) -> dict:
    from opforge.codegen.build import plan_request
    from opforge.codegen.trace import trace_request
    from opforge.skills.op_api.stage import cost_model

    binding = scaled_binding(req, elements)
    traced = trace_request(req)
    grad_names = list(traced.grad_inputs) if req.backward else []
    cost = cost_model(dataclasses.replace(req, p0=[binding]), traced, plan_request(req, traced))
    cost = next(c for c in cost if c["dtype"] == dtype)
    gpu = device == "cuda"
    fused = getattr(_load_impl(req, workdir), req.name) if gpu else None
    case = _op_case(req, binding, parse_dtype(dtype), grad_names, device)
    measured = bench_case(case, req.load_reference(), fused, baselines=baselines)
    return {"op": req.name, "binding": binding, "dtype": dtype, "elements": cost["elements"],
            "times": measured["times"], "launches": measured["launches"], "cost": cost,
            "figures": figures(measured["times"], cost, ceiling["gbps"] if ceiling else None)}


def versions() -> dict:
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    return {"torch": torch.__version__, "triton": tv}


def run_catalog(examples: Path, ops: list[str] | None, *, dtype: str | None = None, elements: int | None = None,
                baselines=BASELINES, progress=None, checkpoint=None) -> dict:
    """The catalog report; `checkpoint(report)` after each operator (report["complete"] False until the end),
    so a run cut short still leaves what it measured."""
    names = select(examples, ops)
    device = device_name()
    gpu = device == "cuda"
    if not gpu:
        baselines = ("eager",)
    if elements is None:
        elements = GPU_ELEMENTS if gpu else None  # on a CPU the P0 size: the reference alone is timed
    ceiling = copy_ceiling(device) if gpu else None
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": device, "device_name": torch.cuda.get_device_name() if gpu else "cpu", **versions(),
              "kernel_timing": None if gpu else NOT_MEASURED_CPU, "baselines": list(baselines),
              "copy_ceiling": ceiling, "compile_modes": COMPILE_MODES, "complete": False, "ops": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            req = load_request(examples / name)
            dt = dtype or ("bfloat16" if "bfloat16" in req.dtypes else req.dtypes[0])
            if dt not in req.dtypes:
                raise InputError("--dtype", f"{name} does not support {dt} (it takes {', '.join(req.dtypes)})")
            try:
                report["ops"].append(bench_op(req, device, dt, elements, baselines, ceiling, Path(tmp)))
            except StaleOutputError as exc:  # recorded loudly, and the other operators still get measured
                report["ops"].append({"op": name, "dtype": dt, "error": f"stale outputs: {exc}"})
            except (RuntimeError, ValueError) as exc:  # a baseline that does not compile, a launch that fails
                report["ops"].append({"op": name, "dtype": dt, "error": f"{type(exc).__name__}: {exc}"[:500]})
            if checkpoint:
                checkpoint(report)
            if progress:
                progress(name)
    report["complete"] = True
    return report


def _ms(t):
    return f"{t['median_ms']:.3f}" if t else "—"


def _device_ms(t) -> str:
    # the profiler's summed kernel time: a median well above it is time spent issuing the call from the host
    return f"{t['device_ms']:.3f}" if t and t.get("device_ms") else "—"


def to_markdown(report: dict) -> str:
    lines = [f"# Catalog benchmark: {report['device_name']}", "",
             f"Date {report['date']}; torch {report['torch']}; Triton {report['triton']}; device {report['device']}.",
             ""]
    if report["kernel_timing"]:
        lines += [f"**Not measured:** {report['kernel_timing']}.", ""]
    else:
        lines += ["Every path timed in one run: CUDA events, L2 flushed before each repetition, rotating input "
                  "copies refilled with new values, outputs checked against the float32 reference every 10 calls. "
                  f"Copy ceiling (device-to-device, measured in this run): {report['copy_ceiling']['gbps']:.0f} GB/s. "
                  "torch.compile modes: " + ", ".join(f"{k} = {v}" for k, v in report["compile_modes"].items())
                  + ".", ""]
    paths = report["baselines"] + (["fused"] if not report["kernel_timing"] else [])
    head = "| op | shape | dtype | pass | " + " | ".join(f"{p} ms" for p in paths)
    if not report["kernel_timing"]:
        head += " | × eager | × compile | × max-autotune | GB/s | % ceiling | launches | fused device ms"
    lines += [head + " | eager bytes | fused bytes (model) |", "|" + "---|" * (head.count("|") + 2)]
    failed = [r for r in report["ops"] if "error" in r]
    for r in report["ops"]:
        if "error" in r:
            continue
        shape = shape_label(r["binding"])
        for p, cp in (("forward", "forward"), ("forward_backward", "backward")):
            if f"eager_{p}" not in r["times"]:
                continue
            cells = [r["op"], shape, r["dtype"], p.replace("_", "+")]
            cells += [_ms(r["times"].get(f"{v}_{p}")) for v in paths]
            if not report["kernel_timing"]:
                f = r["figures"].get(p, {})
                cells += [f"{f[k]:.2f}×" if k in f else "—" for k in
                          ("speedup_vs_eager", "speedup_vs_compile_default", "speedup_vs_compile_max_autotune")]
                cells += [f"{f['gbps']:.0f}" if "gbps" in f else "—",
                          f"{f['pct_of_copy_ceiling']:.0f}%" if "pct_of_copy_ceiling" in f else "—",
                          str(r["launches"].get(f"fused_{p}", "—")),
                          _device_ms(r["times"].get(f"fused_{p}"))]
            c = r["cost"].get(cp, {})
            cells += [f"{c.get('eager_bytes', 0):,}", f"{c.get('fused_bytes', 0):,}"]
            lines.append("| " + " | ".join(cells) + " |")
        d = r["figures"].get("backward_derived")
        if d:  # the backward alone: difference of the forward+backward and forward medians
            cells = [r["op"], shape, r["dtype"], "backward (derived)"] + ["—"] * len(paths)
            cells += [f"{d[k]:.2f}×" if k in d else "—" for k in
                      ("speedup_vs_eager", "speedup_vs_compile_default", "speedup_vs_compile_max_autotune")]
            lines.append("| " + " | ".join(cells + ["—"] * 6) + " |")
    if failed:
        lines += ["", "## Not measured (the run failed for these operators)", ""]
        lines += [f"- **{r['op']}** ({r['dtype']}): {r['error']}" for r in failed]
    lines += ["", "Bytes per pass are the cost model's (API_REPORT.md); for forward+backward the byte columns show "
                  "the backward pass alone. Fused device ms: the kernels' summed time per call (torch.profiler); a "
                  "median well above it is host time (dispatch, launches).", ""]
    return "\n".join(lines)
