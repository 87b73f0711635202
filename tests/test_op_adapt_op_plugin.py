"""op-adapt --profile op-plugin: an ATen operator written into a small op-plugin checkout built here (the real
layout and formats, a few real-looking entries), checked by reading the files it wrote."""
from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from opforge.cli import app
from opforge.errors import InputError
from opforge.skills.op_adapt import op_plugin

runner = CliRunner()

FUNCTIONS_YAML = """\
all_version: [v2.1, v2.2, v2.3, v2.4, v2.5, v2.6, v2.7, v2.8]
official:
  - func: abs(Tensor self) -> Tensor
    acl_op: all_version
    op_api: all_version

  - func: abs.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)
    acl_op: all_version
    op_api: all_version
    gen_opapi:
      out:
        size: self
        dtype: self
      exec: aclnnAbs

  # the pooling entries keep their acl_op fallback
  - func: histc(Tensor self, int bins=100, Scalar min=0, Scalar max=0) -> Tensor
    acl_op: all_version
    op_api: all_version

  - func: index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor
    acl_op: [v2.1, newest]
    op_api: [v2.1, newest]

  - func: mul.Tensor(Tensor self, Tensor other) -> Tensor
    acl_op: all_version
    op_api: all_version

autograd:
  - func: _thnn_fused_gru_cell(Tensor input_gates, Tensor hidden_gates, Tensor hx, Tensor? input_bias=None, \
Tensor? hidden_bias=None) -> (Tensor, Tensor)
    op_api: [v2.5, newest]

custom:
  - func: npu_gelu(Tensor self, *, str approximate='none') -> Tensor
    op_api: [v2.1, newest]
    gen_opapi:
      out:
        size: self
        dtype: self
      exec: aclnnGeluV2, self, approximate_mode, out

symint:
  - func: npu_gather_backward(Tensor grad, SymInt[] self_size, int dim, Tensor index, bool sparse_grad) -> Tensor
    op_api: all_version
"""

SIZE_H = """\
#ifndef OP_PLUGIN_UTILS_KERNEL_NPU_INFER_SHAPE
#define OP_PLUGIN_UTILS_KERNEL_NPU_INFER_SHAPE

#include <ATen/ATen.h>

#include "op_plugin/utils/Export.h"

namespace op_infer {
const int SIZE = 8;

OP_PLUGIN_HIDDEN c10::IntArrayRef input_same_output_size(const at::Tensor& input);
{broadcast}
} // namespace op_infer
#endif // OP_PLUGIN_UTILS_KERNEL_NPU_INFER_SHAPE
"""

BROADCAST = """\
OP_PLUGIN_HIDDEN c10::SmallVector<int64_t, SIZE> broadcast_ops_npu_output_size(c10::IntArrayRef shape1_,
                                                                               c10::IntArrayRef shape2_);

OP_PLUGIN_HIDDEN c10::SmallVector<int64_t, SIZE> broadcast_ops_npu_output_size(const at::Tensor& self,
                                                                               const at::Tensor& other);
"""

SIZE_CPP = """\
#include "op_plugin/utils/KernelNpuOutputSize.h"

namespace op_infer {
c10::IntArrayRef input_same_output_size(const at::Tensor& input) {
  return input.sizes();
}
} // namespace op_infer
"""

FAKE_TEST = '''\
import torch
import torch_npu
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.testing._internal.common_utils import TestCase, run_tests


class TestFastGelu(TestCase):
    def test_fast_gelu(self):
        with FakeTensorMode():
            a = torch.randn(2, 3).npu()
            self.assertEqual(torch_npu.fast_gelu(a).shape, a.shape)


if __name__ == "__main__":
    run_tests()
'''

SCHEMAS = """\
{
  "func: abs(Tensor self) -> Tensor": {
    "version": ["all_version"]
  },
  "func: npu_gelu(Tensor self, *, str approximate='none') -> Tensor": {
    "version": ["v2.1", "newest"]
  }
}
"""


