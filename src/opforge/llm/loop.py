"""The tool-calling loop: the model replies, opforge runs the tools it asked for and sends the results back,
until the model answers without a tool call, calls a finishing tool, or the turn limit is reached.

A malformed call (unknown tool, arguments that are not a JSON object, wrong argument names) is answered with
an error the model can read; it costs a turn, so a model that keeps failing runs out of turns.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

from opforge.llm.providers import Conversation, Tool

MAX_RESULT_CHARS = 12000


class ToolInputError(Exception):
    """The model asked for something the tool refuses: the message goes back to the model."""


@dataclass
class Bound:
    tool: Tool
    run: Callable[..., str]
    finishes: bool = False  # calling it ends the loop after this turn


@dataclass
class LoopResult:
    turns: int = 0
    calls: list[dict] = field(default_factory=list)
    final_text: str = ""
    stopped: str = ""  # "answer" | "finished" | "turn limit"
    usage: dict = field(default_factory=dict)


def _call(b: Bound, args: dict | None) -> tuple[bool, str]:
    if args is None:
        return False, "error: the arguments were not a JSON object; send them as one"
    params = inspect.signature(b.run).parameters
    unknown = sorted(set(args) - set(params))
    missing = sorted(n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in args)
    if unknown or missing:
        return False, (f"error: {b.tool.name} takes {', '.join(params) or 'no arguments'}"
                       + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                       + (f"; missing: {', '.join(missing)}" if missing else ""))
    try:
        return True, b.run(**args)
    except ToolInputError as exc:
        return False, f"error: {exc}"


def run_loop(conv: Conversation, tools: list[Bound], message: str, max_turns: int,
             on_call: Callable[[str, bool, str], None] | None = None) -> LoopResult:
    by_name = {b.tool.name: b for b in tools}
    res = LoopResult()
    conv.add_user(message)
    while res.turns < max_turns:
        reply = conv.send([b.tool for b in tools])
        res.turns += 1
        for k, v in (reply.usage or {}).items():
            if isinstance(v, int):
                res.usage[k] = res.usage.get(k, 0) + v
        res.final_text = reply.text
        if not reply.tool_calls:
            res.stopped = "answer"
            return res
        results, finished = [], False
        for call in reply.tool_calls:
            b = by_name.get(call.name)
            if b is None:
                ok, text = False, f"error: no tool named {call.name!r}; the tools are {', '.join(by_name)}"
            else:
                ok, text = _call(b, call.arguments)
                finished = finished or (ok and b.finishes)
            text = text if len(text) <= MAX_RESULT_CHARS else text[:MAX_RESULT_CHARS] + "\n…(cut)"
            results.append((call, text))
            res.calls.append({"tool": call.name, "ok": ok, "result": text[:300]})
            if on_call:
                on_call(call.name, ok, text)
        conv.add_tool_results(reply, results)
        if finished:
            res.stopped = "finished"
            return res
    res.stopped = "turn limit"
    return res
