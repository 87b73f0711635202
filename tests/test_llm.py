"""The LLM engine against a local endpoint that speaks the OpenAI (and Anthropic) protocol through the real SDK
clients: it builds what the templates refuse, rejects cheating kernels at the gate that catches them, runs out
of budget as BLOCKED_IMPL with the summaries, and fails clearly on bad configuration or a dead endpoint."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest
from conftest import SCAN_REFERENCE as REFERENCE
from conftest import SCAN_REQUEST as REQUEST
from llm_replay import Replay, text, tools
from typer.testing import CliRunner

from opforge.cli import app
from opforge.orchestrator.runner import create_workspace, run_stages
from opforge.workspace.events import read_events

pytest.importorskip("openai")
runner = CliRunner()
KEY_ENV = "OPFORGE_TEST_LLM_KEY"
KEY = "sk-test-not-a-real-key"

RIGHT = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _scaled_roll_kernel(x_ptr, out_ptr, n_rows, n_cols, alpha, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < tl.where(row < n_rows, n_cols, 0)
    x = tl.load(x_ptr + row * n_cols + (cols + n_cols - 1) % n_cols, mask=mask)  # column c - 1, wrapping
    y = x * alpha
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, alpha: float) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    n_cols = x.size(-1)
    n_rows = x.numel() // max(n_cols, 1)
    block = triton.next_power_of_2(max(n_cols, 1))
    _scaled_roll_kernel[(max(n_rows, 1),)](x, out, n_rows, n_cols, alpha, BLOCK=block)
    return out


@torch.library.custom_op("opforge::scaled_roll", mutates_args=())
def _scaled_roll_op(x: torch.Tensor, alpha: float, deterministic: bool) -> torch.Tensor:
    return _launch(x, alpha)


@_scaled_roll_op.register_fake
def _(x, alpha, deterministic):
    return torch.empty_like(x)


def scaled_roll(x, alpha=1.5, deterministic=False):
    return _scaled_roll_op(x, float(alpha), deterministic)
'''
WRONG = RIGHT.replace("y = x * alpha", "y = x")  # forgets the scale
TORCH_MATH = RIGHT.replace("    _scaled_roll_kernel[(max(n_rows, 1),)](x, out, n_rows, n_cols, alpha, BLOCK=block)\n"
                           "    return out", "    return torch.roll(x, 1, -1) * alpha")
READS_GOLDEN = RIGHT.replace("def scaled_roll(x, alpha=1.5, deterministic=False):",
                             "_G = 'scaled_roll_golden'\n\n\ndef scaled_roll(x, alpha=1.5, deterministic=False):")
REACHES_CHECKER = RIGHT.replace("import triton\n", "import triton\nimport opforge.verify.cases as _cases\n", 1)
assert WRONG != RIGHT and TORCH_MATH != RIGHT and READS_GOLDEN != RIGHT and REACHES_CHECKER != RIGHT


def _config(path: Path, url: str, **extra) -> Path:
    doc = {"provider": "openai", "base_url": f"{url}/v1", "model": "replay", "api_key_env": KEY_ENV,
           "code_timeout_s": 300, **extra}
    path.write_text("".join(f"{k}: {v}\n" for k, v in doc.items()))
    return path


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


@pytest.fixture(scope="module")
def blocked_ws(tmp_path_factory) -> Path:
    """The request through the deterministic engine: refused at stage 2 (BLOCKED_API)."""
    base = tmp_path_factory.mktemp("llm")
    req = base / "request"
    req.mkdir()
    (req / "request.yaml").write_text(REQUEST)
    (req / "reference.py").write_text(REFERENCE)
    ws = create_workspace(req, base / "blocked")
    state = run_stages(ws.root)
    assert state.terminal["status"] == "BLOCKED_API" and "aten.roll" in state.terminal["reason"]
    return ws.root


@pytest.fixture(scope="module")
def ready_ws(blocked_ws, tmp_path_factory) -> Path:
    """Stages 1-4 done for an engine that writes kernels (the host engine needs no model for them)."""
    dest = tmp_path_factory.mktemp("ready") / "ws"
    shutil.copytree(blocked_ws, dest)
    for k in (2, 3, 4):
        state = run_stages(dest, only=k, engine="host")
        assert state.stages[k].status == "completed", state.stages[k].reason
    api = json.loads((dest / "api_report.json").read_text())
    assert api["unsupported"] == [] and api["model_lowered"] == ["aten.roll.default"] and api["cost"]
    return dest


def _copy(src: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "ws"
    shutil.copytree(src, dest)
    return dest


def _write(source: str):
    return tools(("write_impl", {"source": source}))


SUBMIT = tools(("submit", {"note": "done"}))


@pytest.mark.slow
def test_llm_builds_what_the_templates_refuse(blocked_ws, tmp_path):
    ws = _copy(blocked_ws, tmp_path)
    script = [_write(WRONG), SUBMIT, _write(RIGHT), tools(("check_gates", {})), SUBMIT]
    with Replay(script, KEY) as srv:
        res = runner.invoke(app, ["op", "resume", str(ws), "--engine", "llm", "--json",
                                  "--llm-config", str(_config(tmp_path / "llm.yaml", srv.url))])
        requests = srv.requests
    assert res.exit_code == 0, res.output
    state = json.loads(res.stdout)
    assert state["terminal"]["status"] == "SUCCESS" and state["engine"] == "llm"
    assert state["stages"]["5"]["attempts"] == 2 and state["stages"]["6"]["status"] == "skipped"
    assert (ws / "scaled_roll_impl.py").read_text() == RIGHT
    assert json.loads((ws / "precision.json").read_text())["summary"]["all_passed"]
    attempts = [e for e in read_events(ws) if e["kind"] == "llm_attempt"]
    assert [(a["attempt"], a["mode"]) for a in attempts] == [(1, "first_impl"), (2, "precision_fix")]
    assert attempts[1]["last_failure"].startswith("precision failed") and "max_abs" in attempts[1]["last_failure"]
    # the failure summary went back to the model, with the last impl, in attempt 2's first message
    second = next(r for r in requests if "attempt 2 of 5" in json.dumps(r))
    first_user = [m for m in second["messages"] if m["role"] == "user"][0]["content"]
    assert "mode precision_fix" in first_user and "precision failed" in first_user and "y = x\n" in \
        first_user
    assert second["messages"][0]["role"] == "system" and "The impl contract" in second["messages"][0]["content"]
    assert {t["function"]["name"] for t in second["tools"]} >= {"write_impl", "check_gates", "run_tests",
                                                                "run_precision", "run_benchmark", "read_artifact"}
    # a tool call's result goes back as a tool message
    after_check = next(r for r in requests if any(m.get("role") == "tool" and '"gates"' in m.get("content", "")
                                                  for m in r["messages"]))
    assert '"passed": true' in [m for m in after_check["messages"] if m.get("role") == "tool"][-1]["content"]
    for f in ws.rglob("*"):  # the key reaches neither the workspace nor the events log
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f


def test_cheating_kernels_fail_their_gates_until_the_budget_is_spent(ready_ws, tmp_path):
    ws = _copy(ready_ws, tmp_path)
    script = [_write(TORCH_MATH), SUBMIT,
              _write(READS_GOLDEN), SUBMIT,
              _write(REACHES_CHECKER), SUBMIT,
              ("tools", [("write_impl", "{not json")]), text("I could not do it."),  # malformed call, then gives up
              tools(("rm_rf", {"path": "/"})), text("done")]  # a tool that does not exist
    with Replay(script, KEY) as srv:
        state = run_stages(ws, engine="llm", llm_config=str(_config(tmp_path / "llm.yaml", srv.url)))
        requests = srv.requests
    assert state.terminal["status"] == "BLOCKED_IMPL"
    assert state.stages[5].attempts == 5
    reason = state.terminal["reason"]
    assert reason.startswith("5 attempts, none passed")
    for gate in ("G5-IMPL-TRITON-ONLY", "G5-IMPL-SEPARATE", "G5-IMPL-IMPORTS"):
        assert gate in reason
    gate_events = [e for e in read_events(ws) if e["kind"] == "gates" and e.get("stage") == 5]
    caught = [sorted(r["id"] for r in e["results"] if not r["passed"]) for e in gate_events]
    assert caught[0] == ["G5-IMPL-TRITON-ONLY"] and caught[1] == ["G5-IMPL-SEPARATE"]
    assert not (ws / "precision.json").exists()  # no cheating kernel ever ran
    tool_msgs = [m["content"] for r in requests for m in r["messages"] if m.get("role") == "tool"]
    assert any("not a JSON object" in t for t in tool_msgs) and any("no tool named 'rm_rf'" in t for t in tool_msgs)
    modes = [e["mode"] for e in read_events(ws) if e["kind"] == "llm_attempt"]
    assert modes == ["first_impl"] + ["retry_impl"] * 4


def test_unreachable_endpoint_and_refused_key_block_with_the_reason(ready_ws, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    ws = _copy(ready_ws, tmp_path)
    res = runner.invoke(app, ["op", "resume", str(ws), "--engine", "llm", "--json",
                              "--llm-config", str(_config(tmp_path / "dead.yaml", dead, timeout_s=5))])
    assert res.exit_code == 1 and "Traceback" not in res.output
    state = json.loads(res.stdout)
    assert state["terminal"]["status"] == "BLOCKED_IMPL" and "unreachable" in state["terminal"]["reason"]
    ws2 = _copy(ready_ws, tmp_path / "b")
    with Replay([], key="sk-the-server-wants-another") as srv:
        state = run_stages(ws2, engine="llm", llm_config=str(_config(tmp_path / "k.yaml", srv.url)))
    assert state.terminal["status"] == "BLOCKED_IMPL" and "refused the key" in state.terminal["reason"]
    assert KEY not in state.terminal["reason"]
    ws3 = _copy(ready_ws, tmp_path / "c")
    with Replay([("raw", 200, "this is not json")], KEY) as srv:  # a malformed reply
        state = run_stages(ws3, engine="llm", llm_config=str(_config(tmp_path / "m.yaml", srv.url)))
    assert state.terminal["status"] == "BLOCKED_IMPL" and "unusable reply" in state.terminal["reason"]


def test_host_engine_holds_a_hand_written_impl_to_the_same_gates(ready_ws, tmp_path):
    ws = _copy(ready_ws, tmp_path)
    state = run_stages(ws, engine="host")
    assert state.terminal["status"] == "BLOCKED_IMPL" and "scaled_roll_impl.py is missing" in \
        state.terminal["reason"]
    ws = _copy(ready_ws, tmp_path / "b")
    (ws / "scaled_roll_impl.py").write_text(TORCH_MATH)
    res = runner.invoke(app, ["op", "resume", str(ws), "--engine", "host", "--json"])
    assert res.exit_code == 1
    assert "G5-IMPL-TRITON-ONLY" in json.loads(res.stdout)["terminal"]["reason"]


@pytest.mark.parametrize("body,field", [
    ("provider: openai\nmodel: m\nbase_url: http://127.0.0.1:9/v1\napi_key: sk-123\n", "api_key"),
    ("provider: gpt\nmodel: m\napi_key_env: X\n", "provider"),
    ("provider: openai\nbase_url: http://127.0.0.1:9/v1\n", "model"),
    ("provider: openai\nmodel: m\nbase_url: localhost:8000\n", "base_url"),
    ("provider: openai\nmodel: m\napi_key_env: OPFORGE_TEST_UNSET_KEY\n", "api_key_env"),
    ("provider: openai\nmodel: m\nbase_url: http://127.0.0.1:9/v1\nmax_turns: 0\n", "max_turns"),
    ("provider: [openai\n", "not valid YAML"),
])
def test_bad_configuration_is_exit_2_with_one_line(blocked_ws, tmp_path, body, field):
    cfg = tmp_path / "llm.yaml"
    cfg.write_text(body)
    out = tmp_path / "ws"
    res = runner.invoke(app, ["op", "run", str(blocked_ws / "request"), "--out", str(out), "--engine", "llm",
                              "--llm-config", str(cfg)])
    assert res.exit_code == 2 and field in res.output and len(res.output.strip().splitlines()) == 1
    assert "sk-123" not in res.output and not out.exists()


def test_no_configuration_for_llm_is_exit_2(blocked_ws, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("OPFORGE_LLM_CONFIG", raising=False)
    res = runner.invoke(app, ["op", "run", str(blocked_ws / "request"), "--out", "ws", "--engine", "llm"])
    assert res.exit_code == 2 and "--llm-config" in res.output
    res = runner.invoke(app, ["op", "run", str(blocked_ws / "request"), "--out", "ws", "--engine", "gpt"])
    assert res.exit_code == 2 and "--engine" in res.output


def test_natural_language_request_becomes_a_valid_request(tmp_path):
    bad_yaml = REQUEST.replace("category: other", "category: rotation")
    script = [tools(("ask_user", {"questions": ["Which dtypes?", "Along which dimension?"]})),
              tools(("write_request", {"request_yaml": bad_yaml, "reference_py": REFERENCE,
                                       "assumptions": ["float32 only"]})),
              tools(("write_request", {"request_yaml": REQUEST, "reference_py": REFERENCE,
                                       "assumptions": ["float32 only", "the roll runs along the last dimension",
                                                       "alpha defaults to 1.5"]}))]
    with Replay(script, KEY) as srv:
        res = runner.invoke(app, ["op", "draft", "each row rotated by one column, scaled by alpha", "--interactive",
                                  "--out", str(tmp_path / "req"), "--json",
                                  "--llm-config", str(_config(tmp_path / "llm.yaml", srv.url))],
                            input="float32\nthe last one\n")
        requests = srv.requests
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert [q["answer"] for q in out["questions"]] == ["float32", "the last one"]
    assert "A: the last one" in [m for m in requests[1]["messages"] if m.get("role") == "tool"][0]["content"]
    assert out["name"] == "scaled_roll" and len(out["assumptions"]) == 3
    refusal = [m for m in requests[2]["messages"] if m.get("role") == "tool"][-1]["content"]
    assert "category" in refusal and "rotation" in refusal  # opforge's own check answered the bad request
    assert sorted(p.name for p in (tmp_path / "req").iterdir()) == ["ASSUMPTIONS.md", "assumptions.json",
                                                                   "reference.py", "request.yaml"]
    assert "the roll runs along the last dimension" in (tmp_path / "req" / "ASSUMPTIONS.md").read_text()
    from opforge.request import load_request

    assert load_request(tmp_path / "req").name == "scaled_roll"


def test_draft_cli_gives_up_clearly_on_a_model_that_never_writes(tmp_path):
    with Replay([text("Here is your operator!"), text("again")], KEY) as srv:
        cfg = _config(tmp_path / "llm.yaml", srv.url)
        res = runner.invoke(app, ["op", "draft", "a scaled sine", "--out", str(tmp_path / "req"),
                                  "--llm-config", str(cfg)])
    assert res.exit_code == 1 and "no valid request" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "req").exists()


@pytest.mark.parametrize("out, why", [
    ("afile", "{t}/afile: is a file; --out names the request folder to write"),
    ("afile/req", "{t}/afile/req: cannot create it: {t}/afile is a file, not a folder"),
    ("full", "{t}/full: folder exists and is not empty (or --force to replace it)"),
])
def test_draft_refuses_an_out_it_cannot_write_before_asking_the_model(tmp_path, out, why):
    """Checked before the configuration is read, so no model is needed (and none is asked) to hear it."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.py").write_text("")
    res = runner.invoke(app, ["op", "draft", "a scaled sine", "--out", str(tmp_path / out),
                              "--llm-config", str(tmp_path / "no-such.yaml")])
    assert res.exit_code == 2 and res.stdout == "", res.output
    assert res.stderr == f"error: {why.format(t=tmp_path)}\n"
    res = runner.invoke(app, ["op", "draft", "a scaled sine", "--out", str(tmp_path / out), "--json"])
    assert res.exit_code == 2 and json.loads(res.stdout)["error"] == {
        "where": str(tmp_path / out), "what": why.format(t=tmp_path).split(": ", 1)[1], "exit_code": 2}


