"""`opforge bench compile`: every kernel compiled for sm_90 on a machine without a GPU, with the compiler's
registers and spills, and a kernel that only the interpreter accepts caught before any GPU run.

The command swaps Triton's driver and turns launches into compiles, so it runs in a process of its own here,
as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opforge.bench.aot import access_widths, occupancy, parse_arch
from opforge.codegen.build import generate_impl, plan_request
from opforge.request import load_request
from opforge.workspace import load_module

ROOT = Path(__file__).resolve().parents[1]


def _bench_compile(*args: str, interpret: str = "0") -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": interpret}
    return subprocess.run([sys.executable, "-m", "opforge", "bench", "compile", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)


def test_catalog_kernels_compile_for_sm90_with_register_counts(tmp_path):
    md = tmp_path / "compile.md"
    r = _bench_compile("--ops", "softmax,cross_entropy_labels", "--elements", "0", "--json", "-", "--md", str(md))
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["arch"] == "sm_90" and rep["failed"] == 0
    kernels = {op["op"]: [(b["pass"], b["kernel"]) for b in op["builds"]] for op in rep["ops"]}
    assert kernels["softmax"] == [("forward", "_softmax_forward_kernel"), ("backward", "_softmax_backward_kernel")]
    # the labelled rows are counted before any gradient: two backward kernels
    assert [k for p, k in kernels["cross_entropy_labels"] if p == "backward"] == [
        "_cross_entropy_labels_backward_a_kernel", "_cross_entropy_labels_backward_b_kernel"]
    for op in rep["ops"]:
        for b in op["builds"]:
            assert 0 < b["registers"] <= 255 and b["spill_bytes"] == 0, b
            assert b["num_warps"] in (1, 2, 4, 8, 16, 32) and 0 < b["occupancy"] <= 1
            assert b["binding"] == load_request(ROOT / "examples" / op["op"]).p0[0]
    # softmax streams rows of 4096 contiguous bfloat16: every global access is a 128-bit vector access
    for b in rep["ops"][0]["builds"]:
        assert b["loads_128"] == b["loads"] >= 1 and b["stores_128"] == b["stores"] >= 1, b
        assert b["bf16_cvt"] >= 1, b  # the GPU rounds to bfloat16 in hardware; the bit trick is the interpreter's
    # a 64-row, 32768-class cross-entropy launches one program per row: under half of an H200's SMs
    fwd = next(b for b in rep["ops"][1]["builds"] if b["pass"] == "forward")
    assert fwd["grid"] == [64] and fwd["waves"] < 0.5
    text = md.read_text()
    assert "| softmax | 2048x4096 | bfloat16 | forward | forward | BLOCK_R=1, BLOCK_C=4096, PERSISTENT=True | 3 | 8 |" \
        in text


def test_a_kernel_only_the_interpreter_accepts_fails_to_compile(tmp_path, monkeypatch):
    """A loop accumulator started as a Python float: the interpreter broadcasts it into a block and gets the
    right answer; the compiler refuses a loop-carried value whose type changes."""
    req = load_request(ROOT / "examples" / "cross_entropy")
    src = generate_impl(req, plan_request(req))
    init = "sum_2_acc = tl.full((BLOCK_R, BLOCK_C), 0.0, tl.float32)"
    assert src.count(init) == 1
    impl = tmp_path / "cross_entropy_impl.py"
    impl.write_text(src.replace(init, "sum_2_acc = 0.0"))

    monkeypatch.setenv("OPFORGE_MAX_BLOCK_C", "16")  # 64 columns walked in chunks: the looped path
    mod = load_module(impl, "opforge_test_cross_entropy_scalar_acc")
    logits, target = torch.randn(4, 64), torch.rand(4, 64) * 1e-3
    torch.testing.assert_close(mod.cross_entropy(logits, target), req.load_reference()(logits, target))

    r = _bench_compile("--request", str(ROOT / "examples" / "cross_entropy"), "--impl", str(impl),
                       "--elements", "0", "--json", "-")
    assert r.returncode == 1, r.stderr[-2000:]
    assert "1 kernel(s) failed to compile for sm_90" in r.stderr
    fwd, bwd = json.loads(r.stdout)["ops"][0]["builds"]
    assert fwd["kernel"] == "_cross_entropy_forward_kernel" and "sum_2_acc" in fwd["error"]
    assert "registers" not in fwd
    assert bwd["kernel"] == "_cross_entropy_backward_kernel" and "error" not in bwd and bwd["registers"] > 0


def test_rows_shared_by_programs_compile_for_sm90(tmp_path):
    """ROW_SPLIT, the option for few long rows (a tuned knob, 1 by default): both kernels of softmax's shared
    rows compile for the GPU target without spills, on a 2-D grid of row blocks by programs per row."""
    req = load_request(ROOT / "examples" / "softmax")
    src = generate_impl(req, plan_request(req))
    assert src.count("\nROW_SPLIT = 1\n") == 1
    impl = tmp_path / "softmax_impl.py"
    impl.write_text(src.replace("\nROW_SPLIT = 1\n", "\nROW_SPLIT = 4\n"))
    r = _bench_compile("--request", str(ROOT / "examples" / "softmax"), "--impl", str(impl), "--elements", "0",
                       "--json", "-")
    assert r.returncode == 0, r.stderr[-2000:]
    builds = json.loads(r.stdout)["ops"][0]["builds"]
    assert [(b["pass"], b["kernel"]) for b in builds] == [
        ("forward", "_softmax_forward_split_stats_kernel"), ("forward", "_softmax_forward_split_kernel"),
        ("backward", "_softmax_backward_kernel")]  # the backward's second sum needs the first: one program a row
    for b in builds[:2]:
        assert b["grid"] == [512, 4] and b["spill_bytes"] == 0 and 0 < b["registers"] <= 255, b


TWICE_REQUEST = """\
name: twice
description: Twice the input
category: elementwise
inputs:
  x: {shape: [N], dtype: [float32]}
