"""`opforge op-adapt check PATH`: a tree with aten::hypot adapted (and the backward's div.Tensor, sum.dim_IntList
and neg alongside) is clean; each test copies it, plants one disagreement between two files, and expects the
check to name exactly the file (and line) where it is."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opforge.cli import app
from opforge.skills.op_adapt.check import RULES, check, cpp_functions, run

KERNEL = "ops/HypotKernelOpdev.cpp"
SUM_KERNEL = "ops/SumKernelOpdev.cpp"
TEST = "tests/test_hypot_opdev.py"
DOC = "docs/hypot.md"
SUM_DOC = "docs/sum.dim_IntList.md"
DTYPES_LINE = "DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)  # CHECKLIST"


@pytest.fixture(scope="module")
def adapted(tmp_path_factory) -> Path:
    from opforge.skills.op_adapt.adapt import plan_reference, reference_root

    root = reference_root(tmp_path_factory.mktemp("adapted") / "tree")
    result, patch = plan_reference("aten::hypot", root)
    patch.apply()
    assert "aten::div.Tensor" in [d.op for d in result.dependencies]
    return root


@pytest.fixture
def tree(adapted, tmp_path) -> Path:
    """A fresh copy of the adapted tree, to plant one disagreement in."""
    return Path(shutil.copytree(adapted, tmp_path / "tree"))


def plant(root: Path, rel: str, old: str, new: str) -> int:
    """Replace `old` (which must be there once) by `new` in root/rel; the 1-based line where it was."""
    text = (root / rel).read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {rel}"
    (root / rel).write_text(text.replace(old, new))
    return text[: text.index(old)].count("\n") + 1


def line_of(root: Path, rel: str, needle: str) -> int:
    text = (root / rel).read_text()
    assert needle in text
    return text[: text.index(needle)].count("\n") + 1


def only(findings, file: str, rule: str):
    assert [(f.file, f.rule) for f in findings] == [(file, rule)], "\n".join(map(str, findings))
    return findings[0]


# -- the clean tree ---------------------------------------------------------------------------------------------

def test_a_clean_adaptation_has_no_findings(adapted):
    report = run(adapted)
    assert report.findings == [], "\n".join(map(str, report.findings))
    assert {"aten::hypot", "aten::div.Tensor", "aten::sum.dim_IntList", "aten::neg"} <= set(report.checked)


def test_rules_are_data_grouped_by_what_they_protect():
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    groups = {r.group for r in RULES}
    assert {"registration", "kernel", "tests", "doc", "derivatives", "meta", "op-plugin"} <= groups
    assert all(r.text and callable(r.fn) for r in RULES)


# -- registration -----------------------------------------------------------------------------------------------

def test_schema_json_differing_from_the_checklist(tree):
    line = plant(tree, "schema.json", '"hypot(Tensor self, Tensor other) -> Tensor"',
                 '"hypot(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"')
    f = only(check(tree), "schema.json", "registration-schema")
    assert f.line == line
    assert "alpha=1" in f.message and "adaptations/hypot/checklist.json" in f.message


def test_overload_missing_from_the_backend_yaml(tree):
    plant(tree, "opdev_functions.yaml", "- hypot\n", "")
    f = only(check(tree), "opdev_functions.yaml", "registration-listed")
    assert f.line == line_of(tree, "opdev_functions.yaml", "autograd:")  # where the entry belongs
    assert "hypot" in f.message and "adaptations/hypot/checklist.json" in f.message


def test_checklist_schema_differing_from_torchgen(tree):
    rel = "adaptations/hypot/checklist.json"
    data = json.loads((tree / rel).read_text())
    data["schema"] = "hypot(Tensor self, Tensor othr) -> Tensor"
    (tree / rel).write_text(json.dumps(data, indent=2) + "\n")
    (tree / "schema.json").write_text((tree / "schema.json").read_text().replace("Tensor other) -> Tensor\"",
                                                                               "Tensor othr) -> Tensor\""))
    findings = [f for f in check(tree) if f.rule == "registration-torchgen"]
    assert [(f.file, f.line) for f in findings] == [(rel, line_of(tree, rel, '"schema":'))]
    assert "native_functions.yaml" in findings[0].message


# -- C++ kernel -------------------------------------------------------------------------------------------------

def test_torch_check_dtype_list_differing_from_the_checklist(tree):
    line = plant(tree, KERNEL, "op_api::dtype_in(other, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16})",
                 "op_api::dtype_in(other, {at::kFloat, at::kDouble, at::kHalf})")
    f = only(check(tree), KERNEL, "kernel-dtypes")
    assert f.line == line
    assert "missing bfloat16" in f.message and "checklist.json" in f.message


@pytest.mark.parametrize("new, words", [
    ("const at::Tensor & othr)", ["`othr`", "`other`"]),  # renamed
    ("const at::Scalar & other)", ["const at::Scalar &", "const at::Tensor &"]),  # retyped
])
def test_kernel_parameter_renamed_or_retyped(tree, new, words):
    line = plant(tree, KERNEL, "const at::Tensor & other)", new)
    f = only(check(tree), KERNEL, "kernel-signature")
    assert f.line == line
    assert all(w in f.message for w in words) and "NativeSignature" in f.message


def test_kernel_parameter_missing(tree):
    line = plant(tree, KERNEL, "hypot(const at::Tensor & self, const at::Tensor & other)",
                 "hypot(const at::Tensor & self)")
    f = only(check(tree), KERNEL, "kernel-signature")
    assert f.line == line and "takes 1 parameters" in f.message and "takes 2" in f.message


def test_kernel_default_differing_from_the_schema(tree):
    line = plant(tree, SUM_KERNEL, "bool keepdim,", "bool keepdim=true,")
    f = only(check(tree), SUM_KERNEL, "kernel-default")
    assert f.line == line and "`true`" in f.message and "`false`" in f.message


def test_kernel_default_equal_to_the_schema_is_fine(tree):
    plant(tree, SUM_KERNEL, "bool keepdim,", "bool keepdim = false,")
    assert check(tree) == []


def test_torch_check_message_differing_from_the_checklist(tree):
    line = plant(tree, KERNEL, "cannot be broadcast together", "do not broadcast")
    f = only(check(tree), KERNEL, "kernel-check")
    assert f.line == line and "do not broadcast" in f.message and "cannot be broadcast together" in f.message


def test_torch_check_removed(tree):
    text = (tree / KERNEL).read_text()
    check_line = next(ln for ln in text.splitlines(keepends=True) if "broadcastable" in ln)
    (tree / KERNEL).write_text(text.replace(check_line, ""))
    f = only(check(tree), KERNEL, "kernel-check")
    assert "no TORCH_CHECK" in f.message and "broadcast" in f.message
    assert f.line == line_of(tree, KERNEL, "OpdevNativeFunctions::hypot") + 1  # the body's first line


# -- tests ------------------------------------------------------------------------------------------------------

def test_test_dtypes_differing_from_the_checklist(tree):
    line = plant(tree, TEST, DTYPES_LINE,
                 "DTYPES = (torch.float32, torch.float64, torch.float16, torch.int32)  # CHECKLIST")
    f = only(check(tree), TEST, "tests-dtypes")
    assert f.line == line and "missing bfloat16" in f.message and "extra int32" in f.message


def test_test_dtypes_in_another_order_are_fine(tree):
    plant(tree, TEST, DTYPES_LINE,
          "DTYPES = (torch.bfloat16, torch.float16, torch.float64, torch.float32)  # CHECKLIST")
    assert check(tree) == []


def test_test_file_that_does_not_parse(tree):
    line = plant(tree, TEST, DTYPES_LINE, "DTYPES = (torch.float32,")
    findings = check(tree)
    assert {(f.file, f.rule) for f in findings} == {(TEST, "tests-dtypes"), (TEST, "tests-grad-inputs")}
    assert all("does not parse" in f.message and f.line >= line for f in findings)


def test_grad_inputs_differing_from_the_checklist(tree):
    line = plant(tree, TEST, "GRAD_INPUTS = ('self', 'other')", "GRAD_INPUTS = ('self',)")
    f = only(check(tree), TEST, "tests-grad-inputs")
    assert f.line == line and "missing other" in f.message


# -- doc --------------------------------------------------------------------------------------------------------

def test_undocumented_argument(tree):
    text = (tree / DOC).read_text()
    row = next(ln for ln in text.splitlines(keepends=True) if ln.startswith("| other |"))
    line = plant(tree, DOC, row, "")
    f = only(check(tree), DOC, "doc-undocumented")
    assert f.line == line  # where the row belongs: after self's
    assert "`other`" in f.message and "hypot(Tensor self, Tensor other)" in f.message


def test_documented_argument_that_does_not_exist(tree):
    text = (tree / DOC).read_text()
    row = next(ln for ln in text.splitlines(keepends=True) if ln.startswith("| other |"))
    plant(tree, DOC, row, row + "| alpha | `Scalar` | `1` | a multiplier |\n")
    f = only(check(tree), DOC, "doc-unknown-argument")
    assert f.line == line_of(tree, DOC, "| alpha |")
    assert "does not exist" in f.message and "`alpha`" in f.message


def test_documented_default_differing_from_the_schema(tree):
    line = plant(tree, SUM_DOC, "| keepdim | `bool` | `False` |", "| keepdim | `bool` | `True` |")
    f = only(check(tree), SUM_DOC, "doc-default")
    assert f.line == line and "`True`" in f.message and "`False`" in f.message


def test_documented_type_differing_from_the_schema(tree):
    line = plant(tree, SUM_DOC, "| dim | `int[1]?` |", "| dim | `int` |")
    f = only(check(tree), SUM_DOC, "doc-type")
    assert f.line == line and "`int[1]?`" in f.message


# -- derivatives.yaml and Meta functions (custom ops: hand-written files) ----------------------------------------

DERIVATIVES = """\
- name: hypot(Tensor self, Tensor other) -> Tensor
  self, other: hypot_backward(grad, self, other, result)
  result: auto_element_wise

