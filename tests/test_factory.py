"""The factory end to end: a built workspace, its artifacts and gates, defects the gates must catch,
rollback, and the resume after a SIGKILL in stage 5."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import make_request
from typer.testing import CliRunner

from opforge.cli import app
from opforge.orchestrator.gates import run_gates
from opforge.orchestrator.state import load_state
from opforge.workspace import Workspace
from opforge.workspace.events import read_events

OP = "qat_symmetric_per_tensor"


def test_all_seven_stages(built_ws):
    state = load_state(built_ws)
    assert state.terminal["status"] == "SUCCESS"
    assert [state.stages[k].status for k in range(1, 8)] == ["completed"] * 5 + ["skipped", "completed"]
    assert "precision passed" in state.stages[6].reason
    for f in ("SPEC.md", "API_REPORT.md", "api_report.json", f"{OP}_golden.py", "DESIGN.md", f"{OP}_impl.py",
              f"test_{OP}.py", "README.md", "PRECISION.md", "precision.json", "PERF.md", "perf.json", "perf.png"):
        assert (built_ws / f).stat().st_size > 0, f
    prec = json.loads((built_ws / "precision.json").read_text())["summary"]
    assert prec["all_passed"] and prec["total"] >= 40
    perf = json.loads((built_ws / "perf.json").read_text())
    assert "needs an accelerator" in perf["kernel_timing"]
    # stage 5 compiled both kernels for sm_90 at every P0 shape and SPEC dtype; PERF.md repeats the figures
    compiled = json.loads((built_ws / "compile.json").read_text())
    spec_json = json.loads((built_ws / "spec.json").read_text())
    builds = compiled["ops"][0]["builds"]
    assert compiled["arch"] == "sm_90" and compiled["failed"] == 0
    assert len(builds) == 2 * len(spec_json["p0_shapes"]) * len(spec_json["supported_dtypes"])
    assert {b["dtype"] for b in builds} == set(spec_json["supported_dtypes"])
    assert all(b["registers"] > 0 and b["spill_bytes"] == 0 for b in builds)
    assert "## Kernels compiled for sm_90" in (built_ws / "PERF.md").read_text()
    assert perf["compiled"]["kernels"][0]["kernel"] == f"_{OP}_forward_kernel"
    api = json.loads((built_ws / "api_report.json").read_text())
    fwd = api["cost"][0]["forward"]
    assert fwd["fused_kernels"] == 1 and fwd["eager_kernels"] > 1 and fwd["fused_bytes"] < fwd["eager_bytes"]
    spec = (built_ws / "SPEC.md").read_text()
    assert spec.startswith("---\nschema_version: 1\n") and "## Dataflow" in spec


def test_generated_impl_has_one_kernel_per_pass(built_ws):
    src = (built_ws / f"{OP}_impl.py").read_text()
    assert src.count("@triton.jit\ndef _qat") == 2
    assert "golden" not in src.split('"""', 2)[2]


def test_workspace_tests_run_with_plain_pytest(ws_copy):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                           "level1 and float32 or opcheck"], cwd=ws_copy, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]


def test_a_test_that_fails_before_recording_its_case_is_named_in_the_precision_report(ws_copy):
    from opforge.skills.op_develop.stage import precision_report, run_tests

    ws = Workspace(ws_copy, OP)
    test = ws_copy / ws.test
    # first in the file, so that -x stops there: it fails before any case is recorded, as an out-of-memory would
    test.write_text(test.read_text().replace("\ndef ", "\ndef test_aa_first():\n    raise MemoryError('no room')\n\n\n"
                                             "def ", 1))
    rc, line, records, failed = run_tests(ws)
    report = precision_report(records, rc, line, failed)
    assert rc == 1 and not records and not report["summary"]["all_passed"]
    assert len(failed) == 1 and "test_aa_first - MemoryError: no room" in failed[0]
    assert report["summary"]["failed_tests"] == failed


def test_workspace_tests_skip_determinism_in_the_interpreter_and_say_why(ws_copy):
    # TRITON_INTERPRET unset: the impl interprets its own kernels and leaves the switch unset, so only the impl
    # can tell the test file where its kernels run; a determinism test that cannot fail there is not a pass
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k",
                           "deterministic or different_inputs"], cwd=ws_copy, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "1 passed, 1 skipped" in proc.stdout
    assert "the interpreter runs programs one at a time: run-to-run differences cannot show" in proc.stdout


