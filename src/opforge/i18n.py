"""The language of human-facing text: reports, summaries and messages. Machine-readable keys and JSON stay English.

Messages are marked in the code with `_()` (or `ngettext()` when a count picks the form, `N_()` for a constant
translated where it is used) and their translations live in gettext catalogs, one `.po` file per part of the
product under `opforge/locale/<lang>/`. The catalogs are read with Babel (the maintained Python gettext tool
chain: it also extracts the marked messages, which is how `tests/test_i18n.py` finds any without a translation)
and served by the standard library's `gettext`. English is the source text: with `en`, `_()` returns its argument.

A message is a `str.format` template with named fields, never an f-string, so that the catalog holds one entry per
sentence and a translation may move the fields around: `_("{n} cases pass").format(n=n)`.

The language is chosen by `--lang`, else `OPFORGE_LANG`, else English; a workspace keeps the one it was created
with, so a resumed run writes the same language.
"""

from __future__ import annotations

import contextlib
import gettext
import io
import os
import re
from functools import lru_cache
from pathlib import Path

from opforge.errors import InputError

LANGUAGES = ("en", "zh")
LOCALE_DIR = Path(__file__).parent / "locale"
_current: str | None = None  # None: not chosen yet, OPFORGE_LANG decides at first use


def check_language(lang: str, where: str = "--lang") -> str:
    """`lang` normalised ("zh_CN", "zh-Hans" and "zh.UTF-8" are "zh"); InputError naming `where` for a language
    with no catalog."""
    base = re.split(r"[-_.@]", lang.strip())[0].lower()
    if base not in LANGUAGES:
        raise InputError(where, f"unknown language {lang!r}: expected one of {', '.join(LANGUAGES)}")
    return base


def language() -> str:
    global _current
    if _current is None:
        env = os.environ.get("OPFORGE_LANG", "").strip()
        _current = check_language(env, "OPFORGE_LANG") if env else "en"
    return _current


def set_language(lang: str | None) -> str:
    """Choose the language for what follows; None keeps the current one (OPFORGE_LANG's, by default)."""
    global _current
    if lang is not None:
        _current = check_language(lang)
    return language()


@contextlib.contextmanager
def using(lang: str | None):
    """The language `lang` inside the block (None: unchanged), the previous one after it."""
    before = language()
    set_language(lang)
    try:
        yield language()
    finally:
        set_language(before)


def catalog_files(lang: str) -> list[Path]:
    return sorted((LOCALE_DIR / lang).glob("*.po"))


@lru_cache(maxsize=None)
def translations(lang: str) -> gettext.NullTranslations:
    """All of `lang`'s catalogs merged into one gettext translation (compiled in memory, so the `.po` files are
    the only copy). English has none."""
    if lang == "en":
        return gettext.NullTranslations()
    from babel.messages.catalog import Catalog
    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po

    merged = Catalog(locale=lang)
    for path in catalog_files(lang):
        with open(path, "rb") as fh:
            for message in read_po(fh, locale=lang):
                if message.id and message.string and not message.fuzzy:
                    merged[message.id] = message
    buf = io.BytesIO()
    write_mo(buf, merged)
    buf.seek(0)
    return gettext.GNUTranslations(buf)


def _(message: str) -> str:
    return translations(language()).gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    return translations(language()).ngettext(singular, plural, n)


def N_(message: str) -> str:
    """Marks a constant for the catalog; it is translated where it is shown, with `_()`."""
    return message


# -- the catalogs' upkeep: which messages the code marks, and which catalog holds each --------------------------

KEYWORDS = {"_": None, "N_": None, "ngettext": (1, 2)}
PACKAGE = Path(__file__).parent
# Human text that lives in data files, by file: the keys whose values people read (each value of a mapping under
# such a key, too). The catalogs hold them as if the code marked them; the code shows one with `_(value)`, or keeps
# it as the template of a Msg.
DATA_TEXTS = {"skills/graph_diagnose/signatures.yaml": ("advice",), "skills/test_triage/rules.yaml": ("why",),
              "skills/helper/routes.yaml": ("why",), "skills/ci_fix/whitelist.yaml": ("ruff_rules",)}


def part_of(relpath: str) -> str:
    """The catalog a source file's messages go to: `skills/<skill>/…` → `<skill>`, `<package>/…` → `<package>`,
    a top-level module → `opforge`."""
    parts = Path(relpath).parts
    if parts[0] == "skills" and len(parts) > 2:
        return parts[1]
    return parts[0] if len(parts) > 1 else "opforge"


