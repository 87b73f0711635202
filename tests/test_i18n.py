"""The translation catalogs: every message the code marks has a Chinese translation with the same fields, no
catalog keeps a message the code dropped, and the language is chosen by --lang / OPFORGE_LANG."""

from __future__ import annotations

import string

import pytest

from opforge import i18n
from opforge.errors import InputError


def _fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


def _strings(message) -> list[str]:
    return list(message.string) if isinstance(message.string, tuple) else [message.string]


@pytest.fixture(scope="module")
def marked():
    return i18n.extract_messages()


def test_every_marked_message_has_a_translation_with_the_same_fields(marked):
    assert marked, "no message is marked for translation"
    problems = []
    for part, messages in marked.items():
        path = i18n.LOCALE_DIR / "zh" / f"{part}.po"
        catalog = i18n.read_catalog(path, "zh") if path.exists() else None
        for msgid, where in messages.items():
            entry = catalog.get(msgid) if catalog is not None else None
            first = f"{where[0][0]}:{where[0][1]}"
            if entry is None or not all(_strings(entry)) or entry.fuzzy:
                problems.append(f"{first}: no translation in zh/{part}.po: {msgid!r}")
                continue
            source = msgid if isinstance(msgid, str) else msgid[1]
            for text in _strings(entry):
                if _fields(text) != _fields(source):
                    problems.append(f"{first}: zh/{part}.po changes the fields of {source!r}: {text!r}")
    assert not problems, ("run `.venv/bin/python scripts/i18n_sync.py` and translate:\n" + "\n".join(problems))


def test_no_catalog_keeps_a_message_the_code_no_longer_marks(marked):
    stale = []
    for path in i18n.catalog_files("zh"):
        used = marked.get(path.stem, {})
        stale += [f"{path.name}: {m.id!r}" for m in i18n.read_catalog(path, "zh") if m.id and m.id not in used]
    assert not stale, "run `.venv/bin/python scripts/i18n_sync.py`:\n" + "\n".join(stale)


def test_a_message_shared_by_two_catalogs_reads_the_same_in_both():
    seen: dict = {}
    clashes = []
    for path in i18n.catalog_files("zh"):
        for m in i18n.read_catalog(path, "zh"):
            if m.id and m.string:
                first = seen.setdefault(m.id, (path.name, m.string))
                if first[1] != m.string:
                    clashes.append(f"{m.id!r}: {first[0]} {first[1]!r} vs {path.name} {m.string!r}")
    assert not clashes, "\n".join(clashes)


def test_the_language_comes_from_the_option_then_the_environment(monkeypatch):
    monkeypatch.setattr(i18n, "_current", None)
    monkeypatch.setenv("OPFORGE_LANG", "zh_CN.UTF-8")
    assert i18n.language() == "zh"
    assert i18n._("Fusion plan") != "Fusion plan"
    with i18n.using("en"):
        assert i18n._("Fusion plan") == "Fusion plan"
    assert i18n.language() == "zh"
    with pytest.raises(InputError, match="--lang: unknown language 'fr'"):
        i18n.set_language("fr")
    monkeypatch.setattr(i18n, "_current", None)
    monkeypatch.setenv("OPFORGE_LANG", "klingon")
    with pytest.raises(InputError, match="OPFORGE_LANG: unknown language"):
        i18n.language()


def test_every_translation_call_takes_text_the_extractor_can_see():
    """`_(f"...")` or `_("a" + b)` has no catalog entry to find, and a `_()` inside an f-string is one token to the
    extractor (before Python 3.12): either would show English in a Chinese report without any test noticing.
    (`_(NAME)` is how a constant marked with `N_()` where it is defined is shown.)"""
    import ast

    problems = []
    for path in sorted(i18n.PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        inside_fstring = {id(n) for f in ast.walk(tree) if isinstance(f, ast.JoinedStr) for n in ast.walk(f)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("_", "N_", "ngettext")):
                continue
            where = f"{path.relative_to(i18n.PACKAGE)}:{node.lineno}"
            literal = node.args[:2] if node.func.id == "ngettext" else node.args[:1]
            if not literal or any(isinstance(a, (ast.JoinedStr, ast.BinOp)) or isinstance(a, ast.Constant)
                                  and not isinstance(a.value, str) for a in literal):
                problems.append(f"{where}: {node.func.id}() of an f-string or an expression built at run time")
            elif id(node) in inside_fstring and isinstance(literal[0], ast.Constant):
                problems.append(f"{where}: {node.func.id}() inside an f-string, where the extractor cannot see it")
    assert not problems, "\n".join(problems)
