"""Stage 7, performance: the reference paths timed in one run (eager in the op's dtype, torch.compile), the
cost model's bytes and launches for eager against fused, PERF.md, perf.json and perf.png.

On a CPU the fused kernel is not timed (the Triton interpreter measures Python), and the report says so;
the GPU harness and autotuning plug in at `_time_kernel` and the `perf` record of the state.
"""

from __future__ import annotations

import json
import math
import re
import sys

import torch

from opforge.bench.aot import FIGURE_COLUMNS, figure_cells, shape_label
from opforge.bench.harness import StaleOutputError, copy_ceiling
from opforge.bench.opbench import COMPILE_MODES, OpCase, bench_case, figures
from opforge.bench.roofline import classify, describe
from opforge.bench.timing import device_name
from opforge.i18n import N_, _, ngettext
from opforge.request import Request
from opforge.skills.op_develop.stage import render_readme
from opforge.verify.tolerance import parse_dtype
from opforge.workspace import StageOutcome, Workspace, load_module
from opforge.workspace.atomic import write_json_atomic, write_text_atomic

NO_KERNEL_TIMING = N_("kernel timing needs an accelerator: on this CPU the fused kernel runs in Triton's "
                      "interpreter, whose times measure Python, so only the reference paths are timed")
NO_TUNING = N_("autotuning runs on an accelerator")


def _load(ws: Workspace, name: str):
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(ws.path(f"{name}.py")):
        return sys.modules[name]  # an impl registers torch.library ops: load it once per process
    return load_module(ws.path(f"{name}.py"), name)


def _case(golden, binding, dtype, grad_names, device) -> OpCase:
    return OpCase(lambda seed: golden.make_inputs(binding, dtype, seed=seed), golden.INPUT_NAMES, grad_names,
                  golden.ATTRIBUTES, dtype, device)


def run(ws: Workspace, req: Request, state, progress=None) -> StageOutcome:
    try:
        return _run(ws, req, state, progress)
    except StaleOutputError as exc:
        return StageOutcome("failed", f"the timing harness caught stale outputs: {exc}", retryable=False)


