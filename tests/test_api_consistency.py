"""api-consistency end to end: planted defects get the right exit and the planted operator; clean cases
are consistent; bad input is one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer
from openpyxl import load_workbook
from typer.testing import CliRunner

from opforge.skills.api_consistency.command import api_consistency

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "consistency"

app = typer.Typer()
app.command()(api_consistency)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def write(dir_: Path, name: str, code: str) -> Path:
    p = dir_ / name
    p.write_text(textwrap.dedent(code))
    return p


def run_json(case, target, out):
    res = invoke(case, "--target", target, "--out", out, "--json")
    assert res.exit_code in (0, 1), res.output
    doc = json.loads(res.stdout)
    row = doc["cases"][0]
    folder = out / row["analysis"].split("/")[0]
    return row, json.loads((folder / "result.json").read_text()), folder


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cases")
    write(d, "rmsnorm.py", """
        import torch

        ENTRY = "rms_norm"

        def rms_norm(x, weight, eps=1e-6):
            var = x.pow(2).mean(-1, keepdim=True)      # planted: squares of activations ~300 overflow float16
            return x * torch.rsqrt(var + eps) * weight

        def inputs():
            x = torch.randn(8, 256)
            x[2] *= 300.0
            return x, torch.ones(256)
        """)
    write(d, "total.py", """
        import torch

        def forward(x):
            return x.sum()

        def inputs():
            return (torch.randn(50000) * 10,)
        """)
    write(d, "impls.py", """
        import torch
        import triton
        import triton.language as tl

        def shuffled_sum(x):
            perm = torch.randperm(x.numel())               # planted: accumulation order changes every call
            return x.reshape(-1)[perm].sum()

        def weighted_upcast(x, w):
            return (x.float() * w).sum(-1)                 # planted: never cast back to the input dtype

        def weighted_ok(x, w):
            return (x.float() * w.float()).sum(-1).to(x.dtype)

        @triton.jit
        def axpy_kernel(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask)
            y = tl.load(y_ptr + offs, mask=mask)
            tl.store(out_ptr + offs, a * x + y, mask=mask)

        def axpy_last_block_bug(x, y, a=0.5):
            out = torch.zeros_like(x)                      # zeros: the unwritten tail is the same every run
            grid = ((x.numel() - 1) // 64,)                # planted: one block short when n % 64 != 0
            axpy_kernel[grid](x, y, out, a, x.numel(), BLOCK=64)
            return out

        def axpy_ok(x, y, a=0.5):
            out = torch.empty_like(x)
            axpy_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, a, x.numel(), BLOCK=64)
            return out

        @torch.library.custom_op("consistency_test::axpy", mutates_args=())
        def axpy_op(x: torch.Tensor, y: torch.Tensor, a: float = 0.5) -> torch.Tensor:
            return axpy_last_block_bug(x, y, a)

        def axpy_blocked_torch(x, y, a=0.5):
            out = torch.zeros_like(x)
            for s in range(0, x.numel() - 64, 64):          # planted: stops before the last block
                out[s:s + 64] = a * x[s:s + 64] + y[s:s + 64]
            return out

        def axpy_crash(x, y, a=0.5):
            return a * x + y[:-1]

        def bucket_via_float(ids):
            return (ids.float() * 0.5).floor().long() % 1000    # planted: int64 ids above 2**24 round in float32

        def row_sum_in_half(x):
            return x.half().sum(-1).float()                # planted: accumulates below the reference's float32
        """)
    write(d, "rowsum.py", """
        import torch

        def forward(x):
            return x.sum(-1)

        def inputs():
            return (torch.randn(16, 4096) * 100,)
        """)
    write(d, "bucket.py", """
        import torch

        def forward(ids):
            return (ids // 2) % 1000

        def inputs():
            return (torch.randint(2**30, 2**31, (512,)),)
        """)
    write(d, "dropout.py", """
        import torch

        def forward(x):
            return torch.nn.functional.dropout(x, 0.25, training=True) * 3

        def inputs():
            return (torch.randn(64, 64),)
        """)
    write(d, "axpy.py", """
        import torch

        def forward(x, y, a=0.5):
            return a * x + y

        def inputs():
            return torch.randn(1000), torch.randn(1000)
        """)
    write(d, "weighted.py", """
        import torch

        def forward(x, w):
            return (x * w).sum(-1)

        def inputs():
            return torch.randn(4, 64).half(), torch.rand(64).half()
        """)
    write(d, "documented.py", """
        import torch

        DOCUMENTED = {"determinism": "the device sums with atomics; order varies by design"}

        def forward(x):
            return x.sum()

        def inputs():
            return (torch.randn(50000) * 10,)
        """)
    write(d, "mlp.py", """
        import torch

        def forward(model, x):
            return model(x)

        def inputs():
            model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                        torch.nn.Linear(64, 8))
            return model, torch.randn(16, 32)
        """)
    write(d, "inv_energy.py", """
        import torch

        def forward(x):
            s = x * 1e-4
            energy = (s * s).sum(-1)                       # planted: the squares underflow in float16
            return 1.0 / energy

        def inputs():
            return (torch.rand(4, 8) * 0.5 + 0.7,)
        """)
    write(d, "test_like.py", """
        import torch

        def test_gelu_tanh(device, dtype):
            x = (torch.linspace(-4, 4, 257) ** 3).to(device=device, dtype=dtype)
            return torch.nn.functional.gelu(x, approximate="tanh")

        class TestRmsNorm:
            def test_rows_keep_unit_scale(self, device, dtype):
                x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 300).to(device, dtype)
                y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
                assert (y.abs().amax(-1) > 0.5).all(), "a row collapsed to zero"
        """)
    return d


def test_half_overflow_in_an_intermediate_is_exit_3_at_the_planted_op(cases, tmp_path):
    row, res, folder = run_json(cases / "rmsnorm.py", "half", tmp_path)
    assert (res["exit"], res["rule"], res["check"]) == (3, "R3", "precision")
    assert res["operator"]["name"] == "aten.pow.Tensor_Scalar"
    assert "x.pow(2)" in res["operator"]["site"]["code"] and res["operator"]["site"]["line"] == 7
    assert res["checks"]["precision"]["outputs"][0]["new_nonfinite"] == 0  # the output itself stays finite
    assert (folder / "culprit.pt").exists()
    # the standalone script reproduces the finding, and the operator alone overflows
    proc = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPRODUCED" in proc.stdout and "aten.pow.Tensor_Scalar alone" in proc.stdout


def test_half_underflow_that_becomes_inf_is_exit_3_at_the_flushing_op(cases, tmp_path):
    row, res, _ = run_json(cases / "inv_energy.py", "half", tmp_path)
    assert (res["exit"], res["rule"]) == (3, "R3")
    assert res["operator"]["name"] == "aten.mul.Tensor" and "(s * s)" in res["operator"]["site"]["code"]
    assert "underflow to 0" in res["operator"]["reason"]


def test_nondeterministic_accumulation_is_exit_3_at_the_sum(cases, tmp_path):
    row, res, _ = run_json(cases / "total.py", "custom:impls:shuffled_sum", tmp_path)
    assert (res["exit"], res["rule"]) == (3, "R4")
    assert res["operator"]["name"] == "aten.sum.default"
    assert res["checks"]["determinism"]["passed"] is False
    assert res["checks"]["determinism"]["localisation"]["inputs"] == "permuted"
    assert "sum()" in res["operator"]["site"]["code"]


def test_documented_difference_is_exit_1(cases, tmp_path):
    row, res, _ = run_json(cases / "documented.py", "custom:impls:shuffled_sum", tmp_path)
    assert (res["exit"], res["rule"]) == (1, "R7")
    assert "atomics" in res["conclusion"]


def test_wrong_dtype_promotion_is_exit_2_at_the_cast(cases, tmp_path):
    row, res, folder = run_json(cases / "weighted.py", "custom:impls:weighted_upcast", tmp_path)
    assert (res["exit"], res["rule"], res["check"]) == (2, "R2", "functional")
    assert res["operator"]["name"] == "aten._to_copy.default" and "x.float()" in res["operator"]["site"]["code"]
    assert "dtype float32, expected float16" in res["conclusion"]
    row, res, _ = run_json(cases / "weighted.py", "custom:impls:weighted_ok", tmp_path)
    assert res["exit"] == 1, res["conclusion"]


def test_computing_below_the_reference_dtype_is_exit_2_at_the_narrowing_cast(cases, tmp_path):
    row, res, _ = run_json(cases / "rowsum.py", "custom:impls:row_sum_in_half", tmp_path)
    assert (res["exit"], res["rule"]) == (2, "R2")
    assert res["operator"]["name"] == "aten._to_copy.default" and "x.half()" in res["operator"]["site"]["code"]
    assert "computes in float16 where the reference never goes below float32" in res["conclusion"]


def test_integer_math_done_in_float_is_exit_2_at_the_cast(cases, tmp_path):
    row, res, _ = run_json(cases / "bucket.py", "custom:impls:bucket_via_float", tmp_path)
    assert (res["exit"], res["rule"]) == (2, "R2"), res["conclusion"]
    assert res["operator"]["name"] == "aten._to_copy.default" and "ids.float()" in res["operator"]["site"]["code"]
    assert "where the reference never goes below integer" in res["conclusion"]


def test_random_program_is_an_expected_difference(cases, tmp_path):
    row, res, _ = run_json(cases / "dropout.py", "half", tmp_path)
    assert (res["exit"], res["rule"]) == (1, "R7"), res["conclusion"]
    assert res["checks"]["determinism"]["repeatable_with_seed"] is True
    assert res["checks"]["determinism"]["localisation"]["op"].startswith("aten.")


def test_half_target_promotion_by_a_float32_constant(tmp_path):
    row, res, _ = run_json(EXAMPLES / "scaled_softmax_promotion.py", "half", tmp_path)
    assert (res["exit"], res["rule"]) == (2, "R2")
    assert res["operator"]["name"] == "aten.mul.Tensor" and "scores * temperature" in res["operator"]["site"]["code"]


def test_triton_kernel_off_by_one_on_the_last_block_is_exit_3_at_the_kernel(cases, tmp_path):
    row, res, _ = run_json(cases / "axpy.py", "custom:impls:axpy_last_block_bug", tmp_path)
    assert (res["exit"], res["rule"]) == (3, "R3")
    assert res["operator"]["name"] == "triton:axpy_kernel"
    assert "axpy_kernel[grid]" in res["operator"]["site"]["code"]
    assert any("last-block" in e for e in res["evidence"])
    row, res, _ = run_json(cases / "axpy.py", "custom:impls:axpy_ok", tmp_path)
    assert (res["exit"], res["rule"]) == (1, "R8"), res["conclusion"]


def test_off_by_one_inside_a_torch_library_op_names_the_op_and_its_kernel(cases, tmp_path):
    row, res, _ = run_json(cases / "axpy.py", "custom:impls:axpy_op", tmp_path)
    assert (res["exit"], res["rule"]) == (3, "R3")
    assert res["operator"]["name"] == "consistency_test.axpy.default"
    assert "launches triton:axpy_kernel" in res["operator"]["reason"]


def test_plain_torch_kernel_off_by_one_is_exit_3_at_the_custom_function(cases, tmp_path):
    row, res, _ = run_json(cases / "axpy.py", "custom:impls:axpy_blocked_torch", tmp_path)
    assert (res["exit"], res["rule"]) == (3, "R3")
    assert res["operator"]["name"] == "impls:axpy_blocked_torch" and res["operator"]["kind"] == "function"
    assert any("last 40 of 1000" in e for e in res["evidence"])


def test_crash_on_the_target_is_a_finding_with_its_traceback(cases, tmp_path):
    row, res, folder = run_json(cases / "axpy.py", "custom:impls:axpy_crash", tmp_path)
    assert (res["exit"], res["rule"]) == (2, "R1")
    assert res["operator"]["name"] == "aten.add.Tensor" and "y[:-1]" in res["operator"]["site"]["code"]
    assert "Traceback" in res["traceback"] and "RuntimeError" in res["traceback"]
    assert "## Traceback on the target" in (folder / "analysis.md").read_text()


@pytest.mark.parametrize("target", ["half", "bf16"])
def test_clean_rotary_embedding_is_consistent_in_low_precision(tmp_path, target):
    row, res, _ = run_json(EXAMPLES / "rope_fp32_positions.py", target, tmp_path)
    assert (res["exit"], res["rule"]) == (1, "R8"), res["conclusion"]
    assert res["checks"]["precision"]["outputs"][0]["max_abs"] > 0  # compared, not skipped


@pytest.mark.parametrize("target", ["half", "bf16"])
def test_module_inputs_are_cast_with_their_parameters(cases, tmp_path, target):
    row, res, folder = run_json(cases / "mlp.py", target, tmp_path)
    assert (res["exit"], res["rule"]) == (1, "R8"), res["conclusion"]
    assert res["checks"]["precision"]["outputs"][0]["dtype"] == {"half": "float16", "bf16": "bfloat16"}[target]
    if target == "half":  # the standalone script casts the module too, and finds nothing to reproduce
        proc = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "not reproduced" in proc.stdout, proc.stdout + proc.stderr


def test_pytest_style_case_runs_with_device_and_dtype(cases, tmp_path):
    row, res, _ = run_json(f"{cases / 'test_like.py'}::test_gelu_tanh", "half", tmp_path)
    assert (res["exit"], res["rule"]) == (1, "R8"), res["conclusion"]
    assert res["checks"]["precision"]["outputs"][0]["dtype"] == "float16"


def test_failing_assertion_of_a_test_class_is_localised(cases, tmp_path):
    row, res, folder = run_json(f"{cases / 'test_like.py'}::TestRmsNorm::test_rows_keep_unit_scale", "half",
                                tmp_path)
    assert (res["exit"], res["rule"]) == (3, "R3"), res["conclusion"]
    assert res["operator"]["name"] == "aten.pow.Tensor_Scalar"
    assert "a row collapsed to zero" in res["conclusion"]
    proc = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "raises AssertionError" in proc.stdout, proc.stdout + proc.stderr
    row, res, _ = run_json(f"{cases / 'test_like.py'}::TestRmsNorm::test_rows_keep_unit_scale", "bf16", tmp_path)
    assert (res["exit"], res["rule"]) == (1, "R8"), res["conclusion"]  # bfloat16 has float32's range


def test_batch_writes_one_row_per_case_and_the_fp16_rope_example_overflows(tmp_path):
    res = invoke(EXAMPLES, "--target", "half", "--out", tmp_path, "--json")
    assert res.exit_code == 1, res.output  # findings among the cases
    rows = {r["case"]: r for r in json.loads(res.stdout)["cases"]}
    assert set(rows) == {"rope_fp16_overflow", "rope_fp32_positions", "scaled_softmax_promotion", "scale_shift",
                         "row_sum"}
    rope = rows["rope_fp16_overflow"]
    assert rope["exit"] == 3 and rope["operator"] == "aten._to_copy.default" and rope["new inf/NaN"] > 0
    assert rows["rope_fp32_positions"]["exit"] == 1
    ws = load_workbook(tmp_path / "summary.xlsx")["cases"]
    header = [c.value for c in ws[1]]
    got = {r[header.index("case")]: r for r in ws.iter_rows(min_row=2, values_only=True)}
    assert len(got) == 5
    assert header[2] == "class" and got["rope_fp16_overflow"][header.index("class")] == 3  # never "exit"
    assert [c.value for c in load_workbook(tmp_path / "summary.xlsx")["rules"][1]][:2] == ["rule", "class"]
    assert got["scaled_softmax_promotion"][header.index("operator")] == "aten.mul.Tensor"
    assert ws.cell(2, header.index("analysis") + 1).hyperlink is not None
    md = (tmp_path / "rope_fp16_overflow__half" / "analysis.md").read_text()
    assert "**class 3: operator defect" in md and "| rule | class | fired | rule |" in md
    assert "exit 1" not in md and "exit 3" not in md  # the class, never an "exit"; the process's code is 0, 1 or 2
    assert "| R3 | 3 | **yes** |" in md and "rope_fp16_overflow.py:18" in md
    assert "## Timeline" in (tmp_path / "rope_fp16_overflow__half" / "repro.md").read_text()


@pytest.mark.parametrize("argv,where", [
    (["missing.py", "--target", "half"], "missing.py: no such file"),
    (["{d}/broken.py", "--target", "half"], "does not import: SyntaxError"),
    (["{d}/noentry.py", "--target", "half"], "no entry function"),
    (["{d}/axpy.py::nothing", "--target", "half"], "no such function"),
    (["{d}/nobuilder.py", "--target", "half"], "no input builder"),
    (["{d}/axpy.py", "--target", "cuda"], "--target: cuda: no CUDA"),
    (["{d}/axpy.py", "--target", "npu"], "--target: npu: no Ascend NPU"),
    (["{d}/axpy.py", "--target", "tpu"], "unknown target 'tpu'"),
    (["{d}/axpy.py", "--target", "custom:nowhere_mod:f"], "custom module nowhere_mod does not import"),
    (["{d}/axpy.py", "--target", "custom:impls:nothing"], "custom module impls has no function nothing"),
    (["{d}/axpy.py", "--target", "custom:impls"], "expected custom:module:function"),
])
def test_bad_input_is_one_line_and_exit_2(cases, tmp_path, argv, where):
    write(cases, "broken.py", "def forward(x:\n")
    write(cases, "noentry.py", "def helper():\n    pass\n\ndef inputs():\n    return ()\n")
    write(cases, "nobuilder.py", "def forward(x):\n    return x\n")
    argv = [a.format(d=cases) for a in argv] + ["--out", str(tmp_path / "o")]
    res = invoke(*argv)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and where in lines[0], res.stderr


def test_compile_target_compiles_and_is_consistent(tmp_path):
    from torch._dynamo.utils import counters

    before = counters["frames"]["ok"]
    row, res, _ = run_json(EXAMPLES / "scale_shift.py", "compile", tmp_path)
    assert (res["exit"], res["rule"]) == (1, "R8"), res["conclusion"]
    assert counters["frames"]["ok"] > before  # Dynamo compiled it (under a dispatch mode it would not)
    assert res["checks"]["memory"]["target_peak_bytes"] is None  # compiled code allocates outside the dispatcher


def test_registered_in_the_opforge_command(tmp_path):
    from opforge.cli import app as opforge_app

    res = CliRunner().invoke(opforge_app, ["api-consistency", str(EXAMPLES / "rope_fp32_positions.py"),
                                           "--target", "npu", "--out", str(tmp_path)])
    assert res.exit_code == 2 and res.stderr.strip().startswith("error: --target: npu: no Ascend NPU")


def test_printed_verdict_and_process_exit_code_speak_one_vocabulary(cases, tmp_path):
    """A consistent case prints "exit 0" and the process returns 0; a defect prints "exit 1" and returns 1. The
    case's triage class is named in words, on stdout (the verdict is a result), and never printed as "exit N"."""
    res = invoke(cases / "axpy.py", "--target", "half", "--out", tmp_path / "ok")
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("consistent (class 1) axpy on half:"), res.stdout
    assert lines[-1] == "exit 0: 1 case(s): 1 consistent" and "exit 1" not in res.stdout
    assert res.stderr == ""
    res = invoke(cases / "rmsnorm.py", "--target", "half", "--out", tmp_path / "bad")
    assert res.exit_code == 1, res.output
    assert res.stdout.startswith("operator defect (class 3) rmsnorm on half:"), res.stdout
    assert "aten.pow.Tensor_Scalar" in res.stdout
    assert res.stdout.strip().splitlines()[-1] == "exit 1: 1 case(s): 1 operator defect"
    doc = json.loads(invoke(cases / "rmsnorm.py", "--target", "half", "--out", tmp_path / "j", "--json").stdout)
    assert doc["exit_code"] == 1 and doc["cases"][0]["exit"] == 3 and doc["cases"][0]["verdict"] == "operator defect"


