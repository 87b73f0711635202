"""Every catalog operator, every dtype it declares, against an independent float64 computation.

The truth here is each operator's formula written out again in float64 (not the golden, not the request's
reference), forward and gradients by float64 autograd; quantizers take their rounding from float32 arithmetic,
as the kernel does, so that a value on a rounding tie cannot flip between the two. The comparison is the
verification policy's: the dtype's tolerance, atol grown with √K for outputs that reduce K elements.
Shapes are small and not block multiples; a second run forces rows to be walked in chunks (looped).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opforge.codegen.build import generate_impl, plan_request
from opforge.request import load_request
from opforge.verify.metrics import compare
from opforge.verify.tolerance import Tolerance, tolerance_for
from opforge.workspace import load_module

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# where the kernels run: the CPU (Triton's interpreter), or on a GPU machine the same checks on the device:
# OPFORGE_TEST_DEVICE=cuda TRITON_INTERPRET=0 pytest tests/test_catalog.py -k matches_float64
DEVICE = os.environ.get("OPFORGE_TEST_DEVICE", "cpu")


def _ste_round(x64, x32):
    """round(x) with an identity gradient, the rounding taken from the float32 value."""
    return x64 + (torch.round(x32).double() - x64).detach()


def qat_per_channel(w, s, eps=1e-4, qmin=-128.0, qmax=127.0):
    s_ = torch.where(s > eps, s, torch.full_like(s, eps))
    s32 = torch.where(s.float() > eps, s.float(), torch.full_like(s.float(), eps))
    x = w / s_
    return torch.clamp(_ste_round(x, w.float() / s32), qmin, qmax) * s_


def qat_per_group(w, s, z, eps=1e-4, qmin=0.0, qmax=255.0):
    n = w.shape[0]
    wg, sg, zg = w.reshape(n, -1, 32), s.unsqueeze(-1), z.unsqueeze(-1)
    sg = torch.where(sg > eps, sg, torch.full_like(sg, eps))
    s32 = sg.float()
    x = wg / sg + zg
    q = torch.clamp(_ste_round(x, wg.float() / s32 + zg.float()), qmin, qmax)
    return ((q - zg) * sg).reshape(w.shape)


def rms(x, w, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def add_rms(x, r, w, eps=1e-6):
    h = x + r
    return rms(h, w, eps), h


def softmax(x):
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def cross_entropy(logits, target):
    m = logits.max(-1, keepdim=True).values
    lse = m + torch.log(torch.exp(logits - m).sum(-1, keepdim=True))
    return (target * (lse - logits)).sum(-1).mean()


def cross_entropy_labels(logits, target, ignore_index=-100):
    m = logits.max(-1, keepdim=True).values
    lse = (m + torch.log(torch.exp(logits - m).sum(-1, keepdim=True))).squeeze(-1)
    counted = target != ignore_index
    picked = logits.gather(-1, torch.where(counted, target, 0).unsqueeze(-1)).squeeze(-1)
    return torch.where(counted, lse - picked, 0.0).sum() / counted.sum()


def swiglu(a, b):
    return a / (1 + torch.exp(-a)) * b


def geglu(a, b):
    return 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))) * b


def rope(x, cos, sin):
    d = x.shape[-1]
    perm = (torch.arange(d) + d // 2) % d  # rotate-half as a permutation with signs
    sign = torch.where(torch.arange(d) < d // 2, -1.0, 1.0).double()
    return x * cos + x[..., perm] * sign * sin


def lsq(x, step, bits=8):
    qn, qp = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    g = 1.0 / math.sqrt(x.numel() * qp)
    s = step * g + (step - step * g).detach()
    s32 = step.float() * g + (step.float() - step.float() * g)
    q = torch.clamp(x / s, qn, qp)
    q32 = torch.clamp(x.float() / s32, qn, qp)
    return _ste_round(q, q32) * s


# name -> (formula, shape bindings, the longest reduction among its outputs: None, "row", "col" or "all")
CATALOG = {
    "qat_symmetric_per_channel": (qat_per_channel, [{"N": 3, "M": 5}, {"N": 37, "M": 129}], "row"),
    "qat_asymmetric_per_group": (qat_per_group, [{"N": 3, "G": 1}, {"N": 37, "G": 5}], "row"),
    "rms_norm": (rms, [{"N": 3, "H": 5}, {"N": 37, "H": 129}], "col"),
    "layer_norm": (layer_norm, [{"N": 3, "H": 5}, {"N": 37, "H": 129}], "col"),
    "add_rms_norm": (add_rms, [{"N": 3, "H": 5}, {"N": 37, "H": 129}], "col"),
    "softmax": (softmax, [{"N": 3, "V": 5}, {"N": 37, "V": 129}], "row"),
    "group_norm": (lambda x, w, b: torch.nn.functional.group_norm(x, 32, w, b, 1e-5),
                   [{"N": 2, "D": 1, "H": 3, "W": 5}, {"N": 3, "D": 2, "H": 4, "W": 9}], "row"),
    "max_pool2d": (lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1),
                   [{"N": 2, "C": 3, "H": 9, "W": 10}, {"N": 3, "C": 4, "H": 17, "W": 23}], None),
    "cumsum": (lambda x: torch.cumsum(x, -1), [{"N": 3, "M": 5}, {"N": 37, "M": 129}], "row"),
    "cross_entropy": (cross_entropy, [{"B": 3, "V": 5}, {"B": 19, "V": 300}], "all"),
    "cross_entropy_labels": (cross_entropy_labels, [{"B": 3, "V": 5}, {"B": 19, "V": 300}], "all"),
    "swiglu": (swiglu, [{"N": 3, "M": 5}, {"N": 37, "M": 129}], None),
    "geglu": (geglu, [{"N": 3, "M": 5}, {"N": 37, "M": 129}], None),
    "rope": (rope, [{"B": 1, "H": 2, "S": 3, "D": 4}, {"B": 2, "H": 3, "S": 25, "D": 24}], None),
    "lsq_fake_quant": (lsq, [{"N": 3, "M": 5}, {"N": 37, "M": 129}], "all"),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each catalog request planned and generated once; the impl modules imported from files."""
    out = {}
    d = tmp_path_factory.mktemp("catalog")
    for name in CATALOG:
        req = load_request(EXAMPLES / name)
        path = d / f"{name}_impl_under_test.py"
        path.write_text(generate_impl(req, plan_request(req)))
        out[name] = (req, load_module(path, path.stem), "PERSISTENT" in path.read_text())
    return out


