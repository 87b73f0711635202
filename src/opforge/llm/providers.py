"""Chat with tools through the providers' official SDKs (`pip install opforge[llm]`).

Both speak one small shape: `Conversation.send()` returns a `Reply` (text + tool calls); tool results go back
with `add_tool_results`. Every SDK failure becomes an `LlmError` with one line that says what went wrong and
never carries the key.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field

from opforge.errors import InputError, OpforgeError
from opforge.llm.config import LlmConfig


class LlmError(OpforgeError):
    """The endpoint failed, refused, or answered with something that is not a usable reply."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict | None  # None when the model's arguments were not a JSON object
    raw: str = ""


@dataclass
class Reply:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments object


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def _sdk(name: str):
    try:
        return __import__(name)
    except ImportError:
        raise InputError("provider", f"the {name!r} package is not installed: pip install 'opforge[llm]'") from None


def _parse_args(raw) -> dict | None:
    if isinstance(raw, dict):
        return raw
    try:
        val = json.loads(raw or "{}")
    except (TypeError, json.JSONDecodeError):
        return None
    return val if isinstance(val, dict) else None


def _describe(exc: Exception, cfg: LlmConfig, key: str | None) -> str:
    status = getattr(exc, "status_code", None)
    kind = type(exc).__name__
    where = cfg.public()["base_url"] or f"the {cfg.provider} API"
    if "Connection" in kind or "Timeout" in kind:
        msg = f"model endpoint {where} unreachable ({kind})"
    elif status in (401, 403):
        msg = f"model endpoint {where} refused the key from ${cfg.api_key_env} (HTTP {status})"
    elif status == 404:
        msg = f"model endpoint {where} does not know model {cfg.model!r} or the path (HTTP 404)"
    elif status is not None:
        body = str(getattr(exc, "message", "") or exc)[:200]
        msg = f"model endpoint {where} answered HTTP {status}: {body}"
    else:
        msg = f"model endpoint {where} gave an unusable reply ({kind}: {str(exc)[:200]})"
    return _redact(msg, key)


class Conversation:
    """One system prompt and a growing list of turns with one provider."""

    def __init__(self, cfg: LlmConfig, system: str):
        self.cfg = cfg
        self.system = system
        self.messages: list[dict] = []
        self._key = cfg.api_key()

    def add_user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def send(self, tools: list[Tool]) -> Reply:
        raise NotImplementedError

    def add_tool_results(self, reply: Reply, results: list[tuple[ToolCall, str]]) -> None:
        raise NotImplementedError

    def transcript(self) -> list[dict]:
        return json.loads(json.dumps(self.messages, default=str))


class OpenAIConversation(Conversation):
    def __init__(self, cfg: LlmConfig, system: str):
        super().__init__(cfg, system)
        openai = _sdk("openai")
        self._errors = (openai.OpenAIError,)
        # local servers take any key; the SDK insists on one
        self._client = openai.OpenAI(api_key=self._key or "unused", base_url=cfg.base_url,
                                     timeout=cfg.timeout_s, max_retries=1)

    def send(self, tools: list[Tool]) -> Reply:
        kw = {}
        if tools:
            kw["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                             "parameters": t.parameters}} for t in tools]
        try:
            resp = self._client.chat.completions.create(
                model=self.cfg.model, messages=[{"role": "system", "content": self.system}, *self.messages],
                max_tokens=self.cfg.max_tokens, temperature=self.cfg.temperature, **kw)
        except self._errors as exc:
            raise LlmError(_describe(exc, self.cfg, self._key)) from None
        except ValueError as exc:  # a body that is not JSON, or JSON the SDK cannot read
            raise LlmError(_describe(exc, self.cfg, self._key)) from None
        try:
            msg = resp.choices[0].message
        except (AttributeError, IndexError, TypeError) as exc:
            raise LlmError(f"model reply has no message ({type(exc).__name__})") from None
        calls = [ToolCall(c.id, c.function.name, _parse_args(c.function.arguments), c.function.arguments or "")
                 for c in (msg.tool_calls or [])]
        turn = {"role": "assistant", "content": msg.content or ""}
        if msg.tool_calls:
            turn["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": c.raw}} for c in calls]
        self.messages.append(turn)
        usage = resp.usage.model_dump() if getattr(resp, "usage", None) else {}
        return Reply(msg.content or "", calls, usage)

    def add_tool_results(self, reply: Reply, results: list[tuple[ToolCall, str]]) -> None:
        for call, text in results:
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": text})


class AnthropicConversation(Conversation):
    def __init__(self, cfg: LlmConfig, system: str):
        super().__init__(cfg, system)
        anthropic = _sdk("anthropic")
        self._errors = (anthropic.AnthropicError,)
        self._client = anthropic.Anthropic(api_key=self._key or "unused", base_url=cfg.base_url,
                                           timeout=cfg.timeout_s, max_retries=1)
        # newer SDKs dropped `temperature` from messages.create for models that fix it themselves
        self._takes_temperature = "temperature" in inspect.signature(self._client.messages.create).parameters

    def send(self, tools: list[Tool]) -> Reply:
        kw = {}
        if tools:
            kw["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters}
                           for t in tools]
        if self._takes_temperature:
            kw["temperature"] = self.cfg.temperature
        try:
            resp = self._client.messages.create(model=self.cfg.model, system=self.system, messages=self.messages,
                                                max_tokens=self.cfg.max_tokens, **kw)
        except self._errors as exc:
            raise LlmError(_describe(exc, self.cfg, self._key)) from None
        except ValueError as exc:  # a body that is not JSON, or JSON the SDK cannot read
            raise LlmError(_describe(exc, self.cfg, self._key)) from None
        try:
            blocks = list(resp.content)
        except (AttributeError, TypeError) as exc:
            raise LlmError(f"model reply has no content ({type(exc).__name__})") from None
        text = "".join(b.text for b in blocks if getattr(b, "type", "") == "text")
        calls = [ToolCall(b.id, b.name, _parse_args(b.input), json.dumps(b.input, default=str))
                 for b in blocks if getattr(b, "type", "") == "tool_use"]
        self.messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in blocks]})
        usage = resp.usage.model_dump() if getattr(resp, "usage", None) else {}
        return Reply(text, calls, usage)

    def add_tool_results(self, reply: Reply, results: list[tuple[ToolCall, str]]) -> None:
        self.messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": text} for call, text in results]})


def open_conversation(cfg: LlmConfig, system: str) -> Conversation:
    cls = {"openai": OpenAIConversation, "anthropic": AnthropicConversation}[cfg.provider]
    return cls(cfg, system)
