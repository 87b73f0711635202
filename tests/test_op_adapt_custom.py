"""A custom fused operator with a backward, adapted from its schema and a PyTorch reference: traced into vendor
kernels, registered, built, and passing opcheck, torch.compile and gradient tests on the device."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opforge.cli import app
from opforge.skills.op_adapt.adapt import reference_root

runner = CliRunner()
SCHEMA = "myops::scaled_silu(Tensor x, Tensor w, float alpha=1.0) -> Tensor"
REFERENCE = '''import torch


def scaled_silu(x, w, alpha=1.0):
    """x * sigmoid(x), gated by w and scaled by alpha."""
    return alpha * x * torch.sigmoid(x) * w
'''


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ref") / "scaled_silu.py"
    path.write_text(REFERENCE)
    return path


@pytest.fixture(scope="module")
def adapted(tmp_path_factory, reference) -> Path:
    root = tmp_path_factory.mktemp("opdev") / "tree"
    result = runner.invoke(app, ["op-adapt", SCHEMA, "--reference", f"{reference}:scaled_silu", "--repo", str(root),
                                 "--json"])
    assert result.exit_code == 0, result.output
    return root


def test_the_vendor_kernels_are_the_traced_reference(adapted):
    source = (adapted / "vendor/custom/ScaledSilu.cpp").read_text()
    assert 'extern "C" vkStatus vkScaledSilu(const vkTensor* x, const vkTensor* w, double alpha, ' \
           "const vkTensor* out)" in source
    assert "at::sigmoid(x_host)" in source and "at::mul(x_host, alpha)" in source  # alpha is the argument
    assert "vkScaledSiluBackward(const vkTensor* grad," in source and "at::sigmoid_backward(" in source
    yaml_text = (adapted / "custom_functions.yaml").read_text()
    assert f"- func: {SCHEMA}\n" in yaml_text
    assert "myops::scaled_silu_backward(Tensor grad, Tensor x, Tensor w, float alpha=1.0) -> (Tensor, Tensor)" \
        in yaml_text
    assert "x, w: scaled_silu_backward(grad, x, w, alpha)" in (adapted / "derivatives.yaml").read_text()


def test_opcheck_compile_gradients_and_constraints_pass_on_the_device(adapted):
    result = runner.invoke(app, ["op-test", "run", str(adapted), "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0, report["verdicts"]
    names = (adapted / "tests/test_myops_scaled_silu_opdev.py").read_text()
    for test in ("test_opcheck", "test_compiles_without_graph_breaks", "test_gradients_match_the_references_autograd",
                 "test_constraint_dtype_x", "test_constraint_same_shape", "test_matches_the_reference_on_the_cpu"):
        assert f"def {test}(" in names
    assert report["tests"] >= 24 and report["failed"] == 0


def test_the_api_page_runs_the_custom_operator(adapted):
    page = (adapted / "docs/myops.scaled_silu.md").read_text()
    assert "| alpha | `float` | `1.0` |" in page and "Output (run on opdev):\n\n```\nopdev:0 torch.float32\ntensor(" \
        in page


@pytest.mark.parametrize("schema, where, what", [
    ("myops::scaled_silu(Tensor x, Tensor w, float alpha=1.0 -> Tensor", "OP", "is not a valid schema"),
    ("scaled_silu(Tensor x) -> Tensor", "OP", "is not a schema `namespace::name"),
])
def test_a_malformed_schema_is_one_line_and_writes_nothing(tmp_path, reference, schema, where, what):
    root = reference_root(tmp_path / "tree")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    result = runner.invoke(app, ["op-adapt", schema, "--reference", f"{reference}:scaled_silu", "--repo", str(root)])
    assert result.exit_code == 2
    line, = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {where}: ") and what in line
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_a_custom_operator_without_its_reference_is_refused(tmp_path, reference):
    root = reference_root(tmp_path / "tree")
    result = runner.invoke(app, ["op-adapt", SCHEMA, "--repo", str(root)])
    assert result.exit_code == 2 and "error: --reference: " in result.stderr
    result = runner.invoke(app, ["op-adapt", SCHEMA, "--reference", f"{reference}:nope", "--repo", str(root)])
    assert result.exit_code == 2 and "has no function nope" in result.stderr