def test_draft_request_checks_out_itself_with_force_only_for_a_folder(tmp_path):
    from opforge.errors import InputError
    from opforge.llm.config import LlmConfig
    from opforge.llm.request_draft import draft_request

    (tmp_path / "afile").write_text("")
    with pytest.raises(InputError, match="is a file"):  # --force replaces a folder, never a file
        draft_request("a scaled sine", tmp_path / "afile", LlmConfig(provider="openai", model="m"), force=True)


def test_anthropic_messages_through_the_official_sdk(tmp_path):
    pytest.importorskip("anthropic")
    from opforge.llm.config import load_config
    from opforge.llm.loop import Bound, run_loop
    from opforge.llm.providers import Tool, open_conversation

    seen = []
    script = [tools(("echo", {"word": "triton"})), text("finished")]
    with Replay(script, KEY) as srv:
        path = tmp_path / "a.yaml"
        path.write_text(f"provider: anthropic\nbase_url: {srv.url}\nmodel: claude-replay\napi_key_env: {KEY_ENV}\n")
        conv = open_conversation(load_config(path), "You echo.")
        echo = Bound(Tool("echo", "Echo a word.", {"type": "object", "properties": {"word": {"type": "string"}},
                                                    "required": ["word"]}), lambda word: seen.append(word) or word * 2)
        result = run_loop(conv, [echo], "echo triton", max_turns=4)
        requests = srv.requests
    assert seen == ["triton"] and result.stopped == "answer" and result.final_text == "finished"
    assert requests[0]["system"] == "You echo." and requests[0]["tools"][0]["input_schema"]["required"] == ["word"]
    back = requests[1]["messages"][-1]["content"][0]
    assert back == {"type": "tool_result", "tool_use_id": "toolu_0", "content": "tritontriton"}


