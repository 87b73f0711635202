"""Eager PyTorch beside the kernel: the precision record carries eager's own error against float64 and the
elements where the kernel and eager differ, PRECISION.md shows them side by side, and SPEC.md says why they
differ (the kernel rounds once per output, eager rounds its intermediates in the low-precision dtype)."""

from __future__ import annotations

import importlib.util
import math
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from opforge.codegen.build import generate_impl, plan_request
from opforge.request import load_request
from opforge.skills.op_develop.stage import precision_report, render_precision
from opforge.skills.op_golden.stage import render_golden
from opforge.skills.op_requirement.stage import build_spec, render_spec
from opforge.verify.cases import check_case

ROOT = Path(__file__).resolve().parents[1]
RMS = ROOT / "examples" / "rms_norm"
SEED = 11
CASE = {"id": "L0-bfloat16-N16xH128", "level": 0, "binding": {"N": 16, "H": 128}, "distribution": "normal"}


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _request(dest: Path, reference: str | None = None, dtypes=None) -> Path:
    shutil.copytree(RMS, dest)
    doc = yaml.safe_load((dest / "request.yaml").read_text())
    doc["shapes"]["p0"] = [{"N": 16, "H": 128}]
    if dtypes:
        doc["inputs"]["x"]["dtype"] = dtypes
    (dest / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    if reference is not None:
        (dest / "reference.py").write_text(reference)
    return dest


@pytest.fixture(scope="module")
def rms(tmp_path_factory):
    """rms_norm's stage 1, 3 and 5 artifacts laid out as in a workspace, and one bfloat16 and one float32 case
    checked on a fixed seed. Its reference rounds `x * rms` to the input dtype before the weight multiply."""
    root = tmp_path_factory.mktemp("rms")
    req = load_request(_request(root / "request"))
    spec, traced = build_spec(req)
    (root / "rms_norm_golden.py").write_text(render_golden(req, spec))
    (root / "rms_norm_impl.py").write_text(generate_impl(req, plan_request(req)))
    golden = _load(root / "rms_norm_golden.py", "_nve_rms_norm_golden")
    impl = _load(root / "rms_norm_impl.py", "_nve_rms_norm_impl")
    records = [check_case(impl, golden, {**CASE, "dtype": dt, "id": CASE["id"].replace("bfloat16", dt)}, spec,
                          seed=SEED) for dt in ("bfloat16", "float32")]
    report = precision_report(records, 0, "2 passed")
    return SimpleNamespace(req=req, spec=spec, traced=traced, records=records, report=report)


def _outputs(record: dict) -> dict:
    return {o["name"]: o for o in record["outputs"] if o["name"] != "no_alias"}


def test_each_output_records_fused_and_eager_error_against_float64(rms):
    for record in rms.report["cases"]:
        outs = _outputs(record)
        assert set(outs) == {"out", "grad_x", "grad_weight"}  # the gradients are covered too
        for name, o in outs.items():
            fused, eager = o["vs_float64"], o["eager"]["vs_float64"]
            for figures in (fused, eager):
                assert all(math.isfinite(figures[k]) and figures[k] >= 0 for k in ("max_abs", "max_rel")), name
            assert o["eager"]["dtype"] == record["dtype"]
            assert o["eager"]["vs_fused"]["differing"] >= 0
    summary = rms.report["numerics_vs_eager"]
    assert "rounds once" in summary["note"]
    for dt in ("bfloat16", "float32"):
        w = summary["dtypes"][dt]["out"]
        assert w["cases"] == 1 and w["vs_eager"]["numel"] == 16 * 128
        assert w["eager_vs_float64"]["max_abs"] >= 0 and w["fused_vs_float64"]["max_abs"] >= 0


def test_in_bfloat16_the_kernel_differs_from_eager_and_is_closer_to_float64(rms):
    bf16 = next(r for r in rms.records if r["dtype"] == "bfloat16")
    assert bf16["passed"]
    for name, o in _outputs(bf16).items():
        vs = o["eager"]["vs_fused"]
        assert vs["differing"] > 0 and vs["max_ulp"] >= 1, name
        assert o["vs_float64"]["max_abs"] <= o["eager"]["vs_float64"]["max_abs"], name
    out = _outputs(bf16)["out"]
    # one rounding against two: eager is at most one ulp from the kernel, the kernel within half an ulp of float64
    assert out["eager"]["vs_fused"]["max_ulp"] == 1 and out["vs_float64"]["max_ulp"] == 0
    assert out["eager"]["vs_float64"]["max_ulp"] == 1


def test_precision_md_shows_fused_and_eager_side_by_side(rms):
    md = render_precision("rms_norm", rms.report)
    section = md.split("## Numerics against eager", 1)[1].split("## Cases", 1)[0]
    assert "computes in float32 and rounds once" in section
    assert "| fused: max abs |" in section and "| eager: max abs |" in section and "elements ≠ eager" in section
    row = next(line for line in section.splitlines() if line.startswith("| bfloat16 | out |"))
    differing = _outputs(rms.records[0])["out"]["eager"]["vs_fused"]["differing"]
    assert f"{differing:,} of 2,048" in row
    assert "eager vs float64 (max abs; elements ≠ fused)" in md.split("## Cases", 1)[1]


def test_eager_that_cannot_run_in_the_dtype_leaves_the_verdict_alone():
    def forward(*tensors, compute_dtype=torch.float32, **attrs):
        if compute_dtype == torch.bfloat16:
            raise RuntimeError('"exp" not implemented for \'BFloat16\'')
        return (tensors[0].to(compute_dtype).exp().to(tensors[0].dtype if compute_dtype != torch.float64
                                                       else torch.float64),)

    golden = SimpleNamespace(INPUT_NAMES=["x"], OUTPUT_NAMES=["out"], GRAD_INPUTS=[], ATTRIBUTES={},
                             INPUTS=[{"name": "x", "shape": ["N"]}], forward=forward,
                             make_inputs=lambda b, dt, seed, dist="normal": [torch.linspace(-1, 1, b["N"]).to(dt)])
    impl = SimpleNamespace(op=lambda x: x.float().exp().to(x.dtype))
    case = {"id": "c", "level": 0, "binding": {"N": 64}, "dtype": "bfloat16", "distribution": "normal"}
    rec = check_case(impl, golden, case, {"op_name": "op", "backward": False}, seed=1)
    out = rec["outputs"][0]
    assert rec["passed"] and out["eager"]["unavailable"].startswith("eager raises: RuntimeError")
    w = precision_report([rec], 0, "1 passed")["numerics_vs_eager"]["dtypes"]["bfloat16"]["out"]
    assert w["eager_unavailable"] == 1


def _numerics(md: str) -> str:
    return next(line for line in md.split("## Precision", 1)[1].splitlines()
                if line.startswith("**Numerics against eager.**"))


def test_spec_says_how_the_kernel_stands_to_eager(rms):
    text = _numerics(render_spec(rms.req, rms.spec, rms.traced))
    assert "computes in float32 and rounds once per output" in text
    assert "bfloat16 and float16 rounds each intermediate" in text and "closer to float64" in text
    # traced in float32, `.to(x.dtype)` leaves no node: the kernel does not round there
    assert "one cast back to the inputs' dtype" in text and "eager rounds there, the kernel does not" in text
    assert "one upcast to float32" in text and "PRECISION.md shows" in text


def test_spec_names_a_cast_to_a_fixed_narrow_dtype_as_a_rounding_step(tmp_path):
    ref = ("import torch\n\n\ndef forward(x, weight, eps: float = 1e-6):\n    xf = x.float()\n"
           "    rms = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)\n"
           "    return (xf * rms).to(torch.bfloat16).to(x.dtype) * weight\n")
    req = load_request(_request(tmp_path / "kept", reference=ref))
    spec, traced = build_spec(req)
    text = _numerics(render_spec(req, spec, traced))
    assert "one cast to a fixed narrow dtype" in text and "is a rounding step in the kernel too" in text
    assert "back to the inputs' dtype" not in text


def test_spec_of_a_float32_only_request_speaks_of_evaluation_order(tmp_path):
    req = load_request(_request(tmp_path / "f32", dtypes=["float32"]))
    spec, traced = build_spec(req)
    text = _numerics(render_spec(req, spec, traced))
    assert "only by the order of operations" in text and "rounds each intermediate" not in text
