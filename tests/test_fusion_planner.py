"""Requests nobody wrote the engine for: other compositions of pointwise ops and reductions build and verify
without code changes; what the engine cannot fuse is refused in stage 2 with the op named, never a traceback."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from opforge.codegen.build import generate_impl, kernels_of, plan_request
from opforge.codegen.ops import markdown_table
from opforge.codegen.plan import Unsupported
from opforge.request import load_request
from opforge.workspace import load_module

ROOT = Path(__file__).resolve().parents[1]

# name -> (inputs, attributes, reference body, shape bindings to check)
UNSEEN = {
    # numbers made tensors in the reference (torch.tensor(c)): traced as copies of constants, kernels' literals
    "tensor_constants": ({"x": [["N", "M"], True]}, {},
                         "return torch.min(x, torch.tensor(0.3)) * 2.0 + torch.tensor(1.5)",
                         [{"N": 5, "M": 7}, {"N": 3, "M": 130}]),
    # an exclusive scan written with a select only for the leading zero's shape
    "exclusive_cumsum_select": ({"x": [["N", "M"], True]}, {},
                                "return torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), "
                                "torch.cumsum(x.narrow(1, 0, x.size(1) - 1), dim=1)), dim=1)",
                                [{"N": 5, "M": 7}, {"N": 3, "M": 130}]),
    # a pooled size that is 1 at some probe sizes is still a dimension the sum reduces (traced at others)
    "conv_pool_sum": ({"x": [["N", 3, "H", "H"], True], "w": [[4, 3, 3, 3], True]}, {},
                      "return torch.sigmoid(torch.nn.functional.avg_pool2d("
                      "torch.nn.functional.conv2d(x, w), 4)).sum(dim=[1, 2, 3])",
                      [{"N": 2, "H": 18}, {"N": 3, "H": 7}]),
    # a transposed convolution that doubles the size, then a 2x2 max pool: the output has the input's size,
    # which its gradient's size reads as once the kernel's numbers are in place
    "convt_pool_same_size": ({"x": [["N", 3, "H", "W"], True], "w": [[3, 4, 3, 3], True]}, {},
                             "return torch.nn.functional.max_pool2d(torch.nn.functional.leaky_relu("
                             "torch.nn.functional.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1), "
                             "0.2), 2)",
                             [{"N": 2, "H": 6, "W": 5}, {"N": 1, "H": 9, "W": 4}]),
    # batch and heads of one size: the attention's views back from (N·N, S, D) trace its size as N**2 // N
    "square_heads_attention": ({"q": [["N", "N", "S", "D"], True], "k": [["N", "N", "S", "D"], True],
                                "v": [["N", "N", "S", "D"], True]}, {},
                               "return torch.nn.functional.scaled_dot_product_attention(q, k, v)",
                               [{"N": 2, "S": 16, "D": 16}, {"N": 3, "S": 32, "D": 16}]),
    # per-channel work before and after a group norm runs on the norm's view of the groups
    "linear_group_norm_swish": ({"x": [["N", 16], True], "w": [[32, 16], True], "bias": [[32], True],
                                 "m": [[32], True]}, {},
                                "g = torch.nn.functional.group_norm(torch.nn.functional.linear(x, w, bias) * m, 4)"
                                "\n    return g * torch.sigmoid(g) * m",
                                [{"N": 5}, {"N": 3}]),
    "softcap": ({"x": [["N", "M"], True]}, {"cap": 30.0},
                "return torch.tanh(x / cap) * cap", [{"N": 5, "M": 7}, {"N": 17, "M": 300}]),
    "l2_normalize": ({"x": [["N", "D"], True]}, {"eps": 1e-12},
                     "return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)",
                     [{"N": 4, "D": 9}, {"N": 3, "D": 700}]),
    "row_logsumexp": ({"x": [["N", "V"], True]}, {},
                      "return torch.logsumexp(x, dim=-1)", [{"N": 6, "V": 11}, {"N": 2, "V": 900}]),
    "mse_loss": ({"a": [["N", "M"], True], "b": [["N", "M"], True]}, {},
                 "return ((a - b) ** 2).mean()", [{"N": 5, "M": 7}, {"N": 33, "M": 65}]),
    "bias_gelu_scale": ({"x": [["B", "S", "H"], True], "bias": [["H"], True]}, {"alpha": 0.5},
                        "return torch.nn.functional.gelu(x + bias) * alpha",
                        [{"B": 2, "S": 3, "H": 5}, {"B": 1, "S": 4, "H": 33}]),
    "activations": ({"x": [["N", "M"], True]}, {"slope": 0.1},
                    "return (torch.nn.functional.leaky_relu(x, slope) + torch.nn.functional.hardswish(x)\n"
                    "            + torch.nn.functional.softplus(x) + torch.relu(x) * x.std(-1, keepdim=True))",
                    [{"N": 5, "M": 7}, {"N": 3, "M": 300}]),
    # reductions over several trailing dimensions: those dimensions are the columns
    "layer_norm_chw": ({"x": [["N", "C", "H", "W"], True], "w": [["C", "H", "W"], True],
                        "b": [["C", "H", "W"], True]}, {},
                       "return torch.nn.functional.layer_norm(x, x.shape[1:], w, b)",
                       [{"N": 3, "C": 4, "H": 5, "W": 6}, {"N": 2, "C": 16, "H": 9, "W": 10}]),
    "instance_norm": ({"x": [["N", "C", "H", "W"], True]}, {}, "return torch.nn.functional.instance_norm(x)",
                      [{"N": 3, "C": 4, "H": 5, "W": 6}, {"N": 2, "C": 3, "H": 40, "W": 50}]),
    # outputs whose reductions want different walk orders: the statistics first, then each group of outputs
    # in its own order (the weight gradients reduce every sample and pixel of a channel)
    "instance_norm_affine": ({"x": [["N", "C", "H", "W"], True], "w": [["C"], True], "b": [["C"], True]},
                             {"eps": 1e-5}, "return torch.nn.functional.instance_norm(x, weight=w, bias=b, eps=eps)",
                             [{"N": 3, "C": 4, "H": 5, "W": 6}, {"N": 2, "C": 3, "H": 20, "W": 25}]),
    "group_norm": ({"x": [["N", "D*4", "H", "W"], True], "w": [["D*4"], True], "b": [["D*4"], True]},
                   {"eps": 1e-5}, "return torch.nn.functional.group_norm(x, 4, w, b, eps)",
                   [{"N": 2, "D": 2, "H": 3, "W": 5}, {"N": 3, "D": 3, "H": 10, "W": 12}]),
    "layer_norm_chw_channel_affine": ({"x": [["N", "C", "H", "W"], True], "w": [["C"], True],
                                       "b": [["C"], True]}, {},
                                      "y = torch.nn.functional.layer_norm(x, x.shape[1:])\n"
                                      "    return y * w[:, None, None] + b[:, None, None]",
                                      [{"N": 3, "C": 4, "H": 5, "W": 6}]),
    # per-row values summed across rows (a per-channel weight's gradient after a mean over H and W): the
    # statistics first, then the weight's gradient over the (N, C) values, down their columns
    "squeeze_excite": ({"x": [["N", "C", "H", "W"], True], "w": [["C"], True]}, {},
                       "return x * torch.sigmoid(x.mean((2, 3), keepdim=True) * w[:, None, None])",
                       [{"N": 2, "C": 3, "H": 4, "W": 5}, {"N": 3, "C": 5, "H": 12, "W": 10}]),
    "pooled_channel_scale": ({"x": [["N", "C", "H", "W"], True], "w": [["C"], True]}, {},
                             "return x.mean((2, 3)) * w", [{"N": 2, "C": 3, "H": 4, "W": 5}]),
    "normalize": ({"x": [["N", "D"], True]}, {}, "return torch.nn.functional.normalize(x, dim=-1)",
                  [{"N": 4, "D": 9}, {"N": 3, "D": 300}]),
    "frobenius_normalize": ({"x": [["N", "D"], True]}, {}, "return x / torch.norm(x, p='fro')",
                            [{"N": 4, "D": 9}]),
    # running statistics read as buffers (no gradient), viewed per channel after elementwise work on them
    "batch_norm_eval": ({"x": [["N", "C", "H", "W"], True], "rm": [["C"], False], "rv": [["C"], False],
                         "w": [["C"], True], "b": [["C"], True]}, {},
                        "return torch.nn.functional.batch_norm(x, rm, rv.abs() + 0.5, w, b, training=False)",
                        [{"N": 2, "C": 3, "H": 4, "W": 5}]),
    "global_avg_pool": ({"x": [["N", "C", "H", "W"], True]}, {}, "return torch.relu(x).mean((2, 3)) * 2.0",
                        [{"N": 3, "C": 4, "H": 5, "W": 6}, {"N": 2, "C": 3, "H": 40, "W": 50}]),
    # reductions over other dimensions: walked last, as the columns, each input read through its strides
    "sum_dim1": ({"x": [["B", "D1", "D2"], True]}, {}, "return x.sum(1) * 0.5",
                 [{"B": 3, "D1": 7, "D2": 5}, {"B": 2, "D1": 130, "D2": 9}]),
    "amin_dim1": ({"x": [["B", "D1", "D2"], True]}, {}, "return x.amin(1, keepdim=True)",
                  [{"B": 3, "D1": 7, "D2": 5}, {"B": 2, "D1": 130, "D2": 9}]),
    "softmax_dim1": ({"x": [["B", "D1", "D2"], True]}, {}, "return torch.softmax(x, 1)",
                     [{"B": 3, "D1": 7, "D2": 5}, {"B": 2, "D1": 300, "D2": 3}]),
    "log_softmax_dim0": ({"x": [["N", "C"], True]}, {}, "return torch.log_softmax(x, 0)",
                         [{"N": 6, "C": 5}, {"N": 300, "C": 7}]),
    "channel_rms_norm": ({"x": [["N", "C", "H", "W"], True], "w": [["C"], True]}, {"eps": 1e-6},
                         "return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + eps) * w[:, None, None]",
                         [{"N": 2, "C": 6, "H": 3, "W": 5}, {"N": 1, "C": 40, "H": 7, "W": 9}]),
    # values that need finished column or full reductions for every row: chains of kernels
    "center_columns": ({"x": [["N", "M"], True]}, {}, "return x - x.mean(0, keepdim=True)",
                       [{"N": 5, "M": 7}, {"N": 40, "M": 300}]),
    "batch_norm": ({"x": [["N", "C"], True], "w": [["C"], True], "b": [["C"], True]}, {"eps": 1e-5},
                   "m = x.mean(0, keepdim=True)\n"
                   "    v = ((x - m) ** 2).mean(0, keepdim=True)\n"
                   "    return (x - m) / torch.sqrt(v + eps) * w + b",
                   [{"N": 6, "C": 5}, {"N": 40, "C": 300}]),
    "absmax_fake_quant": ({"x": [["N", "M"], True]}, {},
                          "s = x.abs().amax() / 127.0 + 1e-12\n"
                          "    q = x / s\n"
                          "    return (q + (torch.round(q) - q).detach()) * s",
                          [{"N": 5, "M": 7}, {"N": 9, "M": 400}]),
    # slices counted from the row's end, forward and in the gradient (slice_backward)
    "end_slices": ({"x": [["N", "M"], True]}, {}, "return x[:, -3:] * 2 + x[:, 1:4] - x[:, -5:-2]",
                   [{"N": 4, "M": 9}, {"N": 3, "M": 70}]),
    # an exclusive running sum: a zero column concatenated before the row's columns but its last
    "exclusive_cumsum": ({"x": [["N", "M"], True]}, {},
                         "return torch.cat((torch.zeros_like(x[:, :1]), x[:, :-1]), dim=1).cumsum(1)",
                         [{"N": 4, "M": 9}, {"N": 3, "M": 70}]),
    # reductions over a dimension a keepdim reduction left at one: the values themselves, the index zero
    "unit_reductions": ({"x": [["B", "K"], True]}, {},
                        "y = x.sum(1, keepdim=True)\n"
                        "    v, i = torch.max(y, dim=1)\n"
                        "    return torch.logsumexp(y, 1) + v * torch.argmin(y, 1) + y.mean(1) - i",
                        [{"B": 5, "K": 16}]),
    # losses whose ATen ops decompose: huber's gradient negates a size in Python (-1/numel); the logits form's
    # minimum(0, x) takes a constant operand
    "huber_loss": ({"x": [["N", "M"], True], "y": [["N", "M"], True]}, {},
                   "return torch.nn.functional.huber_loss(x, y, delta=0.5)", [{"N": 5, "M": 7}]),
    "bce_with_logits": ({"x": [["N", "M"], True], "y": [["N", "M"], False]}, {},
                        "return torch.nn.functional.binary_cross_entropy_with_logits(x, torch.sigmoid(y))",
                        [{"N": 5, "M": 7}]),
    "rowmax_fake_quant": ({"x": [["N", "M"], True]}, {},
                          "s = x.abs().amax(-1, keepdim=True) / 127.0 + 1e-8\n"
                          "    q = x / s\n"
                          "    return (q + (torch.round(q) - q).detach()) * s",
                          [{"N": 5, "M": 7}, {"N": 9, "M": 400}]),
}


def write_request(root: Path, name: str, inputs: dict, attrs: dict, body: str, p0: list) -> Path:
    d = root / name
    d.mkdir(parents=True)
    sig = ", ".join(list(inputs) + [f"{k}: float = {v!r}" for k, v in attrs.items()])
    (d / "reference.py").write_text(f"import torch\n\n\ndef forward({sig}):\n    {body}\n")
    doc = {"name": name, "description": f"{name} (a composition the engine was not written for)",
           "category": "other",
           "inputs": {k: {"shape": shape, "dtype": ["float32", "bfloat16"] if i == 0 else f"like {next(iter(inputs))}",
                          "requires_grad": rg} for i, (k, (shape, rg)) in enumerate(inputs.items())},
           "attributes": {k: {"type": "float", "default": v} for k, v in attrs.items()},
           "reference": "reference.py:forward", "backward": True, "shapes": {"p0": p0[:1]}}
    (d / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


def load_impl(path: Path, source: str):
    path.write_text(source)
    return load_module(path, path.stem)


@pytest.mark.parametrize("name", list(UNSEEN))
def test_unseen_composition_builds_and_matches_float64(tmp_path, name):
    inputs, attrs, body, bindings = UNSEEN[name]
    req = load_request(write_request(tmp_path, name, inputs, attrs, body, bindings))
    impl = load_impl(tmp_path / f"{name}_unseen_impl.py", generate_impl(req, plan_request(req)))
    check_against_float64(req, getattr(impl, name), bindings, seed=7)


def check_against_float64(req, op, bindings: list[dict], seed: int) -> None:
    """The op's output and every input's gradient against the reference's in float64, in float32 and bfloat16."""
    ref = req.load_reference()
    gen = torch.Generator().manual_seed(seed)
    for binding in bindings:
        for dtype, rtol in ((torch.float32, 2e-5), (torch.bfloat16, 2e-2)):
            ins = [torch.randn(req.input_shape(s, binding), generator=gen, dtype=torch.float64).to(dtype)
                   for s in req.inputs]
            got_in = [t.clone().requires_grad_(s.requires_grad) for t, s in zip(ins, req.inputs)]
            ref_in = [t.double().requires_grad_(s.requires_grad) for t, s in zip(ins, req.inputs)]
            got, want = op(*got_in), ref(*ref_in)
            g = torch.randn(want.shape, generator=gen, dtype=torch.float64)
            got_g = torch.autograd.grad(got, [t for t in got_in if t.requires_grad], g.to(dtype))
            want_g = torch.autograd.grad(want, [t for t in ref_in if t.requires_grad], g)
            for a, b in zip((got, *got_g), (want, *want_g)):
                assert a.shape == b.shape and a.dtype == dtype
                scale = float(b.detach().abs().max()) if b.numel() else 1.0
                torch.testing.assert_close(a.detach().double(), b.detach(), rtol=rtol, atol=rtol * scale)


