"""`graph profile`: what a script's compilation costs and gains. The script runs twice in child processes: as
it is under TORCH_TRACE (its graphs, graph breaks, recompiles and compile time by phase, read through tlparse)
and without compiling; in both, each call of a compiled function is timed. The fixes are ordered by the
seconds they stand to save."""

from __future__ import annotations

import re
import statistics
import tempfile
from pathlib import Path

from opforge.i18n import N_, Msg, _, shown
from opforge.skills.graph_diagnose.child import TIME_ENV
from opforge.skills.graph_diagnose.diagnose import run_step
from opforge.skills.graph_diagnose.logs import events, trace_events
from opforge.workspace.atomic import write_bytes_atomic, write_json_atomic, write_text_atomic

RESUME = re.compile(r"torch_dynamo_resume_in_(?P<function>\w+)_at_(?P<line>\d+)$")


def _median_after_warmup(seconds: list[float]) -> float | None:
    """The median call after the first (which compiles, or warms the allocator and caches)."""
    rest = seconds[1:] or seconds
    return statistics.median(rest) if rest else None


def profile(script: Path, args: list[str], *, timeout: float = 300.0, memory_gb: float | None = None,
            progress=None) -> dict:
    with tempfile.TemporaryDirectory(prefix="opforge-profile-") as tmp:
        trace = Path(tmp) / "trace"
        if progress:
            progress("compiled")
        compiled = run_step(script, args, "as-is", timeout, memory_gb, env={TIME_ENV: "1", "TORCH_TRACE": str(trace)},
                            label="compiled")
        if progress:
            progress("eager")
        eager = run_step(script, args, "no-compile", timeout, memory_gb, env={TIME_ENV: "1"}, label="eager")
        logs = sorted(trace.glob("*.log"))
        try:
            ev = trace_events(logs, tmp) if logs else events(compiled.log)
        except FileNotFoundError:  # no tlparse: the events TORCH_LOGS would give, without compile times
            ev = {**events(compiled.log), "compiles": []}
    compiles = ev.get("compiles", [])
    phases = {"dynamo": 0.0, "backend": 0.0, "inductor": 0.0}
    for c in compiles:
        total, backend = c["seconds"] or 0.0, c["backend_seconds"] or 0.0
        phases["dynamo"] += max(0.0, total - backend)
        phases["backend"] += backend
        phases["inductor"] += c["inductor_seconds"] or 0.0
    functions = []
    for key, rec in compiled.timings.items():
        e = eager.timings.get(key, {"seconds": []})["seconds"]
        c_med, e_med = _median_after_warmup(rec["seconds"]), _median_after_warmup(e)
        functions.append({"function": key, "calls": len(rec["seconds"]), "first_call_s": rec["seconds"][0]
                          if rec["seconds"] else None, "compiled_median_s": c_med, "eager_median_s": e_med,
                          "speedup": round(e_med / c_med, 3) if c_med and e_med else None})
    result = {"script": str(script), "args": args, "status": {"compiled": compiled.status, "eager": eager.status},
              "graphs": len([c for c in compiles if c["graph_ops"]]), "compiles": compiles,
              "compile_seconds": {k: round(v, 3) for k, v in phases.items()},
              "graph_breaks": ev["graph_breaks"], "recompiles": ev["recompiles"],
              "recompile_limits": ev["recompile_limits"], "functions": functions,
              "error": compiled.exception and {"type": compiled.exception["type"],
                                              "message": compiled.exception["message"].splitlines()[0]}}
    result["fixes"] = fixes(result)
    result["logs"] = {"compiled": compiled.log, "eager": eager.log}
    return result


def fixes(p: dict) -> list[dict]:
    """What to change, by the seconds at stake: the compile time of the recompiles a guard causes, the compile
    time of the frames a graph break makes Dynamo resume in, and a compiled function slower than eager."""
    out = []
    by_guard: dict = {}
    for r in p["recompiles"]:
        by_guard.setdefault((r["function"], (r["guard"] or "").split("==")[0].strip()), []).append(r)
    seconds_of = {c["frame"]: c["seconds"] or 0.0 for c in p["compiles"]}
    for (fn, lhs), recs in by_guard.items():
        spent = sum(seconds_of.get(r["frame"], 0.0) for r in recs)
        where = recs[0].get("user_line") or {"file": recs[0]["file"], "line": recs[0]["line"]}
        out.append({"fix": Msg(N_("`{function}` recompiles {n} time(s) on the guard `{guard}`: pass `{lhs}` as a "
                                   "tensor or mark it dynamic"), function=fn, n=len(recs), guard=recs[0]["guard"],
                                lhs=lhs), "seconds": round(spent, 3),
                    "what": Msg(N_("compile time spent recompiling")), "where": where})
    sites: dict = {}
    for b in p["graph_breaks"]:
        sites.setdefault((b["file"], b["line"]), []).append(b)
    for (file, line), breaks in sites.items():
        resumed = [c for c in p["compiles"] if (m := RESUME.match(c["function"] or "")) and int(m["line"]) == line]
        spent = sum(c["seconds"] or 0.0 for c in resumed)
        out.append({"fix": Msg(N_("graph break at {where} ({reason}): remove it from the compiled region or follow "
                                   "its hints"), where=f"{Path(file).name}:{line}", reason=breaks[0]["reason"]),
                    "seconds": round(spent, 3),
                    "what": Msg(N_("compile time of the {n} frame(s) resumed after it; each call also leaves the "
                                    "graph there"), n=len(resumed)), "where": {"file": file, "line": line},
                    "gb_id": breaks[0]["gb_id"]})
    for f in p["functions"]:
        if f["speedup"] is not None and f["speedup"] < 1.0:
            loss = (f["compiled_median_s"] - f["eager_median_s"]) * max(1, f["calls"] - 1)
            out.append({"fix": Msg(N_("{function} runs slower compiled than eager ({speedup:.2f}x): check its graph "
                                       "breaks and recompiles, or leave it eager"), function=f["function"],
                                    speedup=f["speedup"]), "seconds": round(loss, 3),
                        "what": Msg(N_("time lost over its calls after the first")), "where": None})
    return sorted(out, key=lambda f: -f["seconds"])