- name: scale(Tensor x, float alpha=1.0) -> Tensor
  x: grad * alpha
  output_differentiability: [true]
"""


def test_derivatives_that_name_schema_arguments_are_fine(tree):
    (tree / "derivatives.yaml").write_text(DERIVATIVES)
    assert check(tree) == []


def test_derivatives_entry_naming_a_missing_argument(tree):
    (tree / "derivatives.yaml").write_text(DERIVATIVES.replace("  x: grad * alpha", "  x, y: grad * alpha"))
    f = only(check(tree), "derivatives.yaml", "derivatives-argument")
    assert f.line == line_of(tree, "derivatives.yaml", "x, y:")
    assert "`y`" in f.message and "scale(Tensor x, float alpha=1.0)" in f.message


def test_derivatives_entry_with_a_schema_the_tree_does_not_register(tree):
    (tree / "derivatives.yaml").write_text(DERIVATIVES.replace("hypot(Tensor self, Tensor other)",
                                                               "hypot(Tensor self, Tensor other, int k=0)"))
    f = only(check(tree), "derivatives.yaml", "derivatives-schema")
    assert f.line == 1 and "schema.json" in f.message


META = '''\
import torch
from torch.library import Library, impl

torch.library.define("opdev_test::scale", "(Tensor x, float alpha=1.0) -> Tensor")
lib = Library("opdev_test", "DEF")
lib.define("shift(Tensor x, *, int by=1) -> Tensor")
meta = Library("opdev_test", "IMPL", "Meta")


@torch.library.register_fake("opdev_test::scale")
def scale_fake(x, alpha=1.0):
    return torch.empty_like(x)


@impl(meta, "shift")
def shift_meta(x, *, by=1):
    return torch.empty_like(x)
'''


def test_meta_functions_with_the_schema_arguments_are_fine(tree):
    (tree / "python" / "meta_registrations.py").write_text(META)
    assert check(tree) == []


@pytest.mark.parametrize("old, new, bad", [
    ("def scale_fake(x, alpha=1.0):", "def scale_fake(x, factor=1.0):", "factor"),
    ("def shift_meta(x, *, by=1):", "def shift_meta(inp, *, by=1):", "inp"),
])
def test_meta_function_parameter_names_differing_from_the_schema(tree, old, new, bad):
    rel = "python/meta_registrations.py"
    (tree / rel).write_text(META)
    line = plant(tree, rel, old, new)
    f = only(check(tree), rel, "meta-parameters")
    assert f.line == line and bad in f.message


@pytest.mark.parametrize("where, text", [
    ("ops/Custom.cpp", 'TORCH_LIBRARY(opdev_test, m) {\n  m.def("clip(Tensor x, float lo, float hi) -> Tensor");\n}\n'),
    ("custom_functions.yaml", "- func: opdev_test::clip(Tensor x, float lo, float hi) -> Tensor\n"),
])
def test_meta_function_for_a_schema_defined_elsewhere(tree, where, text):
    (tree / where).write_text(text)
    rel = "python/meta_registrations.py"
    (tree / rel).write_text('import torch\n\n\n@torch.library.register_fake("opdev_test::clip")\n'
                            'def clip_fake(x, low, hi):\n    return torch.empty_like(x)\n')
    f = only(check(tree), rel, "meta-parameters")
    assert f.line == 5 and "(x, low, hi)" in f.message and "(x, lo, hi)" in f.message and where in f.message


def test_meta_function_for_an_op_the_tree_does_not_define(tree):
    rel = "python/meta_registrations.py"
    (tree / rel).write_text('import torch\n\n\n@torch.library.register_fake("opdev_test::nowhere")\n'
                            'def nowhere_fake(x):\n    return x\n')
    f = only(check(tree), rel, "meta-schema")
    assert f.line == 4 and "opdev_test::nowhere" in f.message


# -- the command ------------------------------------------------------------------------------------------------

def invoke(*args):
    return CliRunner().invoke(app, ["op-adapt", "check", *map(str, args)])


def test_cli_exit_0_on_a_clean_tree(adapted):
    res = invoke(adapted)
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("OK") and len(res.stdout.strip().splitlines()) == 1


def test_cli_exit_1_with_one_line_per_finding(tree):
    line = plant(tree, TEST, DTYPES_LINE, "DTYPES = (torch.float32,)  # CHECKLIST")
    res = invoke(tree)
    assert res.exit_code == 1
    assert len(res.stdout.splitlines()) == 1, res.stdout
    assert res.stdout.startswith(f"{tree / TEST}:{line}: [tests-dtypes] DTYPES is (float32)")


def test_cli_json(tree):
    plant(tree, "opdev_functions.yaml", "- hypot\n", "")
    res = invoke(tree, "--json")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["path"] == str(tree)
    assert [(f["file"], f["rule"]) for f in doc["findings"]] == [("opdev_functions.yaml", "registration-listed")]
    assert "aten::hypot" in doc["checked"]


@pytest.mark.parametrize("make", [lambda p: p, lambda p: p / "absent"])
def test_cli_exit_2_on_a_path_that_is_not_a_tree(tmp_path, make):
    res = invoke(make(tmp_path))
    assert res.exit_code == 2
    assert res.stdout == ""
    assert res.stderr.startswith(f"error: {make(tmp_path)}: ") and len(res.stderr.splitlines()) == 1


def test_cli_exit_2_without_a_path():
    res = CliRunner().invoke(app, ["op-adapt", "check"])
    assert res.exit_code == 2
    assert res.stderr.startswith("error: PATH: ")


# -- the op-plugin layout (hand-written fixture files in the upstream format) ----------------------------------

OP_PLUGIN_YAML = """\
all_version: [v2.1, v2.2]
official:
  - func: atan2(Tensor self, Tensor other) -> Tensor
    acl_op: all_version
    op_api: all_version

  - func: atan2.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)
    op_api: all_version

  - func: sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
    op_api: all_version

  - func: abs(Tensor self) -> Tensor
    op_api: all_version
    gen_opapi:
      out:
        size: self
      exec: aclnnAbs
