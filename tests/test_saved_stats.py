"""Per-row statistics the forward hands the backward (codegen/saved.py): kept where rows are walked in chunks,
since each recomputed reduction costs the backward a walk over the row; left out where rows fit in registers,
since recomputing them there reads nothing more."""

from __future__ import annotations

import torch
from test_fusion_planner import load_impl, write_request

from opforge.codegen.build import generate_impl, plan_request
from opforge.request import load_request

LONG = [{"N": 16, "V": 131072}]  # rows past MAX_BLOCK_C: looped
SHORT = [{"N": 2048, "V": 4096}]  # rows that fit: persistent


def _build(tmp_path, name, body, p0):
    req = load_request(write_request(tmp_path, name, {"x": [["N", "V"], True]}, {}, body, p0))
    return req, plan_request(req)


def test_long_softmax_rows_save_max_and_sum_and_the_backward_walks_once_less(tmp_path, monkeypatch):
    req, b = _build(tmp_path, "sm", "return torch.softmax(x, -1)", LONG)
    assert b.saved is not None and b.saved.bytes_saved > 0
    assert b.saved.walks == (3, 2) and b.backward.walks == 2
    assert [o.name for o in b.forward.outputs] == ["out", *b.saved.names]
    src = generate_impl(req, b)
    bwd = src[src.index("def _sm_backward_kernel("):src.index("def sm_forward(")]
    assert "tl.max(" not in bwd and "saved_amax_ptr" in bwd  # read, not recomputed
    impl = load_impl(tmp_path / "sm_impl.py", src)
    monkeypatch.setattr(impl, "MAX_BLOCK_C", 4)  # every row looped, as at the deciding shape
    x = torch.randn(7, 37, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x[3, 5] = 30.0
    g = torch.randn(7, 37, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    xf = x.float().requires_grad_()
    out = impl.sm(xf)
    assert isinstance(out, torch.Tensor) and out.shape == (7, 37)  # the statistics stay inside
    (gx,) = torch.autograd.grad(out, xf, g.float())
    x64 = x.clone().requires_grad_()
    want = torch.softmax(x64, -1)
    (want_g,) = torch.autograd.grad(want, x64, g)
    torch.testing.assert_close(out.double(), want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(gx.double(), want_g, atol=1e-6, rtol=1e-5)


def test_long_layer_norm_rows_save_mean_and_variance(tmp_path):
    req, b = _build(tmp_path, "ln", "return torch.nn.functional.layer_norm(x, x.shape[-1:])", LONG)
    assert b.saved is not None and b.saved.walks == (4, 2) and b.backward.walks == 2
    impl = load_impl(tmp_path / "ln_impl.py", generate_impl(req, b))
    x = torch.randn(5, 9, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    xf = x.float().requires_grad_()
    (gx,) = torch.autograd.grad(impl.ln(xf).sum(), xf)
    x64 = x.clone().requires_grad_()
    (want,) = torch.autograd.grad(torch.nn.functional.layer_norm(x64, (9,)).sum(), x64)
    torch.testing.assert_close(gx.double(), want, atol=1e-5, rtol=1e-5)


def test_rows_that_fit_recompute_their_statistics(tmp_path):
    _, b = _build(tmp_path, "sm", "return torch.softmax(x, -1)", SHORT)
    assert b.saved is not None and b.saved.bytes_saved < 0  # the stats written and read, nothing saved
    assert [o.name for o in b.forward.outputs] == ["out"] and b.backward.walks == 3


def test_design_states_the_choice_and_its_bytes(tmp_path):
    from opforge.skills.op_design.stage import _saved_md
    _, long_rows = _build(tmp_path / "a", "sm", "return torch.softmax(x, -1)", LONG)
    _, short_rows = _build(tmp_path / "b", "sm", "return torch.softmax(x, -1)", SHORT)
    saved, recomputed = _saved_md(long_rows, LONG[0])[0], _saved_md(short_rows, SHORT[0])[0]
    assert f"{long_rows.saved.bytes_saved:,} fewer bytes" in saved and "`amax`" in saved
    assert f"{-short_rows.saved.bytes_saved:,} more bytes" in recomputed and "recomputed" in recomputed
