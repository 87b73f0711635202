"""Attention recognised in a traced pass (codegen/attention.py) and run as one FlashAttention-style kernel
(codegen/emit_attention.py): the S×S scores never reach memory. Forward passes against float64, at sizes that
are not multiples of the blocks, in the block sizes that ship."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from test_catalog import reduction_tolerance
from test_gemm import _impl

from opforge.codegen.attention import AttentionStage
from opforge.codegen.gemm import GemmStage
from opforge.verify.metrics import compare
from opforge.verify.tolerance import Tolerance

DEVICE = os.environ.get("OPFORGE_TEST_DEVICE", "cpu")

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


def _request(tmp: Path, name: str, inputs: dict, body: str, p0: dict, backward: bool = False) -> Path:
    d = tmp / name
    d.mkdir()
    first = next(iter(inputs))
    doc = {"name": name, "description": f"{name} for the attention tests", "category": "attention",
           "inputs": {k: {"shape": v, "dtype": ["float32", "bfloat16"] if k == first else f"like {first}"}
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


def test_with_a_backward_the_forward_is_fused_and_the_gradients_match(tmp_path):
    # the backward reads the probabilities, so there the region stays GEMM and glue stages
    body = "return torch.softmax(q @ k.transpose(-1, -2) * 0.25, dim=-1) @ v"
    path = _request(tmp_path, "sdpa", {"q": ["B", "H", "S", "D"], "k": ["B", "H", "S", "D"],
                                       "v": ["B", "H", "S", "D"]}, body, {"B": 2, "H": 3, "S": 40, "D": 16},
                    backward=True)
    req, build, impl = _impl(path, tmp_path)
    assert len(build.forward.attentions) == 1 and not build.forward.gemms
    assert not build.backward.attentions and build.backward.gemms
    gen = torch.Generator().manual_seed(3)
    ins = [torch.randn(2, 3, 37, 16, generator=gen, dtype=torch.float64) for _ in range(3)]
    got_in = [t.float().to(DEVICE).requires_grad_() for t in ins]
    ref_in = [t.float().double().requires_grad_() for t in ins]
    got, want = impl.sdpa(*got_in), req.load_reference()(*ref_in)
    g = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    got_g = torch.autograd.grad(got, got_in, g.float().to(DEVICE))
    want_g = torch.autograd.grad(want, ref_in, g)
    for name, a, b in zip(["out", "grad_q", "grad_k", "grad_v"], [got, *got_g], [want, *want_g]):
        res = compare(a.detach().cpu(), b, reduction_tolerance(torch.float32, 37, b), name=name)
        assert res["passed"], f"{name}: max_abs={res['max_abs']}"


def test_probabilities_read_outside_the_region_keep_the_products(tmp_path):
    # the probabilities are an output too: they must be written, so the region is not fused
    body = ("p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)\n"
            "return p @ v, p")
    path = _request(tmp_path, "with_probs", {"q": ["B", "H", "S", "D"], "k": ["B", "H", "S", "D"],
                                             "v": ["B", "H", "S", "D"]}, body, {"B": 2, "H": 3, "S": 40, "D": 16})
    req, build, impl = _impl(path, tmp_path)
    assert not build.forward.attentions and len(build.forward.gemms) == 2


def test_the_attention_kernel_compiles_for_sm90_on_the_tensor_cores_without_spills(tmp_path):
    import json
    import subprocess
    import sys

    path = _request(tmp_path, "sink_attention", {"q": ["B", "G*R", "S", "D"], "k": ["B", "G", "S", "D"],
                                                 "v": ["B", "G", "S", "D"], "sinks": ["G*R"]},
                    GPT_OSS, {"B": 2, "G": 2, "R": 4, "S": 128, "D": 64})
    r = subprocess.run([sys.executable, "-m", "opforge", "bench", "compile", "--request", str(path), "--dtype", "all",
                        "--elements", "0", "--json", "-"], capture_output=True, text=True, timeout=600,
                       cwd=Path(__file__).resolve().parents[1], env={**os.environ, "TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    builds = [b for op in json.loads(r.stdout)["ops"] for b in op["builds"]]
    assert len(builds) == 2  # float32 and bfloat16
    for b in builds:  # float32 multiplies in IEEE float32 (its tolerance), 16-bit dtypes on the tensor cores
        assert b["spill_bytes"] == 0 and (b["wgmma"] > 0) == (b["dtype"] != "float32"), b


def test_a_scale_of_the_head_dimension_to_the_minus_half_is_taken_in_a_row_kernel_too(tmp_path):
    # outside attention the size arithmetic D ** -0.5 is computed in the kernel (no ** on Triton tensors)
    path = _request(tmp_path, "scaled_softmax", {"x": ["N", "D"]},
                    "return torch.softmax(x * x.shape[-1] ** -0.5, dim=-1)", {"N": 16, "D": 64})
    req, build, impl = _impl(path, tmp_path)
    assert "tl.sqrt_rn" in (tmp_path / "scaled_softmax_impl.py").read_text()
    _check(req, impl, {"N": 7, "D": 37}, torch.float32, 37)
