"""Index outputs: argmax, argmin and max.dim / min.dim (values and indices) in the row kernel, int64 outputs
compared exactly with torch's, with its tie rule (the first column) and NaN rule (the first NaN wins)."""

from __future__ import annotations

import pytest
import torch
from test_fusion_planner import load_impl, write_request

from opforge.codegen.build import generate_impl, plan_request
from opforge.codegen.plan import Unsupported
from opforge.request import load_request

# name -> (reference body, shape bindings)
INDEX_OPS = {
    "argmax_rows": ("return torch.argmax(x, dim=-1)", [{"N": 4, "M": 9}, {"N": 5, "M": 70}]),
    "argmin_dim0": ("return torch.argmin(x, dim=0, keepdim=True)", [{"N": 37, "M": 5}]),
    "max_dim": ("v, i = torch.max(x, dim=-1)\n    return v * 2, i", [{"N": 4, "M": 70}]),
    "min_dim": ("v, i = torch.min(x, dim=1, keepdim=True)\n    return torch.exp(v), i", [{"N": 4, "M": 70}]),
    "max_dim0": ("v, i = torch.max(x, dim=0)\n    return v * 2, i", [{"N": 37, "M": 5}]),
}


def _build(tmp_path, name):
    body, bindings = INDEX_OPS[name]
    req = load_request(write_request(tmp_path, name, {"x": [["N", "M"], True]}, {}, body, bindings))
    b = plan_request(req)
    return req, b, load_impl(tmp_path / f"{name}_impl.py", generate_impl(req, b))


def _rows_with_edges(shape, gen, dtype):
    """Random rows, then rows that test the rules: ties at the best value, NaNs, all -inf, +inf."""
    x = torch.randn(shape, generator=gen).to(dtype)
    x[0, :] = 1.0  # every column ties: the first
    x[1, 2] = x[1, -1] = 50.0  # two maxima: the first
    x[2, -2] = float("nan")  # a NaN beats every number
    x[2, 1] = float("nan")  # the first NaN wins
    x[3, :] = float("-inf")
    return x


@pytest.mark.parametrize("name", list(INDEX_OPS))
@pytest.mark.parametrize("chunk", [None, 16], ids=["whole_rows", "chunks"])
def test_indices_equal_torchs_and_values_match_float64(tmp_path, monkeypatch, name, chunk):
    req, _, impl = _build(tmp_path, name)
    if chunk:  # rows longer than a chunk: the best value and its column carried from chunk to chunk
        monkeypatch.setattr(impl, "MAX_BLOCK_C", chunk)
    ref = req.load_reference()
    gen = torch.Generator().manual_seed(5)
    for binding in INDEX_OPS[name][1]:
        for dtype in (torch.float32, torch.bfloat16):
            shape = req.input_shape(req.inputs[0], binding)
            x = _rows_with_edges(shape, gen, dtype) if name != "argmin_dim0" else torch.randn(shape, generator=gen)
            x = x.to(dtype)
            got, want = impl.__dict__[name](x), ref(x.double())
            got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
            for a, b in zip(got, want):
                if b.dtype == torch.int64:
                    assert a.dtype == torch.int64 and torch.equal(a, b), (a, b)
                else:
                    torch.testing.assert_close(a.double(), b, rtol=1e-2, atol=1e-2, equal_nan=True)


def test_the_values_gradient_flows_to_the_first_best_column(tmp_path, monkeypatch):
    req, b, impl = _build(tmp_path, "max_dim")
    assert [o.like for o in b.forward.outputs] == ["x", "torch.int64"]
    assert [o.name for o in b.backward.outputs] == ["grad_x"]  # the indices take no gradient
    for chunk in (None, 16):
        if chunk:
            monkeypatch.setattr(impl, "MAX_BLOCK_C", chunk)
        x = torch.randn(4, 70)
        x[1, 3] = x[1, 50] = 9.0
        xa, xb = x.clone().requires_grad_(), x.clone().double().requires_grad_()
        g = torch.randn(4, dtype=torch.float64)
        (va, _), (vb, _) = impl.max_dim(xa), req.load_reference()(xb)
        ga, = torch.autograd.grad(va, xa, g.float())
        gb, = torch.autograd.grad(vb, xb, g)
        torch.testing.assert_close(ga.double(), gb)
        assert ga[1, 3] != 0 and ga[1, 50] == 0


def test_an_index_over_everything_is_refused_by_name(tmp_path):
    req = load_request(write_request(tmp_path, "flat_argmax", {"x": [["N", "M"], True]}, {},
                                     "return torch.argmax(x)", [{"N": 4, "M": 9}]))
    with pytest.raises(Unsupported, match="aten.argmax.default"):
        plan_request(req)


@pytest.mark.parametrize("chunk", [None, 4], ids=["whole_rows", "chunks"])
def test_max_along_a_leading_dimension_sends_the_gradient_to_torchs_index(tmp_path, monkeypatch, chunk):
    """torch.max(x, dim=0): the gradient goes to the element torch's index names, the first of tied maxima and
    the first NaN, found by a running count down the dimension rather than a scatter by the index."""
    req, _, impl = _build(tmp_path, "max_dim0")
    if chunk:
        monkeypatch.setattr(impl, "MAX_BLOCK_C", chunk)
    x = torch.randint(-2, 3, (9, 6), generator=torch.Generator().manual_seed(8)).double()  # ties everywhere
    x[2, 1] = x[5, 1] = x[3, 4] = float("nan")
    g = torch.randn(6, generator=torch.Generator().manual_seed(9)).double()  # float32 values: 2·g is exact
    got_x, ref_x = x.float().requires_grad_(), x.clone().requires_grad_()
    (got, got_i), (want, want_i) = impl.max_dim0(got_x), req.load_reference()(ref_x)
    assert torch.equal(got_i, want_i)
    got_g, = torch.autograd.grad(got, got_x, g.float())
    want_g, = torch.autograd.grad(want, ref_x, g)
    assert torch.equal(got_g.double(), want_g)
