"""A model's answer held to the retrieved passages: it sees only them, numbered, must cite [n] for every claim,
and answers NO SUPPORT when none supports one. An answer that cites nothing, or a number it was not given, is
not passed on: the passages' own answer stands, with the reason. Retrieval that found no support never asks
the model (it cannot refuse better than the support check, and could invent).
"""

from __future__ import annotations

import re

from opforge.i18n import _, language
from opforge.llm.config import LlmConfig
from opforge.llm.providers import LlmError, open_conversation

SYSTEM = """You answer a PyTorch backend developer's question from the numbered source passages you are given,
and from nothing else. Cite every claim with the number of the passage that supports it, as [1] or [2][3].
Name files and lines as the passages give them. Keep the answer short: a few sentences and, where it helps,
a code snippet taken from or directly built on a passage. If no passage supports an answer, reply exactly
NO SUPPORT and nothing more."""
REFUSAL = "NO SUPPORT"
WRITE_IN = {"zh": "Write the answer in Simplified Chinese; keep code, names, files and the passage numbers as they "
                  "are."}


def prompt(question: str, citations: list[dict]) -> str:
    blocks = [f"Question: {question}", ""]
    for n, c in enumerate(citations, 1):
        blocks.append(f"[{n}] {c['corpus']}: {c['path']}:{c['line']}-{c['end_line']} {c['symbol']}")
        blocks.append(c["snippet"])
        blocks.append("")
    return "\n".join(blocks)


def answer(cfg: LlmConfig, question: str, citations: list[dict]) -> dict:
    """{"answer", "cited": [n...], "refused"} from the model, or {"error"} when its answer is not grounded."""
    conv = open_conversation(cfg, " ".join([SYSTEM, WRITE_IN.get(language(), "")]).strip())
    conv.add_user(prompt(question, citations))
    try:
        text = conv.send([]).text.strip()
    except LlmError as exc:
        return {"error": f"the model failed: {exc}"}
    if text.startswith(REFUSAL):
        return {"answer": _("The model found no support for an answer in the retrieved passages."), "cited": [],
                "refused": True}
    cited = sorted({int(n) for n in re.findall(r"\[(\d+)\]", text)})
    if not cited:
        return {"error": "the model's answer cites no passage"}
    stray = [n for n in cited if not 1 <= n <= len(citations)]
    if stray:
        return {"error": f"the model's answer cites passages it was not given: {stray}"}
    return {"answer": text, "cited": cited, "refused": False}