def test_bad_input_with_json_is_also_json_on_stdout(tmp_path):
    res = invoke(tmp_path / "missing.py", "--target", "half", "--out", tmp_path / "o", "--json")
    assert res.exit_code == 2
    err = json.loads(res.stdout)["error"]
    assert err["exit_code"] == 2 and err["where"].endswith("missing.py") and "no such file" in err["what"]
    assert res.stderr.strip() == f"error: {err['where']}: {err['what']}"


@pytest.mark.parametrize("out,why", [
    ("afile", "afile: is a file; --out names the folder to write the reports in"),
    ("afile/sub", "afile/sub: cannot create it: {t}/afile is a file, not a folder"),
])
def test_out_that_cannot_be_a_folder_is_one_line_and_exit_2(cases, tmp_path, out, why):
    (tmp_path / "afile").write_text("not a folder\n")
    res = invoke(cases / "axpy.py", "--target", "half", "--out", tmp_path / out)
    assert res.exit_code == 2, res.output
    assert res.stderr == f"error: {tmp_path}/{why.format(t=tmp_path)}\n" and res.stdout == ""
    res = invoke(cases / "axpy.py", "--target", "half", "--out", tmp_path / out, "--json")
    assert res.exit_code == 2 and json.loads(res.stdout)["error"] == {
        "where": str(tmp_path / out), "what": why.format(t=tmp_path).partition(": ")[2], "exit_code": 2}
    assert (tmp_path / "afile").read_text() == "not a folder\n"


def test_an_existing_out_folder_is_reused(cases, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("mine")
    res = invoke(cases / "axpy.py", "--target", "half", "--out", tmp_path / "o")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o" / "keep.txt").read_text() == "mine" and (tmp_path / "o" / "summary.xlsx").is_file()
