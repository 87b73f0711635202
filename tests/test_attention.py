"""Attention recognised in a traced pass (codegen/attention.py) and run as one FlashAttention-style kernel
(codegen/emit_attention.py): the S×S scores never reach memory. Forward passes against float64, at sizes that
are not multiples of the blocks, in the block sizes that ship."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from test_catalog import reduction_tolerance
from test_gemm import _check_backward, _impl

from opforge.codegen.attention import AttentionStage
from opforge.codegen.attention_grad import AttentionBackwardStage
from opforge.codegen.build import graph_binding, shape_numel
from opforge.codegen.gemm import GemmStage
from opforge.codegen.trace import trace_request
from opforge.verify.metrics import compare
from opforge.verify.tolerance import Tolerance

DEVICE = os.environ.get("OPFORGE_TEST_DEVICE", "cpu")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

GPT_OSS = """\
b, h, s, d = q.shape
g = k.shape[1]
k = k[:, :, None].expand(b, g, h // g, s, d).reshape(b, h, s, d)
v = v[:, :, None].expand(b, g, h // g, s, d).reshape(b, h, s, d)
scores = q @ k.transpose(-1, -2) * d ** -0.5
scores = scores + torch.triu(q.new_full((s, s), float("-inf")), diagonal=1)
logits = torch.cat([scores, sinks[None, :, None, None].expand(b, h, s, 1)], dim=-1)
probs = torch.softmax(logits, dim=-1)[..., :-1]
return probs @ v"""


def _request(tmp: Path, name: str, inputs: dict, body: str, p0: dict, backward: bool = False,
             no_grad: tuple = ()) -> Path:
    d = tmp / name
    d.mkdir()
    first = next(iter(inputs))
    doc = {"name": name, "description": f"{name} for the attention tests", "category": "attention",
           "inputs": {k: {"shape": v, "dtype": ["float32", "bfloat16"] if k == first else f"like {first}",
                          **({"requires_grad": False} if k in no_grad else {})}
                      for k, v in inputs.items()},
           "reference": "reference.py:forward", "backward": backward, "shapes": {"p0": [p0]}}
    (d / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (d / "reference.py").write_text(f"import torch\n\n\ndef forward({', '.join(inputs)}):\n"
                                    + textwrap.indent(body, "    ") + "\n")
    return d


def _check(req, impl, binding: dict, dtype, k: int):
    gen = torch.Generator().manual_seed(11)
    ins = [torch.randn(req.input_shape(s, binding), generator=gen, dtype=torch.float64) for s in req.inputs]
    got = getattr(impl, req.name)(*(t.to(dtype).to(DEVICE) for t in ins)).cpu()
    want = req.load_reference()(*(t.to(dtype).double() for t in ins))
    assert got.dtype == dtype and got.shape == want.shape
    tol = reduction_tolerance(dtype, k, want)
    if dtype != torch.float32:  # the probabilities multiply V in the dtype, each rounded by up to eps/2: the
        v = ins[[s.name for s in req.inputs].index("v")]  # output, their weighted mean, by eps/2 · max|v|
        tol = Tolerance(tol.atol + torch.finfo(dtype).eps / 2 * float(v.abs().max()), tol.rtol)
    res = compare(got, want, tol, name="out")
    assert res["passed"], f"{req.name} {dtype} {binding}: max_abs={res['max_abs']} worst={res['worst'][:2]}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpt_oss_attention_with_sinks_grouped_heads_and_a_causal_mask_is_one_kernel(tmp_path, dtype):
    path = _request(tmp_path, "sink_attention", {"q": ["B", "G*R", "S", "D"], "k": ["B", "G", "S", "D"],
                                                 "v": ["B", "G", "S", "D"], "sinks": ["G*R"]},
                    GPT_OSS, {"B": 2, "G": 2, "R": 4, "S": 128, "D": 64})
    req, build, impl = _impl(path, tmp_path)
    stages = [s for s in build.forward.steps if isinstance(s, (AttentionStage, GemmStage))]
    assert len(stages) == 1 and isinstance(stages[0], AttentionStage)  # no product, no score, written
    st = stages[0]
    assert (st.q, st.k, st.v, st.sinks) == ("q", "k", "v", "sinks") and st.kinds == ["size"]
    # 70 queries and keys: two blocks of keys, the second part masked; a head dim of 24 padded to 32
    _check(req, impl, {"B": 2, "G": 2, "R": 3, "S": 70, "D": 24}, dtype, 70)


def test_an_additive_bias_and_a_softcap_run_on_the_score_tile(tmp_path):
    # a per-head bias over (query, key) broadcast across the batch, and a tanh softcap before it
    body = ("s = q @ k.transpose(-1, -2) * 0.125\n"
            "s = torch.tanh(s / 30.0) * 30.0 + bias\n"
            "return torch.softmax(s, dim=-1) @ v")
    path = _request(tmp_path, "biased", {"q": ["B", "H", "S", "D"], "k": ["B", "H", "T", "D"],
                                         "v": ["B", "H", "T", "E"], "bias": ["H", "S", "T"]},
                    body, {"B": 2, "H": 3, "S": 40, "T": 72, "D": 16, "E": 24})
    req, build, impl = _impl(path, tmp_path)
    (st,) = build.forward.attentions
    assert st.kinds == ["tile"] and not build.forward.gemms
    _check(req, impl, {"B": 2, "H": 3, "S": 33, "T": 70, "D": 16, "E": 20}, torch.float32, 70)


def test_three_dimensional_operands_multiplied_with_bmm(tmp_path):
    # (batch·heads, S, D) tensors and torch.bmm, as older references write it
    body = "return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.2, dim=-1), v)"
    path = _request(tmp_path, "bmm_attention", {"q": ["N", "S", "D"], "k": ["N", "T", "D"], "v": ["N", "T", "D"]},
                    body, {"N": 6, "S": 40, "T": 48, "D": 16})
    req, build, impl = _impl(path, tmp_path)
    assert len(build.forward.attentions) == 1 and not build.forward.gemms
    _check(req, impl, {"N": 5, "S": 33, "T": 70, "D": 20}, torch.float32, 70)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_backward_of_gpt_oss_attention_never_writes_the_scores(tmp_path, dtype):
    path = _request(tmp_path, "sink_attention", {"q": ["B", "G*R", "S", "D"], "k": ["B", "G", "S", "D"],
                                                 "v": ["B", "G", "S", "D"], "sinks": ["G*R"]},
                    GPT_OSS, {"B": 2, "G": 2, "R": 4, "S": 128, "D": 64}, backward=True)
    req, build, impl = _impl(path, tmp_path)
    # the backward is one stage: dQ (with each query's log-sum-exp and Δ), dK and dV, the sinks' gradient; no
    # product and no glue, so no S×S value is ever in memory
    (bwd,) = build.backward.attentions
    assert isinstance(bwd, AttentionBackwardStage) and bwd.dsinks and bwd.launches == 3
    assert not build.backward.gemms and not build.backward.glue
    _check_backward(req, impl, {"B": 2, "G": 2, "R": 3, "S": 70, "D": 24}, dtype, 70)


def test_a_softcap_is_differentiated_on_the_tile_and_a_bias_without_gradient_is_only_read(tmp_path):
    body = ("s = q @ k.transpose(-1, -2) * 0.125\n"
            "s = torch.tanh(s / 30.0) * 30.0 + bias\n"
            "return torch.softmax(s, dim=-1) @ v")
    inputs = {"q": ["B", "H", "S", "D"], "k": ["B", "H", "T", "D"], "v": ["B", "H", "T", "E"], "bias": ["H", "S", "T"]}
    path = _request(tmp_path, "biased", inputs, body, {"B": 2, "H": 3, "S": 40, "T": 72, "D": 16, "E": 24},
                    backward=True, no_grad=("bias",))
    req, build, impl = _impl(path, tmp_path)
    assert [type(s) for s in build.backward.attentions] == [AttentionBackwardStage]
    _check_backward(req, impl, {"B": 2, "H": 3, "S": 33, "T": 70, "D": 16, "E": 20}, torch.float32, 70)


def test_grouped_heads_by_repeat_interleave_and_a_scale_divided_by_a_size(tmp_path):
    body = ("r = q.shape[1] // k.shape[1]\n"
            "k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)\n"
            "return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v")
    path = _request(tmp_path, "gqa", {"q": ["B", "G*R", "S", "D"], "k": ["B", "G", "S", "D"],
                                      "v": ["B", "G", "S", "D"]}, body, {"B": 2, "G": 2, "R": 4, "S": 128, "D": 64},
                    backward=True)
    req, build, impl = _impl(path, tmp_path)
    assert len(build.forward.attentions) == 1 and [type(s) for s in build.backward.attentions] == [
        AttentionBackwardStage]
    _check_backward(req, impl, {"B": 2, "G": 2, "R": 3, "S": 70, "D": 24}, torch.float32, 70)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alibi_distances_are_computed_from_positions_in_the_kernels(tmp_path, dtype):
    # ALiBi: a per-head slope times the key's distance from the query, built with arange: never an S×S tensor
    body = ("pos = torch.arange(q.shape[2], device=q.device)\n"
            "bias = slopes[:, None, None] * (pos[None, :] - pos[:, None])\n"
            "return torch.softmax(q @ k.transpose(-1, -2) * 0.125 + bias, dim=-1) @ v")
    path = _request(tmp_path, "alibi", {"q": ["B", "H", "S", "D"], "k": ["B", "H", "S", "D"],
                                        "v": ["B", "H", "S", "D"], "slopes": ["H"]},
                    body, {"B": 2, "H": 4, "S": 128, "D": 64}, backward=True, no_grad=("slopes",))
    req, build, impl = _impl(path, tmp_path)
    (st,) = build.forward.attentions
    assert st.kinds == ["tile"] and "sub = cols_ - rows_" in (tmp_path / "alibi_impl.py").read_text()
    assert [type(s) for s in build.backward.attentions] == [AttentionBackwardStage]
    _check_backward(req, impl, {"B": 2, "H": 3, "S": 70, "D": 24}, dtype, 70)


@pytest.mark.parametrize("bias, dtype", [(["B", "H", "S", "S"], torch.float32), (["H", "S", "S"], torch.float32),
                                         (["H", "S", "S"], torch.bfloat16), (["S", "S"], torch.float32)])
def test_a_learned_bias_takes_its_gradient_in_a_kernel_that_sums_the_batches_and_heads_it_serves(
        tmp_path, bias, dtype):
    # d(bias) = dS: a relative-position bias per head (T5), one per batch, or one for all heads; where it is
    # broadcast, one program sums its tile's gradients over the batches (heads) in order, never the S×S matrix
    body = "return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + bias, dim=-1) @ v"
    path = _request(tmp_path, f"sdpa_bias_{len(bias)}_{str(dtype)[6:]}",
                    {"q": ["B", "H", "S", "D"], "k": ["B", "H", "S", "D"], "v": ["B", "H", "S", "D"], "bias": bias},
                    body, {"B": 2, "H": 3, "S": 40, "D": 16}, backward=True)
    req, build, impl = _impl(path, tmp_path)
    (st,) = build.backward.attentions
    assert not build.backward.gemms and st.dbias and st.launches == 3 and st.bias_sums == (False, False)
    _check_backward(req, impl, {"B": 2, "H": 3, "S": 37, "D": 16}, dtype, 37)


@pytest.mark.parametrize("name, bias, dtype", [("slopes", ["H"], torch.float32), ("slopes", ["H"], torch.bfloat16),
                                               ("keys", ["B", 1, 1, "S"], torch.float32)])
def test_a_learned_bias_broadcast_along_the_queries_or_keys_sums_its_gradient_tile_by_tile(
        tmp_path, name, bias, dtype):
    # ALiBi with learned slopes (one value per head: summed over queries and keys too), a learned bias per key
    # (summed over the queries and heads): each tile's share goes to a slot of its own, then the slots are added
    causal = "s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1), -float('inf'))\n"
    body = ("pos = torch.arange(q.shape[2], device=q.device)\n"
            "s = q @ k.transpose(-1, -2) * 0.125 + slopes[:, None, None] * (pos[None, :] - pos[:, None])\n" + causal
            if name == "slopes" else "s = q @ k.transpose(-1, -2) * 0.125 + keys\n") + \
        "return torch.softmax(s, dim=-1) @ v"
    inputs = {"q": ["B", "H", "S", "D"], "k": ["B", "H", "S", "D"], "v": ["B", "H", "S", "D"], name: bias}
    path = _request(tmp_path, f"broadcast_{name}_{str(dtype)[6:]}", inputs, body, {"B": 2, "H": 4, "S": 64, "D": 32},
                    backward=True)
    req, build, impl = _impl(path, tmp_path)
    (st,) = build.backward.attentions
    assert not build.backward.gemms and st.dbias and st.launches == 4
    assert st.bias_sums == ((True, True) if name == "slopes" else (True, False))
    _check_backward(req, impl, {"B": 2, "H": 3, "S": 70, "D": 24}, dtype, 70)


def test_two_learned_biases_keep_the_backward_as_products_and_glue(tmp_path):
    body = "return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + bias + bias2, dim=-1) @ v"
    path = _request(tmp_path, "sdpa_two_biases", {"q": ["B", "H", "S", "D"], "k": ["B", "H", "S", "D"],
                                                  "v": ["B", "H", "S", "D"], "bias": ["B", "H", "S", "S"],
                                                  "bias2": ["B", "H", "S", "S"]},
                    body, {"B": 2, "H": 3, "S": 40, "D": 16}, backward=True)
    req, build, impl = _impl(path, tmp_path)
    assert len(build.forward.attentions) == 1 and not build.backward.attentions and build.backward.gemms
    _check_backward(req, impl, {"B": 2, "H": 3, "S": 37, "D": 16}, torch.float32, 37)


def test_attention_written_with_einsum_is_recognised_forward_and_backward(tmp_path):
    # einsum traces size-1 dimensions added, permuted and viewed away around each bmm: folded into one reshape
    # (decompose.fold_reshapes), the pattern is the same as with @
    body = ('s = torch.einsum("bhqd,bhkd->bhqk", q, k) / q.shape[-1] ** 0.5\n'
            'return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, dim=-1), v)')
    path = _request(tmp_path, "einsum_attention", {"q": ["B", "H", "S", "D"], "k": ["B", "H", "S", "D"],
                                                   "v": ["B", "H", "S", "D"]}, body, {"B": 2, "H": 3, "S": 40, "D": 16},
                    backward=True)
    req, build, impl = _impl(path, tmp_path)
    assert len(build.forward.attentions) == 1 and not build.forward.gemms and not build.forward.glue
    assert len(build.backward.attentions) == 1 and not build.backward.gemms
    _check_backward(req, impl, {"B": 2, "H": 3, "S": 37, "D": 16}, torch.float32, 37)


def test_a_boolean_key_padding_mask_is_read_in_the_score_body_forward_and_backward(tmp_path):
    # keep (B, S) of bool, as a tokenizer's attention mask: masked_fill(~keep, -inf) on the score tile
    path = _request(tmp_path, "padded", {"q": ["B", "H", "S", "D"], "k": ["B", "H", "S", "D"],
                                         "v": ["B", "H", "S", "D"], "keep": ["B", "S"]},
                    "s = (q @ k.transpose(-1, -2)) * 0.25\n"
                    "return torch.softmax(s.masked_fill(~keep[:, None, None, :], float('-inf')), dim=-1) @ v",
                    {"B": 2, "H": 3, "S": 40, "D": 16}, backward=True)
    doc = yaml.safe_load((path / "request.yaml").read_text())
    doc["inputs"]["keep"] = {"shape": ["B", "S"], "dtype": "bool"}
    (path / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    req, build, impl = _impl(path, tmp_path)
    assert len(build.forward.attentions) == 1 and len(build.backward.attentions) == 1
    gen = torch.Generator().manual_seed(3)
    b, h, s, d = 2, 3, 37, 16
    q, k, v = (torch.randn(b, h, s, d, generator=gen, dtype=torch.float64) for _ in range(3))
    keep = torch.rand(b, s, generator=gen) > 0.3
    keep[:, 0] = True  # every query keeps a key: no row of the softmax is all -inf
    g = torch.randn(b, h, s, d, generator=gen, dtype=torch.float64)
    got_in = [t.float().requires_grad_() for t in (q, k, v)]
    want_in = [t.clone().requires_grad_() for t in (q, k, v)]
    got = impl.padded(*got_in, keep)
    want = req.load_reference()(*want_in, keep)
    got_g = torch.autograd.grad(got, got_in, g.float())
    want_g = torch.autograd.grad(want, want_in, g)
    for name, a, w in zip(["out", "grad_q", "grad_k", "grad_v"], [got, *got_g], [want, *want_g]):
        res = compare(a.detach().double(), w.detach(), reduction_tolerance(torch.float32, s, w), name=name)
        assert res["passed"], f"{name}: max_abs={res['max_abs']} worst={res['worst'][:2]}"


def test_probabilities_read_outside_the_region_keep_the_products(tmp_path):
    # the probabilities are an output too: they must be written, so the region is not fused
    body = ("p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)\n"
            "return p @ v, p")
    path = _request(tmp_path, "with_probs", {"q": ["B", "H", "S", "D"], "k": ["B", "H", "S", "D"],
                                             "v": ["B", "H", "S", "D"]}, body, {"B": 2, "H": 3, "S": 40, "D": 16})
    req, build, impl = _impl(path, tmp_path)
    assert not build.forward.attentions and len(build.forward.gemms) == 2


def test_the_attention_kernels_compile_for_sm90_on_the_tensor_cores_without_spills(tmp_path):
    import json
    import subprocess
    import sys

    # with a learned relative bias too: its gradient is a kernel of its own
    inputs = {"q": ["B", "G*R", "S", "D"], "k": ["B", "G", "S", "D"], "v": ["B", "G", "S", "D"], "sinks": ["G*R"],
              "bias": ["G*R", "S", "S"]}
    path = _request(tmp_path, "sink_attention", inputs, GPT_OSS.replace("* d ** -0.5", "* d ** -0.5 + bias"),
                    {"B": 2, "G": 2, "R": 4, "S": 128, "D": 64}, backward=True)
    r = subprocess.run([sys.executable, "-m", "opforge", "bench", "compile", "--request", str(path), "--dtype", "all",
                        "--elements", "0", "--json", "-"], capture_output=True, text=True, timeout=600,
                       cwd=Path(__file__).resolve().parents[1], env={**os.environ, "TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    builds = [b for op in json.loads(r.stdout)["ops"] for b in op["builds"]]
    # per dtype: the forward; in the backward dQ, dK/dV, the bias's and the sinks' gradients
    assert len(builds) == 2 * 5, [(b["dtype"], b["kernel"]) for b in builds]
    for b in builds:  # float32 multiplies in IEEE float32 (its tolerance), 16-bit dtypes on the tensor cores
        products = not b["kernel"].endswith("_dsinks_kernel")
        assert b["spill_bytes"] == 0 and (b["wgmma"] > 0) == (products and b["dtype"] != "float32"), b


def test_a_scale_of_the_head_dimension_to_the_minus_half_is_taken_in_a_row_kernel_too(tmp_path):
    # outside attention the size arithmetic D ** -0.5 is computed in the kernel (no ** on Triton tensors)
    path = _request(tmp_path, "scaled_softmax", {"x": ["N", "D"]},
                    "return torch.softmax(x * x.shape[-1] ** -0.5, dim=-1)", {"N": 16, "D": 64})
    req, build, impl = _impl(path, tmp_path)
    assert "tl.sqrt_rn" in (tmp_path / "scaled_softmax_impl.py").read_text()
    _check(req, impl, {"N": 7, "D": 37}, torch.float32, 37)


def test_the_catalogs_attention_sink_with_a_sliding_window_built_for_it(tmp_path):
    # the catalog's reference, built for a window of 24: the second mask (tril) is computed from positions too,
    # and at 200 positions every walk skips the blocks the window and the causal mask leave out
    path = tmp_path / "attention_sink"
    shutil.copytree(EXAMPLES / "attention_sink", path)
    doc = yaml.safe_load((path / "request.yaml").read_text())
    doc["attributes"]["sliding_window"]["default"] = 24
    (path / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    req, build, impl = _impl(path, tmp_path)
    assert len(build.forward.attentions) == 1 and len(build.backward.attentions) == 1
    src = (tmp_path / "attention_sink_impl.py").read_text()
    assert "cols_ - rows_ <= -24" in src
    assert src.count("range(tl.maximum(pid_m * BLOCK_M - 23, 0), tl.minimum((pid_m + 1) * BLOCK_M, SK), BLOCK_N)") == 3
    assert "range(start, tl.minimum(start + BLOCK_N + 23, SQ), BLOCK_M)" in src
    # the cost model counts the pairs the window keeps: 1 + 2 + ... + 24 for the first 24 queries, then 24 each
    subs = graph_binding(trace_request(req).forward, req, {"B": 1, "G": 1, "R": 2, "S": 200, "D": 16})
    (st,) = build.forward.attentions
    assert st.pairs(lambda shape: shape_numel(shape, subs)) == 300 + 176 * 24
    _check_backward(req, impl, {"B": 1, "G": 1, "R": 2, "S": 200, "D": 16}, torch.float32, 200)
    with pytest.raises(ValueError, match="sliding_window"):  # built for one window: another is refused by name
        q, k, v, sinks = (torch.randn(*s) for s in ((1, 4, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16), (4,)))
        impl.attention_sink(q, k, v, sinks, sliding_window=0)


def test_a_head_of_256_fits_an_h200_programs_shared_memory_in_both_dtypes(tmp_path):
    import json
    import subprocess
    import sys

    # float32 rows of 256 are 1 KB: at 64 × 64 blocks the dK/dV kernel would need 295 KB of shared memory, so
    # the launcher halves the blocks there; bfloat16 keeps 64 × 64 and its tensor cores
    path = _request(tmp_path, "wide_heads", {"q": ["B", "H", "S", "D"], "k": ["B", "H", "S", "D"],
                                             "v": ["B", "H", "S", "D"]},
                    "return torch.softmax(q @ k.transpose(-1, -2) * 0.0625, dim=-1) @ v",
                    {"B": 1, "H": 2, "S": 256, "D": 256}, backward=True)
    r = subprocess.run([sys.executable, "-m", "opforge", "bench", "compile", "--request", str(path), "--dtype", "all",
                        "--elements", "0", "--json", "-"], capture_output=True, text=True, timeout=600,
                       cwd=Path(__file__).resolve().parents[1], env={**os.environ, "TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    builds = [b for op in json.loads(r.stdout)["ops"] for b in op["builds"]]
    assert len(builds) == 2 * 3
    for b in builds:
        assert b["shared_bytes"] <= 227 * 1024 and b["spill_bytes"] == 0, b
        assert (b["constexprs"]["BLOCK_M"] == 32) == (b["dtype"] == "float32"), b


SDPA = {  # keyword arguments of F.scaled_dot_product_attention, and the inputs they need
    "causal": ("is_causal=True", {}),
    "grouped": ("enable_gqa=True, scale=0.3", {"k": ["B", "G", "S", "D"], "v": ["B", "G", "S", "D"]}),
    "bool_mask": ("attn_mask=keep[:, None, None, :]", {"keep": ["B", "S"]}),
}


@pytest.mark.parametrize("case", sorted(SDPA))
def test_scaled_dot_product_attention_is_traced_as_its_formula_and_fused_forward_and_backward(tmp_path, case):
    # torch traces F.scaled_dot_product_attention to a backend's opaque kernel: its formula is fused instead
    kwargs, inputs = SDPA[case]
    heads = "G*R" if case == "grouped" else "H"
    shapes = {"q": ["B", heads, "S", "D"], "k": ["B", heads, "S", "D"], "v": ["B", heads, "S", "D"], **inputs}
    path = _request(tmp_path, f"sdpa_{case}", shapes,
                    f"return torch.nn.functional.scaled_dot_product_attention(q, k, v, {kwargs})",
                    {"B": 2, **({"G": 2, "R": 2} if case == "grouped" else {"H": 3}), "S": 40, "D": 16},
                    backward=True, no_grad=("keep",))
    if case == "bool_mask":
        doc = yaml.safe_load((path / "request.yaml").read_text())
        doc["inputs"]["keep"] = {"shape": ["B", "S"], "dtype": "bool"}
        (path / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    req, build, impl = _impl(path, tmp_path)
    assert len(build.forward.attentions) == 1 and not build.forward.gemms and not build.forward.glue
    assert len(build.backward.attentions) == 1 and not build.backward.gemms
    if case == "bool_mask":
        return  # its numerics: the masked_fill test above; a random mask may leave a query no key
    binding = {"B": 2, **({"G": 2, "R": 2} if case == "grouped" else {"H": 3}), "S": 37, "D": 16}
    _check_backward(req, impl, binding, torch.float32, 37)


def test_a_masked_score_that_overflows_takes_no_weight(tmp_path):
    # the causal mask's -inf is set on the tile, not added: an inf score above the diagonal plus -inf was NaN
    path = _request(tmp_path, "causal", {"q": ["B", "H", "S", "D"], "k": ["B", "H", "S", "D"],
                                         "v": ["B", "H", "S", "D"]},
                    "return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)",
                    {"B": 1, "H": 2, "S": 40, "D": 16})
    req, build, impl = _impl(path, tmp_path)
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 37, 16, generator=gen) for _ in range(3))
    q[0, 0, 3], k[0, 0, 20] = 1e20, 1e20  # query 3 and key 20: a score of inf in float32, masked (20 > 3)
    got = impl.causal(q, k, v)
    want = req.load_reference()(q.double(), k.double(), v.double())
    assert torch.isfinite(got).all()
    res = compare(got.double(), want, reduction_tolerance(torch.float32, 37, want), name="out")
    assert res["passed"], f"max_abs={res['max_abs']} worst={res['worst'][:2]}"


def test_queries_keys_and_values_sliced_from_one_projection_are_read_in_place(tmp_path):
    # x @ w_qkv.T split into Q, K, V and viewed as heads: one GEMM, the attention reads its columns through
    # narrow views, and the output projection is the third kernel; nothing between them is copied. The
    # backward writes dQ, dK, dV, places them side by side (torch.cat: the split's gradient) and takes dx and
    # dw_qkv from that one tensor
    body = ("b, s, e = x.shape\n"
            "q, k, v = torch.nn.functional.linear(x, w_qkv).split(e, dim=-1)\n"
            "q, k, v = (t.view(b, s, 4, e // 4).transpose(1, 2) for t in (q, k, v))\n"
            "o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
            "return torch.nn.functional.linear(o.transpose(1, 2).reshape(b, s, e), w_o)")
    path = _request(tmp_path, "qkv_attention", {"x": ["B", "S", "4*D"], "w_qkv": ["12*D", "4*D"],
                                                "w_o": ["4*D", "4*D"]}, body, {"B": 2, "S": 40, "D": 16},
                    backward=True)
    req, build, impl = _impl(path, tmp_path)
    fwd, bwd = build.forward, build.backward
    assert len(fwd.gemms) == 2 and len(fwd.attentions) == 1 and not fwd.glue
    source = (tmp_path / "qkv_attention_impl.py").read_text()
    assert source.count(".narrow(-1,") == 6  # Q, K, V out of the product, in the forward and the backward
    assert len(bwd.cats) == 1 and bwd.cats[0].reads == ["view_11", "view_10", "view_9"] and not bwd.glue
    assert [type(s).__name__ for s in bwd.steps if not hasattr(s, "op")].count("AttentionBackwardStage") == 1
    # the output projection's weight gradient reads the attention's output: saved by the forward, not
    # computed again by a second forward attention kernel in the backward
    assert not [s for s in bwd.steps if type(s) is AttentionStage] and len(build.saved.names) == 2
    assert build.saved.flops_saved > 0
    _check(req, impl, {"B": 2, "S": 37, "D": 8}, torch.float32, 37)
    # dx goes through three reductions in a row (dO·w_o over E, dP over the keys, dQKV·w_qkv over 3E)
    _check_backward(req, impl, {"B": 2, "S": 37, "D": 8}, torch.float32, 37 * 3 * 32)


def test_grouped_heads_by_repeat_interleave_in_einsums_scaled_by_math_sqrt_of_the_head_dim(tmp_path):
    # math.sqrt of a size stays size arithmetic in the trace (it would fix D at the probe size otherwise)
    body = ("import math\n"
            "r = q.shape[1] // k.shape[1]\n"
            "k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)\n"
            "s = torch.einsum('bhqd,bhkd->bhqk', q, k) / math.sqrt(q.shape[-1])\n"
            "s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).tril(), -float('inf'))\n"
            "return torch.einsum('bhqk,bhkd->bhqd', s.softmax(-1), v)")
    inputs = {"q": ["B", "G*R", "S", "D"], "k": ["B", "G", "S", "D"], "v": ["B", "G", "S", "D"]}
    path = _request(tmp_path, "gqa_einsum", inputs, body, {"B": 1, "G": 2, "R": 2, "S": 96, "D": 32})
    req, build, impl = _impl(path, tmp_path)
    assert len(build.forward.attentions) == 1 and not build.forward.gemms
    _check(req, impl, {"B": 2, "G": 2, "R": 3, "S": 70, "D": 24}, torch.float32, 70)
