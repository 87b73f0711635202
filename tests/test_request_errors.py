"""Malformed requests end with exit 2 and one line naming the problem, and leave no workspace to trust."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_request
from typer.testing import CliRunner

from opforge.cli import app
from opforge.errors import InputError
from opforge.request import FORMAT, load_request

CASES = {
    "missing_field": (lambda d: d.pop("category"), None, "category: missing required field"),
    "unknown_dtype": (lambda d: d["inputs"]["weight"].update(dtype=["bfloat17"]), None, "unknown dtype 'bfloat17'"),
    "unbound_symbol": (lambda d: d["shapes"].update(p0=[{"N": 4}]), None, "shape symbol M is not bound"),
    "reference_missing": (lambda d: d.update(reference="nowhere.py:forward"), None, "nowhere.py not found"),
    "reference_raises": (None, "def forward(weight, scale, eps=1e-4, qmin=-128.0, qmax=127.0):\n"
                               "    raise RuntimeError('broken on purpose')\n", "broken on purpose"),
    "bad_shape_entry": (lambda d: d["inputs"]["weight"].update(shape=["N", "M+"]), None,
                        "weight.shape: 'M+' is neither a symbol, a product like 'G*32', a sum like 'L+R*2', nor"),
    "bad_range": (lambda d: d["inputs"]["scale"].update(range=[1.0, 0.5]), None, "scale.range"),
    "index_first": (lambda d: d["inputs"]["weight"].update(dtype="int64"), None, "weight.dtype: the first input"),
    "index_without_range": (lambda d: d["inputs"]["scale"].update(dtype="int64", range=None, requires_grad=False),
                            None, "scale.range: an integer input needs [low, high)"),
    "index_range_unknown_size": (lambda d: d["inputs"]["scale"].update(dtype="int64", range=[0, "K"],
                                                                       requires_grad=False),
                                 None, "scale.range: 'K' names no size of any input"),
    "index_with_grad": (lambda d: d["inputs"]["scale"].update(dtype="int64", range=[0, "M"]), None,
                        "scale.requires_grad: an integer input has no gradient"),
    "edges_on_float": (lambda d: d["inputs"]["scale"].update(edges=[-100]), None, "scale.edges: only index inputs"),
    "typo_in_perf_target": (lambda d: d.update(perf_target={"speedup_vs_eagr": 2.0}), None,
                            "request.yaml: perf_target.speedup_vs_eagr: unknown key; allowed: speedup_vs_eager"),
    "typo_in_input": (lambda d: d["inputs"]["scale"].update(requires_gard=False), None,
                      "request.yaml: inputs.scale.requires_gard: unknown key; allowed: shape, dtype, requires_grad, "
                      "range, edges"),
    # the probe sizes the reference was traced at (N=5, M=7, K=11) are named by the request's symbols
    "shapes_do_not_broadcast": (lambda d: (d["inputs"]["scale"].update(shape=["K"]),
                                           d["shapes"].update(p0=[{"N": 48, "M": 80, "K": 16}])), None,
                                "request.yaml: inputs: weight has shape [N, M] and scale [K]: M and K must be equal "
                                "for reference.py:forward (it raised: The size of tensor a (M) must match the size "
                                "of tensor b (K) at non-singleton dimension 1)"),
    "float_attribute_not_a_number": (lambda d: d["attributes"]["eps"].update(default="small"), None,
                                     "attributes.eps.default: expected a float, got 'small'"),
    "ints_attribute_not_a_list": (lambda d: d["attributes"].update(kernel={"type": "ints", "default": 3}), None,
                                  "attributes.kernel.default: expected a list of ints, got 3"),
    "ints_attribute_of_floats": (lambda d: d["attributes"].update(kernel={"type": "ints", "default": [2, 1.5]}),
                                 None, "attributes.kernel.default: expected a list of ints, got [2, 1.5]"),
    "probe_sizes_named": (None, "def forward(weight, scale, eps=1e-4, qmin=-128.0, qmax=127.0):\n"
                                "    return weight @ scale\n",
                          "mat1 and mat2 shapes cannot be multiplied (5x7 and 1x1) (called with N=5, M=7)"),
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
    return torch.roll(weight, 1, 1) * scale
"""


def test_unfusable_op_is_refused_in_stage2_by_name(tmp_path):
    req = make_request(tmp_path / "req", reference=UNFUSABLE)
    out = tmp_path / "ws"
    result = CliRunner().invoke(app, ["op", "run", str(req), "--out", str(out), "--json"])
    assert result.exit_code == 2
    assert "BLOCKED_API" in result.output and "aten.roll.default" in result.output
    report = (out / "API_REPORT.md").read_text()
    assert "aten.roll.default" in report
    # the record is complete, not half-written: resume refuses to go on and says why
    again = CliRunner().invoke(app, ["op", "resume", str(out)])
    assert again.exit_code == 2 and "BLOCKED_API" in again.output


