"""PERF.md in Chinese: rendered from one perf.json's data in both languages, it shows the same figures, the same
tables and no English sentence of its own (timings differ between runs, so the comparison is of one data set)."""

from __future__ import annotations

import json

import pytest
from i18n_scan import english_sentences, figures

from opforge import i18n
from opforge.bench.opbench import COMPILE_MODES
from opforge.bench.roofline import describe
from opforge.skills.op_perf.stage import NO_KERNEL_TIMING, NO_TUNING, render_perf

BINDING = {"N": 1024, "M": 2048}
REJECTED = "precision: L0-bfloat16-1 out failed"
COMPILE_ERROR = "CompilationError: at 3:4: boom"


def _times(median: float, samples: int, key: str) -> dict:
    return {"median_ms": median, "iqr_ms": median / 100, key: samples}


def _cost() -> dict:
    return {"forward": {"eager_kernels": 9, "fused_kernels": 1, "eager_bytes": 58720274, "fused_bytes": 8388610,
                        "flops": 16000000},
            "backward": {"eager_kernels": 17, "fused_kernels": 2, "eager_bytes": 104857631, "fused_bytes": 12582916,
                         "roofline": {"intensity": 300.5, "ridge": 233.0, "bound": "compute", "floor_us": 7.5}}}


def _compiled() -> dict:
    kernel = {"binding": BINDING, "pass": "forward", "kernel": "_op_forward_kernel", "num_warps": 4, "registers": 29,
              "spill_bytes": 0, "shared_bytes": 0, "loads": 2, "loads_128": 1, "stores": 1, "stores_128": 1,
              "wgmma": 0, "mma": 3, "occupancy": 1.0, "programs": 2048, "waves": 0.97}
    return {"arch": "sm_90", "dtype": "bfloat16", "unavailable": None,
            "kernels": [kernel, {"binding": BINDING, "pass": "backward", "kernel": "_op_backward_kernel",
                                 "error": COMPILE_ERROR}]}


def gpu_perf() -> dict:
    """perf.json as an accelerator run writes it: every path timed, tuned, compiled, with a target."""
    times = {}
    for i, path in enumerate(("eager", "compile_default", "compile_max_autotune", "fused")):
        times[f"{path}_forward"] = _times(1.234 / (i + 1), 1 if path == "compile_default" else 100, "reps")
        times[f"{path}_forward_backward"] = _times(3.5 / (i + 1), 100, "reps")
    speedups = {"speedup_vs_eager": 3.085, "speedup_vs_compile_default": 2.25, "speedup_vs_compile_max_autotune": 2.0}
    figs = {"forward": {"fused_ms": 0.3085, "gbps": 2100.5, "pct_of_copy_ceiling": 62.3, **speedups},
            "forward_backward": {"fused_ms": 0.875, "gbps": 1800.2, "pct_of_copy_ceiling": 53.4, **speedups},
            "backward_derived": dict(speedups)}
    row = {"binding": BINDING, "dtype": "bfloat16", "device": "cuda", "times": times,
           "launches": {"eager_forward": 9.0, "fused_forward": 1.0, "fused_forward_backward": 3.0}, "cost": _cost(),
           "figures": figs}
    slow = {"binding": {"N": 4096, "M": 4096}, "keys": [], "baseline_ms": 2.0, "best_ms": 2.0, "best": {"BLOCK": 512},
            "stop": "search space exhausted", "objective": "fused forward", "written": []}
    shapes = [{"binding": BINDING, "keys": [[1024, 2048]], "baseline_ms": 1.0, "best_ms": 0.9, "best": {"BLOCK": 1024},
               "stop": "2 rounds without gain", "objective": "fused forward+backward", "written": ["TUNED"]},
              slow, dict(slow, stop="perf target reached"), dict(slow, stop="1 rounds")]
    history = [{"binding": BINDING, "round": 1, "config": {"BLOCK": 1024}, "status": "measured", "ms": 0.9,
                "improved": True},
               {"binding": BINDING, "round": 2, "config": {"BLOCK": 4096}, "status": "rejected", "reason": REJECTED}]
    return {"op_name": "qat_op", "device": "cuda", "torch": "2.5.0", "device_name": "NVIDIA H100 80GB HBM3",
            "kernel_timing": None, "copy_ceiling": {"gbps": 3371.0}, "compile_modes": COMPILE_MODES,
            "baselines": ["eager", "compile_default", "compile_max_autotune"],
            "rows": [row, dict(row, dtype="float32", figures={"forward": figs["forward"]})],
            "tuning": {"rounds": 2, "history": history, "shapes": shapes, "reason": "as stage 7 joins the stops"},
            "headline": "h", "compiled": _compiled(), "quick": False, "perf_target": {"speedup_vs_eager": 3.0}}


