"""The helper's knowledge base: cards that say, in a developer's words, which source answers a kind of question.

Source code names things the way its authors think of them (`recompile_limit`), while a developer asks in
the words of the task ("how often may it recompile"). PyTorch's documentation bridges the two but is not
installed with the wheel. A card is that bridge, written for the topics backend developers ask about most:

    - id: recompile-limit
      asks:                      # how the question is put; matched by BM25 against the question's words
      - how many times may a function recompile before dynamo gives up and runs it eagerly
      answer: torch._dynamo.config.recompile_limit caps the compiled versions kept per code object.
      cites:                     # the passages that answer it, in the question sets' `expect` shape
      - {corpus: torch, path: torch/_dynamo/config.py, symbol: torch._dynamo.config.recompile_limit}

Cards live in `knowledge/*.yaml`, one file per topic. A card never answers by itself: it lends weight to the
passages it cites, which must still be in the index (a card citing a symbol a newer torch removed cites nothing).
`python -m opforge.skills.helper.knowledge --check INDEX` lists the cites that resolve to no passage.
"""

from __future__ import annotations

import argparse
import functools
import sqlite3
import sys
from pathlib import Path

import yaml

from opforge.errors import InputError

FOLDER = Path(__file__).with_name("knowledge")
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml reads the ~1 MB of cards in a tenth of the time


def _card_error(path: Path, n: int, what: str) -> InputError:
    return InputError(f"{path.name}: card {n + 1}", what)


def load(folder: Path = FOLDER) -> list[dict]:
    cards, seen = [], set()
    for path in sorted(folder.glob("*.yaml")):
        try:
            items = yaml.load(path.read_text(), Loader=LOADER) or []
        except yaml.YAMLError as exc:
            raise InputError(path.name, f"not YAML: {str(exc).splitlines()[0]}") from exc
        if not isinstance(items, list):
            raise InputError(path.name, "a knowledge file is a YAML list of cards {id, asks, answer, cites}")
        for n, card in enumerate(items):
            if not isinstance(card, dict) or not isinstance(card.get("id"), str):
                raise _card_error(path, n, "needs an `id`")
            asks, cites = card.get("asks"), card.get("cites")
            if not isinstance(asks, list) or not asks or not all(isinstance(a, str) for a in asks):
                raise _card_error(path, n, f"{card['id']}: `asks` must be a non-empty list of texts")
            if not isinstance(card.get("answer"), str):
                raise _card_error(path, n, f"{card['id']}: `answer` must be a text")
            if not isinstance(cites, list) or not cites or not all(
                    isinstance(c, dict) and isinstance(c.get("corpus"), str) and isinstance(c.get("path"), str)
                    for c in cites):
                raise _card_error(path, n, f"{card['id']}: `cites` must list {{corpus, path, symbol?}}")
            if card["id"] in seen:
                raise _card_error(path, n, f"{card['id']}: another card has this id")
            seen.add(card["id"])
            cards.append({**card, "topic": path.stem})
    return cards


@functools.cache
def cards() -> tuple[dict, ...]:
    return tuple(load())


@functools.cache
def _card_index() -> sqlite3.Connection:
    """The cards in an in-memory FTS5 table, built on first use (a few hundred rows: milliseconds)."""
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.execute("CREATE VIRTUAL TABLE cards USING fts5(asks, answer, tokenize='porter unicode61')")
    db.executemany("INSERT INTO cards(rowid, asks, answer) VALUES (?, ?, ?)",
                   [(n, "\n".join(c["asks"]), c["answer"]) for n, c in enumerate(cards())])
    return db


def match(words: list[str], limit: int = 5) -> list[tuple[dict, float, set[str]]]:
    """The cards whose asks and answer hold the question's words, best first: (card, BM25 score, words held)."""
    if not words or not cards():
        return []
    db = _card_index()
    term = {w: '"' + w.replace('"', "") + '"' for w in words}  # each word as one FTS5 string, stemmed as the cards
    found = []
    for rowid, score in db.execute("SELECT rowid, -bm25(cards, 3.0, 1.0) FROM cards WHERE cards MATCH ? "
                                   "ORDER BY bm25(cards, 3.0, 1.0) LIMIT ?", (" OR ".join(term.values()), limit)):
        held = {w for w in words
                if db.execute("SELECT 1 FROM cards WHERE rowid = ? AND cards MATCH ?", (rowid, term[w])).fetchone()}
        found.append((cards()[rowid], score, held))
    return found


def resolve(db: sqlite3.Connection, cite: dict) -> int | None:
    """The indexed passage a cite names: its symbol in its file, or the file's first passage."""
    if "symbol" in cite:
        row = db.execute("SELECT id FROM chunks WHERE corpus = ? AND path = ? AND symbol = ? ORDER BY line LIMIT 1",
                         (cite["corpus"], cite["path"], cite["symbol"])).fetchone()
    else:
        row = db.execute("SELECT id FROM chunks WHERE corpus = ? AND path = ? ORDER BY line LIMIT 1",
                         (cite["corpus"], cite["path"])).fetchone()
    return row[0] if row else None


def unresolved(db: sqlite3.Connection) -> list[str]:
    """Each cite that names no indexed passage, as `card: corpus path symbol`."""
    indexed = {r[0] for r in db.execute("SELECT DISTINCT corpus FROM chunks")}
    return [f"{card['id']}: {c['corpus']} {c['path']} {c.get('symbol', '')}".rstrip()
            for card in cards() for c in card["cites"]
            if c["corpus"] in indexed and resolve(db, c) is None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="check the helper's knowledge cards against an index")
    parser.add_argument("--check", type=Path, required=True, help="the helper index to resolve the cites in")
    args = parser.parse_args(argv)
    try:
        missing = unresolved(sqlite3.connect(args.check))
    except InputError as exc:
        print(f"error: {exc.where}: {exc.what}", file=sys.stderr)
        return 2
    print(f"{len(cards())} cards, {sum(len(c['cites']) for c in cards())} cites, {len(missing)} unresolved")
    for line in missing:
        print("  " + line)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
