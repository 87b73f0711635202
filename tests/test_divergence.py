"""The divergence localiser on programs with planted defects, and on clean ones it must not blame."""

from __future__ import annotations

import random

import pytest
import torch
import triton
import triton.language as tl

from opforge.verify import divergence as dv

HERE = __file__


def _logsumexp_naive(x):
    e = torch.exp(x)                 # planted: overflows in float16 for x > ~11.1
    return torch.log(e.sum(dim=-1))


def _clean_block(x, w):
    h = torch.nn.functional.layer_norm(x, x.shape[-1:])
    h = h @ w
    h = torch.softmax(h, dim=-1) * h.sum(dim=-1, keepdim=True)
    return torch.nn.functional.gelu(h).mean(dim=0)


def test_records_ops_with_call_sites_in_user_code():
    t = dv.record(_logsumexp_naive, torch.randn(4, 8))
    assert t.error is None
    assert [r.name for r in t.records] == ["aten.exp.default", "aten.sum.dim_IntList", "aten.log.default"]
    exp = t.records[0]
    assert exp.site.file == HERE and exp.site.function == "_logsumexp_naive" and "torch.exp" in exp.site.code
    assert t.records[1].deps == [0] and t.records[2].deps == [1]
    assert t.output_deps == [[2]]
    assert [r.index for r in dv.backward_slice(t, 0)] == [0, 1, 2]


def test_float16_overflow_is_localised_to_the_planted_op():
    x = torch.randn(16, 32) * 2
    x[3, 5] = 12.0  # exp(12) = 162755 > 65504
    t = dv.record(_logsumexp_naive, x.half())
    hit = dv.first_local_divergence(t)
    assert hit is not None
    assert hit.record.name == "aten.exp.default"
    assert hit.new_nonfinite == 1
    assert "inf/NaN where the float64 replay is finite" in hit.reason
    assert hit.record.site.code.startswith("e = torch.exp(x)")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_clean_program_has_no_local_divergence(dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(64, 96, generator=g) * 3).to(dtype)
    w = (torch.randn(96, 48, generator=g) / 10).to(dtype)
    checks = dv.local_check(dv.record(_clean_block, x, w), stop_at_first=False)
    replayed = [c for c in checks if c.replayed]
    assert len(replayed) >= 6
    assert all(c.passed for c in checks), [(c.record.name, c.reason) for c in checks if not c.passed]


def test_wrong_op_result_is_caught_by_replay():
    # an operator whose result is wrong for its inputs: the replay must catch it wherever it sits
    def prog(x):
        y = x * 3
        return torch.ops.aten.add.Tensor(y, 1.0)

    t = dv.record(prog, torch.randn(10))
    t.records[1].outputs[0][-1] += 0.5  # corrupt what the "device" produced for aten.add
    hit = dv.first_local_divergence(t)
    assert hit is not None and hit.record.name == "aten.add.Tensor"
    assert hit.bad == 1


@triton.jit
def _double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def _double(x):
    out = torch.empty_like(x)
    _double_kernel[(triton.cdiv(x.numel(), 32),)](x, out, x.numel(), BLOCK=32)
    return out + 0


def test_triton_launch_is_an_operator_of_the_trace():
    t = dv.record(_double, torch.randn(70))
    names = [r.name for r in t.records]
    assert names == ["aten.empty_like.default", "triton:_double_kernel", "aten.add.Tensor"]
    launch = t.records[1]
    assert launch.kind == "triton" and launch.deps == [0] and launch.input_uninit == [False, True]
    assert len(launch.outputs) == 1 and torch.equal(launch.outputs[0], t.outputs[0])
    assert t.records[2].deps == [1]
    assert "_double_kernel[" in launch.site.code
    assert dv.first_local_divergence(t) is None  # a Triton launch has no float64 replay


def test_crash_names_the_operator_in_flight():
    def prog(a, b):
        h = a.relu()
        return h @ b

    t = dv.record(prog, torch.randn(3, 4), torch.randn(5, 2))
    assert isinstance(t.error, RuntimeError)
    assert t.failed_op.name == "aten.mm.default" and "h @ b" in t.failed_op.site.code


def _shuffled_sum_torch_rng(x):
    perm = torch.randperm(x.numel())
    return x.reshape(-1)[perm].sum()


def _chunk_order_sum(x):
    parts = list(x.split(37))
    random.shuffle(parts)
    acc = torch.zeros((), dtype=x.dtype)
    for p in parts:
        acc = acc + p.sum()
    return acc


@pytest.mark.parametrize("prog,op", [(_shuffled_sum_torch_rng, "aten.sum.default"),
                                     (_chunk_order_sum, "aten.sum.default")])
