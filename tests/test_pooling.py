"""Pooling: max and average pooling in 1D-3D, adaptive pooling and max pooling's indices, each built from a
request and run in the interpreter at the shipped block size, forward and backward against float64."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from test_fusion_planner import check_against_float64, load_impl, write_request

from opforge.codegen.build import device_events, generate_impl, plan_request
from opforge.request import load_request

F = "torch.nn.functional"
X1 = {"x": (["N", "C", "L"], True)}
X2 = {"x": (["N", "C", "H", "W"], True)}
X3 = {"x": (["N", "C", "D", "H", "W"], True)}
B1 = [{"N": 2, "C": 3, "L": 17}]
B2 = [{"N": 2, "C": 3, "H": 9, "W": 10}, {"N": 3, "C": 2, "H": 13, "W": 7}]
B3 = [{"N": 2, "C": 3, "D": 5, "H": 6, "W": 7}]

# name -> (inputs, reference body, bindings); every pooling parameter torch takes, at sizes whose windows
# overhang the border (ceil mode), meet padding, or share elements (stride under the kernel size)
POOLS = {
    "max2d": (X2, f"return {F}.max_pool2d(x, 3, 2, 1)", B2),
    "max2d_dilated_ceil": (X2, f"return {F}.max_pool2d(x, (2, 3), (2, 1), (1, 1), dilation=(1, 2), ceil_mode=True)",
                           B2),
    "avg2d_ceil_no_pad_count": (X2, f"return {F}.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)",
                                B2),
    "avg2d_divisor": (X2, f"return {F}.avg_pool2d(x, (3, 2), 2, divisor_override=5)", B2),
    "relu_max2d_scaled": (X2, f"return {F}.max_pool2d(torch.relu(x), 2) * 2", B2),
    "max3d": (X3, f"return {F}.max_pool3d(x, 2, 2, 1)", B3),
    "avg3d": (X3, f"return {F}.avg_pool3d(x, 3, 2, 1)", B3),
    "max1d_ceil": (X1, f"return {F}.max_pool1d(x, 3, stride=2, padding=1, ceil_mode=True)", B1),
    "avg1d": (X1, f"return {F}.avg_pool1d(x, 3, 2)", B1),
    "adaptive_avg2d": (X2, f"return {F}.adaptive_avg_pool2d(x, (4, 3))", B2),
    "adaptive_max2d_wider": (X2, f"return {F}.adaptive_max_pool2d(x, (4, 12))", B2),  # more outputs than inputs
    "adaptive_avg1d": (X1, f"return {F}.adaptive_avg_pool1d(x, 5)", B1),
    "global_avg": (X2, f"return {F}.adaptive_avg_pool2d(x, 1)", B2),
    # at the first probe sizes (N=5, H=11) the pooled height is N: the upstream gradient must not take N's size
    "conv_pool_logsumexp": ({"x": (["N", "C", "H", "W"], True), "w": (["O", "C", 3, 3], True)},
                            f"y = {F}.max_pool2d({F}.conv2d(x, w, padding=1), 2)\n"
                            "    return torch.relu(torch.logsumexp(y, dim=1, keepdim=True))",
                            [{"N": 2, "C": 3, "H": 8, "W": 7, "O": 4}]),
    "unbatched_max2d": ({"x": (["C", "H", "W"], True)}, f"return {F}.max_pool2d(x, 2)", [{"C": 3, "H": 7, "W": 6}]),
}


def _build(root: Path, name: str, inputs: dict, body: str, bindings: list):
    req = load_request(write_request(root, name, inputs, {}, body, bindings))
    build = plan_request(req)
    src = generate_impl(req, build)
    return req, build, load_impl(root / f"{name}_pool_impl.py", src), src


@pytest.mark.parametrize("name", list(POOLS))
def test_pooling_builds_and_matches_float64(tmp_path, name):
    inputs, body, bindings = POOLS[name]
    req, _, impl, _ = _build(tmp_path, name, inputs, body, bindings)
    check_against_float64(req, getattr(impl, name), bindings, seed=11)


def test_design_describes_a_pooling_kernel(tmp_path):
    from opforge.skills.op_design.stage import _kernel_md

    inputs, body, bindings = POOLS["max3d"]
    req = load_request(write_request(tmp_path, "max3d", inputs, {}, body, bindings))
    build = plan_request(req)
    text = "\n".join(line for p in (build.forward, build.backward) for k in p.kernels for line in _kernel_md(k))
    assert "max pooling over 3 dimensions (kernel" in text and "the gradient of max pooling" in text


def test_max_pool_saves_its_indices_and_needs_no_bounds_checks_without_padding(tmp_path):
    """max_pool2d(relu(x), 2) * 2: the pooling is one kernel between two glue kernels, and it writes the
    indices, which the backward's one pooling kernel gathers by without reading the input again. Windows that
    never leave the input need no bounds checks."""
    inputs, body, bindings = POOLS["relu_max2d_scaled"]
    _, build, _, src = _build(tmp_path, "relu_max2d_scaled", inputs, body, bindings)
    assert device_events(build.forward, {})["kernels"] == 3
    assert len(build.saved.names) == 1 and build.saved.names[0].endswith("_indices")
    (fwd,), (bwd,) = build.forward.pools, build.backward.pools
    assert fwd.indices in build.forward.results and bwd.backward and bwd.indices == build.saved.names[0]
    fwd = src[src.index("def _relu_max2d_scaled_forward_1_kernel"):]
    fwd = fwd[:fwd.index("@triton.jit")]
    assert "tl.static_range(2)" in fwd and ">= 0" not in fwd and "< H" not in fwd
    assert "if True" not in src


def _request_with_indices(root: Path, body: str, shape: list, p0: dict) -> Path:
    d = root / "max_pool_indices"
    d.mkdir()
    (d / "reference.py").write_text(f"import torch\n\n\ndef forward(x):\n    {body}\n")
    doc = {"name": "max_pool_indices", "description": "max pooling and its indices", "category": "pooling",
           "inputs": {"x": {"shape": shape, "dtype": ["float32", "bfloat16"]}},
           "outputs": {"values": {"shape": shape, "dtype": "like x"},
                       "indices": {"shape": shape, "dtype": "int64"}},
           "reference": "reference.py:forward", "backward": True, "shapes": {"p0": [p0]}}
    (d / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


def test_max_pool_indices_match_torch_exactly_on_ties_and_nans(tmp_path):
    """The int64 indices are torch's bit for bit: on ties the first element of the window in scan order, a NaN
    wins its window (the last NaN, as torch's kernels take it); the values and the gradient match float64."""
    body = f"return {F}.max_pool2d(x, 3, 2, 1, return_indices=True)"
    req = load_request(_request_with_indices(tmp_path, body, ["N", "C", "H", "W"], {"N": 2, "C": 3, "H": 9, "W": 8}))
    impl = load_impl(tmp_path / "max_pool_indices_impl.py", generate_impl(req, plan_request(req)))
    gen = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randint(-2, 3, (2, 3, 9, 8), generator=gen).to(dtype)  # small integers: ties everywhere
        x[0, 0, 1, 1] = x[0, 0, 2, 2] = x[1, 2, 4, 0] = float("nan")
        x[1, 1, 5, 5] = float("-inf")
        got_x, ref_x = x.clone().requires_grad_(), x.double().requires_grad_()
        (got, got_i), (want, want_i) = impl.max_pool_indices(got_x), req.load_reference()(ref_x)
        assert got_i.dtype == torch.int64 and torch.equal(got_i, want_i)
        torch.testing.assert_close(got.double(), want, equal_nan=True, rtol=0, atol=0)
        g = torch.randn(want.shape, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(torch.autograd.grad(got, got_x, g.to(dtype))[0].double(),
                                   torch.autograd.grad(want, ref_x, g)[0], rtol=2e-2, atol=2e-2)


def test_channels_last_and_strided_inputs_are_read_in_place(tmp_path):
    inputs, body, bindings = POOLS["avg2d_ceil_no_pad_count"]
    req, _, impl, _ = _build(tmp_path, "avg2d_ceil_no_pad_count", inputs, body, bindings)
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(2, 3, 9, 20, generator=gen, dtype=torch.float64)
    for x in (base[..., ::2], base[..., :10].contiguous(memory_format=torch.channels_last)):
        got_x, ref_x = x.float().requires_grad_(), x.clone().requires_grad_()
        got, want = impl.avg2d_ceil_no_pad_count(got_x), req.load_reference()(ref_x)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
        g = torch.randn(want.shape, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(torch.autograd.grad(got, got_x, g.float())[0].double(),
                                   torch.autograd.grad(want, ref_x, g)[0], rtol=1e-5, atol=1e-6)


def test_pooling_refuses_a_tensor_of_another_rank(tmp_path):
    inputs, body, bindings = POOLS["max2d"]
    _, _, impl, _ = _build(tmp_path, "max2d", inputs, body, bindings)
    with pytest.raises(ValueError, match=r"x: expected 4 dimensions for this operator, got shape \(3, 9, 10\)"):
        impl.max2d(torch.randn(3, 9, 10))


def test_catalog_max_pool_passes_opcheck_and_compiles_without_graph_breaks(tmp_path):
    """The saved indices are declared int64 in the forward's fake, as the kernel writes them: opcheck compares
    the fake with the real outputs, and torch.compile(fullgraph=True) traces through the fakes."""
    req = load_request(Path(__file__).resolve().parents[1] / "examples" / "max_pool2d")
    impl = load_impl(tmp_path / "max_pool2d_opcheck_impl.py", generate_impl(req, plan_request(req)))
    x = torch.randn(2, 3, 9, 10, generator=torch.Generator().manual_seed(4), requires_grad=True)
    torch.library.opcheck(impl._max_pool2d_op, (x, False))
    got = torch.compile(impl.max_pool2d, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(got, torch.nn.functional.max_pool2d(x, 3, 2, 1), rtol=0, atol=0)
