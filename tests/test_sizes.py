"""Sizes: read off the inputs in the request's symbols and attributes, never a size divided by an expression of
itself (a group size as an attribute gave `M // (M // 64)`: a ZeroDivisionError for an empty weight, another
grouping for a width 64 does not divide); and empty inputs give empty outputs and gradients, forward and backward.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import sympy
import torch
import torch.nn.functional as F
import yaml
from conftest import make_request
from test_catalog import CATALOG, EXAMPLES, built  # noqa: F401  (built: the catalog's impls, a fixture)
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._sympy.functions import FloorDiv, PythonMod

from opforge.codegen.build import generate_impl, plan_request
from opforge.codegen.decompose import SizeSafeFunctionals
from opforge.codegen.symbolic import group_divisions, pysrc, real_src
from opforge.codegen.trace import TraceError, trace_request
from opforge.request import load_request
from opforge.workspace import load_module

# A weight of N rows cut into groups of `group_size` (an int attribute), one scale per group.
PER_GROUP = ("w = weight.view(weight.shape[0], -1, group_size)\n"
             "    return (w * scale.unsqueeze(-1)).view(weight.shape)")
# name -> (inputs, reference body, p0, output shapes under a binding)
GROUPED = {
    "pg": ({"weight": [["N", "G*64"], True], "scale": [["N", "G"], True]}, PER_GROUP, {"N": 3, "G": 4},
           lambda b: [(b["N"], 64 * b["G"])]),
    # the grouped view itself is the output
    "pg_view": ({"weight": [["N", "G*64"], True], "scale": [["N", "G"], True]},
                "return weight.view(weight.shape[0], -1, group_size) * scale.unsqueeze(-1)", {"N": 3, "G": 4},
                lambda b: [(b["N"], b["G"], 64)]),
    # groups of 32 whose count is read off another input
    "pg_count": ({"weight": [["N", "G*32"], True], "scale": [["N", "G"], True]},
                 "w = weight.view(weight.shape[0], scale.shape[1], -1)\n"
                 "    return (w * scale.unsqueeze(-1)).view(weight.shape)", {"N": 3, "G": 4},
                 lambda b: [(b["N"], 32 * b["G"])]),
    # a plain width: the impl itself refuses one that 64 does not divide
    "pg_plain": ({"weight": [["N", "M"], True]}, "return (weight.view(weight.shape[0], -1, group_size) * 2.0)"
                 ".view(weight.shape)", {"N": 3, "M": 256}, lambda b: [(b["N"], b["M"])]),
}
BLOCKS = {"BLOCK", "BLOCK_C", "BLOCK_R", "TILE", "COLUMN_BLOCK"}  # launch constants, not sizes


def write_request(root: Path, name: str, inputs: dict, body: str, p0: dict) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "reference.py").write_text(f"import torch\n\n\ndef forward({', '.join(inputs)}, group_size: int = 64):\n"
                                    f"    {body}\n")
    doc = {"name": name, "description": f"{name}, groups of an int attribute", "category": "elementwise",
           "inputs": {k: {"shape": shape, "dtype": ["float32"] if i == 0 else f"like {next(iter(inputs))}",
                          "requires_grad": rg} for i, (k, (shape, rg)) in enumerate(inputs.items())},
           "attributes": {"group_size": {"type": "int", "default": 64}},
           "reference": "reference.py:forward", "backward": True, "shapes": {"p0": [p0]}}
    (d / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    root = tmp_path_factory.mktemp("grouped")
    out = {}
    for name, (inputs, body, p0, _) in GROUPED.items():
        req = load_request(write_request(root, name, inputs, body, p0))
        src = generate_impl(req, plan_request(req))
        path = root / f"{name}_impl.py"
        path.write_text(src)
        out[name] = (req, load_module(path, f"{name}_sizes_impl"), src)
    return out


def size_divisions(src: str, kernels: bool = True) -> list[str]:
    """Every `a // b` and `a % b` of the source whose b is neither an int nor a launch constant (with
    kernels=False, outside the @triton.jit functions)."""
    tree = ast.parse(src)
    funcs = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
    skip = set() if kernels else {id(n) for f in funcs if any("jit" in ast.unparse(d) for d in f.decorator_list)
                                  for n in ast.walk(f)}
    bad = []
    for n in ast.walk(tree):
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.FloorDiv, ast.Mod)) and id(n) not in skip:
            r = n.right
            if not (isinstance(r, ast.Constant) and isinstance(r.value, int)
                    or isinstance(r, ast.Name) and r.id in BLOCKS):
                bad.append(ast.unparse(n))
    return bad


def _fake(op, tensors):
    with FakeTensorMode() as mode:
        outs = op(*[mode.from_tensor(t) for t in tensors])
    return [tuple(o.shape) for o in (outs if isinstance(outs, tuple) else (outs,))]


def _run(req, impl, binding, gen):
    """The impl's outputs and gradients, and the float64 reference's where it is defined (None where torch
    refuses the shape: view(N, -1, 64) of no elements cannot tell the -1)."""
    ins = []
    for spec in req.inputs:
        ins.append(torch.randn(req.input_shape(spec, binding), generator=gen, dtype=torch.float64))
    got_in = [t.float().requires_grad_() for t in ins]
    got = getattr(impl, req.name)(*got_in)
    got = got if isinstance(got, tuple) else (got,)
    g_out = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in got]
    got_g = torch.autograd.grad(got, got_in, [g.float() for g in g_out], allow_unused=True)
    got_g = [torch.zeros_like(t) if g is None else g for t, g in zip(got_in, got_g)]
    ref_in = [t.clone().requires_grad_() for t in ins]
    try:
        ref = req.load_reference()(*ref_in, **req.attr_defaults)
    except RuntimeError:
        return got, got_g, None, None, got_in
    ref = ref if isinstance(ref, tuple) else (ref,)
    ref_g = torch.autograd.grad(ref, ref_in, g_out, allow_unused=True)
    ref_g = [torch.zeros_like(t) if g is None else g for t, g in zip(ref_in, ref_g)]
    return got, got_g, ref, ref_g, got_in


def test_a_group_of_a_view_is_printed_as_its_size_and_its_width_must_be_a_multiple():
    m, n, g = (sympy.Symbol(s, integer=True, positive=True) for s in "MNG")
    assert pysrc(FloorDiv(m, FloorDiv(m, 64)), {}) == "64"
    # torch cancels 48*G // 64 to 3*G // 4: the group is still 64, and 48*G must be a multiple of it
    e = FloorDiv(48 * g, FloorDiv(48 * g, 64))
    assert pysrc(e, {}) == "64" and group_divisions([e], {}) == [("48*G", 64)]
    assert pysrc(FloorDiv(m, 64), {}) == "(M//64)"  # a division by a constant stays
    src = pysrc(PythonMod(m * n, g * n), {})  # the divisor keeps its brackets: not (M*N % G)*N
    assert eval(src, {"M": 10, "N": 3, "G": 4}) == (10 * 3) % (4 * 3)


@pytest.mark.parametrize("name", list(GROUPED))
def test_grouped_sizes_are_never_divided_by_an_expression_of_a_size(grouped, name):
    req, impl, src = grouped[name]
    assert size_divisions(src) == []
    fake = src[src.index(f"@_{name}_op.register_fake"):].split("\n\n\n")[0]
    want = {"pg": "(N, 64*G)", "pg_view": "(N, G, 64)", "pg_count": "(N, 32*G)", "pg_plain": "(N, 64*((M//64)))"}
    assert f"torch.empty({want[name]}," in fake, fake


@pytest.mark.parametrize("name", list(GROUPED))
def test_grouped_ops_match_the_reference_and_give_empty_outputs_for_empty_inputs(grouped, name):
    req, impl, _ = grouped[name]
    shapes = GROUPED[name][3]
    gen = torch.Generator().manual_seed(7)
    rows, cols = req.symbols
    for binding in ({rows: 3, cols: 2 if cols == "G" else 128}, {rows: 0, cols: 5 if cols == "G" else 320},
                    {rows: 3, cols: 0}, {rows: 0, cols: 0}):
        got, got_g, ref, ref_g, ins = _run(req, impl, binding, gen)
        assert [tuple(o.shape) for o in got] == shapes(binding), binding
        assert _fake(getattr(impl, req.name), [t.detach() for t in ins]) == shapes(binding), binding
        assert [g.shape for g in got_g] == [t.shape for t in ins]
        if ref is None:  # torch has no answer for no elements: empty, as the sizes say
            assert all(o.numel() == 0 for o in got) and all(g.numel() == 0 for g in got_g), binding
            continue
        for a, b in zip(list(got) + got_g, list(ref) + ref_g):
            torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_a_width_the_group_size_does_not_divide_is_refused_by_the_op_and_its_fake(grouped):
    req, impl, _ = grouped["pg_plain"]
    w = torch.randn(3, 100)
    with pytest.raises(ValueError, match="multiple of 64"):
        impl.pg_plain(w)
    with pytest.raises(ValueError, match="multiple of 64"):
        _fake(impl.pg_plain, [w])
    req, impl, _ = grouped["pg"]  # a weight width that is not 64 per scale
    with pytest.raises(ValueError, match="weight: expected shape"):
        impl.pg(torch.randn(3, 100), torch.randn(3, 2))


def test_rows_of_g_times_48_in_groups_of_64_run_where_64_divides_and_are_refused_elsewhere(tmp_path):
    d = write_request(tmp_path, "pg_48_64", {"weight": [["N", "G*48"], True]},
                      "return (weight.view(weight.shape[0], -1, group_size) * 2.0).view(weight.shape)",
                      {"N": 3, "G": 4})
    req = load_request(d)
    src = generate_impl(req, plan_request(req))
    assert size_divisions(src) == []
    (tmp_path / "pg_48_64_impl.py").write_text(src)
    impl = load_module(tmp_path / "pg_48_64_impl.py", "pg_48_64_impl")
    w = torch.randn(3, 192)
    torch.testing.assert_close(impl.pg_48_64(w), w * 2.0)
    for op in (impl.pg_48_64, lambda t: _fake(impl.pg_48_64, [t])):  # 240 = 5*48 is no multiple of 64
        with pytest.raises(ValueError, match="48\\*G: expected a multiple of 64"):
            op(torch.randn(3, 240))


def test_sizes_tied_in_a_way_the_shapes_do_not_state_are_refused_at_build(tmp_path):
    # the weight's M columns cut into groups of 64 must be the scale's G: the shapes say nothing of it
    d = write_request(tmp_path, "pg_untied", {"weight": [["N", "M"], True], "scale": [["N", "G"], True]},
                      PER_GROUP, {"N": 3, "M": 256, "G": 4})
    with pytest.raises(TraceError, match=r"\(M//64\) == G.*'G\*64'"):
        plan_request(load_request(d))
    # groups of 64 in rows of G*48: no grouping at the declared sizes
    d = write_request(tmp_path, "pg_48", {"weight": [["N", "G*48"], True], "scale": [["N", "G"], True]},
                      PER_GROUP, {"N": 3, "G": 5})
    with pytest.raises(TraceError, match="invalid for input of size"):
        plan_request(load_request(d))


def _empty_cases():
    """Each catalog op with its rows (the first input's first symbol) empty, then its last symbol empty where
    inputs can be drawn (labels need classes)."""
    cases = []
    for name, (_, bindings, _) in CATALOG.items():
        req = load_request(EXAMPLES / name)
        rows, last = req.inputs[0].shape[0], req.symbols[-1]
        for sym in dict.fromkeys([rows, last]):
            b = {**bindings[0], sym: 0}
            if all(lo < hi for s in req.inputs if s.index for lo, hi in [req.input_range(s, b)]):
                cases.append((name, sym))
    return cases


EMPTY = _empty_cases()
# a mean over rows of a loss with no classes: torch's count is numel / V, NaN at V = 0; the kernel's is the rows,
# which is numel // V for every V > 0 (an integer division by a size would be undefined on a GPU at V = 0)
MEAN_OVER_ROWS = {("cross_entropy", "V")}
# groups with no pixels: torch's native backward finds grad_weight as (Σ g·x − mean·Σ g)·rstd, NaN with the empty
# group's NaN statistics; the kernel sums g·x̂ over no pixels, which is 0
EMPTY_GROUPS = {("group_norm", "W")}
# pooling over an empty width: torch refuses it, and so does the operator, naming the input
REFUSED_EMPTY = {("max_pool2d", "W")}


@pytest.mark.parametrize("name, sym", EMPTY, ids=[f"{n}-{s}=0" for n, s in EMPTY])
def test_catalog_op_on_empty_inputs_matches_torch(built, name, sym):  # noqa: F811
    req, impl, _ = built[name]
    binding = {**CATALOG[name][1][0], sym: 0}
    gen = torch.Generator().manual_seed(11)
    ins = []
    for spec in req.inputs:
        shape = req.input_shape(spec, binding)
        if spec.index:
            ins.append(torch.randint(*req.input_range(spec, binding), shape, generator=gen))
        else:
            ins.append(torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5)
    wrt = [s.requires_grad for s in req.inputs]
    got_in = [(t.float() if t.is_floating_point() else t).requires_grad_(w) for t, w in zip(ins, wrt)]
    ref_in = [t.clone().requires_grad_(w) for t, w in zip(ins, wrt)]
    if (name, sym) in REFUSED_EMPTY:
        with pytest.raises(RuntimeError):
            req.load_reference()(*ref_in, **req.attr_defaults)
        with pytest.raises(ValueError, match=rf"^{req.inputs[0].name}: "):
            getattr(impl, name)(*got_in)
        return
    got, ref = getattr(impl, name)(*got_in), req.load_reference()(*ref_in, **req.attr_defaults)
    got, ref = (got if isinstance(got, tuple) else (got,)), (ref if isinstance(ref, tuple) else (ref,))
    assert _fake(getattr(impl, name), [t.detach() for t in got_in]) == [tuple(r.shape) for r in ref]
    g_out = [torch.randn(r.shape, generator=gen, dtype=torch.float64) for r in ref]
    got_g = torch.autograd.grad(got, [t for t in got_in if t.requires_grad], [g.float() for g in g_out])
    ref_g = torch.autograd.grad(ref, [t for t in ref_in if t.requires_grad], g_out, allow_unused=True)
    ref_g = [torch.zeros_like(t) if g is None else g for t, g in zip([t for t in ref_in if t.requires_grad], ref_g)]
    if (name, sym) in MEAN_OVER_ROWS:  # torch divides by numel / V = 0 / 0; the kernel by the B rows
        assert ref[0].isnan() and got[0].item() == 0.0
        got, ref = got[1:], ref[1:]
    for a, b in zip(list(got) + list(got_g), list(ref) + ref_g):
        assert a.shape == b.shape
        if (name, sym) in EMPTY_GROUPS:
            b = torch.where(b.isnan() & (a == 0), 0.0, b)
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_catalog_launchers_and_fakes_divide_sizes_only_by_constants(built):  # noqa: F811
    for name, (_, impl, _) in built.items():
        assert size_divisions(Path(impl.__file__).read_text(), kernels=False) == [], name


def test_a_product_of_sizes_in_pointwise_math_is_taken_as_a_float_past_2_31(tmp_path):
    """Size arguments are int32 in a kernel: LSQ's 1/sqrt(127·M·N) wrapped for a 64M-element weight (NaN outputs
    on an H200, 2026-12-04). Sizes in pointwise math are floats from the first factor on."""
    M, N = sympy.symbols("M N", integer=True, positive=True)
    expr = 127 * M * N - 3 * M + 5
    path = tmp_path / "size_kernel.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(out_ptr, M, N):\n"
                    f"    tl.store(out_ptr, {real_src(expr, {})})\n")
    out = torch.zeros(1)
    load_module(path, "size_kernel").k[(1,)](out, 2**20, 2**14)
    want = float(expr.subs({M: 2**20, N: 2**14}))
    assert out.item() == pytest.approx(want, rel=1e-6)


FIXES_A_SIZE = """import torch
def forward(weight, scale, eps=1e-4, qmin=-128.0, qmax=127.0):
    return weight * scale / int(weight.shape[0])
