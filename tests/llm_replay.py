"""A local model endpoint for tests: speaks the OpenAI chat-completions and the Anthropic messages protocols
on 127.0.0.1 and replays scripted replies, recording every request it receives.

A script entry is a function of the request body returning ("text", str) or ("tools", [(name, args), ...]),
or ("raw", status, body) to send an exact HTTP answer. When the script runs out the server answers 400, so a
test can never loop on it.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Replay:
    def __init__(self, script, key: str = "sk-test-not-a-real-key"):
        self.script = list(script)
        self.key = key
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._n = 0
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def _next(self, body: dict):
        with self._lock:
            self.requests.append(body)
            if not self.script:
                return ("raw", 400, {"error": {"message": "replay script exhausted", "type": "invalid_request"}})
            self._n += 1
            entry = self.script.pop(0)
        return entry(body) if callable(entry) else entry

    def _handler(self):
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, status: int, body) -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                replay.headers.append(dict(self.headers))
                anthropic = self.path.endswith("/messages")
                bearer = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                sent_key = (self.headers.get("x-api-key") or bearer) if anthropic else bearer  # SDKs differ
                if sent_key != replay.key:
                    return self._send(401, {"error": {"message": "bad key", "type": "authentication_error"}})
                entry = replay._next(body)
                if entry[0] == "raw":
                    return self._send(entry[1], entry[2])
                self._send(200, _anthropic(entry, body) if anthropic else _openai(entry, body))

        return Handler


def _openai(entry, body) -> dict:
    msg = {"role": "assistant", "content": None}
    if entry[0] == "text":
        msg["content"] = entry[1]
        finish = "stop"
    else:
        msg["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                              "function": {"name": n, "arguments": a if isinstance(a, str) else json.dumps(a)}}
                             for i, (n, a) in enumerate(entry[1])]
        finish = "tool_calls"
    return {"id": "chatcmpl-replay", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def _anthropic(entry, body) -> dict:
    if entry[0] == "text":
        content, stop = [{"type": "text", "text": entry[1]}], "end_turn"
    else:
        content = [{"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": a}
                   for i, (n, a) in enumerate(entry[1])]
        stop = "tool_use"
    return {"id": "msg_replay", "type": "message", "role": "assistant", "model": body.get("model", "m"),
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5}}


def text(t: str):
    return ("text", t)


def tools(*calls):
    return ("tools", list(calls))