def test_precision_report_marks_the_cases_run_with_interpreter_blocks(built_ws):
    report = json.loads((built_ws / "precision.json").read_text())
    big = [r["case"] for r in report["cases"] if r.get("interpreter_blocks")]
    # this request's p0 shapes are small: only Level 1's largest shape is over the limit, once per dtype
    assert big and all("N129xM1031" in c for c in big), big
    assert report["summary"]["interpreter_blocks"] == len(big) < report["summary"]["total"]
    assert "for speed only" in (built_ws / "PRECISION.md").read_text()


def test_clean_workspace_passes_every_gate(built_ws):
    state = load_state(built_ws)
    ws = Workspace(built_ws, OP)
    for stage in range(1, 8):
        failed = [r for r in run_gates(ws, stage, state) if not r["passed"]]
        assert not failed, (stage, failed)


def _gate(ws, stage):
    result = CliRunner().invoke(app, ["op", "gate", str(ws), "--stage", str(stage), "--json"])
    data = json.loads(result.stdout)
    return result.exit_code, {r["id"]: r for r in data["results"]}


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_gate_catches_test_file_dropping_a_dtype(ws_copy):
    _edit(ws_copy / f"test_{OP}.py", "DTYPES = ['bfloat16', 'float16', 'float32']", "DTYPES = ['float32']")
    code, res = _gate(ws_copy, 5)
    assert code == 1 and not res["G5-TEST-COVERAGE"]["passed"]
    assert "bfloat16" in res["G5-TEST-COVERAGE"]["message"]


def test_gate_catches_level0_dropping_a_shape(ws_copy):
    path = ws_copy / f"test_{OP}.py"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(line if not line.startswith("LEVEL0 = ") else "LEVEL0 = []" for line in lines))
    code, res = _gate(ws_copy, 5)
    assert code == 1 and "Level 0 lacks" in res["G5-TEST-COVERAGE"]["message"]


def test_gate_catches_impl_importing_the_golden(ws_copy):
    _edit(ws_copy / f"{OP}_impl.py", "import triton  # noqa: E402", f"import {OP}_golden  # noqa\nimport triton")
    code, res = _gate(ws_copy, 5)
    assert code == 1 and not res["G5-IMPL-SEPARATE"]["passed"]


@pytest.mark.parametrize("cheat", [
    "    return torch.round(weight / scale).clamp(qmin, qmax) * scale,\n",
    "    out = weight * 1.0\n    return (out,)\n",
    "    return (weight.clamp(qmin, qmax),)\n",
])
def test_gate_catches_torch_math_on_the_hot_path(ws_copy, cheat):
    path = ws_copy / f"{OP}_impl.py"
    text = path.read_text()
    start = text.index("):\n", text.index(f"def {OP}_forward(weight: torch.Tensor")) + 3  # after the signature
    end = text.index("\n\n", start)
    path.write_text(text[:start] + cheat + text[end:])
    code, res = _gate(ws_copy, 5)
    assert code == 1 and not res["G5-IMPL-TRITON-ONLY"]["passed"], res["G5-IMPL-TRITON-ONLY"]


def test_gate_catches_a_kernel_that_does_not_compile(ws_copy):
    path = ws_copy / "compile.json"
    rep = json.loads(path.read_text())
    rep["ops"][0]["builds"][1]["error"] = "CompilationError: at 7:8: unsupported function referenced"
    path.write_text(json.dumps(rep))
    code, res = _gate(ws_copy, 5)
    msg = res["G5-IMPL-COMPILES"]["message"]
    assert code == 1 and not res["G5-IMPL-COMPILES"]["passed"]
    assert msg.startswith("1 kernel build(s) do not compile for sm_90") and f"_{OP}_backward_kernel" in msg


def test_gate_catches_golden_importing_the_impl(ws_copy):
    _edit(ws_copy / f"{OP}_golden.py", "import torch\n", f"import torch\nfrom {OP}_impl import {OP}  # noqa\n")
    code, res = _gate(ws_copy, 3)
    assert code == 1 and not res["G3-GOLDEN-SEPARATE"]["passed"]


def test_gate_catches_golden_that_does_not_import(ws_copy):
    _edit(ws_copy / f"{OP}_golden.py", "import torch\n", "import torch\nraise SystemExit('no')\n")
    code, res = _gate(ws_copy, 3)
    assert code == 1 and not res["G3-GOLDEN-IMPORT"]["passed"]