outputs:
  out: {shape: [N], dtype: like x}
reference: reference.py:forward
backward: false
shapes:
  p0: [{N: 1024}]
"""
TWICE_IMPL = """\
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 512}, num_warps=4)],
                 key=["n"])
@triton.jit
def _twice_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def twice(x):
    out = torch.empty_like(x)
    _twice_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel())
    return out
"""


def test_an_autotuned_kernel_compiles_every_config(tmp_path):
    """A hand-written (or model-written) impl with @triton.autotune: each config is compiled, none is timed."""
    (tmp_path / "req").mkdir()
    (tmp_path / "req" / "request.yaml").write_text(TWICE_REQUEST)
    (tmp_path / "req" / "reference.py").write_text("def forward(x):\n    return x * 2\n")
    (tmp_path / "impl.py").write_text(TWICE_IMPL)
    r = _bench_compile("--request", str(tmp_path / "req"), "--impl", str(tmp_path / "impl.py"), "--elements", "0",
                       "--json", "-")
    assert r.returncode == 0, r.stderr[-2000:]
    builds = json.loads(r.stdout)["ops"][0]["builds"]
    assert [(b["constexprs"]["BLOCK"], b["num_warps"]) for b in builds] == [(128, 4), (512, 4)]
    assert all(b["registers"] > 0 and b["grid"] is None for b in builds)
    # 128 threads: one float each at BLOCK 128, nothing to vectorise; four each at 512, one 128-bit access
    small, large = builds
    assert small["loads"] == small["stores"] == 1 and small["loads_128"] == small["stores_128"] == 0
    assert large["loads"] == large["loads_128"] == 1 and large["stores"] == large["stores_128"] == 1


@pytest.mark.parametrize("args, field", [
    (["--arch", "sm9"], "--arch"),
    (["--impl", "x.py"], "--impl"),
    (["--ops", "nope"], "--ops"),
    (["--ops", "softmax", "--dtype", "int8"], "--dtype"),
])
def test_bad_input_is_refused_with_one_line(args, field):
    r = _bench_compile(*args)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and field in lines[0]


def test_the_interpreter_switched_on_is_refused():
    r = _bench_compile("--ops", "softmax", interpret="1")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: TRITON_INTERPRET")


def test_occupancy_follows_register_granularity():
    assert parse_arch("sm_90") == 90 and parse_arch("sm_90a") == 90
    # 32 registers x 4 warps: 16 blocks by registers and by warp slots, a full SM
    assert occupancy(32, 4, 0, 90) == {"blocks_per_sm": 16, "occupancy": 1.0}
    # 143 registers round up to 144 per thread (4608 per warp): one 8-warp block fits in 65536
    assert occupancy(143, 8, 32, 90) == {"blocks_per_sm": 1, "occupancy": 0.125}
    # shared memory binds: 100 KB per block leaves room for two
    assert occupancy(32, 4, 100 * 1024, 90)["blocks_per_sm"] == 2
    assert occupancy(32, 4, 0, 75) is None  # no limits on record for that architecture


def test_access_widths_count_128_bit_accesses():
    ptx = """
    @%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
    @%p2 ld.global.b16 { %rs1 }, [ %rd2 + 0 ];
    ld.global.nc.v2.b32 { %r5, %r6 }, [ %rd3 + 0 ];
    @%p1 st.global.v2.b64 [ %rd4 + 0 ], { %rd5, %rd6 };
    ld.shared.v4.b32 { %r7, %r8, %r9, %r10 }, [ %r11 + 0 ];
    wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%f1}, %rd7, %rd8, 1, 1, 1, 0, 1;
    """
    assert access_widths(ptx) == {"loads": 3, "loads_128": 1, "stores": 1, "stores_128": 1, "bf16_cvt": 0,
                                  "wgmma": 1, "mma": 0}


def test_rows_of_65536_columns_stay_in_registers_without_spills(tmp_path):
    """The longest row a row kernel keeps in registers, as Liger's kernels do: layer norm's forward and
    backward at 65536 columns compile persistent, 32 warps, no register spilled."""
    req = tmp_path / "layer_norm"
    req.mkdir()
    for f in ("reference.py", "request.yaml"):
        (req / f).write_text((ROOT / "examples" / "layer_norm" / f).read_text())
    text = (req / "request.yaml").read_text()
    (req / "request.yaml").write_text(text[:text.index("  p0:")] + "  p0: [{N: 64, H: 65536}]\n")
    r = _bench_compile("--request", str(req), "--json", "-")
    assert r.returncode == 0, r.stderr[-2000:]
    builds = json.loads(r.stdout)["ops"][0]["builds"]
    rows = [b for b in builds if not b["kernel"].endswith("_column_sums")]
    assert {b["pass"] for b in rows} == {"forward", "backward"}
    for b in rows:
        assert b["constexprs"]["PERSISTENT"] is True and b["num_warps"] == 32 and b["spill_bytes"] == 0, b
