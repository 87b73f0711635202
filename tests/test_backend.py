"""The reference backend from the outside: its CLI builds it (cached), describes it and runs its own tests."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opforge.backend import build, vendor
from opforge.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def built() -> build.Build:
    return build.build()  # the shipped tree; cached after the first build on this machine


def test_info_names_the_device_and_the_module_to_import(built):
    result = runner.invoke(app, ["backend", "info", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["device"] == "opdev" and info["import"] == "opforge.backend.device"
    assert info["built"] and Path(info["library"]) == built.library
    assert "empty.memory_format" in info["operators"] and "add.Tensor" in info["operators"]
    names = {k["name"]: k for k in info["vendor_kernels"]}
    assert names["vkCopysign"]["aten"] == "copysign.out" and "float16" in names["vkCopysign"]["dtypes"]


def test_a_second_build_of_the_same_tree_is_the_cached_one(built):
    result = runner.invoke(app, ["backend", "build", "--json"])
    assert result.exit_code == 0, result.output
    again = json.loads(result.stdout)
    assert again["cached"] is True and again["library"] == str(built.library)


def test_the_build_digest_follows_the_sources(tmp_path):
    tree = tmp_path / "native"
    shutil.copytree(build.NATIVE, tree)
    assert build.digest(tree) == build.digest(build.NATIVE)
    (tree / "ops" / "OutputSize.h").write_text((tree / "ops" / "OutputSize.h").read_text() + "\n// changed\n")
    assert build.digest(tree) != build.digest(build.NATIVE)


def test_the_backend_runs_its_own_tests(built):
    proc = subprocess.run([sys.executable, "-m", "opforge", "backend", "test"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_a_folder_that_is_not_a_source_tree_is_refused(tmp_path):
    result = runner.invoke(app, ["backend", "build", "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path.resolve()}: not an opdev source tree (no opdev_functions.yaml)"]


def test_an_unknown_operator_in_the_backend_yaml_is_named(tmp_path):
    tree = tmp_path / "native"
    shutil.copytree(build.NATIVE, tree)
    yaml_path = tree / build.BACKEND_YAML
    yaml_path.write_text(yaml_path.read_text().replace("- mul.Tensor", "- mul.Tensr"))
    result = runner.invoke(app, ["backend", "build", "--root", str(tree)])
    assert result.exit_code == 2
    line, = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {yaml_path}: torchgen refused it") and "mul.Tensr" in line


def test_a_vendor_kernel_for_an_overload_that_is_not_out_is_named(tmp_path):
    path = tmp_path / "kernels.yaml"
    path.write_text("kernels:\n  vkSin: {aten: sin, dtypes: [float32]}\n")
    with pytest.raises(Exception, match=r"kernels.vkSin: aten::sin is not an out= overload"):
        vendor.load_kernels(path)


def test_vendor_kernels_take_their_overloads_arguments_in_schema_order():
    k = vendor.load_kernels()["vkSum"]
    assert [(p.name, p.c_type) for p in k.params] == [
        ("self", "const vkTensor*"), ("dim", "const vkIntArray*"), ("keepdim", "bool"), ("dtype", "const int32_t*"),
        ("out", "const vkTensor*")]
    assert k.cpp_call == "at::sum_outf"
    assert vendor.kernel_for("sum.dim_IntList", vendor.load_kernels()) == k
    assert vendor.kernel_for("sin.default", vendor.load_kernels()) is None


@pytest.mark.timeout(300)
def test_a_compile_error_is_one_line_naming_the_file_and_the_log_keeps_the_rest(tmp_path):
    tree = tmp_path / "native"
    shutil.copytree(build.NATIVE, tree)
    broken = tree / "ops" / "MulKernelOpdev.cpp"
    broken.write_text(broken.read_text().replace("return out;", "return out"))
    stale = build.build_dir(tree) / "obj" / "lock"  # what a build killed mid-way leaves behind
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.touch()
    result = runner.invoke(app, ["backend", "build", "--root", str(tree)])
    assert result.exit_code == 1
    line, = result.stderr.strip().splitlines()
    assert "the opdev backend did not compile" in line and "MulKernelOpdev.cpp" in line and "full log:" in line
