"""Streams of the `opforge` command: results (tables, summaries, JSON) on stdout, progress and diagnostics on
stderr, so that `opforge op status WS | less` and `opforge ... --json | jq` both work; with --json an error is
JSON on stdout as well as one line on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import SCAN_REFERENCE as REFERENCE
from conftest import SCAN_REQUEST as REQUEST
from typer.testing import CliRunner

from opforge import cli
from opforge.cli import app

runner = CliRunner()
TABLE = "┏"  # a rich table's first corner: results only, never on stderr



def _json_error(res, where: str | None = None) -> dict:
    err = json.loads(res.stdout)["error"]
    assert set(err) == {"where", "what", "exit_code"} and err["exit_code"] == res.exit_code, err
    if where is not None:
        assert where in err["where"], err
    return err


@pytest.fixture(scope="module")
def blocked(tmp_path_factory) -> tuple[Path, object]:
    """`opforge op run` on a request stage 2 blocks (BLOCKED_API, a few seconds): the workspace and the run."""
    base = tmp_path_factory.mktemp("streams")
    req = base / "request"
    req.mkdir()
    (req / "request.yaml").write_text(REQUEST)
    (req / "reference.py").write_text(REFERENCE)
    res = runner.invoke(app, ["op", "run", str(req), "--out", str(base / "ws")])
    return base / "ws", res


def test_op_run_table_on_stdout_progress_and_reason_on_stderr(blocked):
    _, res = blocked
    assert res.exit_code == 2, res.output  # BLOCKED_API is bad input
    assert TABLE in res.stdout and "requirement" in res.stdout and "aten.roll" in res.stdout
    assert "stage 1 start" not in res.stdout and "BLOCKED_API:" not in res.stdout
    err = res.stderr.strip().splitlines()
    assert err[0] == "stage 1 start: requirement" and any(ln.startswith("stage 2 blocked") for ln in err)
    assert err[-1].startswith("BLOCKED_API: no Triton lowering for: aten.roll") and TABLE not in res.stderr


def test_op_status_and_gate_print_results_on_stdout(blocked):
    ws, _ = blocked
    res = runner.invoke(app, ["op", "status", str(ws)])
    assert res.exit_code == 0 and res.stderr == "", res.stderr
    assert TABLE in res.stdout and res.stdout.strip().splitlines()[-1].startswith("terminal: BLOCKED_API: ")
    res = runner.invoke(app, ["op", "status", str(ws), "--json"])
    assert res.exit_code == 0 and res.stderr == ""
    assert json.loads(res.stdout)["terminal"]["status"] == "BLOCKED_API"
    res = runner.invoke(app, ["op", "gate", str(ws), "--stage", "1"])
    assert res.exit_code == 0 and res.stderr == "" and "gates of stage 1" in res.stdout and "G1-SPEC" in res.stdout


def test_op_resume_json_is_clean_json_with_the_reason_on_stderr(blocked):
    ws, _ = blocked
    res = runner.invoke(app, ["op", "resume", str(ws), "--json"])
    assert res.exit_code == 2
    assert json.loads(res.stdout)["terminal"]["status"] == "BLOCKED_API"
    assert res.stderr.strip().splitlines() == [f"BLOCKED_API: {json.loads(res.stdout)['terminal']['reason']}"]


@pytest.mark.parametrize("argv,where", [
    (["op", "status", "{t}/nowhere", "--json"], "nowhere"),
    (["op", "gate", "{t}/nowhere", "--stage", "2", "--json"], "nowhere"),
    (["op", "rollback", "{t}/nowhere", "--to", "2", "--json"], "nowhere"),
    (["op", "resume", "{t}/nowhere", "--json"], "nowhere"),
    (["op", "run", "{t}/nowhere", "--out", "{t}/ws", "--json"], "nowhere"),
    (["skills", "validate", "{t}/nowhere", "--json"], "nowhere"),
    (["init", "--host", "vim", "{t}", "--json"], "--host"),
    (["bench", "catalog", "--baselines", "eager,nope", "--json", "-"], "--baselines"),
    (["bench", "compile", "--arch", "sm_1", "--json", "-"], "--arch"),
    (["ci-fix", "--repo", "{t}/nowhere", "--json"], "--repo"),
    (["pr-analysis", "--json", "-"], "--repo"),
    (["api-consistency", "{t}/nowhere.py", "--target", "half", "--out", "{t}/o", "--json"], "nowhere.py"),
    # an --out that cannot be what the command writes: one line naming the path, never a traceback
    (["api-consistency", "{t}/nowhere.py", "--target", "half", "--out", "{t}/afile", "--json"], "afile"),
    (["api-consistency", "{t}/nowhere.py", "--target", "half", "--out", "{t}/afile/o", "--json"], "afile/o"),
    (["op", "draft", "a scan", "--out", "{t}/afile", "--json"], "afile"),
    (["op", "draft", "a scan", "--out", "{t}/afile/r", "--json"], "afile/r"),
    (["pr-analysis", "--out", "{t}/adir", "--json", "-"], "--out"),
    (["pr-analysis", "--out", "{t}/afile/r.xlsx", "--json", "-"], "--out"),
])
def test_errors_with_json_are_json_on_stdout_and_one_line_on_stderr(tmp_path, monkeypatch, argv, where):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # bench compile refuses it before looking at --arch
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    res = runner.invoke(app, [a.format(t=tmp_path) for a in argv])
    assert res.exit_code == 2, res.output
    err = _json_error(res, where)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and err["what"] in lines[0], res.stderr


def test_errors_without_json_leave_stdout_empty(tmp_path):
    res = runner.invoke(app, ["op", "status", str(tmp_path / "nowhere")])
    assert res.exit_code == 2 and res.stdout == "" and res.stderr.startswith("error: ")
    res = runner.invoke(app, ["bench", "catalog", "--baselines", "nope", "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 2 and res.stdout == ""


def test_draft_questions_go_to_stderr_so_json_stays_clean(tmp_path, monkeypatch):
    import opforge.llm.config
    import opforge.llm.request_draft

    def fake_draft(text, out, cfg, ask=None, force=False):
        answer = ask("Which dtypes?")
        return {"request_dir": str(out), "name": "x", "assumptions": [], "questions": [{"answer": answer}]}

    monkeypatch.setattr(opforge.llm.config, "load_config", lambda path: object())
    monkeypatch.setattr(opforge.llm.request_draft, "draft_request", fake_draft)
    res = runner.invoke(app, ["op", "draft", "a scan", "--out", str(tmp_path / "r"), "--interactive", "--json"],
                        input="float32\n")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["questions"] == [{"answer": "float32"}]  # the whole of stdout is the JSON
    assert "Which dtypes?" in res.stderr


def test_draft_model_failure_with_json(tmp_path, monkeypatch):
    import opforge.llm.config
    import opforge.llm.request_draft
    from opforge.llm.providers import LlmError

    def fake_draft(*a, **k):
        raise LlmError("no valid request after 2 replies")

    monkeypatch.setattr(opforge.llm.config, "load_config", lambda path: object())
    monkeypatch.setattr(opforge.llm.request_draft, "draft_request", fake_draft)
    res = runner.invoke(app, ["op", "draft", "a scan", "--out", str(tmp_path / "r"), "--json"])
    assert res.exit_code == 1
    assert _json_error(res, "model")["what"] == "no valid request after 2 replies"
    assert res.stderr.strip() == "error: model: no valid request after 2 replies"


def test_init_and_validate_results_on_stdout(tmp_path):
    skill = tmp_path / "skills" / "fine"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: fine\ndescription: Use to check things.\n---\n\nBody.\n")
    res = runner.invoke(app, ["skills", "validate", str(tmp_path / "skills")])
    assert res.exit_code == 0 and TABLE in res.stdout and res.stderr == ""
    proj = tmp_path / "proj"
    proj.mkdir()
    res = runner.invoke(app, ["init", "--host", "codex", str(proj)])
    assert res.exit_code == 0 and res.stdout.startswith("installed opforge for codex") and res.stderr == ""


def _main(monkeypatch, capsys, *argv) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["opforge", *argv])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_usage_errors_of_a_json_command_are_json_too(monkeypatch, capsys):
    code, out, err = _main(monkeypatch, capsys, "op", "status", "--json")
    assert code == 2 and json.loads(out)["error"] == {"where": "ws_dir", "what": "Missing argument 'ws_dir'.",
                                                      "exit_code": 2}
    assert "Missing argument" in err
    code, out, err = _main(monkeypatch, capsys, "op", "gate", "WS", "--stage", "9", "--json")
    assert code == 2 and json.loads(out)["error"]["where"] == "--stage"
    code, out, err = _main(monkeypatch, capsys, "op", "status")  # no --json: stdout stays empty
    assert code == 2 and out == "" and "Missing argument" in err
    code, out, _ = _main(monkeypatch, capsys, "op", "ops", "--json")  # success goes through unchanged
    assert code == 0 and isinstance(json.loads(out), list)


@pytest.mark.parametrize("argv,wanted", [
    (["op", "status", "--json"], True),
    (["op", "status", "WS"], False),
    (["bench", "catalog", "--json", "-"], True),
    (["bench", "catalog", "--json=-"], True),
    (["bench", "catalog", "--json", "report.json"], False),
    (["pr-analysis", "--json", "-", "--repo", "x"], True),
    (["op", "nope", "--json"], False),
    (["--json"], False),
])
def test_json_requested(argv, wanted):
    assert cli._json_requested(argv) is wanted



def test_one_error_helper_for_every_command():
    """errors.py says an error the one way every command does; a leaf, so it needs no CLI to be imported."""
    from opforge import errors

    said = []

    def echo(text, err=False):
        said.append(("stderr" if err else "stdout", text))

    errors.report_error(echo, "--out", "x: is a folder", 2)
    assert said == [("stderr", "error: --out: x: is a folder")]
    said.clear()
    errors.report_error(echo, "model", "gave up", 1, as_json=True)
    assert said == [("stdout", '{"error": {"where": "model", "what": "gave up", "exit_code": 1}}'),
                    ("stderr", "error: model: gave up")]
    assert json.loads(errors.json_error("w", "x")) == {"error": {"where": "w", "what": "x", "exit_code": 2}}
    assert cli.json_error is errors.json_error


def test_no_command_builds_the_error_json_itself():
    src = Path(cli.__file__).parent
    found = [str(p.relative_to(src)) for p in sorted(src.rglob("*.py"))
             if p.name != "errors.py" and 'dumps({"error"' in p.read_text().replace(" ", "")]
    assert not found, f"use opforge.errors.report_error / json_error in: {found}"
