"""With backward: true every floating input takes a gradient unless its request opts out; the delivered op
refuses an opted-out input that autograd would need a gradient for, rather than hand back None for it."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import yaml

from opforge.codegen.build import generate_impl, plan_request
from opforge.errors import InputError
from opforge.request import load_request
from opforge.workspace import load_module

GATED = "return torch.nn.functional.silu(a) * b"
SHAPES = [{"N": 3, "M": 5}, {"N": 7, "M": 33}]


def write_request(root: Path, name: str, inputs: dict, body: str, p0: dict = SHAPES[0]) -> Path:
    """`inputs` maps a name to its yaml spec; the reference takes them in order."""
    d = root / name
    d.mkdir(parents=True)
    (d / "reference.py").write_text(f"import torch\n\n\ndef forward({', '.join(inputs)}):\n    {body}\n")
    doc = {"name": name, "description": f"{name} for the gradient defaults", "category": "other",
           "inputs": inputs, "reference": "reference.py:forward", "backward": True, "shapes": {"p0": [p0]}}
    (d / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


def gated(root: Path, name: str, **b_extra) -> tuple:
    """silu(a) * b built as op `name` (each test its own: torch.library keeps an op name for the process)."""
    inputs = {"a": {"shape": ["N", "M"], "dtype": ["float32"]},
              "b": {"shape": ["N", "M"], "dtype": "like a", **b_extra}}
    req = load_request(write_request(root, name, inputs, GATED))
    path = root / f"{name}_impl.py"
    path.write_text(generate_impl(req, plan_request(req)))
    return req, load_module(path, path.stem)


def grads(fn, a, b, wrt, g):
    out = fn(a, b)
    return out, torch.autograd.grad(out, wrt, g)


def test_every_floating_input_gets_a_gradient_by_default(tmp_path):
    req, impl = gated(tmp_path, "gated_default")
    assert [s.requires_grad for s in req.inputs] == [True, True]
    gen = torch.Generator().manual_seed(3)
    for binding in SHAPES:
        a, b, g = (torch.randn(binding["N"], binding["M"], generator=gen, dtype=torch.float64) for _ in range(3))
        got_a, got_b = a.float().requires_grad_(), b.float().requires_grad_()
        ref_a, ref_b = a.clone().requires_grad_(), b.clone().requires_grad_()
        got, got_g = grads(impl.gated_default, got_a, got_b, (got_a, got_b), g.float())
        want, want_g = grads(req.load_reference(), ref_a, ref_b, (ref_a, ref_b), g)
        for x, y in zip((got, *got_g), (want.detach(), *want_g)):
            assert x is not None and x.dtype == torch.float32
            torch.testing.assert_close(x.double(), y, rtol=1e-5, atol=1e-5 * float(y.abs().max()))


def test_an_opted_out_input_that_requires_grad_is_refused(tmp_path):
    req, impl = gated(tmp_path, "gated_opt_out", requires_grad=False)
    assert [s.requires_grad for s in req.inputs] == [True, False]
    gen = torch.Generator().manual_seed(5)
    a, b, g = (torch.randn(7, 33, generator=gen, dtype=torch.float64) for _ in range(3))
    with pytest.raises(ValueError, match=r"^b: this operator was built without a gradient for b"):
        impl.gated_opt_out(a.float().requires_grad_(), b.float().requires_grad_())
    with torch.no_grad():  # nothing for autograd to need: the op runs
        out = impl.gated_opt_out(a.float(), b.float().requires_grad_())
    torch.testing.assert_close(out.double(), req.load_reference()(a, b), rtol=1e-5, atol=1e-5)

    got_a, ref_a = a.float().requires_grad_(), a.clone().requires_grad_()
    _, (got_g,) = grads(impl.gated_opt_out, got_a, b.float(), (got_a,), g.float())
    _, (want_g,) = grads(req.load_reference(), ref_a, b, (ref_a,), g)
    torch.testing.assert_close(got_g.double(), want_g, rtol=1e-5, atol=1e-5 * float(want_g.abs().max()))


def test_index_inputs_never_take_a_gradient(tmp_path):
    inputs = {"x": {"shape": ["N", "V"], "dtype": ["float32"]},
              "t": {"shape": ["N"], "dtype": "int64", "range": [0, "V"], "edges": [-100]},
              "w": {"shape": ["V"], "dtype": "like x"}}
    body = "return torch.nn.functional.cross_entropy(x * w, t, reduction='none')"
    req = load_request(write_request(tmp_path, "labels", inputs, body, {"N": 5, "V": 7}))
    assert {s.name: s.requires_grad for s in req.inputs} == {"x": True, "t": False, "w": True}

    inputs["t"]["requires_grad"] = True
    with pytest.raises(InputError, match="t.requires_grad: an integer input has no gradient"):
        load_request(write_request(tmp_path, "labels_grad", inputs, body, {"N": 5, "V": 7}))


def test_a_gradient_that_is_the_upstream_gradient_is_a_copy_and_inputs_keep_names_the_kernels_use(tmp_path):
    """d(x + y)/dy is the upstream gradient itself: the kernel stores a copy (an op's output may not alias its
    input). The inputs are named after the kernel's own variables (mask, offs, pid): renamed inside the module,
    the op's signature keeps them."""
    inputs = {"mask": {"shape": ["N", "M"], "dtype": ["float32"]}, "offs": {"shape": ["N", "M"], "dtype": "like mask"},
              "pid": {"shape": ["N", "M"], "dtype": "like mask"}}
    req = load_request(write_request(tmp_path, "pass_through", inputs, "return torch.sigmoid(mask) * offs + pid"))
    path = tmp_path / "pass_through_impl.py"
    path.write_text(generate_impl(req, plan_request(req)))
    impl = load_module(path, path.stem)
    assert list(inspect.signature(impl.pass_through).parameters)[:3] == ["mask", "offs", "pid"]
    gen = torch.Generator().manual_seed(4)
    xs = [torch.randn(5, 33, generator=gen).requires_grad_() for _ in range(3)]
    g = torch.randn(5, 33, generator=gen)
    out = impl.pass_through(*xs)
    got = torch.autograd.grad(out, xs, g)
    want = torch.autograd.grad(req.load_reference()(*xs), xs, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert got[2].data_ptr() != g.data_ptr()
