"""`opforge op plan`: stages 1-2 in memory. Exit 0 with the kernel plan and the cost model for a request the engine
builds; exit 2 naming what it cannot lower, or the bad input; nothing written anywhere."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from opforge.cli import app

ROOT = Path(__file__).resolve().parents[1]


def _tree(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def test_a_buildable_request_gets_its_kernel_plan_and_cost_model(tmp_path):
    req = tmp_path / "linear_gelu"
    shutil.copytree(ROOT / "examples" / "linear_gelu", req)
    before = _tree(tmp_path)
    res = CliRunner().invoke(app, ["op", "plan", str(req), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["buildable"] and out["unsupported"] == []
    # the product with GELU in its epilogue; the backward's GELU gradient, then dx and dweight
    assert [k["layout"] for k in out["kernels"]["forward"]] == ["gemm"]
    assert sorted(k["layout"] for k in out["kernels"]["backward"]).count("gemm") == 2
    row = out["cost"][0]
    assert row["forward"]["fused_kernels"] == 1 and row["forward"]["eager_kernels"] > 1
    assert row["forward"]["roofline"]["bound"] in ("memory", "compute")
    assert _tree(tmp_path) == before  # no workspace, no cache beside the request


def test_a_request_the_engine_cannot_lower_exits_2_naming_the_op(tmp_path):
    req = tmp_path / "bn"
    req.mkdir()
    (req / "request.yaml").write_text(
        "name: linear_roll\ndescription: rotated rows of a linear's output\ncategory: matmul\n"
        "inputs:\n  x: {shape: [B, N, K], dtype: [float32]}\n  w: {shape: [M, K], dtype: like x}\n"
        "reference: reference.py:forward\nbackward: true\nshapes:\n  p0: [{B: 2, N: 8, K: 16, M: 4}]\n")
    (req / "reference.py").write_text(
        "import torch.nn.functional as F\n\n\ndef forward(x, w):\n"
        "    return F.linear(x, w).transpose(1, 2).roll(1, 1)\n")
    res = CliRunner().invoke(app, ["op", "plan", str(req), "--no-cost", "--json"])
    assert res.exit_code == 2
    out = json.loads(res.stdout)
    assert not out["buildable"] and out["kernels"] == {} and "aten.roll.default" in out["unsupported"]
    assert res.stderr.strip().splitlines()[-1].startswith("BLOCKED_API: ")
    assert "Traceback" not in res.output


def test_a_bad_request_exits_2_with_one_line(tmp_path):
    req = tmp_path / "bad"
    shutil.copytree(ROOT / "examples" / "linear_gelu", req)
    text = (req / "request.yaml").read_text()
    (req / "request.yaml").write_text(text.replace("category:", "categroy:"))
    res = CliRunner().invoke(app, ["op", "plan", str(req)])
    assert res.exit_code == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "categroy" in res.stderr


def test_several_requests_are_answered_in_one_process_each_with_its_verdict(tmp_path):
    good = tmp_path / "linear_gelu"
    shutil.copytree(ROOT / "examples" / "linear_gelu", good)
    bad = tmp_path / "bad"
    shutil.copytree(ROOT / "examples" / "linear_gelu", bad)
    (bad / "request.yaml").write_text((bad / "request.yaml").read_text().replace("category:", "categroy:"))
    res = CliRunner().invoke(app, ["op", "plan", str(good), str(ROOT / "examples" / "rms_norm"), str(bad),
                                   "--no-cost", "--json"])
    assert res.exit_code == 2  # one of them is not a request the engine can build
    out = json.loads(res.stdout)
    assert [r.get("op") for r in out] == ["linear_gelu", "rms_norm", None]
    assert out[0]["buildable"] and out[1]["buildable"] and "categroy" in out[2]["error"]
    assert all(r["seconds"] > 0 for r in out[:2])
    assert res.stderr.strip().splitlines()[-1] == f"2 of 3 build; not: {bad}"
