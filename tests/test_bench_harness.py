"""The timing harness on the CPU clock: the same loop that times GPU kernels catches planted kernels that
cache or reuse outputs, and lets an honest kernel through."""

from __future__ import annotations

import pytest
import torch

from opforge.bench.harness import StaleOutputError, WallClock, copy_ceiling, measure, outputs_mismatch


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(64, 128, generator=g), torch.randn(128, generator=g)]


def _honest(ins):
    x, w = ins
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _reference(ins):
    x, w = (t.double() for t in ins)
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w).float()


def _run(fn, **kw):
    return measure(fn, _inputs, clock=WallClock(flush_bytes=1 << 16), reference=_reference, copies=3,
                   check_every=2, warmup_ms=1, rep_ms=5, min_reps=12, **kw)


def test_honest_kernel_is_timed_and_checked():
    t = _run(_honest)
    assert t.reps >= 12 and t.checks >= 6
    assert 0 < t.min_ms <= t.median_ms <= t.max_ms
    assert t.copies == 3


def test_kernel_that_returns_its_first_result_is_caught():
    first = {}

    def cached(ins):
        if "out" not in first:
            first["out"] = _honest(ins)
        return first["out"]
    with pytest.raises(StaleOutputError, match="other inputs"):
        _run(cached)


def test_kernel_memoising_by_pointer_is_caught():
    # right on every buffer it has not seen; the harness refills buffers in place, so the memo goes stale
    memo = {}

    def by_pointer(ins):
        key = tuple(t.data_ptr() for t in ins)
        if key not in memo:
            memo[key] = _honest(ins)
        return memo[key]
    with pytest.raises(StaleOutputError, match="refilled"):
        _run(by_pointer)


def test_kernel_writing_into_one_persistent_buffer_is_caught():
    buf = torch.empty(64, 128)

    def persistent(ins):
        buf.copy_(_honest(ins))
        return buf
    with pytest.raises(StaleOutputError, match="one output buffer"):
        _run(persistent)


def test_mismatch_detects_wrong_values_and_shapes():
    a = torch.randn(10, 10)
    assert outputs_mismatch(a, a.clone(), 1e-6) is None
    assert "relative error" in outputs_mismatch(a, torch.randn(10, 10), 0.02)
    assert outputs_mismatch(a, a[:5], 0.02) is not None
    nan = a.clone()
    nan[0, 0] = float("nan")
    assert outputs_mismatch(nan, a, 0.02) is not None


def test_copy_ceiling_reports_bandwidth():
    c = copy_ceiling("cpu", nbytes=4 * 2**20, clock=WallClock(flush_bytes=1 << 16), rep_ms=5)
    assert c["bytes"] == 8 * 2**20 and c["gbps"] > 0.01


def _coarse_sum(ins):
    # a right answer for these inputs whose second output is far from the float32 one, as eager bfloat16 sums of
    # a quantizer's scale gradient are (6% to 240% off, measured on an H200): a deterministic error of ~60%
    x, _ = ins
    total = x.sum()
    return _honest(ins), total + 0.6 * x.abs().sum() * torch.sign(x[0, 0])


def _reference2(ins):
    x, _ = ins
    return _reference(ins), x.double().sum().float()


def _run2(fn):
    return measure(fn, _inputs, clock=WallClock(flush_bytes=1 << 16), reference=_reference2, copies=3,
                   check_every=2, warmup_ms=1, rep_ms=5, min_reps=12)


def test_a_path_that_is_inaccurate_but_answers_its_inputs_is_timed_with_its_error_recorded():
    t = _run2(_coarse_sum)
    assert t.checks >= 6
    assert t.errors[0] < 1e-5 and t.errors[1] > 1  # the first call's error, per output


def test_a_stale_output_is_caught_beside_an_output_the_reference_cannot_judge():
    first = {}

    def stale_first(ins):  # output 0 is the first call's, output 1 coarse but fresh
        out = _coarse_sum(ins)
        first.setdefault("out", out[0])
        return first["out"], out[1]
    with pytest.raises(StaleOutputError, match="output 0: .* other inputs"):
        _run2(stale_first)


def test_allowances_per_output_skip_the_untellable():
    a, b = torch.randn(10), torch.randn(10)
    assert outputs_mismatch((a, b), (a, a), [0.02, 0.5]) is None  # 0.5: a wrong answer could pass anyway
    assert "output 1" in outputs_mismatch((a, b), (a, a), [0.02, 0.1])