def test_run_to_run_localises_order_dependent_accumulation(prog, op):
    x = torch.randn(4000) * 1000
    for _ in range(5):  # a shuffle can rarely give identical bits: retry a few times
        a, b = dv.record(prog, x), dv.record(prog, x)
        if not dv.bits_equal(a.outputs[0], b.outputs[0]):
            break
    hit = dv.run_to_run(a, b)
    assert hit is not None and hit.record.name == op
    assert hit.max_abs > 0
    if prog is _shuffled_sum_torch_rng:  # randperm and the gather only reorder: skipped
        assert hit.strict and hit.inputs == "permuted"


def test_run_to_run_is_none_for_a_deterministic_program():
    x = torch.randn(64, 64)
    assert dv.run_to_run(dv.record(_clean_block, x, x), dv.record(_clean_block, x, x)) is None


def test_promotion_point_finds_where_float16_becomes_float32():
    def prog(x):
        y = torch.relu(x) * 2
        w = torch.linspace(0.0, 1.0, x.shape[-1])  # float32 whatever x is
        return (y * w).sum(dim=-1)

    t = dv.record(prog, torch.randn(4, 8).half())
    assert t.outputs[0].dtype == torch.float32
    rec = dv.promotion_point(t, 0, torch.float16)
    assert rec.name == "aten.mul.Tensor" and "y * w" in rec.site.code


def test_align_and_first_shape_mismatch_across_an_inserted_op():
    def ref(x):
        return (x * 2).sum(dim=0)

    def dut(x):
        y = (x.contiguous() * 2)
        return y.sum(dim=1)  # planted: the wrong axis

    x = torch.randn(3, 5)
    a, b = dv.record(ref, x), dv.record(dut, x)
    pairs = dv.align(a, b)
    assert [(a.records[i].name, b.records[j].name) for i, j in pairs][0][0] == "aten.mul.Tensor"
    r, d = dv.first_aligned_mismatch(a, b, "shape")
    assert d.short == "sum" and list(d.outputs[0].shape) == [3] and list(r.outputs[0].shape) == [5]


def test_peak_bytes_counts_allocations_not_views():
    def prog(x):
        big = torch.zeros(1 << 18)        # 1 MiB of float32
        v = big.view(512, 512).t()         # views allocate nothing
        return (v[0] + x).sum()

    t = dv.record(prog, torch.randn(512))
    assert (1 << 20) <= t.peak_bytes < (1 << 20) + 16384


def test_budget_keeps_metadata_only():
    t = dv.record(lambda x: (x * 2).sum(), torch.randn(1000), keep_bytes=1000)
    assert not t.records[0].kept and t.records[0].inputs[0].device.type == "meta"
    assert all(c.replayed is False for c in dv.local_check(t, stop_at_first=False))


def test_uninitialised_allocations_are_poisoned():
    def prog(x):
        out = torch.empty_like(x)
        idx = torch.empty(3, dtype=torch.int32)
        out[:-2] = x[:-2]                  # the last two elements are never written
        return out, idx

    t = dv.record(prog, torch.randn(10))
    out, idx = t.outputs
    assert torch.isnan(out[-2:]).all() and not torch.isnan(out[:-2]).any()
    assert (idx == torch.iinfo(torch.int32).max).all()


def test_range_event_finds_the_flush_to_zero_that_a_replay_cannot_blame():
    def prog(x):
        s = x * 1e-4
        sq = s * s                        # underflows to 0 in float16; then 1/0 is inf, correctly
        return 1.0 / sq.sum(-1)

    x = torch.rand(4, 8) * 0.5 + 0.7
    dut, ref = dv.record(prog, x.half()), dv.record(prog, x.double())
    assert torch.isinf(dut.outputs[0]).all() and torch.isfinite(ref.outputs[0]).all()
    assert dv.first_local_divergence(dut) is None  # every operator is right on its own inputs
    rec, why = dv.range_event(ref, dut, dv.backward_slice(dut, 0))
    assert rec.index == 1 and "sq = s * s" in rec.site.code and "underflow to 0" in why


@torch.library.custom_op("opforge_test::double_op", mutates_args=())
def _double_op(x: torch.Tensor) -> torch.Tensor:
    return _double(x)


@_double_op.register_fake
def _(x):
    return torch.empty_like(x)


def test_custom_op_is_one_operator_with_its_launches_as_children():
    t = dv.record(lambda x: _double_op(x).sum(), torch.randn(50))
    names = [r.name for r in t.records]
    assert names == ["triton:_double_kernel", "opforge_test.double_op.default", "aten.sum.default"]
    assert [r.index for r in t.records] == [0, 1, 2]
    op = t.records[1]
    assert op.kind == "custom" and op.children == [0] and t.records[2].deps == [1]