def _run(ws: Workspace, req: Request, state, progress=None) -> StageOutcome:
    spec = json.loads(ws.path("spec.json").read_text())
    api = json.loads(ws.path("api_report.json").read_text())
    device = device_name()
    golden = _load(ws, f"{req.name}_golden")
    grad_names = list(golden.GRAD_INPUTS) if spec["backward"] else []
    gpu = device == "cuda"
    state.perf.update(rounds=0, history=[], best=None, last_improvement=None, rounds_without_gain=0)
    impl = _load(ws, f"{req.name}_impl") if gpu else None
    ceiling = copy_ceiling(device) if gpu else None
    tuning = {"rounds": 0, "history": [], "shapes": [], "reason": NO_TUNING}
    if gpu:
        from opforge.skills.op_perf.tune import tune

        d0 = parse_dtype(spec["supported_dtypes"][0])
        for binding in spec["p0_shapes"]:  # one search per shape, the first dtype's; sizes shared start from it
            case = _case(golden, binding, d0, grad_names, device)
            eager = bench_case(case, golden.REFERENCE, None, baselines=("eager",))["times"]
            key = "eager_forward_backward" if grad_names else "eager_forward"
            result = tune(ws, req, spec, impl, golden, binding, case, eager[key]["median_ms"], state, progress)
            tuning["shapes"].append({k: result[k] for k in ("binding", "keys", "baseline_ms", "best_ms", "best",
                                                             "stop", "objective", "written")})
            tuning["history"] += result["history"]
            if not result["keys"]:  # an impl without per-size entries: one config for every size, tuned once
                break
        tuning.update(rounds=len(tuning["history"]),
                      reason="; ".join(f"{s['binding']}: stopped, {s['stop']}" for s in tuning["shapes"]))
    rows = []
    shapes, dtypes = spec["p0_shapes"], spec["supported_dtypes"]
    quick = bool(state.options.get("quick")) and not gpu
    if quick:  # only the reference paths run here: one shape and dtype show their CPU times
        shapes, dtypes = shapes[:1], dtypes[:1]
    for binding in shapes:
        for dt in dtypes:
            dtype = parse_dtype(dt)
            case = _case(golden, binding, dtype, grad_names, device)
            fused = getattr(impl, req.name) if gpu else None
            measured = bench_case(case, golden.REFERENCE, fused)
            cost = next(c for c in api["cost"] if c["binding"] == binding and c["dtype"] == dt)
            row = {"binding": binding, "dtype": dt, "device": device, "times": measured["times"],
                   "launches": measured["launches"], "cost": cost}
            row["figures"] = figures(row["times"], cost, ceiling["gbps"] if ceiling else None)
            rows.append(row)
            if progress:
                progress(f"timed {dt} {binding}")
    headline = _headline(rows)
    compiled = json.loads(ws.path("compile.json").read_text()) if ws.path("compile.json").exists() else None
    perf = {"op_name": req.name, "device": device, "torch": torch.__version__,
            "device_name": torch.cuda.get_device_name() if gpu else "cpu",
            "kernel_timing": None if gpu else NO_KERNEL_TIMING,
            "copy_ceiling": ceiling, "compile_modes": COMPILE_MODES,
            "baselines": ["eager", "compile_default"] + (["compile_max_autotune"] if gpu else []),
            "rows": rows, "tuning": tuning, "headline": headline, "compiled": _compiled(compiled, spec),
            "quick": quick, "perf_target": dict(req.perf_target)}
    write_json_atomic(ws.path("perf.json"), perf)
    _plot(ws, rows, ceiling)
    write_text_atomic(ws.path("PERF.md"), render_perf(perf))
    precision = json.loads(ws.path("precision.json").read_text()) if ws.path("precision.json").exists() else None
    write_text_atomic(ws.path("README.md"), render_readme(req, spec, precision, perf))
    artifacts = ["PERF.md", "perf.json", "perf.png", "README.md"]
    if any(s["written"] for s in tuning["shapes"]):
        artifacts.append(f"{req.name}_impl.py")
    return StageOutcome("completed", headline, artifacts=artifacts)


def _launches(n: int) -> str:
    return f"{n} launch{'es' if n != 1 else ''}"


def _headline(rows) -> str:
    r = rows[0]
    f = r["cost"]["forward"]
    text = (f"fused forward moves {f['fused_bytes'] / f['eager_bytes']:.0%} of eager's bytes in "
            f"{_launches(f['fused_kernels'])} instead of {f['eager_kernels']} ({r['dtype']}, {r['binding']})")
    if "backward" in r["cost"]:
        b = r["cost"]["backward"]
        text += (f"; backward {b['fused_bytes'] / b['eager_bytes']:.0%} in {_launches(b['fused_kernels'])} instead "
                 f"of {b['eager_kernels']}")
    return text


def _compiled(report: dict | None, spec: dict) -> dict | None:
    """Stage 5's compile for the GPU target, at the first dtype: what the compiler says of each kernel."""
    if report is None:
        return None
    if report["toolchain"]["unavailable"]:
        return {"arch": report["arch"], "unavailable": report["toolchain"]["unavailable"], "kernels": []}
    dt = spec["supported_dtypes"][0]
    keep = ("binding", "pass", "kernel", "num_warps", "registers", "spill_bytes", "shared_bytes", "loads", "loads_128",
            "stores", "stores_128", "wgmma", "mma", "occupancy", "grid", "programs", "waves", "error")
    return {"arch": report["arch"], "dtype": dt, "unavailable": None,
            "kernels": [{k: b[k] for k in keep if k in b} for op in report["ops"] for b in op["builds"]
                        if b["dtype"] == dt]}


PATHS = ("eager", "compile_default", "compile_max_autotune", "fused")


