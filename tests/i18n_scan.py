"""Reading a translated report: its figures, and any English sentence left in it.

Code (fenced blocks, `inline`), YAML front matter, links and paths are not prose and are skipped. Prose is English
when it holds a run of three or more English words: identifiers (float32, grad_x, BLOCKED_API) are not words."""

from __future__ import annotations

import re
from collections import Counter

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_FRONT = re.compile(r"\A---\n.*?\n---\n", re.S)
_INLINE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\([^)]*\)|https?://\S+|\S+/\S+")
# a word ends a sentence before "." but not before ".attr" (torch.compile's "torch" is not a word of prose)
_WORDS = re.compile(r"(?<![\w.])[A-Za-z]{2,}(?:[ ,;:'()\-]+[A-Za-z]{2,}){2,}(?!\w|\.\w)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def prose(text: str) -> str:
    text = _FRONT.sub("", text)
    text = _FENCE.sub("", text)
    text = _INLINE.sub(" ", text)
    return _LINK.sub(" ", text)


def english_sentences(text: str, allowed: tuple[str, ...] = ()) -> list[str]:
    """Runs of three or more English words in the prose of `text`, less those inside an `allowed` phrase
    (the user's own words: a request's description, an operator's name)."""
    body = prose(text)
    for phrase in allowed:
        body = body.replace(phrase, " ")
    return [m.group(0) for m in _WORDS.finditer(body)]


def figures(text: str) -> Counter:
    """Every number in `text`, counted: a translation shows the same figures, in whatever order."""
    return Counter(_NUMBER.findall(text.replace(",", "")))
