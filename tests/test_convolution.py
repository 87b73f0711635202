"""Convolutions: the plan calls the vendor library (the ATen op, which torch dispatches to cuDNN or the
backend's own) for the convolution and its backward, and fuses the pointwise work around them into Triton
kernels; the forward's convolution output is saved for the backward."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from test_gemm import _check, _check_backward, _impl

from opforge.codegen.gemm import LIBRARY, GlueStage, LibraryStage
from opforge.orchestrator.gates import LIBRARY_CALLS, hot_path_violations, impl_reach_problems


def _request(tmp: Path, name: str, inputs: dict, body: str, p0: dict) -> Path:
    d = tmp / name
    d.mkdir()
    first = next(iter(inputs))
    doc = {"name": name, "description": f"{name} for the convolution tests", "category": "convolution",
           "inputs": {k: {"shape": v, "dtype": ["float32", "bfloat16"] if k == first else f"like {first}"}
                      for k, v in inputs.items()},
           "reference": "reference.py:forward", "backward": True, "shapes": {"p0": [p0]}}
    (d / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    head = "import torch\nimport torch.nn.functional as F\n\n\n"
    sig = f"def forward({', '.join(inputs)}):\n"
    (d / "reference.py").write_text(head + sig + textwrap.indent(body, "    ") + "\n")
    return d


def _kinds(plan) -> list[str]:
    return [type(s).__name__ for s in plan.steps if isinstance(s, (LibraryStage, GlueStage))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_convolution_with_bias_relu_and_residual_is_one_library_call_and_one_kernel(tmp_path, dtype):
    path = _request(tmp_path, "conv_block", {"x": ["N", "C", "H", "W"], "weight": ["C", "C", 3, 3], "bias": ["C"]},
                    "return torch.relu(F.conv2d(x, weight, bias, padding=1)) + x", {"N": 2, "C": 8, "H": 10, "W": 10})
    req, build, impl = _impl(path, tmp_path)
    fwd, bwd = build.forward, build.backward
    assert _kinds(fwd) == ["LibraryStage", "GlueStage"]  # the bias inside the call; ReLU and x in one kernel
    assert fwd.libraries[0].op == "aten.convolution.default" and fwd.libraries[0].reads == ["x", "weight", "bias"]
    # the backward reads the forward's convolution output instead of convolving again: ReLU's gradient, the
    # library's three gradients, then the residual's gradient added to dx
    assert build.saved.names == ["saved_convolution"]
    assert _kinds(bwd) == ["GlueStage", "LibraryStage", "GlueStage"] and "saved_convolution" in bwd.steps[0].inputs
    (lib,) = bwd.libraries
    assert lib.writes == ["convolution_dinput", "convolution_dweight", "convolution_dbias"]
    # the gradient the library reads is stored in the weight's dtype, as eager computes it
    assert bwd.steps[0].plan.outputs[0].like == "weight"
    source = (tmp_path / "conv_block_impl.py").read_text()
    assert impl_reach_problems(source) == [] and hot_path_violations(__import__("ast").parse(source)) == []
    assert source.count("torch.ops.aten.convolution") == 2  # forward and backward, nothing recomputed
    # float32 within the reduction's tolerance of float64; bfloat16, where the library rounds the convolution's
    # output to the dtype as eager does, within twice eager's error
    for binding in ({"N": 2, "C": 8, "H": 10, "W": 10}, {"N": 1, "C": 3, "H": 7, "W": 5}):
        (_check if dtype == torch.float32 else _check_backward)(req, impl, binding, dtype, binding["C"] * 9)


def test_strided_dilated_grouped_and_transposed_convolutions_keep_their_arguments(tmp_path):
    # a grouped 1D convolution with stride and dilation, SiLU and a scale, then a transposed 1D convolution
    # back up: each library call takes its convolution's arguments as traced
    body = ("h = F.silu(F.conv1d(x, w1, stride=2, dilation=2, padding=2, groups=2))\n"
            "return F.conv_transpose1d(h * 0.5, w2, stride=2, output_padding=1)")
    path = _request(tmp_path, "conv_pair", {"x": ["N", 4, "L"], "w1": [8, 2, 3], "w2": [8, 4, 3]},
                    body, {"N": 2, "L": 16})
    req, build, impl = _impl(path, tmp_path)
    assert [c.args[3:] for c in build.forward.libraries] == [["[2]", "[2]", "[2]", "False", "[0]", "2"],
                                                            ["[2]", "[0]", "[1]", "True", "[1]", "1"]]
    assert _kinds(build.forward) == ["LibraryStage", "GlueStage", "LibraryStage"]
    # no bias: the backward asks the library for dinput and dweight only (output_mask), the unread dbias
    # named after its stage
    assert [lib.args[-1] for lib in build.backward.libraries] == ["[True, True, False]"] * 2
    for binding in ({"N": 2, "L": 19}, {"N": 1, "L": 8}):  # two groups of two channels
        _check_backward(req, impl, binding, torch.float32, 8 * 3)
        _check_backward(req, impl, binding, torch.bfloat16, 8 * 3)


def test_the_gate_allows_exactly_the_library_calls_the_planner_makes():
    assert LIBRARY_CALLS == {f"torch.ops.{op}" for op in LIBRARY}