def _inputs(req, binding, dtype, gen):
    ins = []
    for spec in req.inputs:
        shape = req.input_shape(spec, binding)
        if spec.index:  # labels, the first of them ignored
            lo, hi = req.input_range(spec, binding)
            t = torch.randint(lo, hi, shape, generator=gen)
            t.view(-1)[:1] = spec.edges[0] if spec.edges else lo
            ins.append(t)
            continue
        lo, hi = spec.range or (-2.0, 2.0)
        ins.append((torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(dtype))
    return ins


def reduction_tolerance(dtype, k: int, truth: torch.Tensor) -> Tolerance:
    """The dtype's tolerance for an output that reduces k elements; a sum that cancels is only as accurate as
    its terms, so atol also grows with float32 rounding of the largest, times √k."""
    base = tolerance_for(dtype, reduced_elems=k)
    scale = float(truth.detach().abs().max()) if truth.numel() else 0.0
    return Tolerance(base.atol + 8 * torch.finfo(torch.float32).eps * scale * math.sqrt(k), base.rtol)


def _k(kind, binding, req) -> int:
    big = max((req.input_shape(s, binding) for s in req.inputs), key=lambda sh: math.prod(sh))
    return {None: 1, "row": big[-1], "col": math.prod(big[:-1]), "all": math.prod(big)}[kind]


# every dtype persistent and looped; where results are reduced across programs ("col", "all"), also strided:
# few programs, each walking several blocks (how blocks are shared out does not depend on the dtype)
CASES = [(n, d, m) for n in CATALOG for d in DTYPES for m in ("persistent", "looped")] + [
    (n, torch.float32, m) for n, (_, _, kind) in CATALOG.items() if kind in ("col", "all")
    for m in ("strided", "looped-strided")] + [(n, torch.float32, "split") for n in CATALOG]


@pytest.mark.parametrize("name, dtype, mode", CASES, ids=[f"{n}-{d}-{m}" for n, d, m in CASES])
def test_catalog_op_matches_float64(built, name, dtype, mode, monkeypatch):
    req, impl, rows = built[name]
    formula, bindings, kind = CATALOG[name]
    looped, strided = mode.startswith("looped"), mode.endswith("strided")
    if looped and not rows:
        pytest.skip("flat kernel: it has no rows to walk in chunks")
    if mode == "split" and not hasattr(impl, "ROW_SPLIT"):
        pytest.skip("no row kernel whose rows programs may share (reductions in one walk, none across rows)")
    if mode == "split":  # 4 programs share each row, each walking its span in chunks of 4 columns
        monkeypatch.setattr(impl, "ROW_SPLIT", 4)
        monkeypatch.setattr(impl, "MAX_BLOCK_C", 4)
    assert not strided or hasattr(impl, "MAX_PROGRAMS") or hasattr(impl, "_num_sms")
    if looped:  # every row of 5+ columns (strided: 65+) is walked in chunks
        monkeypatch.setattr(impl, "MAX_BLOCK_C", 64 if strided else 4)
    if strided:  # small blocks, 3 programs: each walks several blocks and combines its results in registers
        for knob, value in (("MAX_PROGRAMS", 3), ("_num_sms", lambda device: 3), ("COLUMN_BLOCK", 4),
                             ("PARTIAL_ROWS", 2)):
            if hasattr(impl, knob):  # column sums: 3 partial rows, summed by programs of 4 columns
                monkeypatch.setattr(impl, knob, value)
        monkeypatch.setattr(impl, "TILE", 8)
        monkeypatch.setattr(impl, "BLOCK", 16)
    programs = []  # each launch's grid
    kernel_type = type(next(v for k, v in vars(impl).items() if k.endswith("_kernel")))
    launch = kernel_type.run
    monkeypatch.setattr(kernel_type, "run",
                        lambda self, *a, grid, **kw: programs.append(grid) or launch(self, *a, grid=grid, **kw))
    gen = torch.Generator().manual_seed(sum(map(ord, name)) + len(str(dtype)))
    for binding, deterministic in [(b, d) for b in bindings for d in ([False, True] if strided else [False])]:
        ins = _inputs(req, binding, dtype, gen)
        wrt = [s.requires_grad for s in req.inputs]
        got_in = [t.to(DEVICE, copy=True).requires_grad_(w) for t, w in zip(ins, wrt)]
        ref_in = [(t.double() if t.is_floating_point() else t).requires_grad_(w) for t, w in zip(ins, wrt)]
        got = getattr(impl, name)(*got_in, deterministic=deterministic)
        ref = formula(*ref_in)
        got, ref = (got if isinstance(got, tuple) else (got,)), (ref if isinstance(ref, tuple) else (ref,))
        grads_out = [torch.randn(r.shape, generator=gen, dtype=torch.float64).to(dtype) for r in ref]
        got_g = torch.autograd.grad(got, [t for t in got_in if t.requires_grad], [g.to(DEVICE) for g in grads_out])
        got, got_g = [t.cpu() for t in got], [t.cpu() for t in got_g]
        ref_g = torch.autograd.grad(ref, [t for t in ref_in if t.requires_grad], [g.double() for g in grads_out])
        names = [f"out{i}" for i in range(len(got))] + [f"grad_{s.name}" for s in req.inputs if s.requires_grad]
        k = _k(kind, binding, req)
        for n, a, b in zip(names, list(got) + list(got_g), list(ref) + list(ref_g)):
            tol = reduction_tolerance(dtype, k, b)
            assert a.dtype == dtype and a.shape == b.shape, (n, a.dtype, a.shape, b.shape)
            res = compare(a, b, tol, name=n)
            assert res["passed"], f"{name} {dtype} {binding} {n}: max_abs={res['max_abs']} worst={res['worst'][:2]}"
    if mode == "persistent":  # the shipped block sizes, as on a GPU: the larger shape takes several programs
        assert max(g[0] for g in programs) > 1, programs
    if mode == "split":
        assert any(len(g) == 2 and g[1] == 4 for g in programs), programs


def test_impls_run_the_gpus_block_sizes_in_the_interpreter(built):
    for name, (_, impl, _) in built.items():
        assert impl.INTERPRET is (DEVICE == "cpu"), name
        assert (impl.BLOCK, impl.TILE) == (1024, 4096), name  # DESIGN.md's tiling


# Imports an impl in a fresh interpreter and prints where its kernels run, its constants, TRITON_INTERPRET as
# the import left it, and, when interpreted, the loss and gradient error of 19 rows (3 programs) against float64.
IMPORT_AND_RUN = '''
import importlib.util, json, os, sys
import torch
spec = importlib.util.spec_from_file_location("impl", sys.argv[1])
impl = importlib.util.module_from_spec(spec)
sys.modules["impl"] = impl
spec.loader.exec_module(impl)
out = {"env": os.environ.get("TRITON_INTERPRET"), "interpret": impl.INTERPRET,
       "kernel": type(impl._cross_entropy_labels_forward_kernel).__name__,
       "constants": {k: getattr(impl, k) for k in ("BLOCK", "TILE", "MAX_BLOCK_C", "MAX_PROGRAMS", "RBLOCK")}}
if impl.INTERPRET:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(19, 300, generator=gen, requires_grad=True)
    target = torch.randint(0, 300, (19,), generator=gen)
    target[0] = -100
    x64 = logits.detach().double().requires_grad_()
    want = torch.nn.functional.cross_entropy(x64, target, ignore_index=-100)
    got = impl.cross_entropy_labels(logits, target)
    out["loss_error"] = abs(float(got) - float(want))
    out["grad_error"] = float((torch.autograd.grad(got, logits)[0] - torch.autograd.grad(want, x64)[0]).abs().max())
print(json.dumps(out))
'''


def _import_in_subprocess(path: Path, interpret: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, on a GPU machine too
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    proc = subprocess.run([sys.executable, "-c", IMPORT_AND_RUN, str(path)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_an_impl_leaves_triton_interpret_as_it_found_it(built):
    path = Path(built["cross_entropy_labels"][1].__file__)
    cpu = _import_in_subprocess(path, None)  # unset, no GPU: the impl's own kernels are interpreted
    assert cpu["env"] is None and cpu["interpret"] and cpu["kernel"] == "InterpretedFunction"
    assert cpu["loss_error"] < 1e-5 and cpu["grad_error"] < 1e-6
    gpu = _import_in_subprocess(path, "0")  # as `opforge bench compile` imports it: compiled kernels
    assert gpu["env"] == "0" and not gpu["interpret"] and gpu["kernel"] == "JITFunction"
    assert cpu["constants"] == gpu["constants"]  # the interpreter runs what the GPU runs


def test_looped_softmax_takes_max_and_sum_in_one_walk_and_keeps_torch_nonfinite_rows(built, monkeypatch):
    req, impl, _ = built["softmax"]
    fwd = plan_request(req).forward
    assert fwd.phases == 2 and fwd.walks == 2  # max and sum(exp) share a walk (online), then the stores
    monkeypatch.setattr(impl, "MAX_BLOCK_C", 4)
    x = torch.randn(6, 13, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 30
    x[1, 3], x[2, 5], x[3, :], x[4, 7], x[5, :6] = math.nan, math.inf, -math.inf, -math.inf, -math.inf
    got, want = impl.softmax(x.float()).double(), torch.softmax(x, -1)
    assert torch.equal(got.isnan(), want.isnan())  # a NaN, a +inf, an all -inf row: NaN rows, as torch
    torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), rtol=1e-5, atol=1e-7)


# the catalog operators whose reference reads leading dimensions otherwise: cross_entropy takes dim 1 of a 3-D
# input as the classes; the per-group quantizer views its weight by the first dimension alone; pooling reads
# the last dimensions as the window's and the one before them as channels
DECLARED_RANK_ONLY = {"cross_entropy", "cross_entropy_labels", "qat_asymmetric_per_group", "group_norm",
                      "max_pool2d"}


@pytest.mark.parametrize("name", list(CATALOG))
def test_catalog_op_takes_leading_dimensions_where_its_reference_does(built, name):
    """An op built from an (N, H) request called on (2, N, H): the leading dimensions are rows, so the output and
    every gradient are the 2-D call's on the (2N, H) view, bit for bit; an op whose reference means something else
    by them keeps its declared rank and refuses the call."""
    req, impl, _ = built[name]
    binding = CATALOG[name][1][0]
    rows = req.inputs[0].shape[0]
    gen = torch.Generator().manual_seed(17)
    a, b = _inputs(req, binding, torch.float32, gen), _inputs(req, binding, torch.float32, gen)
    leads = [bool(s.shape) and s.shape[0] == rows for s in req.inputs]
    stacked = [(torch.stack([x, y]) if lead else x).to(DEVICE) for x, y, lead in zip(a, b, leads)]
    if name in DECLARED_RANK_ONLY:
        with pytest.raises(ValueError, match="expected"):
            getattr(impl, name)(*stacked)
        return
    flat = [t.reshape(-1, *t.shape[2:]) if lead else t for t, lead in zip(stacked, leads)]
    results = []
    for ins in (stacked, flat):
        ins = [t.clone().requires_grad_(s.requires_grad and t.is_floating_point()) for t, s in zip(ins, req.inputs)]
        out = getattr(impl, name)(*ins)
        outs = out if isinstance(out, tuple) else (out,)
        gen_g = torch.Generator().manual_seed(3)
        grads_out = [torch.randn(o.shape, generator=gen_g).to(DEVICE) for o in outs]
        wrt = [t for t in ins if t.requires_grad]
        results.append((outs, torch.autograd.grad(outs, wrt, grads_out)))
    (outs3, grads3), (outs2, grads2) = results
    for o3, o2 in zip(outs3, outs2):
        assert o3.shape[:2] == (2, binding[rows]) or o3.shape == o2.shape
        assert torch.equal(o3.reshape(o2.shape), o2)
    for g3, g2 in zip(grads3, grads2):
        assert torch.equal(g3.reshape(g2.shape), g2)


def test_every_catalog_impl_passes_the_impl_gates(built):
    """The stage-5 gates on the generated code itself (a full build of each operator is too slow for this
    suite): no torch math outside Triton, nothing reached beyond the allowed modules, no kernel lint finding."""
    import ast

    from opforge.orchestrator.gates import hot_path_violations, impl_reach_problems
    from opforge.verify.kernel_lint import lint_source

    for name, (_, impl, _) in built.items():
        src = Path(impl.__file__).read_text()
        assert hot_path_violations(ast.parse(src)) == [], name
        assert impl_reach_problems(src) == [], name
        assert lint_source(src) == [], name