def test_per_channel_work_around_a_group_norm_runs_on_its_groups(tmp_path):
    # a convolution's bias and scale before the norm, a scale after it: one row kernel after the convolution,
    # its per-channel vectors read in the groups' view (forward only: the backward of work before the norm is not
    # planned yet)
    inputs = {"x": [["N", 3, "H", "W"], False], "w": [[8, 3, 3, 3], False], "b": [[8, 1, 1], False],
              "s": [[8, 1, 1], False], "gw": [[8], False], "gb": [[8], False], "t": [[8, 1, 1], False]}
    body = ("y = torch.sigmoid((torch.nn.functional.conv2d(x, w) + b) * s)\n"
            "    return torch.nn.functional.group_norm(y, 2, gw, gb, 1e-5) * t")
    bindings = [{"N": 2, "H": 6, "W": 5}, {"N": 1, "H": 9, "W": 4}]
    path = write_request(tmp_path, "conv_affine_group_norm", inputs, {}, body, bindings)
    (path / "request.yaml").write_text((path / "request.yaml").read_text().replace("backward: true",
                                                                                    "backward: false"))
    req = load_request(path)
    build = plan_request(req)
    assert [type(k).__name__ for k in kernels_of(build.forward)] == ["RowPlan"]
    op = getattr(load_impl(tmp_path / "conv_affine_impl.py", generate_impl(req, build)), req.name)
    ref, gen = req.load_reference(), torch.Generator().manual_seed(3)
    for binding in bindings:
        ins = [torch.randn(req.input_shape(s, binding), generator=gen, dtype=torch.float64) for s in req.inputs]
        for dtype, rtol in ((torch.float32, 2e-5), (torch.bfloat16, 2e-2)):
            got, want = op(*[t.to(dtype) for t in ins]), ref(*[t.to(dtype).double() for t in ins])
            torch.testing.assert_close(got.double(), want, rtol=rtol, atol=rtol * float(want.abs().max()))


