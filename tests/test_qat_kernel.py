"""The generated QAT kernel on inputs nobody has seen, against an independent float64 computation.

The independent truth is the issue's formula written out here in float64 (not the golden, not the
reference): forward and grad_weight must equal the float32 computation cast to the dtype bit for bit;
grad_scale must be within the dtype tolerance of the float64 formula.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from conftest import make_request

from opforge.codegen.build import generate_impl, plan_request
from opforge.request import load_request
from opforge.workspace import load_module

EPS, QMIN, QMAX = 1e-4, -128.0, 127.0
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture(scope="module")
def impl(tmp_path_factory):
    d = tmp_path_factory.mktemp("impl")
    req = load_request(make_request(d / "req"))
    path = d / "qat_impl_under_test.py"
    path.write_text(generate_impl(req, plan_request(req)))
    return load_module(path, "qat_impl_under_test")


def formula(w, s, g, dtype, eps=EPS, qmin=QMIN, qmax=QMAX):
    """out, grad_weight (in `dtype` via a float32 computation) and grad_scale (float64), from the issue."""
    w32, s32, g32 = w.float(), s.float(), g.float()
    s_ = torch.where(s32 > eps, s32, torch.full_like(s32, eps))
    x = w32 / s_
    r = torch.round(x)
    q = torch.clamp(x + (r - x), qmin, qmax)
    out = (q * s_).to(dtype)
    inside = ((x + (r - x)) >= qmin) & ((x + (r - x)) <= qmax)
    grad_w = torch.where(inside, g32 * s_, torch.zeros_like(g32)) / s_
    w64, s64, g64 = w.double(), s.double(), g.double()
    s64_ = torch.where(s64 > eps, s64, torch.full_like(s64, eps))
    x64 = w64 / s64_
    r64 = torch.round(x64)
    in64 = (r64 >= qmin) & (r64 <= qmax)
    gs = (s64 > eps).double() * (g64 * (torch.clamp(r64, qmin, qmax) - in64.double() * x64)).sum()
    return out, grad_w.to(dtype), gs.reshape(1, 1)


def run_kernel(impl, w, s, g, **kw):
    w = w.clone().requires_grad_()
    s = s.clone().requires_grad_()
    out = impl.qat_symmetric_per_tensor(w, s, **kw)
    out.backward(g)
    return out.detach(), w.grad, s.grad


def tie_inputs(n, m, dtype, gen):
    """Scale 2**-5 so that w = W / s lands exactly on .5 ties and beyond the clamp range."""
    s = torch.full((1, 1), 2.0 ** -5, dtype=dtype)
    ties = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -128.5, 300.0, -300.0, 0.0, -0.0])
    w = (torch.randint(-300, 300, (n, m), generator=gen).double() + 0.5) * 2.0 ** -5
    flat = w.view(-1)
    flat[: min(flat.numel(), len(ties))] = ties[: flat.numel()] * 2.0 ** -5
    return w.to(dtype), s


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (37, 129), (130, 257), (0, 7)])
@pytest.mark.parametrize("kind", ["normal", "ties", "below_eps"])
def test_matches_independent_formula(impl, dtype, shape, kind):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{dtype}{shape}{kind}".encode()))
    n, m = shape
    if kind == "ties":
        w, s = tie_inputs(n, m, dtype, gen)
    else:
        w = (torch.randn(n, m, generator=gen) * 2).to(dtype)
        s = torch.full((1, 1), 1e-6 if kind == "below_eps" else 0.02, dtype=dtype)
    g = torch.randn(n, m, generator=gen).to(dtype)
    out, gw, gs = run_kernel(impl, w, s, g)
    ref_out, ref_gw, ref_gs = formula(w, s, g, dtype)
    assert torch.equal(out, ref_out)
    assert torch.equal(out.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       ref_out.view(torch.int16 if dtype != torch.float32 else torch.int32))  # signs of zero too
    assert torch.equal(gw, ref_gw)
    # grad_scale: one sum over n*m terms, stored in the dtype
    rtol = {torch.bfloat16: 1.6e-2, torch.float16: 1e-3, torch.float32: 1.3e-6}[dtype]
    terms = max(1, n * m)
    atol = 1e-5 * terms ** 0.5 + 64 * torch.finfo(torch.float32).eps * float((g.double().abs() * 130).sum())
    assert gs.dtype == dtype and gs.shape == (1, 1)
    assert abs(gs.double().item() - ref_gs.item()) <= atol + rtol * abs(ref_gs.item())


def test_scale_below_eps_has_no_gradient(impl):
    w = torch.randn(8, 9)
    _, _, gs = run_kernel(impl, w, torch.full((1, 1), 1e-6), torch.randn(8, 9))
    assert gs.item() == 0.0


def test_non_default_attributes_are_runtime_arguments(impl):
    w, s, g = torch.randn(17, 33) * 0.3, torch.full((1, 1), 0.05), torch.randn(17, 33)
    out, gw, gs = run_kernel(impl, w, s, g, eps=1e-3, qmin=-8.0, qmax=7.0)
    ref_out, ref_gw, ref_gs = formula(w, s, g, torch.float32, eps=1e-3, qmin=-8.0, qmax=7.0)
    assert torch.equal(out, ref_out) and torch.equal(gw, ref_gw)
    assert out.max() <= 7 * 0.05 + 1e-6 and out.min() >= -8 * 0.05 - 1e-6


def test_deterministic_reduction_is_bit_reproducible(impl):
    w, s, g = torch.randn(300, 301), torch.full((1, 1), 0.01), torch.randn(300, 301)
    runs = {run_kernel(impl, w, s, g, deterministic=True)[2].item() for _ in range(3)}
    assert len(runs) == 1


def test_wrong_scale_shape_is_a_clear_error(impl):
    with pytest.raises(ValueError, match="scale: expected 1 elements"):
        impl.qat_symmetric_per_tensor(torch.randn(4, 4), torch.ones(2, 2))