def _sig(x: float, digits: int) -> str:
    """`x` to `digits` significant digits, in fixed point (times in ms span 1e-4 to 1e5)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    x = float(f"{x:.{digits}g}")  # rounded first: 0.099996 is 0.1000, not 0.10000
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def _samples(t: dict) -> int | None:
    """How many timed samples the median is over: `runs` (CPU blocks) or `reps` (GPU repetitions)."""
    n = t.get("runs", t.get("reps"))
    return int(n) if n is not None else None


def _ms(t: dict | None) -> str:
    """Median ± IQR; one sample has no spread, and says so instead of a ± 0."""
    if not t:
        return "—"
    if _samples(t) == 1:
        return _("{median} (one sample)").format(median=_sig(t["median_ms"], 4))
    return f"{_sig(t['median_ms'], 4)} ± {_sig(t['iqr_ms'], 2)}"


TARGET_LABELS = {"speedup_vs_eager": N_("speedup over eager")}  # a perf_target key is also its figure's name

# perf.json's words for a pass, a bound, a tuning objective and status, as a report shows them ("+" joins the
# passes of one timed call; the table of speedups spells forward_backward with a space)
PASS_LABELS = {"forward": N_("forward"), "backward": N_("backward"), "forward+backward": N_("forward+backward"),
               "forward backward": N_("forward backward"), "backward derived": N_("backward derived")}
BOUND_LABELS = {"memory": N_("memory"), "compute": N_("compute")}
OBJECTIVE_LABELS = {"fused forward": N_("fused forward"), "fused forward+backward": N_("fused forward+backward")}
STATUS_LABELS = {"measured": N_("measured"), "rejected": N_("rejected")}
STOP_LABELS = {"search space exhausted": N_("search space exhausted"), "perf target reached": N_("perf target reached")}
_STOP_ROUNDS = re.compile(r"(\d+) rounds( without gain)?")


def _label(labels: dict, key: str) -> str:
    """`key` in the current language where it is one of `labels`' words, else as perf.json has it."""
    return _(labels[key]) if key in labels else key


def _pass(p: str, sep: str) -> str:
    return _label(PASS_LABELS, p.replace("_", sep))


def _stop(text: str) -> str:
    """Why a shape's search stopped (bench.tuning's words), in the current language."""
    m = _STOP_ROUNDS.fullmatch(text)
    if m is None:
        return _label(STOP_LABELS, text)
    n = int(m.group(1))
    if m.group(2):
        return ngettext("{n} round without gain", "{n} rounds without gain", n).format(n=n)
    return ngettext("{n} round", "{n} rounds", n).format(n=n)


def _target_lines(perf: dict) -> list[str]:
    """The request's perf_target, and per shape and dtype what was measured against it ("not measured" where
    nothing was: on a CPU the fused kernel is not timed)."""
    lines = [_("## Target"), ""]
    if not perf.get("perf_target"):
        return lines + [_("The request sets no `perf_target`."), ""]
    for figure, value in perf["perf_target"].items():
        lines.append(_("Request: `perf_target.{figure}` = {value:g} ({label} ≥ {value:g}×).").format(
            figure=figure, value=value, label=_label(TARGET_LABELS, figure)))
        if perf["kernel_timing"]:
            lines += ["", _("Measured: **not measured**: kernel timing needs an accelerator, and this run had none "
                            "(device {device}; see the note above).").format(device=perf["device"]), ""]
            continue
        lines += ["", _("| shape | dtype | pass | measured | target met |"), "|---|---|---|---|---|"]
        for r in perf["rows"]:
            for p, f in r.get("figures", {}).items():
                if p == "backward_derived" or figure not in f:
                    continue
                met = _("yes") if f[figure] >= value else _("**no**")
                lines.append(f"| {r['binding']} | {r['dtype']} | {_pass(p, '+')} | {f[figure]:.2f}× | {met} |")
        lines.append("")
    return lines