"""


def test_a_reference_that_reads_a_size_as_an_int_is_refused_at_trace(tmp_path):
    """Such a trace holds the probe's sizes as constants: a kernel built from it computed the probe's shape for
    every input (torch 2.11's cross_entropy with probability targets, seen on an H200)."""
    req = load_request(make_request(tmp_path / "req", reference=FIXES_A_SIZE))
    with pytest.raises(TraceError, match="fixed dimension N of weight"):
        trace_request(req)


@pytest.mark.parametrize("kw", [{}, {"reduction": "sum"}, {"label_smoothing": 0.1}, {"weight": True},
                                {"labels": True}])
def test_size_safe_cross_entropy_is_torchs_and_defers_what_it_does_not_cover(kw):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 5, 3, generator=g, dtype=torch.float64)
    t = torch.randint(0, 5, (6, 3), generator=g) if kw.pop("labels", False) else torch.rand(6, 5, 3, generator=g,
                                                                                            dtype=torch.float64)
    if kw.pop("weight", False):
        kw["weight"] = torch.rand(5, generator=g, dtype=torch.float64)
    with SizeSafeFunctionals():
        got = F.cross_entropy(x, t, **kw)
    torch.testing.assert_close(got, F.cross_entropy(x, t, **kw), rtol=1e-12, atol=0)


def test_two_dimensions_of_one_size_divide_by_a_product_the_gpu_compiler_takes(tmp_path):
    """A square input's mean divides by N·N: written N*N, never N**2, which the interpreter runs and Triton's
    compiler refuses (no ** on integers)."""
    from test_gemm import _check, _impl, _request

    path = _request(tmp_path, "square", {"x": ["N", "N"]}, "return x - x.mean()", {"N": 16})
    req, _, impl = _impl(path, tmp_path)
    jit = [f for f in ast.parse(Path(impl.__file__).read_text()).body if isinstance(f, ast.FunctionDef)
           and any("jit" in ast.unparse(d) for d in f.decorator_list)]
    assert jit and not [n for f in jit for n in ast.walk(f) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow)]
    assert any("N * N" in ast.unparse(f) for f in jit)
    _check(req, impl, {"N": 13}, torch.float32, 169)
