"""A looped row's sum of exp(a - c) rides in the walk that finds max(a) when c follows from the max per row
(codegen/rows.py `_pair_online`): torch.logsumexp's where(|max| == inf, 0, max) as well as softmax's max
itself. One walk fewer, the same values as float64 torch, and the same inf and NaN where a row is not finite."""

from __future__ import annotations

import math

import pytest
import torch
from test_fusion_planner import load_impl, write_request

from opforge.codegen.build import generate_impl, plan_request
from opforge.request import load_request
from opforge.verify.kernel_lint import lint_source

SHAPE = {"N": 11, "M": 37}

# name -> (reference body, walks of (forward, backward) over a looped row: paired, then as before pairing)
CASES = {
    "lse": ("return torch.logsumexp(x, -1)", (1, 2), (2, 3)),
    "lse_log_softmax": ("return x - torch.logsumexp(x, -1, keepdim=True)", (2, 2), (3, 3)),
    "lse_total": ("return torch.logsumexp(x, -1).sum()", (1, 2), (2, 3)),  # programs meet: walked rows inside
}


def _build(tmp_path, name, body):
    req = load_request(write_request(tmp_path, name, {"x": [["N", "M"], True]}, {}, body, [SHAPE]))
    return req, plan_request(req)


def _looped(tmp_path, monkeypatch, name, req, b):
    impl = load_impl(tmp_path / f"{name}_impl.py", generate_impl(req, b))
    monkeypatch.setattr(impl, "MAX_BLOCK_C", 4)  # 37 columns in chunks of 4: every row walked
    monkeypatch.setattr(impl, "TILE", 8)  # two rows a program: six programs, the last one's rows masked
    return getattr(impl, name)


def _same_nonfinite(got, want):
    for test in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(test(got), test(want)), test.__name__


def _close_where_finite(got, want):
    ok = want.isfinite()  # a total over rows is NaN as a whole, and so is its every gradient
    if ok.any():
        torch.testing.assert_close(got[ok], want[ok], rtol=2e-5, atol=2e-5 * float(want[ok].abs().max()))


def _run(op, ref, x, g):
    xf = x.float().requires_grad_()
    out = op(xf)
    (gx,) = torch.autograd.grad(out, xf, g.float())
    x64 = x.clone().requires_grad_()
    want = ref(x64)
    (want_g,) = torch.autograd.grad(want, x64, g)
    return (out.double(), gx.double()), (want.detach(), want_g)


def _nonfinite_rows(gen):
    x = torch.randn(SHAPE["N"], SHAPE["M"], generator=gen, dtype=torch.float64) * 20
    x[1, 9] = math.inf  # one +inf: torch's logsumexp gives inf, not exp(inf - inf)
    x[2, :] = -math.inf  # all -inf: -inf
    x[3, 30] = math.nan
    x[4, 2], x[4, 33] = -math.inf, math.inf
    x[5, ::3] = -math.inf  # some -inf: finite
    x[6, :] = math.inf  # all +inf
    x[7, :] = 1e30  # finite, but exp of anything but the difference overflows
    return x


@pytest.mark.parametrize("name", list(CASES))
def test_a_shift_from_the_max_rides_in_the_max_walk(tmp_path, name):
    body, paired, unpaired = CASES[name]
    req, b = _build(tmp_path, name, body)
    assert lint_source(generate_impl(req, b)) == []
    for plan in (b.forward, b.backward):
        sums = [r for r in plan.row_reductions if r.online]
        assert len(sums) == 1 and sums[0].online.kind == "max" and sums[0].shift is not sums[0].online.node
    assert (b.forward.walks, b.backward.walks) == paired
    for plan in (b.forward, b.backward):
        for r in plan.row_reductions:
            r.online = None
    assert (b.forward.walks, b.backward.walks) == unpaired  # one walk more each, unpaired


def _op_and_reference(tmp_path, monkeypatch, name):
    req, b = _build(tmp_path, name, CASES[name][0])
    return _looped(tmp_path, monkeypatch, name, req, b), req.load_reference()


@pytest.mark.parametrize("name", list(CASES))
def test_looped_rows_match_float64_torch(tmp_path, monkeypatch, name):
    op, ref = _op_and_reference(tmp_path, monkeypatch, name)
    gen = torch.Generator().manual_seed(3)
    for scale in (1.0, 40.0):  # wide rows: the running max moves and the sum is rescaled often
        x = torch.randn(SHAPE["N"], SHAPE["M"], generator=gen, dtype=torch.float64) * scale
        x[0] = torch.arange(SHAPE["M"], dtype=torch.float64) * scale  # the max grows with every chunk
        g = torch.randn(ref(x).shape, generator=gen, dtype=torch.float64)
        for a, w in zip(*_run(op, ref, x, g)):
            torch.testing.assert_close(a, w, rtol=2e-5, atol=2e-5 * float(w.abs().max()))