def test_model_code_runs_in_a_child_with_a_time_limit_and_no_keys(tmp_path, monkeypatch):
    from opforge.llm.sandbox import run_python

    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-123")
    res = run_python(["-c", f"import os; print(os.environ.get('{KEY_ENV}'), os.environ.get('SOME_SERVICE_TOKEN'), "
                            "os.getpid())"], tmp_path, 30, drop_env=(KEY_ENV,))
    assert res.returncode == 0 and res.output.split()[:2] == ["None", "None"]
    assert int(res.output.split()[2]) != os.getpid()
    res = run_python(["-c", "import time\nwhile True: time.sleep(0.05)"], tmp_path, 1)
    assert res.timed_out and res.returncode == -9


def test_engine_choice(tmp_path, monkeypatch):
    from opforge.llm.engines import AutoEngine, Engine, HostEngine, LlmEngine, make_engine
    from opforge.orchestrator.state import State

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("OPFORGE_LLM_CONFIG", raising=False)
    assert type(make_engine("auto")) is Engine  # no model configured: auto is the deterministic engine
    assert isinstance(make_engine("host"), HostEngine)
    cfg = _config(tmp_path / "opforge-llm.yaml", "http://127.0.0.1:9")
    auto, llm = make_engine("auto"), make_engine("llm", cfg)
    assert type(auto) is AutoEngine and type(llm) is LlmEngine
    state = State.new("op", str(tmp_path))

    def default(ws, req, st):
        return None

    assert auto.stage_fn(5, state, default) is default  # auto keeps the templates while they can lower
    assert llm.stage_fn(5, state, default) is not default
    state.options["model_ops"] = ["aten.roll.default"]
    assert auto.stage_fn(5, state, default) is not default and auto.stage_fn(4, state, default) is not default
    state.set_terminal("BLOCKED_API", "no lowering")
    assert auto.reopens(state) and not Engine().reopens(state)
