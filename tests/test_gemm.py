"""Matrix products: passes cut at each mm/addmm/bmm into GEMM and glue stages (codegen/gemm.py), the GEMM
kernels with their bias and fused epilogue (codegen/emit_gemm.py), forward and backward against float64.
Shapes are small and not multiples of the tiles; the kernels run at the block sizes they ship with."""

from __future__ import annotations

import functools
import inspect
import os
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from test_catalog import reduction_tolerance

from opforge.codegen.build import generate_impl, plan_request
from opforge.codegen.gemm import GemmStage, GlueStage, HostView, einsum_problem
from opforge.request import load_request
from opforge.verify.metrics import compare
from opforge.workspace import load_module

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# the CPU (Triton's interpreter), or on a GPU machine the same checks on the device (scripts/gpu_session.sh)
DEVICE = os.environ.get("OPFORGE_TEST_DEVICE", "cpu")


def _request(tmp: Path, name: str, inputs: dict, body: str, p0: dict, backward: bool = True,
             extra: dict | None = None) -> Path:
    """`inputs`: name -> shape; `extra`: name -> more fields of its spec (requires_grad, range)."""
    d = tmp / name
    d.mkdir()
    doc = {"name": name, "description": f"{name} for the GEMM tests", "category": "matmul",
           "inputs": {k: {"shape": v, "dtype": ["float32", "bfloat16"] if i == 0 else "like " + next(iter(inputs)),
                          **(extra or {}).get(k, {})} for i, (k, v) in enumerate(inputs.items())},
           "reference": "reference.py:forward", "backward": backward, "shapes": {"p0": [p0]}}
    (d / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    args = ", ".join(inputs)
    (d / "reference.py").write_text(f"import torch\nimport torch.nn.functional as F\n\n\ndef forward({args}):\n"
                                    + textwrap.indent(body, "    ") + "\n")
    return d


def _impl(path: Path, tmp: Path):
    req = load_request(path)
    build = plan_request(req)
    src = tmp / f"{req.name}_impl.py"
    src.write_text(generate_impl(req, build))
    return req, build, load_module(src, src.stem)


def _check(req, impl, binding: dict, dtype, k: int):
    gen = torch.Generator().manual_seed(7)
    ins = [torch.randn(req.input_shape(s, binding), generator=gen, dtype=torch.float64) for s in req.inputs]
    wrt = [s.requires_grad for s in req.inputs]
    got_in = [t.to(dtype).to(DEVICE).requires_grad_(w) for t, w in zip(ins, wrt)]
    ref_in = [t.to(dtype).double().requires_grad_(w) for t, w in zip(ins, wrt)]
    got, want = getattr(impl, req.name)(*got_in), req.load_reference()(*ref_in)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    # one upstream gradient per output, rounded to the dtype so both sides start from the same values
    grads = [torch.randn(w.shape, generator=gen, dtype=torch.float64).to(dtype).double() for w in want]
    got_g, want_g = [], []
    if any(wrt):  # a request without backward: outputs only
        got_g = [t.cpu() for t in torch.autograd.grad(got, [t for t in got_in if t.requires_grad],
                                                      [g.to(dtype).to(DEVICE) for g in grads])]
        want_g = torch.autograd.grad(want, [t for t in ref_in if t.requires_grad], grads)
    names = [f"out{i}" for i in range(len(got))] + [f"grad_{s.name}" for s in req.inputs if s.requires_grad]
    for name, a, b in zip(names, [t.cpu() for t in got] + got_g, list(want) + list(want_g)):
        assert a.dtype == dtype and a.shape == b.shape, (name, a.dtype, a.shape, b.shape)
        res = compare(a.detach(), b.detach(), reduction_tolerance(dtype, k, b), name=name)
        assert res["passed"], f"{req.name} {dtype} {binding} {name}: max_abs={res['max_abs']} worst={res['worst'][:2]}"


def _gradients(req, impl, binding: dict, dtype):
    """Outputs and input gradients of the op in `dtype`, of the reference in float64 and of the reference in
    `dtype` (eager PyTorch), for one upstream gradient."""
    gen = torch.Generator().manual_seed(5)
    ins = [torch.randn(req.input_shape(s, binding), generator=gen, dtype=torch.float64) for s in req.inputs]
    wrt = [s.requires_grad for s in req.inputs]

    def run(f, dt, device):
        xs = [t.to(dt).to(device).requires_grad_(w) for t, w in zip(ins, wrt)]
        out = f(*xs)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
        grads = torch.autograd.grad(out, [x for x in xs if x.requires_grad], g.to(dtype).to(out.dtype).to(device))
        return [t.detach().cpu().double() for t in (out, *grads)]

    names = ["out"] + [f"grad_{s.name}" for s in req.inputs if s.requires_grad]
    ref = functools.partial(req.load_reference(), **req.attr_defaults)
    return names, run(getattr(impl, req.name), dtype, DEVICE), run(ref, torch.float64, "cpu"), run(ref, dtype, "cpu")


def _check_backward(req, impl, binding: dict, dtype, k: int):
    """float32 against float64 within the reduction's tolerance; a 16-bit dtype within twice the error eager
    PyTorch makes in that dtype (which rounds probabilities, normalised rows and outputs where the kernels do)."""
    names, got, want, eager = _gradients(req, impl, binding, dtype)
    for name, a, w, e in zip(names, got, want, eager):
        if dtype == torch.float32:
            res = compare(a, w, reduction_tolerance(dtype, k, w), name=name)
            assert res["passed"], f"{req.name} {binding} {name}: max_abs={res['max_abs']} worst={res['worst'][:2]}"
        else:
            err, allowed = float((a - w).abs().max()), 2 * float((e - w).abs().max()) + 1e-6
            assert err <= allowed, f"{req.name} {dtype} {binding} {name}: {err} > 2 × eager's error ({allowed})"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_gelu_fuses_bias_and_gelu_into_the_product_and_matches_float64(tmp_path, dtype):
    req, build, impl = _impl(EXAMPLES / "linear_gelu", tmp_path)
    fwd = build.forward
    assert [type(s) for s in fwd.steps if not hasattr(s, "op")] == [GemmStage]  # one kernel: GELU in the epilogue
    gemm = fwd.gemms[0]  # the epilogue stores GELU's output and the product, saved for the backward
    assert gemm.bias == "bias" and gemm.epilogue is not None and gemm.writes == ["addmm", "mul_5"]
    assert build.saved.what == "products" and build.saved.names == ["saved_addmm"]
    bwd = build.backward  # GELU's gradient at the saved product with the bias's column sum, then dx and dweight
    kinds = [type(s).__name__ for s in bwd.steps if isinstance(s, (GemmStage, GlueStage))]
    assert kinds == ["GlueStage", "GemmStage", "GemmStage"] and "saved_addmm" in bwd.steps[0].inputs
    for binding in ({"N": 37, "K": 70, "M": 45}, {"N": 1, "K": 3, "M": 130}):
        _check(req, impl, binding, dtype, binding["K"])


def test_batched_products_with_a_scaled_residual_epilogue(tmp_path):
    path = _request(tmp_path, "bmm_residual", {"a": ["B", "N", "K"], "b": ["B", "K", "M"], "res": ["B", "N", "M"]},
                    "return torch.relu(torch.bmm(a, b) * 0.5 + res)", {"B": 3, "N": 64, "K": 32, "M": 48})
    req, build, impl = _impl(path, tmp_path)
    gemm = build.forward.gemms[0]
    assert gemm.batched and gemm.loads == ["res"] and gemm.epilogue is not None
    _check(req, impl, {"B": 3, "N": 19, "K": 33, "M": 21}, torch.float32, 33)


def test_per_column_and_per_row_scales_broadcast_into_the_epilogue(tmp_path):
    # a per-output-channel scale (N,) and a per-row scale (M, 1) are read as tiles at stride 0: no glue kernel
    path = _request(tmp_path, "scaled_linear", {"x": ["M", "K"], "w": ["N", "K"], "scale": ["N"], "rs": ["M", 1]},
                    "return torch.relu(F.linear(x, w) * scale * rs)", {"M": 64, "K": 32, "N": 48})
    req, build, impl = _impl(path, tmp_path)
    (gemm,) = build.forward.gemms
    assert not build.forward.glue and gemm.epilogue is not None and gemm.loads == ["scale", "rs"]
    _check(req, impl, {"M": 19, "K": 33, "N": 21}, torch.float32, 33)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_weights_are_dequantized_on_the_operand_loads(tmp_path, dtype):
    # the catalog's weight-only int8 linear: w_q · scale is the prologue of B in the forward GEMM and in the
    # backward's dx = dC · W; the float weight is never in memory, only the int8 one is read
    req, build, impl = _impl(EXAMPLES / "int8_weight_linear", tmp_path)
    (fwd,) = build.forward.gemms
    assert list(fwd.prologues) == ["b"] and fwd.prologues["b"].loads == ["w_q", "unsqueeze"]
    assert not build.forward.glue and fwd.operand_reads == ["x", "w_q", "unsqueeze"]
    (dx,) = build.backward.gemms
    assert list(dx.prologues) == ["b"]
    gen = torch.Generator().manual_seed(5)
    m, k, n = 37, 70, 45
    x = torch.randn(m, k, generator=gen, dtype=torch.float64)
    w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scale = torch.rand(n, generator=gen, dtype=torch.float64) * 0.02 + 0.001
    bias = torch.randn(n, generator=gen, dtype=torch.float64)
    g = torch.randn(m, n, generator=gen, dtype=torch.float64).to(dtype)
    got_x, got_b = x.to(dtype).to(DEVICE).requires_grad_(), bias.to(dtype).to(DEVICE).requires_grad_()
    got = impl.int8_weight_linear(got_x, w_q.to(DEVICE), scale.to(dtype).to(DEVICE), got_b)
    want_x, want_b = x.to(dtype).double().requires_grad_(), bias.to(dtype).double().requires_grad_()
    want = req.load_reference()(want_x, w_q, scale.to(dtype).double(), want_b)
    got_grads = torch.autograd.grad(got, [got_x, got_b], g.to(DEVICE))
    want_grads = torch.autograd.grad(want, [want_x, want_b], g.double())
    for name, a, b in zip(["out", "grad_x", "grad_bias"], [got, *got_grads], [want, *want_grads]):
        assert a.dtype == dtype
        res = compare(a.detach().cpu(), b.detach(), reduction_tolerance(dtype, k, b), name=name)
        assert res["passed"], f"{dtype} {name}: max_abs={res['max_abs']} worst={res['worst'][:2]}"


GROUPED = {  # int8 weights with one scale per group of 32 input channels, as (N, K) for F.linear and as (K, N)
    "rows": ({"w_q": ["N", "G*32"], "scale": ["N", "G"]},
             "n, k = w_q.shape\nreturn F.linear(x, (w_q.view(n, -1, 32).to(x.dtype) * scale[..., None]).view(n, k))"),
    "columns": ({"w_q": ["G*32", "N"], "scale": ["G", "N"]},
                "k, n = w_q.shape\nreturn x @ (w_q.view(-1, 32, n).to(x.dtype) * scale[:, None, :]).view(k, n)"),
}


@pytest.mark.parametrize("layout, dtype", [("rows", torch.bfloat16), ("columns", torch.float32)])
def test_a_weight_with_a_scale_per_group_of_input_channels_is_dequantized_on_the_operand_loads(
        tmp_path, layout, dtype):
    # the view that merges (N, G, 32) into (N, K) is no launcher view of a stride-0 scale: the prologue reads its
    # inputs 3-D, cutting the merged axis's index into (group, place); in the backward's dx = dC · W the merged
    # axis is the product's columns
    shapes, body = GROUPED[layout]
    d = tmp_path / f"grouped_{layout}"
    d.mkdir()
    doc = {"name": f"grouped_{layout}", "description": "a per-group dequantized linear", "category": "matmul",
           "inputs": {"x": {"shape": ["M", "G*32"], "dtype": ["float32", "bfloat16"]},
                      "w_q": {"shape": shapes["w_q"], "dtype": "int8", "range": [-127, 128]},
                      "scale": {"shape": shapes["scale"], "dtype": "like x", "requires_grad": False,
                                "range": [0.001, 0.02]}},
           "reference": "reference.py:forward", "backward": True, "shapes": {"p0": [{"M": 40, "G": 3, "N": 24}]}}
    (d / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (d / "reference.py").write_text("import torch\nimport torch.nn.functional as F\n\n\ndef forward(x, w_q, scale):\n"
                                    + textwrap.indent(body, "    ") + "\n")
    req, build, impl = _impl(d, tmp_path)
    (fwd,), (dx,) = build.forward.gemms, build.backward.gemms
    assert not build.forward.glue and not build.backward.glue
    assert fwd.prologues["b"].merge[1] == 0 and dx.prologues["b"].merge[1] == 1  # K, then the columns
    gen = torch.Generator().manual_seed(9)
    m, g, n = 37, 3, 45
    x = torch.randn(m, g * 32, generator=gen, dtype=torch.float64)
    x[3, 5] = float("inf")  # an infinity times a weight is an infinity: the rounding error's dot adds nothing
    w_q = torch.randint(-127, 128, [g * 32 if s == "G*32" else n for s in shapes["w_q"]], generator=gen,
                        dtype=torch.int8)
    scale = torch.rand([g if s == "G" else n for s in shapes["scale"]], generator=gen, dtype=torch.float64) * 0.02
    grad = torch.randn(m, n, generator=gen, dtype=torch.float64).to(dtype)
    got_x = x.to(dtype).requires_grad_()
    got = getattr(impl, req.name)(got_x, w_q, scale.to(dtype))
    want_x = x.to(dtype).double().requires_grad_()
    want = req.load_reference()(want_x, w_q, scale.to(dtype).double())
    got_g, = torch.autograd.grad(got, [got_x], grad)
    want_g, = torch.autograd.grad(want, [want_x], grad.double())
    for name, a, b in (("out", got, want), ("grad_x", got_g, want_g)):
        assert torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(torch.isinf(a), torch.isinf(b)), name
        finite = torch.isfinite(b)
        res = compare(a.detach()[finite], b.detach()[finite], reduction_tolerance(dtype, g * 32, b[finite]),
                      name=name)
        assert res["passed"], f"{layout} {dtype} {name}: max_abs={res['max_abs']} worst={res['worst'][:2]}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_linear_normalises_in_the_products_prologue(tmp_path, dtype):
    # the row statistics are a glue stage writing one value per row; x · rstd · gamma is computed on the
    # product's A tiles, so the normalised activations are never in memory
    req, build, impl = _impl(EXAMPLES / "rms_norm_linear", tmp_path)
    (stats,) = build.forward.glue
    (gemm,) = build.forward.gemms
    assert list(gemm.prologues) == ["a"] and {"x", "gamma"} <= set(gemm.prologues["a"].loads)
    assert [o.name for o in stats.outputs] == [n for n in gemm.prologues["a"].loads if n not in ("x", "gamma")]
    # a computed operand is multiplied as its bfloat16 rounding plus the rest: held to float64, not to eager
    _check(req, impl, {"N": 19, "H": 70, "M": 33}, dtype, 70)


def test_an_attribute_read_by_both_a_prologue_and_the_epilogue_is_one_kernel_argument(tmp_path):
    # alpha scales the weight on its loads and the product after the K loop: one parameter of the GEMM kernel
    path = _request(tmp_path, "scaled_twice", {"x": ["M", "K"], "w": ["N", "K"]},
                    "return torch.relu(F.linear(x, w * alpha) * alpha)", {"M": 64, "K": 32, "N": 48})
    doc = yaml.safe_load((path / "request.yaml").read_text())
    doc["attributes"] = {"alpha": {"type": "float", "default": 0.5}}
    (path / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (path / "reference.py").write_text((path / "reference.py").read_text().replace("(x, w):", "(x, w, alpha=0.5):"))
    req, build, impl = _impl(path, tmp_path)
    (gemm,) = build.forward.gemms
    assert list(gemm.prologues) == ["b"] and gemm.epilogue is not None and gemm.attrs == ["alpha"]
    _check(req, impl, {"M": 19, "K": 33, "N": 21}, torch.float32, 33)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inputs_named_like_the_gemm_kernels_own_variables_and_a_residual_gradient(tmp_path, dtype):
    """Inputs named a, b, c, k and acc (the GEMM kernel's operands, loop and accumulator) are renamed inside the
    module and keep their names in the op's signature; the residual's gradient is the upstream gradient,
    returned as a copy."""
    d = _request(tmp_path, f"kernel_names_{str(dtype)[6:]}",
                 {"a": ["M", "K"], "b": ["N", "K"], "c": ["N"], "k": ["M", "N"], "acc": ["M", "N"]},
                 "return torch.tanh(F.linear(a, b, c)) * k + acc", {"M": 40, "K": 48, "N": 24})
    req, build, impl = _impl(d, tmp_path)
    assert list(inspect.signature(getattr(impl, req.name)).parameters)[:5] == ["a", "b", "c", "k", "acc"]
    assert build.backward.copies == ["grad_out"]
    _check(req, impl, {"M": 40, "K": 48, "N": 24}, dtype, 48)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_norm_projection_split_into_heads_then_rotated(tmp_path, dtype):
    """RMSNorm, a projection to H*D columns viewed (T, -1, D), a rotary embedding: the glue after the product
    reads the head count off the weight (w.shape[1] // D), forward and backward."""
    d = _request(tmp_path, f"norm_rope_{str(dtype)[6:]}",
                 {"x": ["T", "E"], "gamma": ["E"], "w": ["E", "H*D"], "cos": ["T", "D"], "sin": ["T", "D"]},
                 "xf = x.float()\n"
                 "n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * gamma\n"
                 "q = (n @ w).view(x.shape[0], -1, cos.shape[-1])\n"
                 "h = q.shape[-1] // 2\n"
                 "return q * cos[:, None] + torch.cat([-q[..., h:], q[..., :h]], dim=-1) * sin[:, None]",
                 {"T": 24, "E": 40, "H": 3, "D": 16},
                 extra=dict.fromkeys(("cos", "sin"), {"requires_grad": False, "range": [-1.0, 1.0]}))
    req, build, impl = _impl(d, tmp_path)
    _check(req, impl, {"T": 24, "E": 40, "H": 3, "D": 16}, dtype, 40)


_PAIRS = {"requires_grad": False, "range": [-1.0, 1.0]}


@pytest.mark.parametrize("pairs, bias, dtype", [
    ("y1, y2 = y[..., 0::2], y[..., 1::2]", True, torch.float32),
    ("y1, y2 = y[..., 0::2], y[..., 1::2]", True, torch.bfloat16),
    ("p = y.view(*y.shape[:-1], -1, 2)\ny1, y2 = p[..., 0], p[..., 1]", False, torch.float32)])
def test_interleaved_rotary_pairs_after_a_projection(tmp_path, pairs, bias, dtype):
    """GPT-J's rotary: the pairs are the even and odd columns (y[..., 0::2] and y[..., 1::2], or the elements
    of y.view(..., -1, 2)), rotated and interleaved again by stack(..., -1).flatten(-2). Both are column moves of
    one glue kernel; their gradient (a sum of strided slice_backwards or select_backwards) is the same
    interleave, and a bias's gradient, summed over rows of all the heads, is a kernel of its own."""
    inputs = {"x": ["T", "C"], "w": ["H*E*2", "C"], "b": ["H*E*2"], "cos": ["T", "E"], "sin": ["T", "E"]}
    if not bias:
        inputs.pop("b")
    d = _request(tmp_path, f"gptj_rope_{str(dtype)[6:]}", inputs,
                 f"y = F.linear(x, w{', b' if bias else ''}).view(x.shape[0], -1, cos.shape[-1] * 2)\n{pairs}\n"
                 "c, s = cos[:, None], sin[:, None]\n"
                 "return torch.stack([y1 * c - y2 * s, y1 * s + y2 * c], dim=-1).flatten(-2)",
                 {"T": 12, "C": 24, "H": 3, "E": 4}, extra=dict.fromkeys(("cos", "sin"), _PAIRS))
    req, build, impl = _impl(d, tmp_path)
    (rope,) = build.forward.glue
    src = Path(impl.__file__).read_text()
    assert "tl.where(cols % 2 == 0, " in src and "slice_backward" not in src  # interleaved, both ways
    assert "aten.select.int" not in str(build.traced.forward.graph)
    assert len(build.backward.glue) == 1 + bias  # the rotary's gradient, then the bias's column sums of it
    _check(req, impl, {"T": 11, "C": 24, "H": 3, "E": 5}, dtype, 24)


def test_a_fused_latent_and_rotary_projection_declared_as_a_sum_of_sizes(tmp_path):
    """DeepSeek's key-value down-projection: one weight of L + 2R rows ("L+R*2" in the request), split into
    the latent (RMSNorm) and the rotary part, whose pairs are x.unflatten(-1, (-1, 2))[..., k]."""
    d = _request(tmp_path, "latent_rope",
                 {"x": ["T", "C"], "w_kv": ["L+R*2", "C"], "g": ["L"], "cos": ["T", "R"], "sin": ["T", "R"]},
                 "kv = x @ w_kv.t()\n"
                 "latent, pe = kv.split([g.shape[0], cos.shape[-1] * 2], dim=-1)\n"
                 "lf = latent.float()\n"
                 "latent = (lf * torch.rsqrt(lf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * g\n"
                 "pairs = pe.unflatten(-1, (-1, 2))\n"
                 "a, b = pairs[..., 0], pairs[..., 1]\n"
                 "return latent, torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)",
                 {"T": 12, "C": 20, "L": 16, "R": 4}, extra=dict.fromkeys(("cos", "sin"), _PAIRS))
    req, build, impl = _impl(d, tmp_path)
    assert req.input_shape(req.inputs[1], {"T": 12, "C": 20, "L": 16, "R": 4}) == (24, 20)
    _check(req, impl, {"T": 9, "C": 20, "L": 10, "R": 3}, torch.float32, 20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_linear_of_three_dimensional_activations_fuses_its_epilogue_through_the_view(tmp_path, dtype):
    """F.linear of (B, S, E) traces (B·S, N) viewed (B, S, N): the bias, a per-token scale, the activation and the
    residual move below that view (decompose.sink_row_views) and run in the GEMM's epilogue."""
    d = _request(tmp_path, f"linear_3d_{str(dtype)[6:]}",
                 {"x": ["B", "S", "E"], "w": ["N", "E"], "b": ["N"], "s": ["B", "S", 1], "r": ["B", "S", "N"]},
                 "return F.silu(F.linear(x, w, b) * s) + r", {"B": 2, "S": 24, "E": 40, "N": 48})
    req, build, impl = _impl(d, tmp_path)
    (gemm,) = build.forward.gemms
    assert gemm.epilogue is not None and not build.forward.glue
    _check(req, impl, {"B": 2, "S": 19, "E": 33, "N": 21}, dtype, 33)


@pytest.mark.parametrize("split_k", [3, 8])
def test_split_k_shares_each_tile_among_programs_and_gives_the_same_bits_each_run(tmp_path, split_k):
    """A skinny product (few tiles, long K) with split-K forced: the K splits of a tile store partials and the
    last one adds them in split order and runs the epilogue (bias, GELU, residual). 8 splits of 5 K steps
    leave some splits nothing to do. Forward and backward (dx and dw are split too) match float64; on a GPU,
    where the splits finish in any order, a second run gives the same bits."""
    path = _request(tmp_path, f"skinny_{split_k}", {"x": ["M", "K"], "w": ["N", "K"], "b": ["N"], "r": ["M", "N"]},
                    "return F.gelu(F.linear(x, w, b)) + r", {"M": 6, "K": 72, "N": 10})
    req, build, impl = _impl(path, tmp_path)
    impl.GEMM_BLOCK_K, impl.GEMM_SPLIT_K = 16, split_k
    _check(req, impl, {"M": 6, "K": 72, "N": 10}, torch.float32, 72)
    _check(req, impl, {"M": 3, "K": 40, "N": 7}, torch.bfloat16, 40)
    x, w, b, r = (torch.randn(*s, device=DEVICE) for s in ((5, 70), (9, 70), (9,), (5, 9)))
    op = getattr(impl, req.name)
    assert torch.equal(op(x, w, b, r), op(x, w, b, r))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_work_after_a_product_runs_on_the_tile_when_it_holds_whole_rows(tmp_path, dtype):
    """A softmax scaled per column and a row mean after a linear: one kernel when a tile holds the rows, the
    product stored and then the row kernel when the rows are wider than GEMM_ROWS_N; both match float64,
    forward and backward."""
    path = _request(tmp_path, "linear_softmax", {"x": ["M", "K"], "w": ["N", "K"], "b": ["N"], "g": ["N"]},
                    "y = F.linear(x, w, b)\nreturn torch.softmax(y, -1) * g, y.mean(-1)", {"M": 24, "K": 40, "N": 50})
    req, build, impl = _impl(path, tmp_path)
    (gemm,) = build.forward.gemms
    assert gemm.rows is not None and not build.forward.glue and gemm.row_reads == ["g_in"]
    assert gemm.writes == ["addmm", *gemm.rows.outputs] and len(gemm.writes) == 3  # the product: saved
    row_kernel = f"_{req.name}_{gemm.rows.plan.name}"
    launches = []
    wide = getattr(impl, row_kernel)
    setattr(impl, row_kernel, lambda *a, **k: launches.append(1) or wide(*a, **k))
    binding = {"M": 19, "K": 33, "N": 21}
    _check(req, impl, binding, dtype, 33)
    assert not launches  # the row work ran on the tile
    impl.GEMM_ROWS_N = 16
    _check(req, impl, binding, dtype, 33)
    assert launches  # 21 columns do not fit: the row kernel ran on the stored product


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_statistics_per_channel_of_a_products_output(tmp_path, dtype):
    """Batch norm in training over (B, M, N) channels-first views of a linear's output: its statistics reduce
    B and N per channel, which the glue's row kernel walks as its columns, reading the product through its
    strides; forward and backward match float64."""
    path = _request(tmp_path, "linear_bn", {"x": ["B", "N", "K"], "w": ["M", "K"], "g": ["M"], "b": ["M"]},
                    "return torch.relu(F.batch_norm(F.linear(x, w).transpose(1, 2), None, None, g, b, training=True))",
                    {"B": 2, "N": 8, "K": 16, "M": 4})
    req, build, impl = _impl(path, tmp_path)
    assert len(build.forward.gemms) == 1 and len(build.forward.glue) == 1
    _check(req, impl, {"B": 3, "N": 9, "K": 20, "M": 5}, dtype, 27)


def test_a_product_only_the_row_work_reads_is_never_stored(tmp_path):
    path = _request(tmp_path, "linear_logsoftmax", {"x": ["M", "K"], "w": ["N", "K"]},
                    "return torch.log_softmax(F.linear(x, w), -1)", {"M": 24, "K": 40, "N": 50}, backward=False)
    req, build, impl = _impl(path, tmp_path)
    (gemm,) = build.forward.gemms
    assert gemm.rows is not None and not gemm.store_product and gemm.writes == gemm.rows.outputs
    for rows_n in (256, 16):  # on the tile; then stored (float32) for the row kernel
        impl.GEMM_ROWS_N = rows_n
        _check(req, impl, {"M": 19, "K": 33, "N": 21}, torch.bfloat16, 33)


def test_a_row_reduction_across_the_rows_is_not_run_on_the_tile(tmp_path):
    # a sum down the columns meets every row tile: its own kernel, after the product is stored
    path = _request(tmp_path, "linear_colsum", {"x": ["M", "K"], "w": ["N", "K"]},
                    "y = F.linear(x, w)\nreturn torch.softmax(y, -1).sum(0)", {"M": 24, "K": 40, "N": 50},
                    backward=False)
    req, build, impl = _impl(path, tmp_path)
    (gemm,) = build.forward.gemms
    assert gemm.rows is None and gemm.store_product and len(build.forward.glue) == 1
    _check(req, impl, {"M": 19, "K": 33, "N": 21}, torch.float32, 33)


def test_a_product_of_two_products_runs_them_in_order(tmp_path):
    # a swiglu MLP: the gate and up products, then the down product of their SiLU-gated product
    path = _request(tmp_path, "mlp", {"x": ["N", "H"], "w1": ["F", "H"], "w3": ["F", "H"], "w2": ["H", "F"]},
                    "return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)",
                    {"N": 16, "H": 32, "F": 64})
    req, build, impl = _impl(path, tmp_path)
    first = build.forward.gemms
    assert len(first) == 3 and first[0].store_product and first[1].epilogue is not None  # gate stored, up fused
    # backward: the work at (N, F) that reads the same inputs is one glue kernel per depth, and dh = dy·w2 ends
    # in one epilogue computing both the gate's and the up projection's gradient: dh is never stored
    assert len(build.backward.glue) == 1
    assert any(g.epilogue is not None and not g.store_product and len(g.writes) == 2 for g in build.backward.gemms)
    _check(req, impl, {"N": 13, "H": 24, "F": 40}, torch.float32, 40)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mla_prolog_matches_float64_through_six_products_two_norms_and_two_ropes(tmp_path, dtype):
    req, build, impl = _impl(EXAMPLES / "mla_prolog", tmp_path)
    fwd = build.forward
    assert len(fwd.gemms) == 6 and [g.batched for g in fwd.gemms].count(True) == 1  # the absorbed w_uk
    # each norm runs on its down-projection's tile (it holds the whole latent row), each rope is a glue kernel at
    # its own shape; the head views and transposes are never copied
    assert [g.rows is not None for g in fwd.gemms].count(True) == 2
    assert len([s for s in fwd.steps if isinstance(s, GlueStage)]) == 2
    assert {s.op for s in fwd.steps if isinstance(s, HostView)} >= {"aten.transpose.int", "aten.view.default"}
    binding = {"T": 19, "He": 40, "Hcq": 24, "N": 3, "D": 8, "R": 6, "C": 20}
    _check(req, impl, binding, dtype, max(binding.values()))
    if dtype == torch.float32:  # latent rows too wide for a tile: stored, then the norms' own row kernels
        impl.GEMM_ROWS_N = 16
        _check(req, impl, binding, dtype, max(binding.values()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_glue_of_the_saved_inputs_alone_is_recomputed_where_it_is_read(tmp_path, dtype):
    """A GELU (tanh) MLP with a residual: in the backward, GELU(h) at the saved pre-activation is read only by
    dW2 = dyᵀ·GELU(h), so it is that product's prologue, and GELU'(h) is read only once dGELU = dy·W2 is known,
    so the glue kernel after that product computes it again: neither is stored."""
    path = _request(tmp_path, f"gelu_mlp_{str(dtype)[6:]}",
                    {"x": ["N", "E"], "w1": ["F", "E"], "b1": ["F"], "w2": ["E", "F"], "b2": ["E"]},
                    'return x + F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)',
                    {"N": 16, "E": 24, "F": 40})
    req, build, impl = _impl(path, tmp_path)
    bwd = [s for s in build.backward.steps if isinstance(s, (GemmStage, GlueStage))]
    assert [type(s).__name__ for s in bwd] == ["GlueStage", "GemmStage", "GemmStage", "GlueStage", "GemmStage",
                                               "GemmStage"]  # db2's column sums first
    assert list(bwd[2].prologues) == ["b"] and "saved_addmm" in bwd[3].inputs
    _check(req, impl, {"N": 13, "E": 20, "F": 36}, dtype, 36)


def test_products_sharing_an_operand_with_its_transpose(tmp_path):
    # x·xᵀ: both operands are x, one through a launcher transpose; its gradient g·x + gᵀ·x is two more
    path = _request(tmp_path, "gram", {"x": ["N", "K"]}, "return torch.tanh(x @ x.t())", {"N": 48, "K": 40})
    req, build, impl = _impl(path, tmp_path)
    assert build.forward.gemms[0].a == "x" and build.forward.gemms[0].epilogue is not None
    for dtype in (torch.float32, torch.bfloat16):
        _check(req, impl, {"N": 21, "K": 37}, dtype, 37)


def test_operands_of_the_wrong_size_are_refused_with_the_product_named(tmp_path):
    _, _, impl = _impl(EXAMPLES / "linear_gelu", tmp_path)
    with pytest.raises((ValueError, RuntimeError), match="cannot multiply|expected"):
        impl.linear_gelu(*(torch.randn(*s, device=DEVICE) for s in ((4, 8), (6, 9), (6,))))


def test_every_gemm_kernel_compiles_for_sm90_on_the_tensor_cores_without_spills():
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "opforge", "bench", "compile", "--ops", "linear_gelu,mla_prolog",
                        "--elements", "0", "--json", "-"], capture_output=True, text=True, cwd=root, timeout=600,
                       env={**os.environ, "TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    for op in json.loads(r.stdout)["ops"]:
        build = plan_request(load_request(EXAMPLES / op["op"]))
        gemms = [b for b in op["builds"] if "BLOCK_K" in b["constexprs"]]
        # linear_gelu: the forward's product with its epilogue; the backward's dx and dweight
        assert len(gemms) == len(build.forward.gemms) + len(build.backward.gemms) > 0
        for b in op["builds"]:
            assert b["spill_bytes"] == 0, b
        for b in gemms:
            assert b["wgmma"] > 0, b  # Hopper's warpgroup matrix instructions, not FMA loops


def test_split_k_compiles_for_sm90_on_the_tensor_cores_without_spills(tmp_path):
    """The split path (partials, the tile's ticket, the ordered sum) only exists when SPLIT_K > 1: compiled here
    with 4 splits, forward and backward, as the GPU compiler sees it."""
    import json
    import subprocess
    import sys

    req, _, _ = _impl(EXAMPLES / "linear_gelu", tmp_path)
    src = tmp_path / "linear_gelu_impl.py"
    src.write_text(src.read_text().replace("GEMM_SPLIT_K = 1\n", "GEMM_SPLIT_K = 4\n"))
    code = ("import json, sys; from pathlib import Path; from opforge.bench.aot import compile_op; "
            "from opforge.request import load_request; "
            "print(json.dumps(compile_op(load_request(sys.argv[1]), impl_path=Path(sys.argv[2]))))")
    r = subprocess.run([sys.executable, "-c", code, str(EXAMPLES / "linear_gelu"), str(src)], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout.splitlines()[-1])
    gemms = [b for b in report["builds"] if b.get("constexprs", {}).get("SPLIT_K") == 4]
    assert report["failed"] == 0 and len(gemms) == 3, report
    assert all(b["spill_bytes"] == 0 and b["wgmma"] > 0 for b in gemms)


def test_row_work_on_the_tile_and_its_fallback_compile_for_sm90_without_spills(tmp_path):
    """Both branches of a product with row work, as the GPU compiler sees them: the tile running a dynamic
    per-row quantization (ROWS_IN_TILE, the row outputs' arguments bound), and, with GEMM_ROWS_N = 0, the
    product stored (the row arguments None) and then the row kernel."""
    import json
    import subprocess
    import sys

    path = _request(tmp_path, "dyn_quant", {"x": ["M", "K"], "w": ["N", "K"]},
                    "y = F.linear(x, w)\ns = y.abs().amax(-1, keepdim=True).clamp(min=1e-5) / 127.0\n"
                    "return torch.clamp(torch.round(y / s), -127, 127) * s, s", {"M": 64, "K": 128, "N": 96},
                    backward=False)
    _impl(path, tmp_path)
    fused = tmp_path / "dyn_quant_impl.py"
    wide = tmp_path / "dyn_quant_wide_impl.py"
    wide.write_text(fused.read_text().replace("GEMM_ROWS_N = 256\n", "GEMM_ROWS_N = 0\n"))
    code = ("import json, sys; from pathlib import Path; from opforge.bench.aot import compile_op; "
            "from opforge.request import load_request; "
            "print(json.dumps([compile_op(load_request(sys.argv[1]), impl_path=Path(p), dtypes=['bfloat16']) "
            "for p in sys.argv[2:]]))")
    r = subprocess.run([sys.executable, "-c", code, str(path), str(fused), str(wide)], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    on_tile, stored = json.loads(r.stdout.splitlines()[-1])
    for report, launches in ((on_tile, [True]), (stored, [False, None])):
        assert report["failed"] == 0, report
        kernels = [b["constexprs"].get("ROWS_IN_TILE") for b in report["builds"]]
        assert kernels == launches, kernels  # the GEMM alone, or the GEMM then the row kernel
        assert all(b["spill_bytes"] == 0 for b in report["builds"])
        assert report["builds"][0]["wgmma"] > 0


@pytest.mark.parametrize("equation, problem", [
    ("bnk,bkm->bnm", None), ("ij,jk", None), ("bhqd,bhkd->bhqk", None), ("...ij,...jk->...ik", None),
    ("bnk,bkm->b", "sums index n"), ("ii,ij->j", "repeats index i"), ("ij,jk,kl->il", "multiplies 3 operands")])
def test_einsums_are_told_apart_by_whether_they_are_one_product(equation, problem):
    got = einsum_problem(equation)
    assert (got is None) if problem is None else (got is not None and got.startswith(problem)), got


def test_an_einsum_the_engine_cannot_fuse_is_refused_by_name_at_stage_2(tmp_path):
    from typer.testing import CliRunner

    from opforge.cli import app

    path = _request(tmp_path, "ein", {"a": ["B", "N", "K"], "b": ["B", "K", "M"]},
                    'return torch.einsum("bnk,bkm->b", a, b)', {"B": 3, "N": 64, "K": 32, "M": 48})
    res = CliRunner().invoke(app, ["op", "run", str(path), "--out", str(tmp_path / "ws")])
    assert res.exit_code == 2, res.output  # BLOCKED_API, no traceback
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("BLOCKED_API: torch.einsum('bnk,bkm->b') sums index n within one operand"), last
    assert "Traceback" not in res.output


@pytest.mark.parametrize("body, named", [
    ("return torch.sort(F.linear(x, w), dim=-1).values", "aten.sort"),  # an op of two results after a product
    ("return F.linear(x, w).transpose(1, 2).roll(1, 1)", "aten.roll.default")])
def test_work_after_a_product_the_engine_cannot_lower_is_refused_by_name(tmp_path, body, named):
    from opforge.codegen.plan import Unsupported

    path = _request(tmp_path, "after", {"x": ["B", "N", "K"], "w": ["M", "K"]}, body,
                    {"B": 2, "N": 8, "K": 16, "M": 4})
    with pytest.raises(Unsupported, match=named):
        plan_request(load_request(path))