REFUSED = {
    "roll": ("return torch.roll(x, 1, -1)", "aten.roll.default"),
    "flip": ("return torch.flip(x, [-1]) * 2", "aten.flip.default"),  # a flip around no scan moves columns
    "sort": ("return torch.sort(x, dim=-1).values * 2", "aten.sort"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_outside_the_supported_set_is_refused_by_name(tmp_path, case):
    body, named = REFUSED[case]
    req = load_request(write_request(tmp_path, case, {"x": [["N", "M"], True]}, {}, body, [{"N": 5, "M": 7}]))
    with pytest.raises(Unsupported) as exc:
        plan_request(req)
    assert named in str(exc.value)


def test_cli_stops_in_stage_2_with_the_op_named(tmp_path):
    d = write_request(tmp_path, "roll_op", {"x": [["N", "M"], True]}, {}, "return torch.roll(x, 1, -1) * 2",
                      [{"N": 5, "M": 7}])
    proc = subprocess.run([sys.executable, "-m", "opforge", "op", "run", str(d), "--out", str(tmp_path / "ws")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("BLOCKED_API") and "aten.roll.default" in last
    report = (tmp_path / "ws" / "API_REPORT.md").read_text()
    assert "## Unsupported" in report and "aten.roll.default" in report


def test_docs_op_table_is_generated_from_the_code():
    assert (ROOT / "docs" / "ops.md").read_text() == markdown_table()


def test_group_norm_backward_walks_channels_for_its_weight_gradients(tmp_path):
    """The statistics reduce each (sample, group) over its channels and pixels; the weight gradients reduce each
    channel over the samples and pixels: a kernel finishes the statistics, then grad_x walks the groups' rows
    and grad_w, grad_b walk the channels' (the samples and pixels through their strides)."""
    inputs, attrs, body, bindings = UNSEEN["group_norm"]
    b = plan_request(load_request(write_request(tmp_path, "gn", inputs, attrs, body, bindings)))
    assert len(b.forward.kernels) == 1
    stats, grad_x, grad_wb = b.backward.kernels
    assert [o.name for o in grad_x.outputs] == ["grad_x"] and [o.name for o in grad_wb.outputs] == ["grad_w", "grad_b"]
    assert stats.n_rows == grad_x.n_rows == "4*N" and grad_wb.n_rows == "4*D" and grad_wb.n_cols == "H*N*W"
    assert [o.name for o in b.backward.outputs] == ["grad_x", "grad_w", "grad_b"]
    assert any("no one walk order suits" in w for w in b.backward.why)


def test_an_output_no_walk_order_suits_is_refused_by_name(tmp_path):
    req = load_request(write_request(tmp_path, "clash", {"x": [["N", "C", "H", "W"], True]}, {},
                                     "return x.sum((2, 3), keepdim=True) + x.sum((0, 2, 3), keepdim=True)",
                                     [{"N": 2, "C": 3, "H": 4, "W": 5}]))
    with pytest.raises(Unsupported, match="no one walk order suits.*aten.sum.dim_IntList"):
        plan_request(req)


def test_sequence_string_and_none_attributes_specialise_the_build(tmp_path):
    """A reduction's dimensions as a list, its kind as a string, an optional shift as None: the kernels are built for
    those values, which the op takes as a list or a tuple and refuses to change."""
    d = tmp_path / "attrs"
    d.mkdir()
    (d / "reference.py").write_text(
        "import torch\n\n\ndef forward(x, dims=(1,), mode='max', shift=None):\n"
        "    r = x.amax(dims, keepdim=True) if mode == 'max' else x.mean(dims, keepdim=True)\n"
        "    return x - r if shift is None else x - r + shift\n")
    (d / "request.yaml").write_text(yaml.safe_dump({
        "name": "attrs", "description": "attributes of every type", "category": "reduction",
        "inputs": {"x": {"shape": ["N", "M"], "dtype": ["float32"]}},
        "attributes": {"dims": {"type": "ints", "default": [1]}, "mode": {"type": "str", "default": "max"},
                       "shift": {"type": "float", "default": None}},
        "reference": "reference.py:forward", "backward": True, "shapes": {"p0": [{"N": 5, "M": 7}]}}))
    req = load_request(d)
    assert [a.default for a in req.attributes] == [(1,), "max", None]
    b = plan_request(req)
    impl = load_impl(tmp_path / "attrs_impl.py", generate_impl(req, b))
    x = torch.randn(5, 7)
    torch.testing.assert_close(impl.attrs(x), x - x.amax(1, keepdim=True))
    torch.testing.assert_close(impl.attrs(x, dims=[1]), x - x.amax(1, keepdim=True))
    for wrong in ({"dims": (0,)}, {"mode": "mean"}, {"shift": 1.0}):
        with pytest.raises(ValueError, match="this build is specialised to"):
            impl.attrs(x, **wrong)


def test_group_size_relation_from_a_product_shape(tmp_path):
    """'G*32' ties the weight's row to the number of groups; the kernel's rows are the groups."""
    req = load_request(ROOT / "examples" / "qat_asymmetric_per_group")
    build = plan_request(req)
    assert build.forward.layout == "rows"
    assert build.forward.n_cols == "32"
    layouts = {a.name: a.layout for a in build.forward.inputs}
    assert layouts == {"weight": "flat", "scale": "row", "offset": "row"}
    assert {(r.axis, r.kind) for r in build.backward.reductions} == {("row", "sum")}


def test_plan_names_its_reductions():
    req = load_request(ROOT / "examples" / "layer_norm")
    b = plan_request(req)
    axes = sorted(r.axis for r in b.backward.reductions)
    assert axes.count("col") == 2 and "row" in axes  # grad_weight and grad_bias sum over rows
    assert b.forward.phases == 2  # the mean, then the variance around it
    src = generate_impl(req, b)
    assert "if PERSISTENT:" in src and "def _layer_norm_backward_column_sums(" in src and "atomic" not in src
    assert textwrap.dedent(src).count("def _layer_norm_backward_kernel(") == 1


def test_row_strided_input_is_read_in_place(tmp_path):
    req = load_request(ROOT / "examples" / "rms_norm")
    impl = load_impl(tmp_path / "rms_strided_impl.py", generate_impl(req, plan_request(req)))
    wide = torch.randn(6, 40, generator=torch.Generator().manual_seed(3))
    x = wide[:, 3:20]  # 17 columns, rows 40 elements apart
    view, stride = impl._rows_of(x)
    assert view.data_ptr() == x.data_ptr() and stride == 40
    w = torch.randn(17, generator=torch.Generator().manual_seed(4))
    got = impl.rms_norm(x, w)
    x64 = x.double()
    want = x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    dense, stride = impl._rows_of(x.t())  # columns not contiguous: a dense copy
    assert dense.is_contiguous() and stride == 6


def test_a_value_needing_finished_reductions_splits_the_pass_and_says_why(tmp_path):
    inputs, attrs, body, bindings = UNSEEN["batch_norm"]
    req = load_request(write_request(tmp_path, "bn", inputs, attrs, body, bindings))
    b = plan_request(req)
    assert len(b.forward.kernels) == 3  # column means, then column variances around them, then the output
    # backward: means, variances, then every column sum at once (the one that is scaled by another's result
    # is summed unscaled and scaled after), then grad_x
    assert len(b.backward.kernels) == 4
    assert all("needs a finished column or full reduction" in w for w in b.forward.why)
    assert b.forward.temps and all(t.startswith("forward") for t in b.forward.temps)
    src = generate_impl(req, b)
    assert src.count("@triton.jit\ndef _bn_forward") == 5  # and the column means' two column-sum kernels
    assert len(re.findall(r"@triton.jit\ndef _bn_forward_\w+_column_sums", src)) == 2


# integer labels (x: (N, V) logits, t: (N,) labels in [0, V)): one element per row gathered or scattered
LABELLED = {
    "label_smoothing_ce": "return torch.nn.functional.cross_entropy(x, t, label_smoothing=0.1)",
    "nll_sum_of_log_softmax": "return torch.nn.functional.nll_loss(torch.log_softmax(x, -1), t, reduction='sum')",
    "picked_margin": "return torch.exp(x.gather(-1, t.unsqueeze(-1)) - x.amax(-1, keepdim=True))",
    "one_hot_mask": "return x * torch.zeros_like(x).scatter(-1, t.unsqueeze(-1), 2.0)",
}


def write_labelled(root: Path, name: str, body: str, label_dim: str = "N") -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "reference.py").write_text(f"import torch\n\n\ndef forward(x, t):\n    {body}\n")
    doc = {"name": name, "description": f"{name} over integer labels", "category": "other",
           "inputs": {"x": {"shape": ["N", "V"], "dtype": ["float32", "bfloat16"]},
                      "t": {"shape": [label_dim], "dtype": "int64", "range": [0, "V" if label_dim == "N" else "N"]}},
           "reference": "reference.py:forward", "backward": True, "shapes": {"p0": [{"N": 5, "V": 7}]}}
    (d / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


@pytest.mark.parametrize("name", list(LABELLED))
def test_labelled_composition_builds_and_matches_float64(tmp_path, name):
    req = load_request(write_labelled(tmp_path, name, LABELLED[name]))
    impl = load_impl(tmp_path / f"{name}_labelled_impl.py", generate_impl(req, plan_request(req)))
    ref = req.load_reference()
    gen = torch.Generator().manual_seed(11)
    for n, v in ((5, 7), (9, 300)):
        for dtype, rtol in ((torch.float32, 2e-5), (torch.bfloat16, 2e-2)):
            x = torch.randn(n, v, generator=gen, dtype=torch.float64).to(dtype)
            t = torch.randint(0, v, (n,), generator=gen)
            got_x, ref_x = x.clone().requires_grad_(), x.double().requires_grad_()
            got, want = getattr(impl, name)(got_x, t), ref(ref_x, t)
            g = torch.randn(want.shape, generator=gen, dtype=torch.float64)
            for a, b in zip((got, *torch.autograd.grad(got, got_x, g.to(dtype))),
                            (want, *torch.autograd.grad(want, ref_x, g))):
                assert a.shape == b.shape and a.dtype == dtype
                scale = float(b.abs().max()) if b.numel() else 1.0
                torch.testing.assert_close(a.double(), b, rtol=rtol, atol=rtol * scale)


def test_gather_along_another_dimension_is_refused_by_name(tmp_path):
    d = write_labelled(tmp_path, "column_gather", "return x.gather(0, t.unsqueeze(0))", label_dim="V")
    with pytest.raises(Unsupported) as exc:
        plan_request(load_request(d))
    assert "aten.gather.default" in str(exc.value)


def test_relu_passes_nan_and_negative_zero_and_takes_minus_infinity_to_zero_as_torch_does(tmp_path):
    # -inf · 0 is NaN: a ReLU written as where(x > 0, x, x · 0) turns a convolution's -inf into NaN
    req = load_request(write_request(tmp_path, "relu_edges", {"x": [["N"], True]}, {}, "return torch.relu(x)",
                                     [{"N": 8}]))
    impl = load_impl(tmp_path / "relu_edges_impl.py", generate_impl(req, plan_request(req)))
    x = torch.tensor([float("-inf"), float("nan"), -0.0, 0.0, -1.5, 2.0, float("inf"), -3e38])
    got, want = impl.relu_edges(x), torch.relu(x)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bit for bit, the sign of zero too


def test_a_power_of_zero_is_one_at_inf_and_nan_too(tmp_path):
    # x ** 0 written as x · 0 + 1 would be NaN there; torch gives 1 for every base
    req = load_request(write_request(tmp_path, "pow_zero", {"x": [["N"], True]}, {}, "return x.pow(0) + x.pow(2)",
                                     [{"N": 8}]))
    impl = load_impl(tmp_path / "pow_zero_impl.py", generate_impl(req, plan_request(req)))
    x = torch.tensor([float("-inf"), float("nan"), -0.0, 0.0, -1.5, 2.0, float("inf"), -3e38])
    torch.testing.assert_close(impl.pow_zero(x), x.pow(0) + x.pow(2), equal_nan=True)


def test_a_nan_constant_of_a_decomposition_is_a_constant_not_an_attribute(tmp_path):
    """kl_div's decomposition holds a NaN (where target is 0 it takes 0 instead of 0·log 0): the two traces the
    attributes are found by both hold it, and NaN ≠ NaN must not read as a constant that follows an attribute."""
    from test_gemm import _check, _impl, _request

    path = _request(tmp_path, "kl", {"inp": ["N", "V"], "target": ["N", "V"]},
                    'return F.kl_div(inp, target, reduction="batchmean")', {"N": 8, "V": 64},
                    extra={"target": {"requires_grad": False, "range": [0.0, 1.0]}})
    req, _, impl = _impl(path, tmp_path)
    _check(req, impl, {"N": 5, "V": 48}, torch.float32, 240)