def cpu_perf() -> dict:
    """perf.json as a quick CPU run writes it: reference paths only, kernel timing and tuning not run."""
    times = {"eager_forward": _times(812.5, 1, "runs"), "compile_default_forward": _times(0.012346, 40, "runs")}
    row = {"binding": BINDING, "dtype": "bfloat16", "device": "cpu", "times": times, "launches": {},
           "cost": _cost(), "figures": {}}
    return {"op_name": "qat_op", "device": "cpu", "torch": "2.5.0", "device_name": "cpu",
            "kernel_timing": NO_KERNEL_TIMING, "copy_ceiling": None, "compile_modes": COMPILE_MODES,
            "baselines": ["eager", "compile_default"], "rows": [row],
            "tuning": {"rounds": 0, "history": [], "shapes": [], "reason": NO_TUNING}, "headline": "h",
            "compiled": {"arch": "sm_90", "unavailable": "no Triton NVIDIA backend (x)", "kernels": []},
            "quick": True, "perf_target": {"speedup_vs_eager": 3.0}}


def _render(perf: dict, lang: str) -> str:
    with i18n.using(lang):
        return render_perf(json.loads(json.dumps(perf)))  # from perf.json's text, as a re-render reads it


def _cells(md: str) -> list[int]:
    return [line.count("|") for line in md.splitlines() if line.startswith("|")]


@pytest.mark.parametrize("make", [gpu_perf, cpu_perf, lambda: dict(cpu_perf(), perf_target={})])
def test_perf_md_in_chinese_shows_the_figures_of_the_english_one(make):
    perf = make()
    en, zh = _render(perf, "en"), _render(perf, "zh")
    assert "## Bytes and launches" in en and "## Bytes and launches" not in zh
    assert figures(zh) == figures(en)
    assert _cells(zh) == _cells(en)  # every table keeps its columns
    with i18n.using("zh"):
        roofline = describe()  # the roofline's paragraph is translated with bench/roofline.py
    allowed = (perf["op_name"], perf["device_name"], *COMPILE_MODES.values(), roofline, REJECTED, COMPILE_ERROR,
               "no Triton NVIDIA backend")
    assert english_sentences(zh, allowed) == []


def test_perf_md_renders_the_stored_words_of_perf_json_in_chinese():
    zh = _render(gpu_perf(), "zh")
    for english in ("search space exhausted", "perf target reached", "rounds without gain", "fused forward",
                    "measured (best)", "backward derived", "| memory |", "| compute |"):
        assert english not in zh, english
    en = _render(gpu_perf(), "en")
    assert ("{'N': 1024, 'M': 2048}: stopped, 2 rounds without gain; {'N': 4096, 'M': 4096}: stopped, search space "
            "exhausted") in en
    assert "stopped, 1 round" in en and "2 rounds." in en
    cpu = _render(cpu_perf(), "zh")
    assert NO_KERNEL_TIMING not in cpu and NO_TUNING not in cpu
    with i18n.using("zh"):
        assert i18n._(NO_KERNEL_TIMING) in cpu
