"""Products along a dimension (torch.prod): a row reduction multiplied in registers, and torch's gradient,
zeros included, written in tensor operations (torch's own asks which elements are zero, which a trace with
symbolic sizes cannot follow)."""

from __future__ import annotations

import pytest
import torch
from test_fusion_planner import load_impl, write_request

from opforge.codegen.build import generate_impl, plan_request
from opforge.codegen.plan import Unsupported
from opforge.request import load_request


def _build(tmp_path, name, body, inputs=None):
    inputs = inputs or {"x": [["N", "M"], True]}
    req = load_request(write_request(tmp_path, name, inputs, {}, body, [{"N": 4, "M": 9}]))
    src = generate_impl(req, plan_request(req))
    return req, load_impl(tmp_path / f"{name}_impl.py", src), src


@pytest.mark.parametrize("chunk", [None, 4], ids=["whole_rows", "chunks"])
@pytest.mark.parametrize("dim", [-1, 0])
def test_prod_and_its_gradient_match_torch_with_zeros(tmp_path, monkeypatch, chunk, dim):
    """Rows without a zero, with one (its gradient the product of the others) and with two (no gradient)."""
    name = f"prod_{'last' if dim == -1 else 'first'}"
    req, impl, src = _build(tmp_path, name, f"return torch.prod(x, {dim}) * 2")
    assert "tl.reduce(" in src and "_mul" in src
    if chunk:  # rows longer than a chunk: each chunk's products multiplied into the running ones
        monkeypatch.setattr(impl, "MAX_BLOCK_C", chunk)
    gen = torch.Generator().manual_seed(6)
    x = 1.0 + 0.2 * torch.randn(7, 13, generator=gen, dtype=torch.float64)
    x = x if dim == -1 else x.T.contiguous()
    rows = x if dim == -1 else x.T
    rows[1, 4] = rows[2, 0] = rows[2, 12] = rows[3, 12] = 0.0  # one zero; two zeros; a zero at the end
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        got_x, ref_x = x.to(dtype).requires_grad_(), x.to(dtype).double().requires_grad_()
        got, want = getattr(impl, name)(got_x), req.load_reference()(ref_x)
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
        g = torch.randn(want.shape, generator=gen, dtype=torch.float64)
        got_g, = torch.autograd.grad(got, got_x, g.to(dtype))
        want_g, = torch.autograd.grad(want, ref_x, g)
        torch.testing.assert_close(got_g.double(), want_g, rtol=tol, atol=tol)


def test_a_product_over_rows_of_another_walk_is_refused_by_name(tmp_path):
    """Products have no atomic to meet across programs: a product down the columns is named and refused."""
    req = load_request(write_request(tmp_path, "prod_clash", {"x": [["N", "M"], True]}, {},
                                     "return torch.prod(x, 0, keepdim=True) * x.amax(1, keepdim=True)",
                                     [{"N": 5, "M": 7}]))
    with pytest.raises(Unsupported, match="aten.prod.dim_int"):
        plan_request(req)