def write_profile(out: Path, p: dict) -> None:
    steps = out / "steps"
    steps.mkdir(parents=True, exist_ok=True)
    for name, text in p["logs"].items():
        write_text_atomic(steps / f"{name}.log", text)
    slim = {k: v for k, v in p.items() if k != "logs"}
    write_json_atomic(out / "profile.json", slim)
    png = _plot(slim)
    if png:
        write_bytes_atomic(out / "profile.png", png)
    write_text_atomic(out / "profile.md", profile_md(slim, bool(png)))


def profile_md(p: dict, plot: bool) -> str:
    cs = p["compile_seconds"]
    lines = ["# " + _("graph profile: {script}").format(script=Path(p["script"]).name), "",
             _("{graphs} graph(s) from {compiles} compilation(s), {breaks} graph break(s), {recompiles} recompile(s). "
               "Compile time: Dynamo {dynamo:.2f} s, backend {backend:.2f} s (of which Inductor {inductor:.2f} s).")
             .format(graphs=p["graphs"], compiles=len(p["compiles"]), breaks=len(p["graph_breaks"]),
                     recompiles=len(p["recompiles"]), dynamo=cs["dynamo"], backend=cs["backend"],
                     inductor=cs["inductor"]), ""]
    if p["error"]:
        lines += [_("The compiled run failed ({type}: {message}): run `opforge graph diagnose` on it.").format(
            type=p["error"]["type"], message=p["error"]["message"]), ""]
    if plot:
        lines += ["![" + _("compile time and call time") + "](profile.png)", ""]
    lines += ["## " + _("Fixes, by the seconds at stake"), ""]
    lines += [f"{i}. {shown(f['fix'])} — {f['seconds']:.2f} s ({shown(f['what'])})"
              for i, f in enumerate(p["fixes"], 1)] or \
        [_("Nothing to fix: no recompiles, no graph breaks, no compiled function slower than eager.")]
    lines += ["", "## " + _("Compiled against eager (median call after the first)"), "",
              _("| function | calls | first call s | compiled s | eager s | speedup |"), "|---|---|---|---|---|---|"]
    def cell(v):
        return f"{v:.6f}" if v is not None else "—"

    for f in p["functions"]:
        lines.append(f"| `{f['function']}` | {f['calls']} | {cell(f['first_call_s'])} | {cell(f['compiled_median_s'])} "
                     f"| {cell(f['eager_median_s'])} | {f['speedup'] if f['speedup'] is not None else '—'} |")
    lines += ["", "## " + _("Compilations"), "", _("| frame | function | seconds | backend s | ops | recompile |"),
              "|---|---|---|---|---|---|"]
    recompiled = {r["frame"] for r in p["recompiles"]}
    yes = _("yes")
    for c in p["compiles"]:
        lines.append(f"| {c['frame']} | `{c['function']}` | {c['seconds'] or 0:.3f} | {c['backend_seconds'] or 0:.3f} "
                     f"| {c['graph_ops'] if c['graph_ops'] is not None else '—'} | "
                     f"{yes if c['frame'] in recompiled else ''} |")
    return "\n".join(lines + [""])


def _plot(p: dict) -> bytes | None:
    """Compile time per compilation by phase, beside each compiled function's median call, eager and
    compiled."""
    if not p["compiles"] and not p["functions"]:
        return None
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    frames = [c["frame"] for c in p["compiles"]]
    backend = [c["backend_seconds"] or 0.0 for c in p["compiles"]]
    dynamo = [max(0.0, (c["seconds"] or 0.0) - be) for c, be in zip(p["compiles"], backend)]
    a.bar(frames, dynamo, label="Dynamo")
    a.bar(frames, backend, bottom=dynamo, label="backend")
    a.set(title="compile time per compilation", ylabel="s", xlabel="frame/compile id")
    a.tick_params(axis="x", rotation=60)
    a.legend()
    fs = [f for f in p["functions"] if f["compiled_median_s"] and f["eager_median_s"]]
    xs = range(len(fs))
    b.bar([x - 0.2 for x in xs], [f["eager_median_s"] * 1e3 for f in fs], width=0.4, label="eager")
    b.bar([x + 0.2 for x in xs], [f["compiled_median_s"] * 1e3 for f in fs], width=0.4, label="compiled")
    b.set_xticks(list(xs), [f["function"].split(" ")[-1] for f in fs])
    b.set(title="median call after the first", ylabel="ms (log)", yscale="log")
    b.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
