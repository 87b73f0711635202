"""Malformed requests end with exit 2 and one line naming the problem, and leave no workspace to trust."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import make_request
from typer.testing import CliRunner

from opforge.cli import app

CASES = {
    "missing_field": (lambda d: d.pop("category"), None, "category: missing required field"),
    "unknown_dtype": (lambda d: d["inputs"]["weight"].update(dtype=["bfloat17"]), None, "unknown dtype 'bfloat17'"),
    "unbound_symbol": (lambda d: d["shapes"].update(p0=[{"N": 4}]), None, "shape symbol M is not bound"),
    "reference_missing": (lambda d: d.update(reference="nowhere.py:forward"), None, "nowhere.py not found"),
    "reference_raises": (None, "def forward(weight, scale, eps=1e-4, qmin=-128.0, qmax=127.0):\n"
                               "    raise RuntimeError('broken on purpose')\n", "broken on purpose"),
    "bad_range": (lambda d: d["inputs"]["scale"].update(range=[1.0, 0.5]), None, "scale.range"),
    "index_first": (lambda d: d["inputs"]["weight"].update(dtype="int64"), None, "weight.dtype: the first input"),
    "index_without_range": (lambda d: d["inputs"]["scale"].update(dtype="int64", range=None, requires_grad=False),
                            None, "scale.range: an index input needs [low, high)"),
    "index_range_unknown_size": (lambda d: d["inputs"]["scale"].update(dtype="int64", range=[0, "K"],
                                                                       requires_grad=False),
                                 None, "scale.range: 'K' names no size of any input"),
    "index_with_grad": (lambda d: d["inputs"]["scale"].update(dtype="int64", range=[0, "M"]), None,
                        "scale.requires_grad: an index input has no gradient"),
    "edges_on_float": (lambda d: d["inputs"]["scale"].update(edges=[-100]), None, "scale.edges: only index inputs"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_request_exits_2_with_one_line(tmp_path, name):
    edit, ref, needle = CASES[name]
    req = make_request(tmp_path / "req", edit=edit, reference=ref)
    out = tmp_path / "ws"
    result = CliRunner().invoke(app, ["op", "run", str(req), "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.output
    assert not out.exists()  # nothing written that a resume could pick up
    assert not list(tmp_path.glob(".ws.*"))  # nor a temporary folder left behind


UNFUSABLE = """import torch
def forward(weight, scale, eps=1e-4, qmin=-128.0, qmax=127.0):
    return torch.cumsum(weight, dim=1) * scale
"""


def test_unfusable_op_is_refused_in_stage2_by_name(tmp_path):
    req = make_request(tmp_path / "req", reference=UNFUSABLE)
    out = tmp_path / "ws"
    result = CliRunner().invoke(app, ["op", "run", str(req), "--out", str(out), "--json"])
    assert result.exit_code == 2
    assert "BLOCKED_API" in result.output and "aten.cumsum.default" in result.output
    report = (out / "API_REPORT.md").read_text()
    assert "aten.cumsum.default" in report
    # the record is complete, not half-written: resume refuses to go on and says why
    again = CliRunner().invoke(app, ["op", "resume", str(out)])
    assert again.exit_code == 2 and "BLOCKED_API" in again.output


def test_real_entry_point_reports_one_line(tmp_path):
    req = make_request(tmp_path / "req", edit=lambda d: d.pop("inputs"))
    proc = subprocess.run([sys.executable, "-m", "opforge", "op", "run", str(req), "--out", str(tmp_path / "ws")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: request.yaml: inputs: missing required field"]


def test_corrupt_state_file_is_reported_not_replaced(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".orchestrator_state.json").write_text('{"schema_version": 1, "op_na')
    before = (ws / ".orchestrator_state.json").read_bytes()
    result = CliRunner().invoke(app, ["op", "status", str(ws)])
    assert result.exit_code == 2 and ".orchestrator_state.json" in result.output
    assert (ws / ".orchestrator_state.json").read_bytes() == before
