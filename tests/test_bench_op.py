"""Per-op benchmarking and autotuning on the CPU, through the same guarded loop the GPU uses (wall clock instead
of CUDA events; the generated kernel runs in Triton's interpreter, so its times are not figures, only the
mechanics are checked)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from opforge.bench.harness import StaleOutputError, WallClock, measure, outputs_mismatch
from opforge.bench.opbench import OpCase, bench_case, figures
from opforge.bench.tuning import (
    apply_config,
    autotune,
    current_config,
    launch_keys,
    neighbours,
    tuned_entry,
    write_back,
    write_tuned,
)
from opforge.codegen.build import generate_impl, plan_request
from opforge.codegen.trace import trace_request
from opforge.request import load_request
from opforge.skills.op_api.stage import cost_model
from opforge.verify.inputs import make_tensor
from opforge.workspace import load_module

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BINDING = {"N": 8, "H": 64}


@pytest.fixture(scope="module")
def rms(tmp_path_factory):
    req = load_request(EXAMPLES / "rms_norm")
    path = tmp_path_factory.mktemp("impl") / "rms_norm_impl.py"
    path.write_text(generate_impl(req, plan_request(req)))
    return req, load_module(path, "bench_rms_norm_impl"), path


def _case(req):
    def make(seed):
        return [make_tensor(req.input_shape(s, BINDING), torch.float32, seed=seed + 31 * k)
                for k, s in enumerate(req.inputs)]
    return OpCase(make, [s.name for s in req.inputs], ["x", "weight"], req.attr_defaults, torch.float32, "cpu")


def _clock():
    return WallClock(flush_bytes=1 << 16)


def test_fused_and_eager_timed_in_one_run_with_figures(rms):
    req, impl, _ = rms
    case = _case(req)
    res = bench_case(case, req.load_reference(), impl.rms_norm, rep_ms=5, baselines=("eager",), clock=_clock())
    assert set(res["times"]) == {"eager_forward", "eager_forward_backward", "fused_forward", "fused_forward_backward"}
    assert all(t["checks"] >= 1 and t["copies"] == 3 for t in res["times"].values())
    traced = trace_request(req)
    cost = cost_model(dataclasses.replace(req, p0=[BINDING]), traced, plan_request(req, traced))
    row = next(c for c in cost if c["dtype"] == "float32")
    figs = figures(res["times"], row, ceiling_gbps=10.0)
    fwd = figs["forward"]
    assert fwd["gbps"] == pytest.approx(row["forward"]["fused_bytes"] / (fwd["fused_ms"] * 1e-3) / 1e9)
    assert fwd["pct_of_copy_ceiling"] == pytest.approx(10 * fwd["gbps"])
    assert fwd["speedup_vs_eager"] == pytest.approx(res["times"]["eager_forward"]["median_ms"] / fwd["fused_ms"])
    assert "speedup_vs_eager" in figs["forward_backward"]


def test_planted_caching_kernel_is_caught_through_the_op_path(rms):
    req, impl, _ = rms
    seen = {}

    def caching(x, weight, eps):
        if "out" not in seen:
            seen["out"] = impl.rms_norm(x, weight, eps)
        return seen["out"]
    with pytest.raises(StaleOutputError):
        bench_case(_case(req), req.load_reference(), caching, rep_ms=5, baselines=("eager",), clock=_clock())


def test_cpu_without_clock_times_reference_paths_only(rms):
    req, impl, _ = rms
    res = bench_case(_case(req), req.load_reference(), impl.rms_norm, baselines=("eager",))
    assert set(res["times"]) == {"eager_forward", "eager_forward_backward"}
    assert res["times"]["eager_forward"]["timer"] == "cpu"


def test_autotune_verifies_each_candidate_and_writes_back(rms, tmp_path):
    req, impl, path = rms
    case = _case(req)
    ref = case.reference(req.load_reference(), False)
    call = case.forward(impl.rms_norm)
    keys = launch_keys(impl, lambda: call(case.inputs(0)))
    assert keys == [(8, 64)]  # the forward's one row launch: 8 rows of 64 columns
    start = current_config(impl, keys)
    assert "BLOCK" not in start and start["ROW_NUM_WARPS"] is None  # only what a row launch reads is searched
    verified = []

    def timed():
        # timed through the real loop, but scored as a tie: the search path must not follow this machine's noise
        measure(call, case.inputs, clock=_clock(), reference=ref, warmup_ms=1, rep_ms=3, min_reps=3)
        return 1.0

    def verify():
        cfg = current_config(impl, keys)
        verified.append(cfg)
        if impl._knobs(8, 64)["TILE"] > start["TILE"]:  # a planted precision failure for wider tiles
            return "precision: planted failure"
        ins = case.inputs(777)
        return outputs_mismatch(call(ins), ref(ins), 1e-5)
    try:
        res = autotune(impl, timed, verify, keys=keys)
        assert 1 <= len(res["history"]) <= 10
        assert len(verified) == len(res["history"])  # every candidate verified before its time counted
        rejected = [h for h in res["history"] if h["status"] == "rejected"]
        assert rejected and all("ms" not in h for h in rejected)
        assert res["best"]["TILE"] <= start["TILE"]
        assert res["stop"] in ("3 rounds without gain", "10 rounds", "search space exhausted")
        assert current_config(impl, keys) == res["best"]
        assert impl.TILE == start["TILE"]  # the module's values, which other sizes run, never moved
        # the target stops the search before any round
        assert autotune(impl, timed, verify, keys=keys, target_ms=1e9)["history"] == []
    finally:
        impl.TUNED = {}
    copy = tmp_path / "impl.py"
    copy.write_text(path.read_text())
    assert write_back(copy, {"NUM_WARPS": 8}) == ["NUM_WARPS"]  # an impl without a table: module values
    assert "\nNUM_WARPS = 8\n" in copy.read_text()


def test_a_tuned_size_leaves_every_other_size_alone(rms, tmp_path):
    """A config tuned at one shape is written for that shape's launch sizes only: another row length (and
    another row count) still runs the defaults, and a re-tune of the same size replaces its entry."""
    req, impl, path = rms
    copy = tmp_path / "rms_norm_tuned_impl.py"
    copy.write_text(path.read_text())
    entry = tuned_entry(impl, {"TILE": 256, "MAX_BLOCK_C": impl.MAX_BLOCK_C, "ROW_NUM_WARPS": 16,
                               "NUM_STAGES": None})
    assert entry == {"TILE": 256, "ROW_NUM_WARPS": 16}  # what differs from the defaults
    assert write_tuned(copy, {(8, 64): entry, (2048, 4096): {"NUM_STAGES": 2}}) == ["(8, 64)", "(2048, 4096)"]
    assert write_tuned(copy, {(2048, 4096): {"NUM_STAGES": 2}}) == []  # unchanged: nothing written
    assert write_tuned(copy, {(2048, 4096): {}}) == ["(2048, 4096)"]  # back to the defaults: entry dropped
    text = copy.read_text()
    assert "TUNED: dict[tuple, dict] = {\n    (8, 64): {'TILE': 256, 'ROW_NUM_WARPS': 16},\n}\n" in text
    # the written table as the module reads it (the fixture's module: a second copy of the impl would register
    # opforge::rms_norm again, and dropping it would take the first one's registration with it)
    table = ast.literal_eval(text.split("TUNED: dict[tuple, dict] = ", 1)[1].split("\n}\n", 1)[0] + "\n}")
    kernel, block_r = impl._rms_norm_forward_kernel, []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                block_r.append(kwargs["BLOCK_R"])
                return kernel[grid](*args, **kwargs)
            return launch
    impl.TUNED, impl._rms_norm_forward_kernel = table, Spy()
    try:
        assert impl._knobs(8, 64)["TILE"] == 256 and impl._knobs(5, 40)["TILE"] == 256  # same powers of two
        assert impl._knobs(8, 128)["TILE"] == impl._knobs(16, 64)["TILE"] == 4096  # other sizes: the defaults
        assert impl._row_launch(4096, impl._knobs(8, 64)) == {}  # the interpreter takes no launch options
        for n in (8, 64):
            x, w = torch.randn(n, 64), torch.randn(64)
            torch.testing.assert_close(impl.rms_norm(x, w), req.load_reference()(x, w, **req.attr_defaults))
    finally:
        impl.TUNED, impl._rms_norm_forward_kernel = {}, kernel
    assert block_r == [4, 64]  # 8 rows: the tuned 256-element tile; 64 rows: the default 4096


class _LaunchSpy:
    """Forwards launches of one kernel and records the strategy each was given."""

    def __init__(self, kernel):
        self.kernel, self.deterministic, self.grids = kernel, [], []

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def call(*args, **kwargs):
            self.deterministic.append(kwargs["DETERMINISTIC"])
            self.grids.append(grid)
            return launch(*args, **kwargs)
        return call


def test_reduction_strategy_is_a_knob(tmp_path, monkeypatch):
    """ORDERED_PARTIALS makes every call reduce across programs as deterministic=True does (the same bits on any
    device, where same-address atomics may round differently), and the tuner searches it and writes it back."""
    req = load_request(EXAMPLES / "cross_entropy")  # the loss: a full sum over every row's term
    path = tmp_path / "cross_entropy_impl.py"
    path.write_text(generate_impl(req, plan_request(req)))
    impl = load_module(path, "bench_cross_entropy_impl")
    spy = _LaunchSpy(impl._cross_entropy_forward_kernel)
    monkeypatch.setattr(impl, "_cross_entropy_forward_kernel", spy)
    g = torch.Generator().manual_seed(5)
    x, t = torch.randn(64, 64, generator=g), torch.rand(64, 64, generator=g) * 1e-3

    def loss(**kw):
        return impl.cross_entropy(x, t, **kw)

    start = current_config(impl)
    assert start["ORDERED_PARTIALS"] is False
    try:
        apply_config(impl, {**start, "TILE": 64})  # a row a program: 64 programs add into the loss
        atomics, ordered = loss(), loss(deterministic=True)
        apply_config(impl, {**start, "TILE": 64, "ORDERED_PARTIALS": True})
        tuned = loss()
    finally:
        apply_config(impl, start)
    assert spy.deterministic == [False, True, True] and spy.grids == [(64,)] * 3
    try:  # the grid of a kernel that reduces across programs is capped; each program walks several rows
        apply_config(impl, {**start, "TILE": 64, "MAX_PROGRAMS": 5})
        capped = loss()
    finally:
        apply_config(impl, start)
    assert spy.grids[-1] == (5,)
    torch.testing.assert_close(capped, atomics)
    assert torch.equal(tuned, ordered)
    torch.testing.assert_close(atomics, ordered)
    # one step of every knob comes before a second step of any: the strategy is within the first rounds
    knobs = [next(k for k in c if c[k] != start[k]) for c in neighbours(start)]
    repeat = next(i for i, k in enumerate(knobs) if k in knobs[:i])
    assert "ORDERED_PARTIALS" in knobs[:repeat]
    copy = tmp_path / "impl.py"
    copy.write_text(path.read_text())
    assert write_back(copy, {"ORDERED_PARTIALS": True}) == ["ORDERED_PARTIALS"]
    assert "\nORDERED_PARTIALS = True\n" in copy.read_text()


def test_accelerator_report_renders_measured_rows(rms, tmp_path):
    # PERF.md and perf.png as a GPU run writes them, from rows measured here through the same loop
    from opforge.skills.op_perf.stage import _plot, render_perf
    from opforge.workspace import Workspace

    req, impl, _ = rms
    res = bench_case(_case(req), req.load_reference(), impl.rms_norm, rep_ms=5, baselines=("eager",), clock=_clock())
    traced = trace_request(req)
    cost = next(c for c in cost_model(dataclasses.replace(req, p0=[BINDING]), traced, plan_request(req, traced))
                if c["dtype"] == "float32")
    ceiling = {"gbps": 50.0, "bytes": 1, "median_ms": 1.0, "timer": "wall clock"}
    row = {"binding": BINDING, "dtype": "float32", "device": "cuda", "times": res["times"],
           "launches": {"fused_forward": 1.0}, "cost": cost, "figures": figures(res["times"], cost, 50.0)}
    tuning = {"rounds": 1, "reason": "stopped: 3 rounds without gain", "objective": "fused forward",
              "baseline_ms": 1.0, "best_ms": 0.9, "best": {"TILE": 2048}, "written": ["TILE"],
              "history": [{"round": 1, "config": {"TILE": 2048}, "status": "measured", "ms": 0.9, "improved": True}]}
    perf = {"device": "cuda", "device_name": "test", "torch": torch.__version__, "kernel_timing": None,
            "compile_modes": {"compile_default": "default"},
            "copy_ceiling": ceiling, "rows": [row], "tuning": tuning}
    md = render_perf({**perf, "op_name": req.name, "perf_target": req.perf_target})
    assert "| fused |" in md and "× eager" in md and "% copy ceiling" in md
    assert f"{row['figures']['forward']['speedup_vs_eager']:.2f}×" in md
    assert "| 1 | {'TILE': 2048} | measured (best) | 0.9000 |" in md
    ws = Workspace(tmp_path, "rms_norm")
    _plot(ws, [row], ceiling)
    assert (tmp_path / "perf.png").read_bytes()[:4] == b"\x89PNG"


def test_catalog_table_for_measured_rows(rms):
    from opforge.bench.catalog import to_markdown

    req, impl, _ = rms
    res = bench_case(_case(req), req.load_reference(), impl.rms_norm, rep_ms=5, baselines=("eager",), clock=_clock())
    traced = trace_request(req)
    cost = next(c for c in cost_model(dataclasses.replace(req, p0=[BINDING]), traced, plan_request(req, traced))
                if c["dtype"] == "float32")
    figs = figures(res["times"], cost, 50.0)
    res["times"]["fused_forward"]["device_ms"] = 0.0123  # the profiler's kernel time, as on a GPU
    report = {"date": "d", "device": "cuda", "device_name": "test", "torch": "t", "triton": "x",
              "kernel_timing": None, "baselines": ["eager"], "copy_ceiling": {"gbps": 50.0},
              "compile_modes": {"compile_default": "default"},
              "ops": [{"op": "rms_norm", "binding": BINDING, "dtype": "float32", "times": res["times"],
                       "launches": {"fused_forward": 1.0}, "figures": figs, "cost": cost},
                      {"op": "softmax", "dtype": "bfloat16", "error": "stale outputs: repetition 10"}]}
    md = to_markdown(report)
    assert "- **softmax** (bfloat16): stale outputs: repetition 10" in md and "| softmax |" not in md
    fwd = next(line for line in md.splitlines() if line.startswith("| rms_norm | 8x64 | float32 | forward |"))
    cells = [c.strip() for c in fwd.strip("|").split("|")]
    assert len(cells) == len(md.splitlines()[md.splitlines().index(fwd) - 1].strip("|").split("|"))
    assert f"{figs['forward']['speedup_vs_eager']:.2f}×" in cells and "1.0" in cells and "0.012" in cells
    if "backward_derived" in figs:  # only when the fused backward took measurable time
        bwd = next(line for line in md.splitlines() if "backward (derived)" in line)
        assert bwd.count("|") == fwd.count("|")


def test_a_products_tile_is_tuned_per_size_beside_the_glue_around_it(tmp_path):
    # linear_gelu: the product's launch reads a ("gemm", M, N, K) entry of the size table, the glue's row launches
    # theirs; a search sets and writes each key only the knobs its launches read
    req = load_request(EXAMPLES / "linear_gelu")
    path = tmp_path / "linear_gelu_impl.py"
    path.write_text(generate_impl(req, plan_request(req)))
    impl = load_module(path, "bench_linear_gelu_impl")
    shapes = {"x": (20, 24), "weight": (40, 24), "bias": (40,)}
    x, weight, bias = (make_tensor(shapes[s.name], torch.float32, seed=k) for k, s in enumerate(req.inputs))
    want = torch.nn.functional.gelu(x @ weight.t() + bias, approximate="tanh")
    keys = launch_keys(impl, lambda: impl.linear_gelu(x, weight, bias))
    gemm = ("gemm", 32, 64, 32)  # M, N, K rounded up to powers of two
    assert gemm in keys
    start = current_config(impl, keys)
    assert start["GEMM_BLOCK_M"] == impl.GEMM_BLOCK_M and "TILE" not in start  # no row launch reads a tile
    assert any(n["GEMM_NUM_STAGES"] != start["GEMM_NUM_STAGES"] for n in neighbours(start))
    try:
        apply_config(impl, {**start, "GEMM_BLOCK_M": 32, "GEMM_BLOCK_K": 16}, keys)
        assert impl.TUNED[gemm] == {"GEMM_BLOCK_M": 32, "GEMM_BLOCK_K": 16}
        assert all("GEMM_BLOCK_M" not in impl.TUNED[k] for k in keys if k != gemm)
        assert impl._gemm_knobs(20, 40, 24)["GEMM_BLOCK_M"] == 32 and impl._gemm_knobs(200, 40, 24)[
            "GEMM_BLOCK_M"] == impl.GEMM_BLOCK_M  # another size runs the defaults
        torch.testing.assert_close(impl.linear_gelu(x, weight, bias), want, rtol=1e-5, atol=1e-5)  # 2 row tiles now
        assert current_config(impl, keys)["GEMM_BLOCK_K"] == 16
        # written beside row keys, the table stays readable (keys of two kinds sort by their text)
        assert write_tuned(path, {gemm: impl.TUNED[gemm], (32, 64): {"TILE": 256}}) == [str(gemm), "(32, 64)"]
        table = ast.literal_eval(path.read_text().split("TUNED: dict[tuple, dict] = ", 1)[1].split("\n}\n")[0] + "}")
        assert table[gemm] == {"GEMM_BLOCK_M": 32, "GEMM_BLOCK_K": 16}
    finally:
        impl.TUNED = {}


def test_an_attentions_blocks_are_tuned_per_size(tmp_path):
    # attention_sink: its forward launch reads an ("attention", SQ, SK, D) entry; 48 queries in blocks of 32
    # are two programs per head instead of one, and the result does not move
    req = load_request(EXAMPLES / "attention_sink")
    path = tmp_path / "attention_sink_impl.py"
    path.write_text(generate_impl(req, plan_request(req)))
    impl = load_module(path, "bench_attention_sink_impl")
    shapes = {"q": (1, 4, 48, 16), "k": (1, 2, 48, 16), "v": (1, 2, 48, 16), "sinks": (4,)}
    ins = [make_tensor(shapes[s.name], torch.float32, seed=k) for k, s in enumerate(req.inputs)]
    want = impl.attention_sink(*ins)
    keys = launch_keys(impl, lambda: impl.attention_sink(*ins))
    key = ("attention", 64, 64, 16)
    assert keys == [key]
    start = current_config(impl, keys)
    assert set(start) == {"ATTN_BLOCK_M", "ATTN_BLOCK_N", "ATTN_NUM_WARPS", "ATTN_NUM_STAGES"}
    try:
        apply_config(impl, {**start, "ATTN_BLOCK_M": 32, "ATTN_BLOCK_N": 32}, keys)
        assert impl.TUNED[key] == {"ATTN_BLOCK_M": 32, "ATTN_BLOCK_N": 32}
        torch.testing.assert_close(impl.attention_sink(*ins), want, rtol=1e-5, atol=1e-5)
    finally:
        impl.TUNED = {}
