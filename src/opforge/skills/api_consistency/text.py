"""A diagnosis's phrases joined into one: its conclusion, evidence and timeline are stored in result.json in
English and shown in analysis.md, repro.md and the printed verdicts in the language chosen with --lang
(`opforge.i18n.Msg`, `shown`)."""

from __future__ import annotations

from opforge.i18n import N_, Msg


def join(items: list, sep: str = ", ") -> Msg | str:
    """A list of phrases in one phrase: "a, b, c" (`sep` ", "), or "a; b; c" (`sep` "; ")."""
    if not items:
        return ""
    template = {", ": N_("{items}, {item}"), "; ": N_("{items}; {item}")}[sep]
    out = items[0]
    for item in items[1:]:
        out = Msg(template, items=out, item=item)
    return out