custom:
  - func: npu_scale(Tensor self, float alpha=1.0) -> Tensor
    op_api: [v2.1, newest]
"""

OP_PLUGIN_KERNEL = """\
// Copyright (c) 2023 Huawei Technologies Co., Ltd
#include "op_plugin/OpApiInterface.h"
#include "op_plugin/utils/op_api_common.h"

namespace op_api {
using npu_preparation = at_npu::native::OpPreparation;

at::Tensor& atan2_out(const at::Tensor &self, const at::Tensor &other, at::Tensor &out)
{
    DO_COMPATIBILITY(aclnnAtan2, acl_op::atan2_out(self, other, out));
    EXEC_NPU_CMD(aclnnAtan2, self, other, out);
    return out;
}

at::Tensor atan2(const at::Tensor &self, const at::Tensor &other)
{
    at::Tensor result = npu_preparation::apply_tensor_without_format(self);
    return op_api::atan2_out(self, other, result);
}

at::Tensor sum(const at::Tensor &self, at::OptionalIntArrayRef dim, bool keepdim,
               c10::optional<c10::ScalarType> dtype)
{
    return at::empty({0});
}

at::Tensor npu_scale(const at::Tensor &self, double alpha)
{
    return self;
}
}  // namespace op_api
"""


@pytest.fixture
def op_plugin(tmp_path) -> Path:
    root = tmp_path / "op-plugin"
    (root / "op_plugin" / "config").mkdir(parents=True)
    (root / "op_plugin" / "ops" / "opapi").mkdir(parents=True)
    (root / "op_plugin" / "config" / "op_plugin_functions.yaml").write_text(OP_PLUGIN_YAML)
    (root / "op_plugin" / "ops" / "opapi" / "Atan2KernelNpuOpApi.cpp").write_text(OP_PLUGIN_KERNEL)
    return root


OPAPI = "op_plugin/ops/opapi/Atan2KernelNpuOpApi.cpp"


def test_op_plugin_clean_fixture(op_plugin):
    report = run(op_plugin)
    assert report.layout == "op-plugin" and report.findings == [], "\n".join(map(str, report.findings))
    assert report.checked == ["atan2", "atan2.out", "npu_scale", "sum.dim_IntList"]


def test_op_plugin_kernel_parameter_renamed(op_plugin):
    line = plant(op_plugin, OPAPI, "const at::Tensor &other, at::Tensor &out)", "const at::Tensor &other, "
                                                                                  "at::Tensor &result)")
    f = only(check(op_plugin), OPAPI, "op-plugin-parameter-name")
    assert f.line == line and "`result`" in f.message and "`out`" in f.message and "atan2.out(" in f.message


def test_op_plugin_kernel_parameter_retyped(op_plugin):
    line = plant(op_plugin, OPAPI, "npu_scale(const at::Tensor &self, double alpha)",
                 "npu_scale(const at::Tensor &self, int64_t alpha)")
    f = only(check(op_plugin), OPAPI, "op-plugin-signature")
    assert f.line == line and "`int64_t`" in f.message and "`double`" in f.message
    assert "op_plugin_functions.yaml:20" in f.message  # the func: line


def test_op_plugin_default_differing(op_plugin):
    line = plant(op_plugin, OPAPI, "double alpha)", "double alpha = 2.0)")
    f = only(check(op_plugin), OPAPI, "op-plugin-default")
    assert f.line == line and "`2.0`" in f.message and "`1.0`" in f.message


def test_op_plugin_yaml_default_differing(op_plugin):
    plant(op_plugin, OPAPI, "double alpha)", "double alpha = 1.0)")
    assert check(op_plugin) == []
    plant(op_plugin, "op_plugin/config/op_plugin_functions.yaml", "float alpha=1.0", "float alpha=0.5")
    f = only(check(op_plugin), OPAPI, "op-plugin-default")
    assert "`0.5`" in f.message and "`1.0`" in f.message


def test_op_plugin_derivatives_in_upstream_format(op_plugin):
    rel = "op_plugin/config/derivatives.yaml"
    (op_plugin / rel).write_text("all_version: [v2.1, v2.2]\nbackward:\n"
                                 "- name: npu_scale(Tensor self, float alpha=1.0) -> Tensor\n"
                                 "  self: grad * alpha\n  version: [v2.1, newest]\n")
    assert check(op_plugin) == []
    plant(op_plugin, rel, "  self: grad", "  input: grad")
    f = only(check(op_plugin), rel, "derivatives-argument")
    assert f.line == 4 and "`input`" in f.message


# -- the C++ reader ---------------------------------------------------------------------------------------------

def test_cpp_functions_reads_definitions_and_skips_bodies_comments_and_strings():
    src = ('// at::Tensor commented(int a) {}\n#include "x.h"\nnamespace n {\n'
           'static at::Tensor& f(const at::Tensor& a, /* b */ int64_t b = 1,\n    double c=0.5) const {\n'
           '  if (a.defined()) { g(a, ")"); }\n  return a;\n}\nat::Tensor h(at::Tensor x);\n}\n')
    fs = cpp_functions(src)
    assert [(f.name, f.returns, f.line, f.definition) for f in fs] == [("f", "at::Tensor&", 4, True),
                                                                      ("h", "at::Tensor", 9, False)]
    assert [(p.type, p.name, p.default, p.line) for p in fs[0].params] == [
        ("const at::Tensor&", "a", None, 4), ("int64_t", "b", "1", 4), ("double", "c", "0.5", 5)]
