"""The roofline the reports classify passes by: intensity against the device's ridge, and the time floor."""

from __future__ import annotations

import pytest

from opforge.bench.roofline import H200, classify, ridge


def test_a_large_bfloat16_product_is_compute_bound_and_a_pointwise_pass_memory_bound():
    n = 4096
    gemm = classify(2 * n ** 3, 3 * n * n * 2, "bfloat16")  # A, B read and C written once, 2 bytes each
    assert gemm["bound"] == "compute" and gemm["intensity"] > gemm["ridge"]
    assert gemm["floor_us"] == pytest.approx(2 * n ** 3 / H200.peak["bfloat16"] * 1e6, rel=1e-3)
    pointwise = classify(n * n, 2 * n * n * 2, "bfloat16")  # one flop per element read and written
    assert pointwise["bound"] == "memory"
    assert pointwise["floor_us"] == pytest.approx(2 * n * n * 2 / H200.bandwidth * 1e6, rel=1e-3)


def test_a_float32_product_meets_a_ridge_lower_by_the_tensor_cores_it_does_not_use():
    # float32 operators multiply in IEEE float32 on the CUDA cores: far less peak, so a far lower ridge
    assert ridge(H200, "float32") < ridge(H200, "bfloat16") / 10
    n = 512  # 2·n³ flops over 3·n²·4 bytes: n/6 ≈ 85 flops/byte, between the two ridges
    assert classify(2 * n ** 3, 3 * n * n * 4, "float32")["bound"] == "compute"
    assert classify(2 * n ** 3, 3 * n * n * 2, "bfloat16")["bound"] == "memory"


def test_the_api_report_classifies_each_pass_of_a_matrix_product():
    from test_gemm import EXAMPLES

    from opforge.codegen.build import plan_request
    from opforge.codegen.trace import trace_request
    from opforge.request import load_request
    from opforge.skills.op_api.stage import _md, _op_rows, cost_model

    req = load_request(EXAMPLES / "linear_gelu")
    traced = trace_request(req)
    build = plan_request(req, traced)
    cost = cost_model(req, traced, build)
    fwd = next(c for c in cost if c["dtype"] == "float32")["forward"]
    assert fwd["flops"] >= 2 * 256 * 128 * 512  # the product's 2·N·K·M, the epilogue's statements on top
    assert fwd["roofline"] == classify(fwd["flops"], fwd["fused_bytes"], "float32")
    md = _md(req, _op_rows(traced), [], "", cost, build)
    assert "| bound |" in md and "Roofline on the NVIDIA H200" in md and "GEMM program owns" in md
