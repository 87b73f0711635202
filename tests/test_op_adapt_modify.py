"""MODIFY mode: each change type touches exactly the files that change needs (planned, not built)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opforge.cli import app
from opforge.skills.op_adapt.adapt import plan, reference_root

runner = CliRunner()
REFERENCE = '''import torch


def gated(x, w, alpha=1.0):
    return alpha * x * torch.sigmoid(w)


def gated_v2(x, w, alpha=1.0, beta=0.0):
    return alpha * x * torch.sigmoid(w) + beta


def gated_frozen(x, w, alpha=1.0):
    return (alpha * x * torch.sigmoid(w)).detach()
'''


def dry(op: str, root: Path, *extra: str) -> dict:
    result = runner.invoke(app, ["op-adapt", op, "--repo", str(root), "--dry-run", "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def tree(tmp_path) -> Path:
    return reference_root(tmp_path / "tree")


@pytest.fixture
def ref(tmp_path) -> Path:
    path = tmp_path / "gated.py"
    path.write_text(REFERENCE)
    return path


def test_a_variant_adds_its_function_to_the_operators_kernel_file(tree):
    out = dry("aten::eq.Scalar", tree, "--modify", "variant")
    assert "ops/EqKernelOpdev.cpp" in out["files"] and "opdev_functions.yaml" in out["files"]
    assert "tests/test_eq_Scalar_opdev.py" in out["files"] and "adaptations/eq.Scalar/CHECKLIST.md" in out["files"]
    assert not [f for f in out["files"] if f.startswith("ops/") and f != "ops/EqKernelOpdev.cpp"]
    result, patch = plan("aten::eq.Scalar", tree, modify="variant")
    kernel = patch.files["ops/EqKernelOpdev.cpp"]
    assert kernel.count("at::Tensor OpdevNativeFunctions::eq(") == 2  # eq.Tensor's function is kept
    assert "EXEC_OPDEV_CMD(vkEqScalar, self, other, out);" in kernel


def test_a_variant_of_an_operator_that_is_not_adapted_is_refused(tree):
    result = runner.invoke(app, ["op-adapt", "aten::hypot", "--repo", str(tree), "--modify", "variant"])
    assert result.exit_code == 2 and "no overload of hypot is adapted" in result.stderr


def test_a_bugfix_rewrites_the_kernel_from_the_corrected_checklist_and_nothing_else(tree):
    path = tree / "adaptations/abs/checklist.json"
    checklist = json.loads(path.read_text())
    checklist["dtypes"].remove("float16")  # the correction: the vendor's float16 path is wrong, say
    for rule in checklist["constraints"]:
        rule["cpp"] = rule["cpp"].replace("at::kHalf, ", "")
    path.write_text(json.dumps(checklist, indent=2))
    out = dry("aten::abs", tree, "--modify", "bugfix")
    assert sorted(out["files"]) == ["adaptations/abs/CHECKLIST.md", "docs/abs.md", "ops/AbsKernelOpdev.cpp",
                                    "tests/test_abs_opdev.py"]
    _, patch = plan("aten::abs", tree, modify="bugfix")
    assert "at::kHalf" not in patch.files["ops/AbsKernelOpdev.cpp"]
    assert "torch.float16" not in patch.files["tests/test_abs_opdev.py"].split("DTYPES = ")[1].split("\n")[0]


def test_an_interface_change_rewrites_every_file_that_holds_the_schema(tree, ref):
    first = "myops::gated(Tensor x, Tensor w, float alpha=1.0) -> Tensor"
    _, patch = plan(first, tree, reference=f"{ref}:gated")
    patch.apply()
    new = "myops::gated(Tensor x, Tensor w, float alpha=1.0, float beta=0.0) -> Tensor"
    out = dry(new, tree, "--modify", "interface", "--reference", f"{ref}:gated_v2")
    for f in ("custom_functions.yaml", "ops/GatedKernelOpdev.cpp", "vendor/custom/Gated.cpp", "python/myops_gated.py",
              "derivatives.yaml", "schema.json", "tests/test_myops_gated_opdev.py", "docs/myops.gated.md"):
        assert f in out["files"], f
    _, patch = plan(new, tree, reference=f"{ref}:gated_v2", modify="interface")
    yaml_text = patch.files["custom_functions.yaml"]
    assert yaml_text.count("- func: myops::gated(") == 1 and "float beta=0.0) -> Tensor" in yaml_text
    assert patch.files["derivatives.yaml"].count("- name: gated(") == 1
    assert "def gated_meta(x, w, alpha=1.0, beta=0.0):" in patch.files["python/myops_gated.py"]


def test_a_backward_supplement_adds_the_backward_to_a_custom_operator_without_one(tree, ref):
    schema = "myops::gated(Tensor x, Tensor w, float alpha=1.0) -> Tensor"
    _, patch = plan(schema, tree, reference=f"{ref}:gated_frozen")
    patch.apply()
    assert "register_autograd" not in (tree / "python/myops_gated.py").read_text()
    out = dry(schema, tree, "--modify", "backward", "--reference", f"{ref}:gated")
    assert {"derivatives.yaml", "python/myops_gated.py", "vendor/custom/Gated.cpp", "custom_functions.yaml",
            "ops/GatedKernelOpdev.cpp"} <= set(out["files"])
    _, patch = plan(schema, tree, reference=f"{ref}:gated", modify="backward")
    assert "register_autograd" in patch.files["python/myops_gated.py"]
    assert "vkGatedBackward" in patch.files["vendor/custom/Gated.cpp"]
    result = runner.invoke(app, ["op-adapt", schema, "--repo", str(tree), "--modify", "interface", "--reference",
                                 f"{ref}:gated"])
    assert result.exit_code == 2 and "nothing changed" in result.stderr


def test_an_unknown_change_type_is_refused(tree):
    result = runner.invoke(app, ["op-adapt", "aten::abs", "--repo", str(tree), "--modify", "rename"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --modify: must be one of variant, bugfix, interface, backward, not 'rename'"
