"""Scans along any dimension (cumsum, logcumsumexp, cumprod, their backward scans from a row's end) in the row kernel:
forward and backward against float64, with rows that fit one chunk and rows walked in chunks with a carry."""

from __future__ import annotations

import pytest
import torch
from test_fusion_planner import check_against_float64, load_impl, write_request

from opforge.codegen.build import generate_impl, plan_request
from opforge.codegen.plan import Unsupported
from opforge.request import load_request

# name -> (inputs, reference body, shape bindings)
SCANS = {
    "cumsum_rows": ({"x": [["N", "M"], True]}, "return torch.cumsum(x, dim=-1)", [{"N": 3, "M": 9}, {"N": 5, "M": 70}]),
    "cumsum_dim0": ({"x": [["N", "M"], True]}, "return torch.cumsum(x, dim=0)", [{"N": 40, "M": 3}]),
    "cumsum_middle": ({"x": [["B", "N", "M"], True]}, "return torch.cumsum(x, dim=1)", [{"B": 2, "N": 37, "M": 5}]),
    "reverse_cumsum": ({"x": [["N", "M"], True]}, "return torch.cumsum(x.flip(-1), -1).flip(-1)",
                       [{"N": 5, "M": 70}]),
    "logcumsumexp": ({"x": [["N", "M"], True]}, "return torch.logcumsumexp(x, dim=-1)", [{"N": 5, "M": 70}]),
    "linear_then_cumsum": ({"x": [["B", "N", "K"], True], "w": [["M", "K"], True]},
                           "return torch.nn.functional.linear(x, w).transpose(1, 2).cumsum(1)",
                           [{"B": 2, "N": 40, "K": 16, "M": 4}]),
    "cumprod_rows": ({"x": [["N", "M"], True]}, "return torch.cumprod(x, -1)", [{"N": 3, "M": 9}, {"N": 5, "M": 40}]),
    "cumprod_dim0": ({"x": [["N", "M"], True]}, "return x.cumprod(0) * 2", [{"N": 37, "M": 3}]),
    "weighted_cumsum": ({"x": [["N", "M"], True], "w": [["M"], True]}, "return torch.cumsum(x * w, -1).relu()",
                        [{"N": 6, "M": 70}]),
}


def _build(tmp_path, name):
    inputs, body, bindings = SCANS[name]
    req = load_request(write_request(tmp_path, name, inputs, {}, body, bindings))
    b = plan_request(req)
    source = generate_impl(req, b)
    return req, b, source, load_impl(tmp_path / f"{name}_impl.py", source)


@pytest.mark.parametrize("name", list(SCANS))
@pytest.mark.parametrize("chunk", [None, 16], ids=["whole_rows", "chunks"])
def test_scan_forward_and_backward_match_float64(tmp_path, monkeypatch, name, chunk):
    req, _, _, impl = _build(tmp_path, name)
    if chunk:  # rows longer than a chunk: walked with a carry, from the end for a backward scan
        monkeypatch.setattr(impl, "MAX_BLOCK_C", chunk)
    check_against_float64(req, getattr(impl, name), SCANS[name][2], seed=3)


def test_a_long_running_sum_stays_accurate(tmp_path, monkeypatch):
    """A running sum over 4096 columns of ones walked in 64-column chunks: the carry makes every prefix exact."""
    req, _, _, impl = _build(tmp_path, "cumsum_rows")
    monkeypatch.setattr(impl, "MAX_BLOCK_C", 64)
    x = torch.ones(3, 4096)
    assert torch.equal(impl.cumsum_rows(x), torch.arange(1, 4097, dtype=torch.float32).expand(3, -1))


def test_backward_scans_run_from_the_row_end(tmp_path):
    """cumsum's gradient is flip(cumsum(flip(g))): one scan backwards, no column read back to front."""
    _, b, source, _ = _build(tmp_path, "cumsum_rows")
    assert "reverse=True" in source and "flip" not in source
    assert "# the chunks from the row's end: its scans run backwards" in source
    assert all(k.scans for k in b.backward.kernels) and b.backward.reverse and not b.forward.reverse


def test_logcumsumexp_saves_its_output_for_the_backward(tmp_path):
    """Its gradient scans backwards over values of the forward scan: the forward stores the scan, the backward
    reads it, so that no walk has to run both ways."""
    _, b, source, _ = _build(tmp_path, "logcumsumexp")
    assert b.saved is not None and b.saved.what == "scans"
    assert [o.name for o in b.forward.outputs][1:] == b.saved.names
    assert "_logaddexp" in source and not b.forward.reverse and b.backward.reverse


def test_a_scan_along_a_dimension_the_walk_cannot_take_is_refused(tmp_path):
    """The running sum wants dimension 0 as the columns, the row max dimension 1: the op is named."""
    req = load_request(write_request(tmp_path, "clash", {"x": [["N", "M"], True]}, {},
                                     "return torch.cumsum(x, 0) * x.amax(1, keepdim=True)", [{"N": 5, "M": 7}]))
    with pytest.raises(Unsupported, match="aten.cumsum.default"):
        plan_request(req)


@pytest.mark.parametrize("chunk", [None, 4], ids=["whole_rows", "chunks"])
def test_cumprod_gradient_is_torchs_where_rows_hold_zeros(tmp_path, monkeypatch, chunk):
    """Before a row's first zero the product rule divides by the element; at the first zero, and at a second,
    the gradient is torch's own (it multiplies the other elements instead); the forward scans (zeros counted,
    products) are finished in one kernel and handed to the one that sums from the row's end."""
    req, b, _, impl = _build(tmp_path, "cumprod_rows")
    assert [bool(k.reverse) for k in b.backward.kernels if k.scans] == [False, True]
    if chunk:
        monkeypatch.setattr(impl, "MAX_BLOCK_C", chunk)
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(6, 11, generator=gen, dtype=torch.float64) + 0.5
    x[1, 0] = x[2, 4] = x[3, 10] = x[4, 3] = x[4, 7] = x[5, 2] = x[5, 3] = 0.0  # first, middle, last; two zeros
    g = torch.randn(6, 11, generator=gen, dtype=torch.float64)
    got_x, ref_x = x.float().requires_grad_(), x.clone().requires_grad_()
    got, want = impl.cumprod_rows(got_x), torch.cumprod(ref_x, -1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    got_g, = torch.autograd.grad(got, got_x, g.float())
    want_g, = torch.autograd.grad(want, ref_x, g)
    torch.testing.assert_close(got_g.double(), want_g, rtol=1e-5, atol=1e-5)
