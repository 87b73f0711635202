"""graph diagnose on scripts with real torch.compile problems: each script runs in child processes up the
backend ladder, and the conclusion, the layer and the evidence are read back from result.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opforge.cli import app

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "graph"  # each a planted problem


def line_of(name: str, text: str) -> int:
    """The line of examples/graph/NAME.py that holds `text`."""
    return next(i for i, ln in enumerate((EXAMPLES / f"{name}.py").read_text().splitlines(), 1) if text in ln)


def diagnose(tmp_path: Path, name: str, *extra) -> tuple[int, dict]:
    script = tmp_path / f"{name}.py"
    script.write_text((EXAMPLES / f"{name}.py").read_text())
    return diagnose_file(tmp_path, script, *extra)


def diagnose_file(tmp_path: Path, script: Path, *extra) -> tuple[int, dict]:
    res = CliRunner().invoke(app, ["graph", "diagnose", str(script), "--out", str(tmp_path / "out"), *extra])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads((tmp_path / "out" / "result.json").read_text())


def test_a_data_dependent_branch_under_fullgraph_is_the_users_code_at_its_line(tmp_path):
    code, r = diagnose(tmp_path, "branch")
    assert code == 1 and (r["conclusion"], r["layer"], r["rule"]) == ("user_code", "dynamo", "data-dependent-branch")
    assert r["evidence"]["user_line"]["line"] == line_of("branch", "if x.sum()")
    assert r["evidence"]["user_line"]["code"] == "if x.sum() > 0:"
    assert r["graph_break"]["id"] == "GB0170" and r["graph_break"]["type"] == "Data-dependent branching"  # registry
    assert [s["step"] for s in r["steps"]] == ["as-is", "no-compile", "eager"]  # it fails at Dynamo already
    out = tmp_path / "out"
    assert "GB0170" in (out / "analysis.md").read_text() and (out / "steps" / "03_eager.log").read_text()


def test_a_custom_op_without_a_fake_kernel_is_an_operator_problem_named(tmp_path):
    code, r = diagnose(tmp_path, "no_fake")
    assert (r["conclusion"], r["layer"], r["evidence"]["operator"]) == ("operator", "fake", "diag::twice")
    assert "twice.register_fake" in r["next_action"]
    # opcheck on the op's first eager call: the fake-tensor tests fail for want of a fake kernel
    assert "no fake impl" in r["evidence"]["opcheck"]["diag.twice.default"]["test_faketensor"]
    assert r["evidence"]["user_line"]["line"] == line_of("no_fake", "twice(x).sin()")  # the call in the compiled fn


def test_a_fake_kernel_with_the_wrong_shape_is_found_at_the_compiled_code(tmp_path):
    code, r = diagnose(tmp_path, "wrong_fake")
    assert (r["conclusion"], r["layer"], r["rule"]) == ("operator", "fake", "wrong-fake-shape")
    assert "diag.head" in r["evidence"]["operator"]
    fake_test = r["evidence"]["opcheck"]["diag.head.default"]["test_faketensor"]  # opcheck on its first eager call
    assert "torch.Size([4, 3]) and torch.Size([8, 3])" in fake_test
    # the generic backends run the real kernel after the fake one and never compare them: the ladder passes
    assert [s["status"] for s in r["steps"][2:]] == ["ok", "ok", "ok"]


def test_a_missing_cxx_compiler_is_the_environment_of_inductor(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))  # a cached kernel needs no compiler
    code, r = diagnose(tmp_path, "gelu")
    assert (r["conclusion"], r["layer"], r["rule"]) == ("environment", "inductor", "no-cxx-compiler")
    assert r["failing_step"] == "as-is" and all(s["status"] == "ok" for s in r["steps"][1:])
    repro = (tmp_path / "out" / "repro.py").read_text()
    compile(repro, "repro.py", "exec")  # a standalone script: the original below a header
    assert "torch.nn.functional.gelu(x) * 2" in repro


def test_a_script_that_runs_clean_is_reported_so(tmp_path):
    code, r = diagnose(tmp_path, "clean")
    assert code == 0 and r["conclusion"] == "clean" and len(r["steps"]) == 1
    assert not (tmp_path / "out" / "repro.py").exists()


def test_an_out_of_memory_without_compiling_is_a_runtime_problem(tmp_path):
    code, r = diagnose(tmp_path, "host_oom")
    assert (r["conclusion"], r["layer"], r["rule"]) == ("runtime", "runtime", "out-of-memory")
    assert r["evidence"]["user_line"]["line"] == line_of("host_oom", "torch.empty")


def test_a_hang_is_cut_at_the_time_limit_and_told(tmp_path):
    code, r = diagnose(tmp_path, "hang", "--timeout", "4")
    assert code == 1 and [s["status"] for s in r["steps"]] == ["timeout", "timeout"]
    assert r["conclusion"] == "user_code" and "without compiling too" in r["next_action"]


@pytest.mark.parametrize("name, words", [("missing.py", "no such script"), (".", "holds no Python script"),
                                         ("notes.txt", "not a Python")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, name, words):
    (tmp_path / "notes.txt").write_text("")
    res = CliRunner().invoke(app, ["graph", "diagnose", str(tmp_path / name), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output


def test_a_recompile_storm_names_the_guard_that_fails_every_call(tmp_path):
    code, r = diagnose(tmp_path, "storm")
    assert code == 1 and r["runs"] and (r["conclusion"], r["layer"], r["rule"]) == ("user_code", "dynamo",
                                                                                     "recompile-limit")
    assert r["evidence"]["user_line"]["line"] == line_of("storm", "len(name)")
    assert r["evidence"]["guard"].startswith("name == ")
    assert len(r["events"]["recompiles"]) == 8 and r["events"]["recompile_limits"][0]["limit"] == "recompile_limit"


def test_graph_breaks_from_a_host_sync_are_found_in_a_run_that_finishes(tmp_path):
    code, r = diagnose(tmp_path, "host_sync")
    assert code == 1 and r["runs"] and (r["conclusion"], r["rule"]) == ("user_code", "graph-break")
    assert r["evidence"]["user_line"]["line"] == line_of("host_sync", "y.sum().item()")
    assert r["graph_break"]["id"] == "GB0124"  # Tensor.item()
    assert ".item()" in r["evidence"]["user_line"]["code"]


def logs(tmp_path: Path, path: Path, *extra) -> tuple[int, dict]:
    res = CliRunner().invoke(app, ["graph", "logs", str(path), "--out", str(tmp_path / "logs_out"), *extra])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads((tmp_path / "logs_out" / "result.json").read_text())


def test_a_torch_logs_text_alone_gives_the_same_conclusion(tmp_path):
    diagnose(tmp_path, "branch")  # its as-is step's log is TORCH_LOGS text with the traceback
    code, r = logs(tmp_path, tmp_path / "out" / "steps" / "01_as-is.log")
    assert (r["conclusion"], r["layer"], r["rule"]) == ("user_code", "dynamo", "data-dependent-branch")
    assert r["evidence"]["user_line"]["line"] == line_of("branch", "if x.sum()") and r["graph_break"]["id"] == "GB0170"
    assert r["events"]["error"]["type"] == "torch._dynamo.exc.Unsupported"


def test_a_torch_trace_folder_is_read_through_tlparse(tmp_path):
    script = tmp_path / "storm.py"
    script.write_text((EXAMPLES / "storm.py").read_text())
    subprocess.run([sys.executable, str(script)], env={**os.environ, "TORCH_TRACE": str(tmp_path / "trace")},
                   check=True, capture_output=True)
    code, r = logs(tmp_path, tmp_path / "trace", "--json")
    assert code == 1 and r["rule"] == "recompile-limit"
    assert r["evidence"]["user_line"]["line"] == line_of("storm", "len(name)")
    compiles = r["events"]["compiles"]
    assert len(compiles) == 9 and all(c["function"] in ("f", None) for c in compiles)  # 8 graphs, then the limit
    assert all(c["seconds"] is not None for c in compiles[:8])


@pytest.mark.parametrize("name, words", [("missing.log", "no such log"), ("empty", "holds no TORCH_TRACE log")])
def test_logs_bad_input_is_one_line_and_exit_2(tmp_path, name, words):
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(app, ["graph", "logs", str(tmp_path / name), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output


def test_a_wrong_decomposition_registered_into_inductor_is_found_with_check(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    code, r = diagnose(tmp_path, "wrong_decomposition", "--check")  # the script asserts nothing itself
    assert (r["conclusion"], r["layer"], r["located"], r["rule"]) == ("framework_bug", "inductor", True,
                                                                      "foreign-entry")
    assert r["evidence"]["operator"] == "aten.sigmoid.default"
    assert r["evidence"]["registered_at"]["line"] == line_of("wrong_decomposition", "def sigmoid")
    # the decompositions serve aot_eager_decomp_partition too: it is the first step whose results differ, and
    # the script runs clean once they are taken away
    steps = {s["step"]: s["status"] for s in r["steps"]}
    assert steps["aot_eager"] == "ok" and steps["aot_eager_decomp_partition"] == "failed"
    assert steps["without-foreign"] == "ok"
    assert "differs from eager" in r["evidence"]["exception"]["message"]


def test_profile_times_compilation_by_phase_and_orders_the_fixes(tmp_path):
    script = tmp_path / "host_sync.py"
    script.write_text((EXAMPLES / "host_sync.py").read_text())
    res = CliRunner().invoke(app, ["graph", "profile", str(script), "--out", str(tmp_path / "prof")])
    assert res.exit_code == 0, res.output
    p = json.loads((tmp_path / "prof" / "profile.json").read_text())
    assert p["graphs"] >= 2 and {b["line"] for b in p["graph_breaks"]} == {line_of("host_sync", "y.sum().item()")}
    assert p["compile_seconds"]["dynamo"] > 0 and all(c["seconds"] is not None for c in p["compiles"])
    (f,) = p["functions"]  # f, called twice compiled and twice eagerly
    assert f["calls"] == 2 and f["compiled_median_s"] > 0 and f["eager_median_s"] > 0
    gains = [x["seconds"] for x in p["fixes"]]
    site = f"graph break at host_sync.py:{line_of('host_sync', 'y.sum().item()')}"
    assert gains == sorted(gains, reverse=True) and any(site in x["fix"] for x in p["fixes"])
    assert (tmp_path / "prof" / "profile.png").read_bytes()[:4] == b"\x89PNG"


def test_a_folder_of_scripts_is_a_batch_with_one_summary(tmp_path):
    folder = tmp_path / "scripts"
    folder.mkdir()
    for name in ("branch", "clean"):
        (folder / f"{name}.py").write_text((EXAMPLES / f"{name}.py").read_text())
    res = CliRunner().invoke(app, ["graph", "diagnose", str(folder), "--out", str(tmp_path / "batch")])
    assert res.exit_code == 1, res.output  # one finding
    from openpyxl import load_workbook

    rows = list(load_workbook(tmp_path / "batch" / "summary.xlsx").active.iter_rows(values_only=True))
    assert rows[0][:3] == ("script", "conclusion", "layer")
    assert [r[:3] for r in rows[1:]] == [("branch.py", "user_code", "dynamo"), ("clean.py", "clean", None)]
    assert (tmp_path / "batch" / "branch" / "analysis.md").exists() and (tmp_path / "batch" / "clean").is_dir()


# a torch-npu wheel in miniature: the files and shapes `learn-npu` reads in the real one (a GE converter that
# raises "not implemented", the converter layer's error messages class, a module reading the environment)
NPU_WHEEL = {
    "torch_npu-2.13.0.dist-info/METADATA": "Name: torch_npu\nVersion: 2.13.0\n",
    "torch_npu/dynamo/torchair/_ge_concrete_graph/ge_converter/aten/erfinv.py": (
        "@register_fx_node_ge_converter(torch.ops.aten.erfinv.default)\n"
        "def conveter_aten_erfinv_default(self, meta_outputs=None):\n"
        "    raise NotImplementedError(\"torch.ops.aten.erfinv.default ge_converter is not implemented!\")\n"),
    "torch_npu/dynamo/torchair/_utils/error_messages.py": (
        "class ConverterErrorMsg:\n"
        "    _HEADER = \"Failed to auto-generated converter for {target} to AscendIR: \"\n"
        "    SCALAR_INPUT = (\n"
        "        _HEADER\n"
        "        + \"this op has scalar input: {name}, not support auto-generate converter.\"\n"
        "    )\n"
        "    SO_LOAD_FAILED = \"Failed to load GetRegisteredIrDef from libge_runner.so.\"\n"),
    "torch_npu/dynamo/torchair/core/_backend.py": "import os\nDEVICE = int(os.getenv('ASCEND_DEVICE_ID', '0'))\n",
    "torch_npu/dynamo/torchair/_ge_concrete_graph/auto_functionalized_v2.py": (
        "def ref(base, op):\n"
        "    raise RuntimeError(f'Can not find input desc name of: {base} in op {op.name} '\n"
        "                       'of auto_functionalize_v2')\n"),
    "torch_npu/npu/utils.py": "import os\nLEVEL = os.getenv('NOT_GRAPH_MODE')\n",  # outside the graph modes
}

NPU_SCRIPT = '''
import torch


def npu(gm, example_inputs):  # stands in for torchair's backend, which converts each node to GE
    for node in gm.graph.nodes:
        if node.op == "call_function" and "erfinv" in str(node.target):
            raise RuntimeError("torch.ops.aten.erfinv.default ge_converter is not implemented!")
    return gm


@torch.compile(backend=npu)
def f(x):
    return torch.erfinv(x) * 2


print(f(torch.rand(8)))
'''


def test_learn_npu_reads_a_torch_npu_wheel_and_diagnose_names_the_missing_converter(tmp_path, monkeypatch):
    import zipfile

    wheel = tmp_path / "torch_npu-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in NPU_WHEEL.items():
            z.writestr(name, text)
    profile = tmp_path / "profile.json"
    res = CliRunner().invoke(app, ["graph", "learn-npu", str(wheel), "--out", str(profile), "--json"])
    assert res.exit_code == 0, res.output
    learned = json.loads(profile.read_text())
    assert learned["version"] == "2.13.0" and list(learned["converters_not_implemented"]) == [
        "torch.ops.aten.erfinv.default"]
    assert [m["id"] for m in learned["messages"]] == ["SCALAR_INPUT", "SO_LOAD_FAILED"]  # not the _HEADER part
    assert learned["messages"][0]["template"].startswith("Failed to auto-generated converter for {target}")
    assert list(learned["environment"]) == ["ASCEND_DEVICE_ID"]

    monkeypatch.setenv("OPFORGE_NPU_PROFILE", str(profile))
    script = tmp_path / "npu_compile.py"
    script.write_text(NPU_SCRIPT.lstrip())
    from opforge.skills.graph_diagnose import npu_profile

    npu_profile.load.cache_clear()
    code, r = diagnose_file(tmp_path, script)
    assert (r["conclusion"], r["layer"], r["rule"]) == ("operator", "npu", "ge-converter-not-implemented")
    assert r["evidence"]["operator"] == "torch.ops.aten.erfinv.default"
    assert r["evidence"]["torch_npu_source"]["file"].endswith("ge_converter/aten/erfinv.py")
    assert "torch_npu 2.13.0 ships no GE converter" in r["next_action"]

    # a log alone: another message the graph modes raise (an f-string in the wheel), told apart by its words
    log = tmp_path / "npu.log"
    log.write_text("Traceback (most recent call last):\n  File \"/work/train.py\", line 9, in <module>\n    f(x)\n"
                   "RuntimeError: Can not find input desc name of: arg0_1 in op Scatter of auto_functionalize_v2\n")
    res = CliRunner().invoke(app, ["graph", "logs", str(log), "--out", str(tmp_path / "log_out")])
    r = json.loads((tmp_path / "log_out" / "result.json").read_text())
    assert res.exit_code == 1 and r["rule"] == "torchair-in-place-without-functionalization"
    assert r["conclusion"] == "operator" and r["evidence"]["torch_npu_source"]["line"] == 2
    assert r["evidence"]["user_line"] == {"file": "/work/train.py", "line": 9, "function": "<module>", "code": "f(x)"}


@pytest.mark.parametrize("content, words", [(None, "no such wheel"), (b"not a zip", "not a wheel"),
                                            ("empty-zip", "not a torch-npu wheel")])
def test_learn_npu_bad_input_is_one_line_and_exit_2(tmp_path, content, words):
    import zipfile

    wheel = tmp_path / "x.whl"
    if content == "empty-zip":
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("other/__init__.py", "")
    elif content is not None:
        wheel.write_bytes(content)
    res = CliRunner().invoke(app, ["graph", "learn-npu", str(wheel), "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output


def test_a_wrong_result_no_registration_explains_is_bisected_to_the_decomposition(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    code, r = diagnose(tmp_path, "partial_decomposition", "--check")
    assert (r["conclusion"], r["layer"], r["located"], r["rule"]) == ("framework_bug", "aot_autograd", True,
                                                                      "bisected")
    assert r["evidence"]["bisect"]["subsystem"] == "decomposition"
    assert r["evidence"]["operator"] == "aten.sigmoid.default"
    assert [s["step"] for s in r["steps"]][-1] == "bisect"  # the foreign-entry check found nothing to take away
