"""Sentences the analysis writes into its report: English text (what JSON holds and the LLM reviewer reads) that
keeps its message and fields, so the human reports can show it in the chosen language."""

from __future__ import annotations

from opforge.i18n import _


def _message(template: str, fields: dict) -> Msg:
    return Msg(template, **fields)


def _joined(sep: str, parts: tuple) -> Joined:
    return Joined(sep, parts)


class Msg(str):
    """`template.format(**fields)` in English; `shown()` formats the template's translation instead."""

    template: str
    fields: dict

    def __new__(cls, template: str, **fields) -> Msg:
        self = super().__new__(cls, template.format(**fields))
        self.template, self.fields = template, fields
        return self

    def __reduce__(self):
        return _message, (self.template, self.fields)


class Joined(str):
    """Sentences or details joined by `sep`, each shown in the chosen language."""

    sep: str
    parts: tuple

    def __new__(cls, sep: str, parts) -> Joined:
        parts = tuple(parts)
        self = super().__new__(cls, sep.join(parts))
        self.sep, self.parts = sep, parts
        return self

    def __reduce__(self):
        return _joined, (self.sep, self.parts)


def shown(value):
    """`value` for people, in the current language: a Msg or Joined translated (their fields too), a list item by
    item, anything else as it is (a report read back from JSON shows its English text)."""
    if isinstance(value, Msg):
        return _(value.template).format(**{k: shown(v) for k, v in value.fields.items()})
    if isinstance(value, Joined):
        return value.sep.join(str(shown(p)) for p in value.parts)
    if isinstance(value, list):
        return [shown(v) for v in value]
    return value