def test_spec_is_frozen(ws_copy):
    _edit(ws_copy / "SPEC.md", "## Formula", "## Formula (edited)")
    code, res = _gate(ws_copy, 4)
    assert code == 1 and not res["C-SPEC-FROZEN"]["passed"]


def test_rollback_then_resume_redoes_only_later_stages(ws_copy):
    (ws_copy / "DESIGN.md").write_text("scribbled over")
    result = CliRunner().invoke(app, ["op", "rollback", str(ws_copy), "--to", "5"])
    assert result.exit_code == 0, result.output
    assert "## Fusion plan" in (ws_copy / "DESIGN.md").read_text()  # restored from stage 4's snapshot
    state = load_state(ws_copy)
    assert state.stages[4].status == "completed" and state.stages[5].status == "pending"
    assert state.rollbacks and state.rollbacks[-1]["to_stage"] == 5
    # stages 5-7's files are out of the workspace, which status calls pending, but kept, not deleted
    later = ("PRECISION.md", "precision.json", "PERF.md", "perf.json", f"{OP}_impl.py")
    assert not any((ws_copy / f).exists() for f in later)
    aside = [d for d in (ws_copy / "history_version").iterdir() if d.name.startswith("rolled_back_to_stage5_")]
    assert len(aside) == 1 and all((aside[0] / f).is_file() for f in later)
    assert f"later file(s) to history_version/{aside[0].name}." in result.output


def test_sigkill_in_stage5_then_resume(tmp_path):
    """Kill the whole run while stage 5 runs; the state file stays readable; resume skips stages 1-4."""
    req = make_request(tmp_path / "req", p0=[{"N": 40, "M": 72}])
    ws = tmp_path / "ws"
    proc = subprocess.Popen([sys.executable, "-m", "opforge", "op", "run", str(req), "--out", str(ws), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    seen_stage5 = False
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (ws / ".orchestrator_state.json").exists():
                state = load_state(ws)  # never unreadable, whenever we look
                if state.stages[5].status == "in_progress" and (ws / f"{OP}_impl.py").exists():
                    seen_stage5 = True
                    time.sleep(1.0)  # let the test subprocess get going
                    break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert seen_stage5, "the run never reached stage 5"
    killed = load_state(ws)
    assert killed.stages[5].status == "in_progress" and killed.terminal is None
    assert [killed.stages[k].status for k in range(1, 5)] == ["completed"] * 4
    n_events = len(read_events(ws))

    result = CliRunner().invoke(app, ["op", "resume", str(ws), "--json"])
    assert result.exit_code == 0, result.output
    state = load_state(ws)
    assert state.terminal["status"] == "SUCCESS"
    assert [state.stages[k].attempts for k in range(1, 5)] == [1, 1, 1, 1]
    assert state.stages[5].attempts == 2
    restarted = [e["stage"] for e in read_events(ws)[n_events:] if e["kind"] == "stage_started"]
    assert restarted == [5, 6, 7]


def test_the_demo_quick_run_scales_level0_down_and_says_so(tmp_path):
    """`scripts/demo.sh` runs the demo request with --quick: Level 0 at the p0 shapes scaled down to at most
    65,536 elements (the gate checks coverage of those), CPU timings at one shape and dtype, SUCCESS."""
    from pathlib import Path

    demo = Path(__file__).resolve().parents[1] / "examples" / OP
    ws = tmp_path / "demo"
    r = CliRunner().invoke(app, ["op", "run", str(demo), "--out", str(ws), "--quick", "--json"])
    assert r.exit_code == 0, r.output[-2000:]
    assert load_state(ws).options["quick"] is True
    level0 = json.loads((ws / "design.json").read_text())["verification"]["level0"]
    bindings = {json.dumps(c["binding"], sort_keys=True) for c in level0}
    assert bindings == {json.dumps({"M": 256, "N": 256})}  # 1024x2048 and 4096x4096, both halved to 256x256
    assert len(level0) == 3  # one case per dtype
    assert "Quick run (`--quick`)" in (ws / "DESIGN.md").read_text()
    perf = json.loads((ws / "perf.json").read_text())
    assert perf["quick"] is True and len(perf["rows"]) == 1
    assert "Quick run (`--quick`)" in (ws / "PERF.md").read_text()
