"""op-adapt into the reference backend, for real: the CHECKLIST, the files, the build, the API page's output, and
a patch that lands whole or not at all."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from opforge.backend import build
from opforge.cli import app
from opforge.skills.op_adapt.adapt import reference_root

runner = CliRunner()


def tree_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def adapted(tmp_path_factory) -> tuple[Path, dict]:
    """aten::exp adapted into a fresh copy of the shipped tree (its backward needs nothing opdev lacks)."""
    root = tmp_path_factory.mktemp("opdev") / "tree"
    result = runner.invoke(app, ["op-adapt", "aten::exp", "--repo", str(root), "--json"])
    assert result.exit_code == 0, result.output
    return root, json.loads(result.stdout)


def test_every_file_of_the_adaptation_is_written_from_the_checklist(adapted):
    root, out = adapted
    assert set(out["files"]) >= {"opdev_functions.yaml", "ops/ExpKernelOpdev.cpp", "schema.json",
                                 "tests/test_exp_opdev.py", "docs/exp.md", "adaptations/exp/CHECKLIST.md"}
    checklist = json.loads((root / "adaptations/exp/checklist.json").read_text())
    assert checklist["schema"] == "exp(Tensor self) -> Tensor" and checklist["vendor_kernel"] == "vkExp"
    assert checklist["dtypes"] == ["float32", "float64", "float16", "bfloat16"]
    assert checklist["conflicts"][0]["field"] == "dtypes"  # torch tests integer inputs; the vendor refuses them
    assert "- exp\n" in (root / "opdev_functions.yaml").read_text()
    kernel = (root / "ops/ExpKernelOpdev.cpp").read_text()
    assert "at::Tensor OpdevNativeFunctions::exp(const at::Tensor & self) {" in kernel
    assert "EXEC_OPDEV_CMD(vkExp, self, out);" in kernel
    assert "op_api::dtype_in(self, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16})" in kernel
    assert json.loads((root / "schema.json").read_text())["aten::exp"] == "exp(Tensor self) -> Tensor"
    assert "DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)" in \
        (root / "tests/test_exp_opdev.py").read_text()


def test_the_operator_runs_on_the_device_after_the_build(adapted):
    root, out = adapted
    code = ("import torch, opforge.backend.device\n"
            "x = torch.linspace(-2, 2, 7)\n"
            "print(torch.equal(torch.exp(x.to('opdev')).cpu(), torch.exp(x)), torch.exp(x.to('opdev')).device)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "OPDEV_ROOT": str(root)}, timeout=300)
    assert proc.stdout.split() == ["True", "opdev:0"], proc.stderr[-2000:]
    assert Path(out["build"]["library"]).is_file()


def test_the_api_page_shows_what_the_example_printed_on_the_device(adapted):
    root, _ = adapted
    page = (root / "docs/exp.md").read_text()
    assert "| self | `Tensor` | required |" in page
    torch.manual_seed(0)
    expected = str(torch.exp(torch.randn(2, 3)))
    assert f"Output (run on opdev):\n\n```\nopdev:0 torch.float32\n{expected}\n```" in page


def test_its_tests_pass_on_the_device(adapted):
    root, _ = adapted
    result = runner.invoke(app, ["op-test", "run", str(root), "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0, report["verdicts"]
    # OpInfo samples, fake tensors and compile per dtype, gradients per float dtype, one dtype constraint
    assert report["tests"] >= 13 and report["failed"] == 0


def test_dry_run_prints_the_patch_and_writes_nothing(tmp_path):
    root = reference_root(tmp_path / "tree")
    before = tree_files(root)
    result = runner.invoke(app, ["op-adapt", "aten::exp", "--repo", str(root), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "+++ b/ops/ExpKernelOpdev.cpp" in result.stdout and "+- exp" in result.stdout
    assert tree_files(root) == before


@pytest.mark.parametrize("op, what", [
    ("aten::no_such_op", "is not an ATen operator overload"),
    ("aten::sinh", "the vendor library has no kernel for it"),
    ("aten::exp_", "name the functional overload"),
])
def test_an_operator_that_cannot_be_adapted_is_one_line_and_exit_2(tmp_path, op, what):
    root = reference_root(tmp_path / "tree")
    result = runner.invoke(app, ["op-adapt", op, "--repo", str(root)])
    assert result.exit_code == 2
    line, = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {op}: ") and what in line


def test_an_operator_adapted_already_and_a_folder_that_is_no_tree_are_refused(adapted, tmp_path):
    root, _ = adapted
    before = tree_files(root)
    result = runner.invoke(app, ["op-adapt", "aten::exp", "--repo", str(root)])
    assert result.exit_code == 2 and "already registered" in result.stderr and "--modify" in result.stderr
    assert tree_files(root) == before
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["op-adapt", "aten::exp", "--repo", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "not an opdev source tree" in result.stderr


def test_a_build_that_fails_takes_the_whole_patch_back(tmp_path):
    root = reference_root(tmp_path / "tree")
    broken = root / "ops" / "OutputSize.cpp"
    broken.write_text(broken.read_text().replace("return sizes;", "return sizes"))  # the tree no longer compiles
    before = tree_files(root)
    result = runner.invoke(app, ["op-adapt", "aten::exp", "--repo", str(root)])
    assert result.exit_code == 1
    assert "did not compile" in result.stderr and "nothing was kept" in result.stderr
    assert tree_files(root) == before


def test_the_shipped_tree_is_not_touched_by_an_adaptation_elsewhere(adapted):
    assert "- exp\n" not in (build.NATIVE / "opdev_functions.yaml").read_text()
    assert not (build.NATIVE / "adaptations" / "exp").exists()


def verdicts(root: Path, *extra: str) -> dict[str, tuple[str, str | None]]:
    result = runner.invoke(app, ["op-test", "run", str(root), "--reruns", "1", "--json", *extra])
    assert result.exit_code == 1, result.output
    return {v["test"].split("::")[-1]: (v["verdict"], v["file"]) for v in json.loads(result.stdout)["verdicts"]}


def copy_of(adapted, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(adapted[0], tmp_path / "tree", ignore=shutil.ignore_patterns("__pycache__")))


def test_a_mistake_in_the_test_code_is_a_test_bug(adapted, tmp_path):
    root = copy_of(adapted, tmp_path)
    test = root / "tests/test_exp_opdev.py"
    test.write_text(test.read_text().replace("        reached = 0\n", "        reached = zero\n"))
    found = verdicts(root, "--test", "tests/test_exp_opdev.py")
    assert found and {v for v, _ in found.values()} == {"test_bug"}
    assert {f for _, f in found.values()} == {"tests/test_exp_opdev.py"}
    assert all(name.startswith("test_samples_match_cpu") for name in found)


def test_a_test_dtype_list_that_differs_from_the_checklist_is_a_test_bug(adapted, tmp_path):
    root = copy_of(adapted, tmp_path)
    test = root / "tests/test_exp_opdev.py"
    test.write_text(test.read_text().replace("DTYPES = (torch.float32,", "DTYPES = (torch.int32, torch.float32,"))
    found = verdicts(root, "--test", "tests/test_exp_opdev.py")
    assert found and all("int32" in name for name in found)
    assert set(found.values()) == {("test_bug", "tests/test_exp_opdev.py")}


def test_a_flaky_failure_is_the_environment(adapted, tmp_path):
    root = copy_of(adapted, tmp_path)
    (root / "tests/test_link.py").write_text(
        "from pathlib import Path\n\n\n"
        "def test_the_link_holds():\n"
        "    marker = Path(__file__).with_suffix('.ran')\n"
        "    if not marker.exists():  # fails the first time only, as a flaky device link would\n"
        "        marker.write_text('ran')\n"
        "        raise ConnectionError('device link reset')\n")
    assert verdicts(root, "--test", "tests/test_link.py") == {"test_the_link_holds": ("environment", None)}


def test_a_kernel_that_computes_the_wrong_thing_is_an_adaptation_bug_in_its_file(adapted, tmp_path):
    root = copy_of(adapted, tmp_path)
    kernel = root / "ops/ExpKernelOpdev.cpp"
    kernel.write_text(kernel.read_text().replace("EXEC_OPDEV_CMD(vkExp, self, out);",
                                                 "EXEC_OPDEV_CMD(vkSigmoid, self, out);"))
    found = verdicts(root, "--test", "tests/test_exp_opdev.py")  # the first run rebuilds the tree
    assert any(name.startswith("test_samples_match_cpu") for name in found)
    assert set(found.values()) == {("adaptation_bug", "ops/ExpKernelOpdev.cpp")}
