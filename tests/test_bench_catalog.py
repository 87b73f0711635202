"""`opforge bench catalog` on a machine without a GPU: reference timings and the cost model, and a plain
statement of what was not measured."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from opforge.cli import app

runner = CliRunner()


def test_catalog_on_cpu_reports_reference_and_cost_model(tmp_path):
    out = tmp_path / "cat.json"
    md = tmp_path / "cat.md"
    r = runner.invoke(app, ["bench", "catalog", "--ops", "rms_norm,geglu", "--elements", "65536",
                            "--json", str(out), "--md", str(md)])
    assert r.exit_code == 0, r.output
    rep = json.loads(out.read_text())
    assert rep["device"] == "cpu" and rep["copy_ceiling"] is None
    assert "not timed" in rep["kernel_timing"] and "speedups" in rep["kernel_timing"]
    assert [o["op"] for o in rep["ops"]] == ["rms_norm", "geglu"]
    for o in rep["ops"]:
        assert set(o["times"]) == {"eager_forward", "eager_forward_backward"}
        assert all(t["median_ms"] > 0 for t in o["times"].values())
        assert o["figures"] == {} and o["launches"] == {}
        f = o["cost"]["forward"]
        assert f["fused_kernels"] < f["eager_kernels"] and f["fused_bytes"] < f["eager_bytes"]
        assert o["elements"] == 65536
    text = md.read_text()
    assert "Not measured" in text and "| rms_norm | 16x4096 | bfloat16 | forward |" in text
    assert "fused ms" not in text  # no column for figures that were not measured


def test_catalog_json_to_stdout(tmp_path):
    r = runner.invoke(app, ["bench", "catalog", "--ops", "softmax", "--elements", "4096", "--json", "-"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["ops"][0]["op"] == "softmax" and rep["torch"]


def test_catalog_bad_input_exits_2_with_one_line():
    r = runner.invoke(app, ["bench", "catalog", "--ops", "no_such_op"])
    assert r.exit_code == 2
    assert r.stderr.strip().count("\n") == 0 and "--ops" in r.stderr and "no_such_op" in r.stderr
    r = runner.invoke(app, ["bench", "catalog", "--baselines", "eager,turbo"])
    assert r.exit_code == 2 and "--baselines" in r.stderr