@pytest.mark.parametrize("name", list(CASES))
def test_looped_rows_keep_torch_inf_and_nan(tmp_path, monkeypatch, name):
    op, ref = _op_and_reference(tmp_path, monkeypatch, name)
    gen = torch.Generator().manual_seed(4)
    x = _nonfinite_rows(gen)
    g = torch.randn(ref(x).shape, generator=gen, dtype=torch.float64)
    (out, gx), (want, want_g) = _run(op, ref, x, g)
    lse = torch.logsumexp(x, -1)
    assert lse[1] == math.inf and lse[2] == -math.inf and lse[3].isnan() and lse[6] == math.inf
    for a, w in ((out, want), (gx, want_g)):
        _same_nonfinite(a, w)
        _close_where_finite(a, w)


# a shift that is not finite for some finite maxes: c = max - 2 above 1, +inf in (0, 1], NaN at 0, -inf below
ODD = "m = x.amax(-1, keepdim=True)\n    c = torch.where(m > 1, m - 2, m * float('inf'))\n" \
      "    return torch.log(torch.exp(x - c).sum(-1))"


def test_any_shift_from_the_max_keeps_the_two_walk_values(tmp_path, monkeypatch):
    req, b = _build(tmp_path, "odd", ODD)
    assert [r.online.name for r in b.forward.row_reductions if r.online] == ["amax"]
    assert b.forward.walks == 1
    op, ref = _looped(tmp_path, monkeypatch, "odd", req, b), req.load_reference()
    x = _nonfinite_rows(torch.Generator().manual_seed(5))
    x[8] = -torch.rand(SHAPE["M"], dtype=torch.float64) - 0.5  # max below 0: c = -inf, no -inf: inf
    x[8, 20] = -math.inf  # c = -inf and a -inf in the row: NaN
    x[9] = x[8].clamp(min=-1.0)  # c = -inf, every element finite: inf
    x[10] = torch.rand(SHAPE["M"], dtype=torch.float64) * 0.9  # c = +inf: log(0) = -inf
    x[0] = -x[0].abs()
    x[0, 17] = 0.0  # max 0: c NaN
    with torch.no_grad():
        got, want = op(x.float()).double(), ref(x)
    assert want[8].isnan() and want[9] == math.inf and want[10] == -math.inf and want[0].isnan()
    _same_nonfinite(got, want)
    _close_where_finite(got, want)


def test_a_shift_that_needs_another_reduction_is_not_paired(tmp_path, monkeypatch):
    body = "c = x.amax(-1, keepdim=True) + x.mean(-1, keepdim=True)\n    return torch.exp(x - c).sum(-1)"
    req, b = _build(tmp_path, "two", body)
    assert not any(r.online for r in b.forward.row_reductions)  # c needs the mean too: walked after both
    op, ref = _looped(tmp_path, monkeypatch, "two", req, b), req.load_reference()
    x = torch.randn(SHAPE["N"], SHAPE["M"], generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(op(x.float()).double(), ref(x), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["lse", "lse_log_softmax", "odd"])
def test_rows_shared_by_programs_keep_the_values_of_one(tmp_path, monkeypatch, name):
    """ROW_SPLIT = 4: four programs share each row of 37 columns (spans of 12, 12, 12 and 1, walked in chunks
    of 4); their maxima and rescaled sums meet in the second kernel as a walk's columns meet, so the values,
    the inf and the NaN are those of one program walking the row."""
    req, b = _build(tmp_path, name, CASES[name][0] if name in CASES else ODD)
    assert b.forward.splits_rows  # (odd's backward reads the saved max and sum: no reduction to share)
    op, ref = _looped(tmp_path, monkeypatch, name, req, b), req.load_reference()
    impl = op.__globals__
    grids = []
    stats = impl[f"_{name}_forward_split_stats_kernel"]
    monkeypatch.setitem(impl, f"_{name}_forward_split_stats_kernel",
                        type("Spy", (), {"__getitem__": lambda self, grid: grids.append(grid) or stats[grid]})())
    gen = torch.Generator().manual_seed(6)
    x = _nonfinite_rows(gen)
    g = torch.randn(ref(x).shape, generator=gen, dtype=torch.float64)
    one = _run(op, ref, x, g)[0]
    monkeypatch.setitem(impl, "ROW_SPLIT", 4)
    (out, gx), (want, want_g) = _run(op, ref, x, g)
    assert grids == [(6, 4)]  # 11 rows, 2 a program (TILE 8 over chunks of 4): 6 row blocks of 4 programs
    for a, w, o in ((out, want, one[0]), (gx, want_g, one[1])):
        _same_nonfinite(a, w)
        _close_where_finite(a, w)
        _same_nonfinite(a, o)
