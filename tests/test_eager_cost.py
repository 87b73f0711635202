"""The eager side of the cost model counts what eager PyTorch dispatches, not the decomposed graph's nodes."""

from __future__ import annotations

import json

import torch
from conftest import ROOT, make_request

from opforge.codegen.eager_dispatch import dispatched_kernels, eager_cost, tensor_bytes
from opforge.request import load_request
from opforge.skills.op_api.stage import run as api_stage
from opforge.workspace import Workspace

MiB = 2**20


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_softmax_is_one_kernel_reading_and_writing_once():
    req = load_request(ROOT / "examples" / "softmax")
    cost = eager_cost(req, {"N": 2048, "V": 4096}, "bfloat16")
    assert cost["forward"] == {"kernels": 1, "bytes": 2 * 2048 * 4096 * 2, "ops": ["aten._softmax.default"]}
    assert cost["forward"]["bytes"] == 32 * MiB
    # backward reads the upstream gradient and the saved output, writes the input's gradient
    assert cost["backward"] == {"kernels": 1, "bytes": 48 * MiB, "ops": ["aten._softmax_backward_data.default"]}


def test_layer_norm_is_one_native_layer_norm():
    req = load_request(ROOT / "examples" / "layer_norm")
    n, h = 2048, 4096
    cost = eager_cost(req, {"N": n, "H": h}, "bfloat16")
    assert cost["forward"]["ops"] == ["aten.native_layer_norm.default"]
    # x, weight, bias read; y written with the float32 mean and rstd it saves for the backward
    assert cost["forward"]["bytes"] == (n * h + 2 * h) * 2 + n * h * 2 + 2 * n * 4
    assert cost["backward"]["ops"] == ["aten.native_layer_norm_backward.default"]


def test_float32_request_counts_four_byte_elements():
    req = load_request(ROOT / "examples" / "softmax")
    assert eager_cost(req, {"N": 2048, "V": 4096}, "float32")["forward"]["bytes"] == 64 * MiB


def test_a_composition_counts_each_dispatched_op():
    x = _meta(2048, 4096)
    ks = dispatched_kernels(lambda: (x * 2).sum())
    assert [k.op for k in ks] == ["aten.mul.Tensor", "aten.sum.default"]
    assert [k.bytes for k in ks] == [32 * MiB, 16 * MiB + 2]  # the scalar 2 is an argument, not a tensor read


def test_views_launch_nothing():
    x = _meta(2048, 4096)
    assert dispatched_kernels(lambda: x.view(4096, 2048).unsqueeze(0).squeeze(0).t().t().detach()[:7]) == []
    plain = dispatched_kernels(lambda: x * 2)
    viewed = dispatched_kernels(lambda: x.view(-1).unsqueeze(0).expand(3, -1)[1].view(2048, 4096) * 2)
    assert viewed == plain
    # a reshape that must copy is a kernel: eager runs it
    assert [k.op for k in dispatched_kernels(lambda: x.t().reshape(-1))] == ["aten.clone.default"]


def test_broadcast_and_repeated_operands_count_their_stored_elements():
    x, w = _meta(2048, 4096), _meta(4096)
    assert tensor_bytes(w.expand(2048, 4096)) == 4096 * 2
    assert dispatched_kernels(lambda: x * x)[0].bytes == 32 * MiB  # x read once
    assert dispatched_kernels(lambda: x * w)[0].bytes == 32 * MiB + 4096 * 2
    # in place: self is read and written
    y = torch.zeros(8, 16)
    assert dispatched_kernels(lambda: y.add_(1))[0].bytes == 2 * 8 * 16 * 4


REFERENCE_READS_A_VALUE = """import torch
def forward(weight, scale, eps=1e-4, qmin=-128.0, qmax=127.0):
    return weight * float(scale.max().item())
"""


def test_a_reference_that_reads_values_runs_on_the_cpu(tmp_path):
    req = load_request(make_request(tmp_path / "req", reference=REFERENCE_READS_A_VALUE))
    cost = eager_cost(req, req.p0[0], "float32")
    assert cost["forward"]["ops"] == ["aten.max.default", "aten.mul.Tensor"]
    assert cost["backward"]["ops"] == ["aten.mul.Tensor"]


def test_api_report_carries_the_dispatched_count(tmp_path):
    req = load_request(ROOT / "examples" / "softmax")
    outcome = api_stage(Workspace(tmp_path, req.name), req, None)
    assert outcome.status == "completed"
    rep = json.loads((tmp_path / "api_report.json").read_text())
    row = next(c for c in rep["cost"] if c["dtype"] == "bfloat16")
    assert (row["forward"]["eager_kernels"], row["forward"]["eager_bytes"]) == (1, 32 * MiB)
    assert (row["backward"]["eager_kernels"], row["backward"]["eager_bytes"]) == (1, 48 * MiB)
    assert row["forward"]["eager_ops"] == ["aten._softmax.default"]
    md = (tmp_path / "API_REPORT.md").read_text()
    assert f"| forward | 1 (0) | {32 * MiB:,} | 1 | {32 * MiB:,} | 1.0× |" in md
    assert "- forward: `aten._softmax.default`" in md
