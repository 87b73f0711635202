"""The optional LLM review, through the real OpenAI client against a local server that speaks the chat API."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openpyxl
import pytest
from typer.testing import CliRunner

from opforge.cli import app
from opforge.skills.pr_analysis import load_profile
from opforge.skills.pr_analysis.synthrepo import build_repo

pytest.importorskip("openai")
runner = CliRunner()
CPU_OPS = load_profile("dispatch:CPU").operators  # the operators the synthetic PRs edit as "implemented"


class _Chat(BaseHTTPRequestHandler):
    """POST /v1/chat/completions: disagrees with every row whose change renames something."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body))
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        title = user.split("\n", 1)[0]
        agree = "Rename" not in title
        content = json.dumps({"agree": agree, "note": f"reviewed: {title[8:60]}"})
        reply = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": content}}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def chat_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    srv.requests = []
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    t.join(timeout=5)


def test_llm_review_adds_notes_and_never_changes_a_grade(tmp_path, chat_server):
    repo = tmp_path / "pytorch"
    build_repo(repo, 31, CPU_OPS)  # every scenario once
    base = ["pr-analysis", "--repo", str(repo), "--range", "main~31..main"]
    plain = runner.invoke(app, [*base, "--out", str(tmp_path / "a.xlsx"), "--json", "-"])
    assert plain.exit_code == 0, plain.output
    url = f"http://127.0.0.1:{chat_server.server_address[1]}/v1"
    res = runner.invoke(app, [*base, "--out", str(tmp_path / "b.xlsx"), "--json", "-", "--llm", url,
                              "--llm-model", "local-reviewer"])
    assert res.exit_code == 0, res.output
    before, after = json.loads(plain.stdout), json.loads(res.stdout)
    assert [r["impact"] for r in before["rows"]] == [r["impact"] for r in after["rows"]]
    reviewed = [r for r in after["rows"] if r["impact"] in ("High", "Medium")]
    assert len(chat_server.requests) == len(reviewed) == after["llm_review"]["reviewed"] > 0
    assert all(p == "/v1/chat/completions" and b["model"] == "local-reviewer" for p, b in chat_server.requests)
    assert all("llm" not in r for r in after["rows"] if r["impact"] not in ("High", "Medium"))
    for r in reviewed:
        assert r["llm"]["agree"] == ("Rename" not in r["title"]) and r["llm"]["note"].startswith("reviewed: ")
    assert after["llm_review"]["disagreements"] == sum("Rename" in r["title"] for r in reviewed) > 0
    ws = openpyxl.load_workbook(tmp_path / "b.xlsx")["PRs"]
    header = [c.value for c in ws[1]]
    assert header[-1] == "LLM note"
    notes = [ws.cell(i, len(header)).value or "" for i in range(2, ws.max_row + 1)]
    assert sum(n.startswith("DISAGREES") for n in notes) == after["llm_review"]["disagreements"]


def test_unreachable_llm_endpoint_is_bad_input(tmp_path):
    repo = tmp_path / "pytorch"
    build_repo(repo, 8, CPU_OPS)
    res = runner.invoke(app, ["pr-analysis", "--repo", str(repo), "--range", "main~8..main", "--out",
                              str(tmp_path / "r.xlsx"), "--llm", "http://127.0.0.1:9/v1"])
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and "--llm: the endpoint" in res.stderr
    assert not Path(tmp_path / "r.xlsx").exists()
