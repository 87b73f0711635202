"""Stage 5, develop: the impl (Triton kernels + torch.library op), its tests, its README; then the tests
run in a fresh pytest process and their per-case metrics become PRECISION.md and precision.json, and every
kernel is compiled for the GPU target (COMPILE.md, compile.json), on a machine without a GPU too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from string import Template

from opforge.bench.aot import default_arch
from opforge.codegen.build import generate_impl, plan_request
from opforge.i18n import N_, _, language, ngettext
from opforge.request import Request
from opforge.skills.op_precision.summary import per_output_lines
from opforge.verify.cases import RECORD_ENV, SHIPPED_BLOCKS_UP_TO, generic_binding, read_records
from opforge.workspace import REQUEST_COPY, StageOutcome, Workspace
from opforge.workspace.atomic import write_json_atomic, write_text_atomic

TEST_TEMPLATE = Path(__file__).with_name("test.py.tmpl")
RECORDS = ".precision_records.jsonl"
PYTEST_TIMEOUT_S = 1800
COMPILE_TIMEOUT_S = 900


def render_tests(ws: Workspace, spec: dict, design: dict) -> str:
    return Template(TEST_TEMPLATE.read_text()).substitute(
        op=spec["op_name"], dtypes=repr(spec["supported_dtypes"]), p0=repr(spec["p0_shapes"]),
        tolerance=repr(spec["tolerance"]), exact=repr(spec["exact_outputs"]),
        reduced=repr(spec["reduced_outputs"]), reduced_extent=repr(spec.get("reduced_extent", {})),
        backward=repr(bool(spec["backward"])),
        level0=repr(design["verification"]["level0"]), level1=repr(design["verification"]["level1"]),
        generic=repr(generic_binding(spec)), runtime_attrs=repr(spec["runtime_params"]))


def render_readme(req: Request, spec: dict, precision: dict | None, perf: dict | None = None) -> str:
    """README.md from the request, spec.json, precision.json and perf.json, in the current language."""
    op = req.name
    args = ", ".join(s.name for s in req.inputs)
    lines = [f"# {op}", "", req.description + ".", "", _("## Use"), "", "```python",
             f"from {op}_impl import {op}", "", f"out = {op}({args})  # attributes: " +
             (", ".join(f"{k}={v!r}" for k, v in spec["default_params"].items()) or "none"),
             "```", "",
             _("`{op}` is `torch.ops.opforge.{op}` (a `torch.library.custom_op` with fake and autograd "
               "registrations): it works under `torch.compile(fullgraph=True)` and passes `opcheck`. "
               "`deterministic=True` makes the backward's reductions bit-reproducible.").format(op=op), "",
             _("## Constraints"), "",
             _("- dtypes: {dtypes}; compute in float32.").format(dtypes=", ".join(spec["supported_dtypes"])),
             _("- inputs: {inputs}; any sizes (shapes are run-time arguments).").format(
                 inputs=", ".join(f"{s['name']} {tuple(s['shape'])}" for s in spec["inputs"])),
             _("- On a machine without a GPU the kernels run in Triton's interpreter (correct, not fast)."), "",
             _("## Measured"), ""]
    if precision:
        s = precision["summary"]
        lines.append(_("- Precision: {passed}/{total} cases passed (PRECISION.md); bit-exact outputs: {exact}.").format(
            passed=s["passed"], total=s["total"], exact=", ".join(spec["exact_outputs"]) or _("none")))
    if perf:
        lines.append(_performance_line(perf))
    lines += ["", _("Tests: `pytest` in this folder."), ""]
    return "\n".join(lines)


def _launches(n: int) -> str:
    return ngettext("{n} launch", "{n} launches", n).format(n=n)


def _performance_line(perf: dict) -> str:
    """The first timed row's bytes and launches against eager (perf.json's headline, from its figures)."""
    rows = perf.get("rows")
    if not rows or "forward" not in rows[0].get("cost", {}):
        if "headline" in perf:
            return _("- Performance: {headline}").format(headline=perf["headline"])
        return _("- Performance: see PERF.md")
    r = rows[0]
    f = r["cost"]["forward"]
    fields = {"share": f["fused_bytes"] / f["eager_bytes"], "launches": _launches(f["fused_kernels"]),
              "eager": f["eager_kernels"], "dtype": r["dtype"], "binding": r["binding"]}
    if "backward" not in r["cost"]:
        return _("- Performance: fused forward moves {share:.0%} of eager's bytes in {launches} instead of {eager} "
                 "({dtype}, {binding})").format(**fields)
    b = r["cost"]["backward"]
    return _("- Performance: fused forward moves {share:.0%} of eager's bytes in {launches} instead of {eager} "
             "({dtype}, {binding}); backward {bwd_share:.0%} in {bwd_launches} instead of {bwd_eager}").format(
        **fields, bwd_share=b["fused_bytes"] / b["eager_bytes"], bwd_launches=_launches(b["fused_kernels"]),
        bwd_eager=b["eager_kernels"])


def run_tests(ws: Workspace) -> tuple[int, str, list[dict], list[str]]:
    """pytest on the workspace's tests: its exit code, its last line, the cases' records, and the short summary's
    FAILED/ERROR lines (a test that fails before recording its case names itself only there)."""
    rec = ws.path(RECORDS)
    rec.unlink(missing_ok=True)
    env = {**os.environ, RECORD_ENV: str(rec)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "--no-header",
                           "-o", "addopts=", ws.test], cwd=ws.root, env=env, capture_output=True, text=True,
                          timeout=PYTEST_TIMEOUT_S)
    records = read_records(rec)
    rec.unlink(missing_ok=True)
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    failed = [ln.strip()[:400] for ln in tail if ln.startswith(("FAILED ", "ERROR "))]
    return proc.returncode, tail[-1] if tail else "", records, failed


def compile_args(ws: Workspace, arch: str) -> list[str]:
    """`python` arguments of `opforge bench compile` on the impl at every P0 shape and SPEC dtype; it writes
    compile.json and COMPILE.md, and exits 1 when a kernel fails to compile."""
    return ["-m", "opforge", "bench", "compile", "--request", str(ws.path(REQUEST_COPY)), "--impl",
            str(ws.path(ws.impl)), "--arch", arch, "--dtype", "all", "--elements", "0",
            "--json", str(ws.path("compile.json")), "--md", str(ws.path("COMPILE.md"))]


def compile_for_gpu(ws: Workspace, arch: str) -> str | None:
    """The compile in a process of its own (it swaps Triton's driver). None, or why it could not run."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "OPFORGE_LANG": language()}  # COMPILE.md in the run's language
    try:
        proc = subprocess.run([sys.executable, *compile_args(ws, arch)], cwd=ws.root, env=env, capture_output=True,
                              text=True, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"compiling for {arch} took over {COMPILE_TIMEOUT_S} s"
    if proc.returncode not in (0, 1):  # 1: a kernel failed to compile, recorded in compile.json
        return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return None


def precision_report(records: list[dict], pytest_rc: int, pytest_line: str, failed_tests=()) -> dict:
    total = len(records)
    skipped = sum(bool(r.get("skipped")) for r in records)
    passed = sum(r["passed"] and not r.get("skipped") for r in records)
    worst = {}
    for r in records:
        for o in r["outputs"]:
            if o["name"] == "no_alias":
                continue
            w = worst.setdefault(o["name"], {"max_abs": 0.0, "max_ulp": 0, "exact_cases": 0, "cases": 0})
            w["cases"] += 1
            w["exact_cases"] += int(bool(o.get("exact")))
            w["max_abs"] = max(w["max_abs"], float(o.get("max_abs") or 0.0))
            w["max_ulp"] = max(w["max_ulp"], int(o.get("max_ulp") or 0))
    return {"summary": {"total": total, "passed": passed, "skipped": skipped, "failed": total - passed - skipped,
                        "interpreter_blocks": sum(bool(r.get("interpreter_blocks")) for r in records),
                        "pytest_rc": pytest_rc, "pytest": pytest_line, "failed_tests": list(failed_tests),
                        "all_passed": pytest_rc == 0 and passed + skipped == total and passed > 0},
            "per_output": worst, "numerics_vs_eager": numerics_vs_eager(records), "cases": records}


EAGER_NOTE = N_("The kernel loads each input in its dtype, computes in float32 and rounds once, when it stores an "
              "output (and where the reference casts to a fixed narrow dtype); eager PyTorch in bfloat16/float16 "
              "rounds each intermediate tensor to the dtype. Where it does, the kernel differs from eager in many "
              "elements, by about one ulp of the dtype (more where a result cancels towards zero), while lying "
              "closer to float64; in float32 the two differ only by the order of operations. Verdicts hold the "
              "kernel to float64 within the SPEC tolerance; eager's figures are information only.")  # kept in
# precision.json in English; PRECISION.md shows it translated


def numerics_vs_eager(records: list[dict]) -> dict:
    """Per dtype and output, worst over the cases: the kernel's error against float64, eager's own error
    against float64, and the elements where the kernel and eager differ."""
    out: dict = {"note": EAGER_NOTE, "dtypes": {}}
    for r in records:
        for o in r["outputs"]:
            if o["name"] == "no_alias" or "eager" not in o:
                continue
            w = out["dtypes"].setdefault(r["dtype"], {}).setdefault(o["name"], {
                "cases": 0, "fused_vs_float64": _zero_err(), "eager_vs_float64": _zero_err(),
                "vs_eager": {"differing": 0, "numel": 0, "max_ulp": 0}, "eager_unavailable": 0})
            w["cases"] += 1
            _worst(w["fused_vs_float64"], o.get("vs_float64") or o)
            e = o["eager"]
            if "unavailable" in e:
                w["eager_unavailable"] += 1
                continue
            _worst(w["eager_vs_float64"], e["vs_float64"])
            w["vs_eager"]["differing"] += e["vs_fused"]["differing"]
            w["vs_eager"]["numel"] += int(o.get("numel") or 0)
            w["vs_eager"]["max_ulp"] = max(w["vs_eager"]["max_ulp"], e["vs_fused"]["max_ulp"])
    return out


def _zero_err() -> dict:
    return {"max_abs": 0.0, "max_rel": 0.0, "max_ulp": 0}


def _worst(acc: dict, res: dict) -> None:
    for k in ("max_abs", "max_rel"):
        acc[k] = max(acc[k], float(res.get(k) or 0.0))
    acc["max_ulp"] = max(acc["max_ulp"], int(res.get("max_ulp") or 0))


def render_precision(op: str, report: dict) -> str:
    """PRECISION.md from precision.json, in the current language."""
    s = report["summary"]
    fields = {"pytest": s["pytest"], "rc": s["pytest_rc"], "passed": s["passed"], "total": s["total"],
              "skipped": s.get("skipped")}
    if s.get("skipped"):
        run = _("pytest: `{pytest}` (exit {rc}). Cases: {passed}/{total} passed, {skipped} skipped (the reference "
                "does not define them).").format(**fields)
    else:
        run = _("pytest: `{pytest}` (exit {rc}). Cases: {passed}/{total} passed.").format(**fields)
    lines = [_("# Precision: {op}").format(op=op), "", run, *_render_blocks(report["cases"]),
             "", *per_output_lines(report["cases"])]
    lines += ["", _("Exact outputs are compared bit for bit with the golden's float32 path; max abs / ULP are then "
                    "against that path (0 means identical). Other outputs are against float64 truth."), "",
              *_render_eager(report.get("numerics_vs_eager")),
              _("## Cases"), "",
              _("| case | seed | passed | outputs (max abs) | eager vs float64 (max abs; elements ≠ fused) |"),
              "|---|---|---|---|---|"]
    for r in report["cases"]:
        shown = [o for o in r["outputs"] if o["name"] != "no_alias"]
        outs = ", ".join(f"{o['name']}={o.get('max_abs', 0):.2g}" for o in shown)
        eager = ", ".join(f"{o['name']}={_eager_cell(o['eager'])}" for o in shown if "eager" in o)
        if r.get("skipped"):
            verdict = _("skipped: {reason}").format(reason=r["skipped"])
        else:
            verdict = _("yes") if r["passed"] else _("**no**")
        case = _("{case} (interpreter blocks)").format(case=r["case"]) if r.get("interpreter_blocks") else r["case"]
        lines.append(f"| {case} | {r['seed']} | {verdict} | {outs} | {eager} |")
    failing = [r for r in report["cases"] if not r["passed"]]
    if failing:
        lines += ["", _("## Failures"), ""]
        for r in failing[:10]:
            for o in r["outputs"]:
                if not o["passed"]:
                    lines.append(_("- {case} (seed {seed}) {output}: {mismatches} mismatches, worst {worst}").format(
                        case=r["case"], seed=r["seed"], output=o["name"], mismatches=o.get("mismatches"),
                        worst=o.get("worst", [])[:3]))
    return "\n".join(lines) + "\n"


def _render_blocks(cases: list[dict]) -> list[str]:
    big = [r["interpreter_blocks"] for r in cases if r.get("interpreter_blocks")]
    if not big:
        return []
    ran, shipped = (", ".join(f"{k}={v}" for k, v in big[0][w].items()) for w in ("ran", "shipped"))
    return ["", _("Block sizes: {n} of {total} cases, those with inputs over {limit:,} elements, ran in Triton's "
                  "interpreter with {ran} instead of the shipped {shipped}, for speed only (marked below); the other "
                  "cases ran the shipped block sizes, over several programs where their shapes span them.").format(
                      n=len(big), total=len(cases), limit=SHIPPED_BLOCKS_UP_TO, ran=ran, shipped=shipped)]


def _render_eager(summary: dict | None) -> list[str]:
    if not summary or not summary["dtypes"]:
        return []
    lines = [_("## Numerics against eager"), "", _(summary["note"]), "",
             _("Worst over each dtype's cases. Errors are against float64 truth (ULP: distance from float64 rounded "
               "to the output's dtype); the last columns count the elements where the kernel's result is not "
               "bit-identical to eager's in the same dtype."), "",
             _("| dtype | output | cases | fused: max abs | fused: max rel | fused: max ULP | eager: max abs | "
               "eager: max rel | eager: max ULP | elements ≠ eager | max ULP fused↔eager |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for dt, per in summary["dtypes"].items():
        for name, w in per.items():
            f, e, d = w["fused_vs_float64"], w["eager_vs_float64"], w["vs_eager"]
            if w["eager_unavailable"] == w["cases"]:
                eager = _("eager unavailable") + " | | "
                diff = "| "
            else:
                eager = f"{e['max_abs']:.3g} | {e['max_rel']:.3g} | {e['max_ulp']}"
                if d["numel"]:
                    differing = _("{differing:,} of {numel:,} ({share:.1%})").format(
                        differing=d["differing"], numel=d["numel"], share=d["differing"] / d["numel"])
                else:
                    differing = _("{differing:,} of {numel:,}").format(differing=d["differing"], numel=d["numel"])
                diff = f"{differing} | {d['max_ulp']}"
            lines.append(f"| {dt} | {name} | {w['cases']} | {f['max_abs']:.3g} | {f['max_rel']:.3g} | "
                         f"{f['max_ulp']} | {eager} | {diff} |")
    return lines + [""]


def _eager_cell(e: dict) -> str:
    if "unavailable" in e:
        return _("n/a")
    return f"{e['vs_float64']['max_abs']:.2g} ({e['vs_fused']['differing']:,})"


def run(ws: Workspace, req: Request, state) -> StageOutcome:
    spec = json.loads(ws.path("spec.json").read_text())
    design = json.loads(ws.path("design.json").read_text())
    build = plan_request(req)
    write_text_atomic(ws.path(ws.impl), generate_impl(req, build))
    write_text_atomic(ws.path(ws.test), render_tests(ws, spec, design))
    # plain `pytest` in the workspace must not collect the snapshots' copies of the test file
    write_text_atomic(ws.path("conftest.py"), 'collect_ignore = ["history_version", "request"]\n')
    arch = default_arch()
    trouble = compile_for_gpu(ws, arch)
    if trouble:
        return StageOutcome("failed", f"could not compile the kernels for {arch}: {trouble}")
    rc, line, records, failed = run_tests(ws)
    report = precision_report(records, rc, line, failed)
    write_json_atomic(ws.path("precision.json"), report)
    write_text_atomic(ws.path("PRECISION.md"), render_precision(req.name, report))
    write_text_atomic(ws.path("README.md"), render_readme(req, spec, report))
    arts = ws.stage_artifacts(5)
    ok = report["summary"]["all_passed"]
    compiled = json.loads(ws.path("compile.json").read_text())
    reason = f"tests: {line}" if ok else f"precision failed: {line}"
    if not compiled["toolchain"]["unavailable"]:
        n = sum(len(op["builds"]) for op in compiled["ops"])
        reason += f"; {n - compiled['failed']}/{n} kernel builds compile for {arch}"
    return StageOutcome("completed", reason, artifacts=arts, details={"precision_passed": ok})