def test_real_entry_point_reports_one_line(tmp_path):
    req = make_request(tmp_path / "req", edit=lambda d: d.pop("inputs"))
    proc = subprocess.run([sys.executable, "-m", "opforge", "op", "run", str(req), "--out", str(tmp_path / "ws")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: request.yaml: inputs: missing required field"]


def _mapping_in(doc: dict, mapping: str) -> tuple[dict, str]:
    """The mapping of `doc` that FORMAT calls `mapping`, and its path there ('inputs.<name>': the first input)."""
    node, path = doc, []
    for part in filter(None, mapping.split(".")):
        key = next(iter(node)) if part.startswith("<") else part
        node, path = node[key], path + [key]
    return node, ".".join(path + ["colour"])


@pytest.mark.parametrize("mapping", list(FORMAT))
def test_every_mapping_refuses_an_unknown_key(tmp_path, mapping):
    where = []

    def edit(doc):
        doc["tolerance"] = {"float32": {"atol": 1e-5}}  # the demo has none
        node, path = _mapping_in(doc, mapping)
        node["colour"] = "blue"
        where.append(path)

    req = make_request(tmp_path / "req", edit=edit)
    with pytest.raises(InputError) as err:
        load_request(req)
    assert str(err.value) == f"request.yaml: {where[0]}: unknown key; allowed: {', '.join(FORMAT[mapping])}"


@pytest.mark.parametrize("edit,text", [
    (None, "name: [unclosed\n"),
    (None, "- just\n- a list\n"),
    (lambda d: d.update(outputs={"a": None, "b": None}), None),  # found when the reference is traced
    (lambda d: [s.update(requires_grad=False) for s in d["inputs"].values()], None),
], ids=["not_yaml", "not_a_mapping", "outputs_count", "backward_without_grads"])
def test_every_error_about_request_yaml_has_one_prefix(tmp_path, edit, text):
    """Whichever check finds it (the YAML parser, the validator, the trace), the line starts the same way."""
    req = make_request(tmp_path / "req", edit=edit)
    if text is not None:
        (req / "request.yaml").write_text(text)
    result = CliRunner().invoke(app, ["op", "run", str(req), "--out", str(tmp_path / "ws")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: request.yaml: "), result.output


def _one_line_exit_2(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.output


def test_out_that_is_a_file_is_bad_input(tmp_path):
    req = make_request(tmp_path / "req")
    (tmp_path / "afile").write_text("mine\n")
    proc = subprocess.run([sys.executable, "-m", "opforge", "op", "run", str(req), "--out", str(tmp_path / "afile")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'afile'}: is a file; --out names the workspace folder to create"]
    assert (tmp_path / "afile").read_text() == "mine\n"
    _one_line_exit_2(["op", "run", str(req), "--out", str(tmp_path / "afile" / "ws")],
                     f"{tmp_path / 'afile' / 'ws'}: cannot create it: {tmp_path / 'afile'} is a file, not a folder")


def test_out_that_cannot_be_written_is_bad_input(tmp_path, monkeypatch):
    req = make_request(tmp_path / "req")
    out = tmp_path / "ro" / "ws"
    (tmp_path / "ro").mkdir()
    # as root a read-only folder is still writable: stand in for the permission check, then for the OS
    monkeypatch.setattr("os.access", lambda path, mode: Path(path) != tmp_path / "ro")
    _one_line_exit_2(["op", "run", str(req), "--out", str(out)], f"{out}: cannot create it: {tmp_path / 'ro'} is not "
                                                                 "writable")
    monkeypatch.undo()

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro" / ".ws.abc"))

    monkeypatch.setattr("tempfile.mkdtemp", refuse)
    _one_line_exit_2(["op", "run", str(req), "--out", str(out)], f"{out}: cannot create it: Permission denied")
    assert not list((tmp_path / "ro").iterdir())


@pytest.mark.parametrize("command", ["catalog", "compile"])
def test_bench_report_paths_are_checked_before_the_run(tmp_path, command):
    (tmp_path / "afile").write_text("")
    _one_line_exit_2(["bench", command, "--ops", "softmax", "--json", str(tmp_path)],
                     f"--json: {tmp_path}: is a folder; --json names a file to write")
    _one_line_exit_2(["bench", command, "--ops", "softmax", "--md", str(tmp_path / "nope" / "r.md")],
                     f"--md: {tmp_path / 'nope' / 'r.md'}: {tmp_path / 'nope'} does not exist")
    _one_line_exit_2(["bench", command, "--ops", "softmax", "--md", str(tmp_path / "afile" / "r.md")],
                     f"--md: {tmp_path / 'afile' / 'r.md'}: {tmp_path / 'afile'} is a file, not a folder")


def test_corrupt_state_file_is_reported_not_replaced(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".orchestrator_state.json").write_text('{"schema_version": 1, "op_na')
    before = (ws / ".orchestrator_state.json").read_bytes()
    result = CliRunner().invoke(app, ["op", "status", str(ws)])
    assert result.exit_code == 2 and ".orchestrator_state.json" in result.output
    assert (ws / ".orchestrator_state.json").read_bytes() == before