def _tuning_reason(t: dict) -> str:
    if t.get("shapes"):  # as stage 7 joins them, from each shape's stop
        return "; ".join(_("{shape}: stopped, {stop}").format(shape=s["binding"], stop=_stop(s["stop"]))
                         for s in t["shapes"])
    return _(NO_TUNING) if t["reason"] == NO_TUNING else t["reason"]


def render_perf(perf: dict) -> str:
    """PERF.md from perf.json alone, in the current language: the same data renders in any of them."""
    gpu = perf["device"] == "cuda"
    lines = [_("# Performance: {name}").format(name=perf["op_name"]), "",
             _("Device: {device} ({device_name}); torch {torch}.").format(
                 device=perf["device"], device_name=perf.get("device_name", perf["device"]), torch=perf["torch"]), ""]
    if perf["kernel_timing"]:
        why = _(NO_KERNEL_TIMING) if perf["kernel_timing"] == NO_KERNEL_TIMING else perf["kernel_timing"]
        lines += [_("**Note:** {why}. Not measured here: the fused kernel's time, speedups, achieved bandwidth, the "
                    "copy ceiling, launches per call, autotuning.").format(why=why), ""]
    else:
        c = perf["copy_ceiling"]
        lines += [_("Every path timed in this run with CUDA events, L2 flushed before each repetition, rotating input "
                    "copies refilled with new values and outputs checked against the float32 reference every 10 "
                    "calls. Copy ceiling (device-to-device, same run): {gbps:.0f} GB/s. torch.compile modes: "
                    "{modes}.").format(gbps=c["gbps"],
                                       modes=", ".join(f"{k} = {v}" for k, v in perf["compile_modes"].items())), ""]
    lines += _target_lines(perf)
    lines += [_("## All paths (median ± IQR, ms)") if gpu else _("## Reference paths (median ± IQR, ms)"), "",
              _("Medians to 4 significant digits, interquartile ranges to 2; a time from one sample (a call slower "
                "than the timer's budget) has no spread and says so."), "",
              *([_("Quick run (`--quick`): the reference paths are timed at the first p0 shape and dtype only; run "
                   "without --quick for every one."), ""] if perf.get("quick") else []),
              _("| shape | dtype | path | forward | forward+backward | launches fwd | launches fwd+bwd |") if gpu
              else _("| shape | dtype | path | forward | forward+backward |"),
              "|---|---|---|---|---|" + ("---|---|" if gpu else "")]
    for r in perf["rows"]:
        for v in PATHS:
            if f"{v}_forward" not in r["times"]:
                continue
            row = (f"| {r['binding']} | {r['dtype']} | {v} | {_ms(r['times'].get(f'{v}_forward'))} | "
                   f"{_ms(r['times'].get(f'{v}_forward_backward'))} |")
            if gpu:
                la = r.get("launches", {})
                row += f" {la.get(f'{v}_forward', '—')} | {la.get(f'{v}_forward_backward', '—')} |"
            lines.append(row)
    if gpu:
        lines += ["", _("## Fused kernel against the baselines"), "",
                  _("| shape | dtype | pass | × eager | × compile | × compile max-autotune | GB/s | % copy ceiling |"),
                  "|---|---|---|---|---|---|---|---|"]
        for r in perf["rows"]:
            for p, f in r.get("figures", {}).items():
                def x(k, f=f):
                    return f"{f[k]:.2f}×" if k in f else "—"
                gb = f"{f['gbps']:.0f}" if "gbps" in f else "—"
                pc = f"{f['pct_of_copy_ceiling']:.0f}%" if "pct_of_copy_ceiling" in f else "—"
                lines.append(f"| {r['binding']} | {r['dtype']} | {_pass(p, ' ')} | {x('speedup_vs_eager')} | "
                             f"{x('speedup_vs_compile_default')} | {x('speedup_vs_compile_max_autotune')} | "
                             f"{gb} | {pc} |")
        lines += ["", _("GB/s: the cost model's bytes for the fused kernel over its median time. 'backward derived' "
                        "is the difference of the forward+backward and forward medians."), ""]
    lines += ["", _("## Bytes and launches: eager against fused (cost model, API_REPORT.md)"), "",
              _("| shape | dtype | pass | eager launches | fused launches | eager bytes | fused bytes | ratio | "
                "flops/byte | bound | roofline floor µs |"), "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in perf["rows"]:
        for p in ("forward", "backward"):
            c = r["cost"].get(p)
            if c:
                roof = c.get("roofline") or classify(c.get("flops", 0), c["fused_bytes"], r["dtype"])
                lines.append(f"| {r['binding']} | {r['dtype']} | {_pass(p, ' ')} | {c['eager_kernels']} | "
                             f"{c['fused_kernels']} | {c['eager_bytes']:,} | {c['fused_bytes']:,} | "
                             f"{c['eager_bytes'] / c['fused_bytes']:.1f}× | {roof['intensity']} | "
                             f"{_label(BOUND_LABELS, roof['bound'])} | {roof['floor_us']} |")
    lines += ["", describe()]
    lines += _md_compiled(perf.get("compiled"))
    t = perf["tuning"]
    lines += ["", _("For memory-bound kernels the byte ratio bounds the speedup over eager from above once launch "
                    "overhead is amortised."), "", _("## Tuning history"), "",
              ngettext("{n} round. {reason}", "{n} rounds. {reason}", t["rounds"]).format(
                  n=t["rounds"], reason=_tuning_reason(t)), ""]
    for s in t.get("shapes", []):
        fields = dict(shape=s["binding"], objective=_label(OBJECTIVE_LABELS, s["objective"]),
                      start=s["baseline_ms"], best_ms=s["best_ms"], best=s["best"],
                      sizes=", ".join(map(str, s["keys"])), written=", ".join(s["written"]) or _("nothing"))
        if s["keys"]:
            text = _("{shape}: objective {objective}; start {start:.4f} ms, best {best_ms:.4f} ms with {best}; "
                     "written into the impl for the sizes {sizes}: {written}.")
        else:
            text = _("{shape}: objective {objective}; start {start:.4f} ms, best {best_ms:.4f} ms with {best}; "
                     "written into the impl for every size: {written}.")
        lines += [text.format(**fields), ""]
    if t.get("history"):
        lines += [_("| shape | round | config | status | ms |"), "|---|---|---|---|---|"]
        for h in t["history"]:
            ms = f"{h['ms']:.4f}" if "ms" in h else h.get("reason", "")
            status = _label(STATUS_LABELS, h["status"])
            if h.get("improved"):
                status = _("{status} (best)").format(status=status)
            lines.append(f"| {h.get('binding', '')} | {h['round']} | {h['config']} | {status} | {ms} |")
        lines.append("")
    lines += ["![perf](perf.png)", ""]
    return "\n".join(lines)


def _md_compiled(c: dict | None) -> list[str]:
    if not c:
        return []
    lines = ["", _("## Kernels compiled for {arch} (COMPILE.md)").format(arch=c["arch"]), ""]
    if c["unavailable"]:
        return lines + [_("Not compiled: {reason}.").format(reason=c["unavailable"])]
    lines += [_("The compiler's figures at each P0 shape in {dtype}; nothing ran. Occupancy is theoretical (resident "
                "warps per SM); waves below 1 leave resident slots empty, and fewer programs than SMs leave whole SMs "
                "idle.").format(dtype=c["dtype"]), "",
              _("| shape | pass | kernel | {figure_columns} |").format(figure_columns=_(FIGURE_COLUMNS)),
              "|" + "---|" * (FIGURE_COLUMNS.count("|") + 4)]
    for k in c["kernels"]:
        head = f"| {shape_label(k['binding'])} | {_pass(k['pass'], ' ')} | {k['kernel']} |"
        if "error" in k:
            lines.append(f"{head} " + _("**does not compile:** {error}").format(error=k["error"]) + " |")
        else:
            lines.append(f"{head} {figure_cells(k)} |")
    return lines


def _plot_measured(ax1, ax2, rows, labels, ceiling) -> None:
    """Achieved bandwidth per shape against the copy ceiling; speedups over each baseline."""
    xs = range(len(rows))
    width = 0.2
    passes = [p for p in ("forward", "forward_backward") if p in rows[0]["figures"]]
    for i, p in enumerate(passes):
        ax1.bar([x + i * width for x in xs], [r["figures"][p]["gbps"] for r in rows], width, label=p.replace("_", "+"))
    if ceiling:
        ax1.axhline(ceiling["gbps"], color="k", linestyle="--", label="copy ceiling")
    ax1.set_xticks(list(xs), labels, fontsize=7)
    ax1.set_ylabel("GB/s")
    ax1.set_title("fused kernel: achieved bandwidth")
    ax1.legend(fontsize=7)
    bases = ("eager", "compile_default", "compile_max_autotune")
    k = 0
    for p in passes:
        for b in bases:
            vals = [r["figures"][p].get(f"speedup_vs_{b}", 0) for r in rows]
            ax2.bar([x + (k - len(passes) * len(bases) / 2) * width / 2 for x in xs], vals, width / 2,
                    label=f"{p.replace('_', '+')} vs {b.replace('_', ' ')}")
            k += 1
    ax2.axhline(1.0, color="k", linewidth=0.8)
    ax2.set_xticks(list(xs), labels, fontsize=7)
    ax2.set_ylabel("speedup (×)")
    ax2.set_title("fused kernel over each baseline")
    ax2.legend(fontsize=6)


def _plot(ws: Workspace, rows, ceiling=None) -> None:
    """perf.png. Its labels stay English in every language: Chinese ones need a CJK font, which matplotlib's
    bundled fonts lack."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{r['dtype']}\n{shape_label(r['binding'])}" for r in rows]
    xs = range(len(rows))
    width = 0.2
    if rows[0].get("figures"):
        _plot_measured(ax1, ax2, rows, labels, ceiling)
        _save(ws, fig, plt)
        return
    series = [k for k in rows[0]["times"]]
    for i, k in enumerate(series):
        ax1.bar([x + (i - (len(series) - 1) / 2) * width for x in xs], [r["times"][k]["median_ms"] for r in rows],
                width, label=k.replace("_", " "))
    ax1.set_yscale("log")  # small shapes take a thousandth of the large ones' time: a linear axis hides them
    top = max(r["times"][k]["median_ms"] for r in rows for k in series)
    ax1.set_ylim(top=top * 10)  # a decade of headroom for the legend
    ax1.set_xticks(list(xs), labels, fontsize=7)
    ax1.set_ylabel("ms (median, log scale)")
    ax1.set_title(f"reference paths on {rows[0]['device']}")
    ax1.legend(fontsize=7)
    passes = [p for p in ("forward", "backward") if p in rows[0]["cost"]]
    centre = (2 * len(passes) - 1) / 2  # the bars of each shape centred on its tick
    for i, p in enumerate(passes):
        ax2.bar([x + (2 * i - centre) * width for x in xs], [r["cost"][p]["eager_bytes"] / 2**20 for r in rows],
                width, label=f"{p} eager")
        ax2.bar([x + (2 * i + 1 - centre) * width for x in xs], [r["cost"][p]["fused_bytes"] / 2**20 for r in rows],
                width, label=f"{p} fused")
    ax2.set_xticks(list(xs), labels, fontsize=7)
    ax2.set_ylabel("MiB moved")
    ax2.set_title("bytes per call: eager vs fused (cost model)")
    ax2.legend(fontsize=7)
    _save(ws, fig, plt)


def _save(ws: Workspace, fig, plt) -> None:
    fig.tight_layout()
    tmp = ws.path("perf.png.tmp")
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    tmp.replace(ws.path("perf.png"))