def make_checkout(root: Path, *, broadcast_helpers: bool = True) -> Path:
    """A minimal op-plugin checkout: the registration yaml, the output-size helpers, the test baselines."""
    files = {
        "op_plugin/config/op_plugin_functions.yaml": FUNCTIONS_YAML,
        "op_plugin/config/derivatives.yaml": "all_version: [v2.1, v2.2]\nbackward:\n",
        "op_plugin/utils/KernelNpuOutputSize.h": SIZE_H.replace("{broadcast}", BROADCAST if broadcast_helpers else ""),
        "op_plugin/utils/KernelNpuOutputSize.cpp": SIZE_CPP,
        "test/core_tests/test_fake_tensor.py": FAKE_TEST,
        "test/core_tests/torch_npu_OpApi_schema_all.json": SCHEMAS,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for folder in ("op_plugin/ops/opapi", "op_plugin/ops/aclops", "op_plugin/python/meta", "test/test_base_ops",
                   "docs/zh/custom_APIs"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hypot_checklist():
    """aten::hypot's CHECKLIST, computed once (torch's OpInfo probes take seconds); each use gets a copy."""
    from opforge.backend.build import NATIVE
    from opforge.skills.op_adapt.checklist import aten_checklist

    return aten_checklist("aten::hypot", NATIVE, set())


@pytest.fixture
def fast_checklist(monkeypatch, hypot_checklist):
    real = op_plugin.aten_checklist
    monkeypatch.setattr(op_plugin, "aten_checklist", lambda op, root, supported: copy.deepcopy(hypot_checklist)
                        if op == "aten::hypot" else real(op, root, supported))


@pytest.fixture
def adapted(tmp_path, fast_checklist) -> tuple[Path, dict, dict]:
    """aten::hypot adapted into a fresh checkout: (root, the --json result, the checkout before)."""
    root = make_checkout(tmp_path / "op-plugin")
    before = snapshot(root)
    result = runner.invoke(app, ["op-adapt", "aten::hypot", "--profile", "op-plugin", "--repo", str(root), "--json"])
    assert result.exit_code == 0, result.output
    return root, json.loads(result.stdout), before


def test_the_yaml_entries_land_in_official_in_name_order_and_the_rest_is_untouched(adapted):
    root, _, before = adapted
    text = (root / op_plugin.YAML).read_text()
    data = yaml.safe_load(text)
    funcs = [e["func"] for e in data["official"]]
    assert funcs == [
        "abs(Tensor self) -> Tensor", "abs.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)",
        "histc(Tensor self, int bins=100, Scalar min=0, Scalar max=0) -> Tensor",
        "hypot(Tensor self, Tensor other) -> Tensor",
        "hypot.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)",
        "hypot_(Tensor(a!) self, Tensor other) -> Tensor(a!)",
        "index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor",
        "mul.Tensor(Tensor self, Tensor other) -> Tensor"]
    assert all(e["op_api"] == "all_version" and "acl_op" not in e for e in data["official"] if "hypot" in e["func"])
    assert "hypot" not in str(data["custom"]) + str(data["autograd"]) + str(data["symint"])
    # removing the added lines gives the original file back, comments and all
    added = "".join(f"  - func: {f}\n    op_api: all_version\n\n" for f in funcs[3:6])
    assert text.replace(added, "") == before[op_plugin.YAML].decode()


def test_the_kernel_has_the_schema_signatures_checks_and_the_aclnn_call(adapted):
    root, _, _ = adapted
    kernel = (root / "op_plugin/ops/opapi/HypotKernelNpuOpApi.cpp").read_text()
    assert "namespace op_api {" in kernel
    assert "at::Tensor hypot(const at::Tensor& self, const at::Tensor& other) {" in kernel
    assert "at::Tensor& hypot_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {" in kernel
    assert "at::Tensor& hypot_(at::Tensor& self, const at::Tensor& other) {" in kernel
    assert kernel.count("EXEC_NPU_CMD(aclnnHypot, self, other, out);\n  return out;") == 2
    assert "op_api::hypot_out(self, other, self);" in kernel
    assert "op_infer::broadcast_ops_npu_output_size(self, other)" in kernel
    assert "npu_preparation::apply_tensor_without_format(output_size, self.options().dtype(output_dtype))" in kernel
    assert "TORCH_CHECK(dtype_in(self, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16})," in kernel
    assert '"hypot: other must have dtype in [float32 float64 float16 bfloat16] on NPU",' in kernel
    assert "TORCH_CHECK(broadcastable({self.sizes(), other.sizes()})," in kernel
    # the same checks are the ones the CHECKLIST records
    checklist = json.loads((root / "op_plugin/config/adaptations/hypot/checklist.json").read_text())
    assert checklist["vendor_kernel"] == "aclnnHypot"
    for r in checklist["constraints"]:
        assert f"TORCH_CHECK({r['cpp']}," in kernel and f'"{r["message"]}"' in kernel


def test_no_helper_is_added_when_the_checkout_has_it(adapted):
    root, out, before = adapted
    for rel in ("op_plugin/utils/KernelNpuOutputSize.h", "op_plugin/utils/KernelNpuOutputSize.cpp"):
        assert (root / rel).read_bytes() == before[rel]
    actions = {f["path"]: f["action"] for f in out["checklist"]["files"]}
    assert actions["op_plugin/utils/KernelNpuOutputSize.h"] == \
        "none: the checkout has broadcast_ops_npu_output_size"


def test_a_missing_helper_is_declared_and_defined(tmp_path, fast_checklist):
    root = make_checkout(tmp_path / "op-plugin", broadcast_helpers=False)
    result = runner.invoke(app, ["op-adapt", "aten::hypot", "--profile", "op-plugin", "--repo", str(root)])
    assert result.exit_code == 0, result.output
    header = (root / "op_plugin/utils/KernelNpuOutputSize.h").read_text()
    source = (root / "op_plugin/utils/KernelNpuOutputSize.cpp").read_text()
    assert "OP_PLUGIN_HIDDEN c10::SmallVector<int64_t, SIZE> broadcast_ops_npu_output_size(const at::Tensor& self, " \
           "const at::Tensor& other);" in " ".join(header.split())
    assert max(len(line) for line in header.splitlines() + source.splitlines()) <= 120  # op-plugin's column limit
    assert header.index("broadcast_ops_npu_output_size") < header.index("} // namespace op_infer")
    assert "return c10::SmallVector<int64_t, SIZE>(at::infer_size(shape1, shape2));" in source
    assert source.rstrip().endswith("} // namespace op_infer")
    assert source.count("input_same_output_size") == 1  # what was there stays as it was


def test_the_tests_parse_and_cover_the_checklist_dtypes(adapted):
    root, _, _ = adapted
    text = (root / "test/test_base_ops/test_hypot.py").read_text()
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    assert cls.name == "TestHypot" and [b.id for b in cls.bases] == ["TestCase"]
    assert "from torch_npu.testing.testcase import TestCase, run_tests" in text
    assert "DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]" in text
    assert "OUT = torch.ops.aten.hypot.out" in text and "INPLACE = torch.ops.aten.hypot_.default" in text
    tests = {f.name for f in cls.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")}
    assert tests == {"test_hypot_dtypes_match_cpu", "test_hypot_out_matches_cpu", "test_hypot_inplace_matches_cpu",
                     "test_hypot_refuses_other_dtypes"}
    assert "self.assertRtolEqual(cpu_output, npu_output)" in text


def test_the_generated_test_helpers_run_on_the_cpu(adapted):
    """The module's CPU half (inputs, the reference computation) runs as written, with torch_npu stubbed out."""
    import sys
    import types

    root, _, _ = adapted
    text = (root / "test/test_base_ops/test_hypot.py").read_text()
    stub = types.ModuleType("torch_npu.testing.testcase")
    stub.TestCase, stub.run_tests = object, lambda: None
    mods = {"torch_npu": types.ModuleType("torch_npu"), "torch_npu.testing": types.ModuleType("torch_npu.testing"),
            "torch_npu.testing.testcase": stub}
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        ns: dict = {"__name__": "generated"}
        exec(compile(text, "test_hypot.py", "exec"), ns)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    import torch

    for dtype in ns["DTYPES"]:
        call = ns["inputs"](ns["SHAPES"][1], dtype)
        expected = ns["TestHypot"].cpu_op_exec(None, call)
        assert expected.shape == (2, 4, 3) and expected.dtype == dtype
        torch.testing.assert_close(expected.float(), torch.hypot(*[a.float() for a in call[0]]).to(dtype).float())


def test_the_fake_tensor_case_is_added_before_the_main_guard(adapted):
    root, _, before = adapted
    text = (root / op_plugin.FAKE_TENSOR_TEST).read_text()
    ast.parse(text)
    assert text.startswith(before[op_plugin.FAKE_TENSOR_TEST].decode().split('if __name__')[0])
    assert text.index("class TestHypotMeta(TestCase):") < text.index('if __name__ == "__main__":')
    assert "result = torch.ops.aten.hypot.default(self_, other)" in text
    assert 'self.assertEqual(result.device.type, "npu")' in text


def test_the_schema_baseline_gains_the_three_schemas_in_its_format(adapted):
    root, _, before = adapted
    text = (root / op_plugin.SCHEMA_BASELINE).read_text()
    data = json.loads(text)
    old = json.loads(before[op_plugin.SCHEMA_BASELINE])
    assert {k: data[k] for k in old} == old
    assert {k for k in data if k not in old} == {
        "func: hypot(Tensor self, Tensor other) -> Tensor",
        "func: hypot.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)",
        "func: hypot_(Tensor(a!) self, Tensor other) -> Tensor(a!)"}
    assert '  "func: hypot(Tensor self, Tensor other) -> Tensor": {\n    "version": ["all_version"]\n  }' in text


def test_the_doc_lists_every_argument_with_the_schemas_type_and_default(adapted):
    root, _, _ = adapted
    doc = (root / "docs/zh/native_APIs/torch-hypot.md").read_text()
    for section in ("## 功能描述", "## 参数说明", "## 约束说明", "## 支持的型号", "## 调用示例"):
        assert section in doc
    args = re.findall(r"^- \*\*(\w+)\*\*（`([^`]+)`(?:，默认值为`([^`]+)`)?）", doc, flags=re.M)
    assert args == [("self", "Tensor", ""), ("other", "Tensor", "")]
    assert "hypot(Tensor self, Tensor other) -> Tensor" in doc and "aclnnHypot" in doc
    assert "result = torch.ops.aten.hypot.default(self_, other)" in doc


def test_the_doc_of_an_argument_with_a_default_shows_it(hypot_checklist):
    from opforge.skills.op_adapt.checklist import Argument

    c = copy.deepcopy(hypot_checklist)
    c.arguments.append(Argument("keepdim", "bool", "False", True))
    doc = op_plugin.doc_source(c)
    assert "- **keepdim**（`bool`，默认值为`False`）：关键字参数，可选参数。" in doc


def test_meta_and_backward_are_recorded_as_not_needed(adapted):
    root, out, _ = adapted
    actions = {f["path"]: f["action"] for f in out["checklist"]["files"]}
    assert actions["op_plugin/python/meta/_meta_registrations.py"] == "none: torch has it"
    assert actions["op_plugin/config/derivatives.yaml"].startswith("none: torch has it")
    assert not (root / "op_plugin/python/meta/_meta_registrations.py").exists()
    assert "none: torch has it" in (root / "op_plugin/config/adaptations/hypot/CHECKLIST.md").read_text()


def test_json_lists_every_file_written(adapted):
    root, out, before = adapted
    written = {rel for rel, data in snapshot(root).items() if before.get(rel) != data}
    assert set(out["files"]) == written
    assert {"op_plugin/config/op_plugin_functions.yaml", "op_plugin/ops/opapi/HypotKernelNpuOpApi.cpp",
            "test/test_base_ops/test_hypot.py", "docs/zh/native_APIs/torch-hypot.md",
            "op_plugin/config/adaptations/hypot/CHECKLIST.md"} <= written
    assert out["op"] == "aten::hypot" and out["dry_run"] is False and out["build"] is None


def test_dry_run_prints_the_diff_and_writes_nothing(tmp_path, fast_checklist):
    root = make_checkout(tmp_path / "op-plugin")
    before = snapshot(root)
    result = runner.invoke(app, ["op-adapt", "aten::hypot", "--profile", "op-plugin", "--repo", str(root),
                                 "--dry-run"])
    assert result.exit_code == 0, result.output
    assert snapshot(root) == before
    assert "+++ b/op_plugin/ops/opapi/HypotKernelNpuOpApi.cpp" in result.stdout
    assert "+  - func: hypot(Tensor self, Tensor other) -> Tensor\n" in result.stdout


def test_the_summary_names_each_file(tmp_path, fast_checklist):
    root = make_checkout(tmp_path / "op-plugin")
    result = runner.invoke(app, ["op-adapt", "aten::hypot", "--profile", "op-plugin", "--repo", str(root)])
    assert result.exit_code == 0, result.output
    assert "aten::hypot adapted" in result.stdout
    assert "C++ kernel (op_api)" in result.stdout and "none: torch has it" in result.stdout
    assert result.stderr == ""


def test_a_tree_that_is_not_an_op_plugin_checkout_exits_2(tmp_path):
    (tmp_path / "something").mkdir()
    result = runner.invoke(app, ["op-adapt", "aten::hypot", "--profile", "op-plugin", "--repo",
                                 str(tmp_path / "something")])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'something'}: not an op-plugin checkout (no op_plugin/config/op_plugin_functions.yaml)"]
    assert result.stdout == ""
    assert list((tmp_path / "something").iterdir()) == []


def test_adapting_the_same_operator_twice_exits_2_and_changes_nothing(adapted):
    root, _, _ = adapted
    after_first = snapshot(root)
    result = runner.invoke(app, ["op-adapt", "aten::hypot", "--profile", "op-plugin", "--repo", str(root)])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: aten::hypot: already adapted in op_plugin/config/op_plugin_functions.yaml "
        "(hypot, hypot.out, hypot_); use --modify"]
    assert snapshot(root) == after_first


def test_an_existing_kernel_file_is_not_overwritten(tmp_path, fast_checklist):
    root = make_checkout(tmp_path / "op-plugin")
    (root / "op_plugin/ops/opapi/HypotKernelNpuOpApi.cpp").write_text("// someone's work\n")
    before = snapshot(root)
    result = runner.invoke(app, ["op-adapt", "aten::hypot", "--profile", "op-plugin", "--repo", str(root)])
    assert result.exit_code == 2 and "exists already" in result.stderr
    assert snapshot(root) == before


def test_a_kernel_whose_signature_differs_from_the_schema_is_refused():
    from opforge.skills.op_adapt.op_plugin import check_signatures

    good = "at::Tensor hypot(const at::Tensor& self, const at::Tensor& other) {\n  return self;\n}\n"
    check_signatures(good, ["hypot(Tensor self, Tensor other) -> Tensor"], "k.cpp")
    with pytest.raises(InputError, match=r"k\.cpp: defines at::Tensor hypot\(const at::Tensor&self,at::Tensor&other\)"):
        check_signatures(good.replace("const at::Tensor& other", "at::Tensor& other"),
                         ["hypot(Tensor self, Tensor other) -> Tensor"], "k.cpp")
    with pytest.raises(InputError, match="defines nothing for hypot_out"):
        check_signatures(good, ["hypot.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)"], "k.cpp")


def test_a_yaml_entry_that_torchgen_cannot_parse_is_refused():
    text = "official:\n  - func: abs(Tensor self) -> Tensor\n    op_api: all_version\n"
    bad = "hypot(Tensor self, Tensr other) -> Tensor"
    new = op_plugin.add_entries(text, "official", [bad])
    with pytest.raises(InputError, match="does not parse with torchgen"):
        op_plugin.check_yaml(text, new, "official", [bad])


def test_entries_go_to_the_end_of_a_section_when_every_name_sorts_before():
    text = "all_version: [v2.1]\nofficial:\n  - func: abs(Tensor self) -> Tensor\n    op_api: all_version\n\n" \
           "custom:\n  - func: npu_x(Tensor self) -> Tensor\n    op_api: all_version\n"
    new = op_plugin.add_entries(text, "official", ["zeta(Tensor self, Tensor other) -> Tensor"])
    assert new == text.replace("\n\ncustom:", "\n\n  - func: zeta(Tensor self, Tensor other) -> Tensor\n"
                                              "    op_api: all_version\n\ncustom:")
    op_plugin.check_yaml(text, new, "official", ["zeta(Tensor self, Tensor other) -> Tensor"])