def data_texts(path: Path, keys: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, text) of every string in the YAML file under one of `keys`."""
    import yaml

    found = []

    def walk(node, wanted: bool) -> None:
        if isinstance(node, yaml.ScalarNode):
            if wanted and node.value:
                found.append((node.start_mark.line + 1, node.value))
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                walk(value, wanted or key.value in keys)
        elif isinstance(node, yaml.SequenceNode):
            for value in node.value:
                walk(value, wanted)

    walk(yaml.compose(path.read_text()), False)
    return found


def extract_messages() -> dict[str, dict[str | tuple[str, str], list[tuple[str, int]]]]:
    """{catalog: {message: [(file, line), ...]}} for every message the package marks (Babel's extractor) and every
    text of DATA_TEXTS."""
    from babel.messages.extract import extract_from_dir

    found: dict[str, dict] = {}
    for filename, lineno, message, _comments, _context in extract_from_dir(
            str(PACKAGE), method_map=[("**.py", "python")], keywords=KEYWORDS, comment_tags=()):
        if isinstance(message, tuple):
            message = message[:2]
        found.setdefault(part_of(filename), {}).setdefault(message, []).append((filename, lineno))
    for rel, keys in DATA_TEXTS.items():
        for lineno, text in data_texts(PACKAGE / rel, keys):
            found.setdefault(part_of(rel), {}).setdefault(text, []).append((rel, lineno))
    return found


def read_catalog(path: Path, lang: str):
    from babel.messages.pofile import read_po

    with open(path, "rb") as fh:
        return read_po(fh, locale=lang)


def sync_catalogs(lang: str, parts: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Bring `lang`'s catalogs (all, or those named in `parts`) in line with the code: a new message gets an empty
    entry to translate, one the code no longer marks is dropped, translations are kept. Locations name the file
    without a line, so moving code does not touch the catalog. Returns {catalog: {"added", "dropped",
    "untranslated"}}."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    from opforge.workspace.atomic import write_bytes_atomic

    summary = {}
    folder = LOCALE_DIR / lang
    folder.mkdir(parents=True, exist_ok=True)
    for part, messages in sorted(extract_messages().items()):
        if parts and part not in parts:
            continue
        path = folder / f"{part}.po"
        old = read_catalog(path, lang) if path.exists() else Catalog(locale=lang)
        new = Catalog(locale=lang, domain=part, project="opforge", version="0.1", fuzzy=False,
                      header_comment=f"# opforge's messages from {part}, in {lang}",
                      creation_date=old.creation_date, revision_date=old.creation_date)
        for msgid, where in messages.items():
            kept = old.get(msgid)
            string = kept.string if kept is not None else ("",) * new.num_plurals if isinstance(msgid, tuple) else ""
            new.add(msgid, string, locations=[(f"opforge/{f}", n) for f, n in where],
                    flags=("python-brace-format",))
        added = sum(1 for m in messages if old.get(m) is None)
        dropped = sum(1 for m in old if m.id and m.id not in messages)
        untranslated = sum(1 for m in new if m.id and not (all(m.string) if isinstance(m.string, tuple)
                                                           else m.string))
        buf = io.BytesIO()
        write_po(buf, new, width=120, sort_output=True, include_lineno=False)
        write_bytes_atomic(path, buf.getvalue())
        summary[part] = {"added": added, "dropped": dropped, "untranslated": untranslated}
    return summary


# -- text kept in English where it is stored, shown in the reader's language --------------------------------------

class Msg(str):
    """A sentence a skill stores in its JSON results (English there, for machines and for models to read) and shows
    in its reports in the chosen language: the English `template.format(**fields)`, remembering the template (marked
    with `N_()` where it is written) and its fields, which may be Msg themselves."""

    template: str
    fields: dict

    def __new__(cls, template: str, /, **fields) -> Msg:
        self = super().__new__(cls, template.format(**fields))
        self.template, self.fields = template, fields
        return self

    def __reduce__(self):  # a copy or a pickle (a worker process's result) keeps the template
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


def _message(template: str, fields: dict) -> Msg:
    return Msg(template, **fields)


def _joined(sep: str, parts: tuple) -> Joined:
    return Joined(sep, parts)


def shown(value):
    """`value` for people, in the current language: a Msg or Joined translated (their fields too), a list item by
    item, anything else as it is (an error message, a name, a report read back from JSON shows its English)."""
    if isinstance(value, Msg):
        return _(value.template).format(**{k: shown(v) for k, v in value.fields.items()})
    if isinstance(value, Joined):
        return value.sep.join(str(shown(p)) for p in value.parts)
    if isinstance(value, list):
        return [shown(v) for v in value]
    return value
