"""The helper's index: one SQLite file in the user's cache folder, its passages searched by SQLite's FTS5.

FTS5 ranks by BM25 and ships inside Python's sqlite3: nothing to install, one file on disk, opened in
milliseconds (no model or matrix to load before the first answer), and updated in place one file at a time,
which is what an incremental index needs. Beside it an exact symbol table maps every full dotted name and its
last one or two parts to their passages, for questions that name what they ask about.

An index is rebuilt incrementally: a file whose content hash is unchanged keeps its passages. Each corpus is one
transaction, so an interrupted build leaves the index as it was before that corpus and the next run goes on.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import InputError
from opforge.skills.helper import chunks as ch
from opforge.skills.helper.corpus import File, cache_dir

SCHEMA = 1
WEIGHTS = (5.0, 3.0, 1.0)  # BM25 weights of a passage's names (symbol and path), its summary, and its text

_TABLES = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE corpora(name TEXT PRIMARY KEY, root TEXT, built REAL, seconds REAL, files INT, chunks INT);
CREATE TABLE files(corpus TEXT, path TEXT, hash TEXT, PRIMARY KEY(corpus, path));
CREATE TABLE chunks(id INTEGER PRIMARY KEY, corpus TEXT, path TEXT, symbol TEXT, kind TEXT, line INT,
                    end_line INT, names TEXT, text TEXT, summary TEXT);
CREATE INDEX chunks_file ON chunks(corpus, path);
CREATE TABLE symbols(name TEXT, chunk INT);
CREATE INDEX symbols_name ON symbols(name);
CREATE VIRTUAL TABLE fts USING fts5(names, summary, text, content='chunks', content_rowid='id',
                                    tokenize='porter unicode61');
"""


def default_path() -> Path:
    return Path(os.environ["OPFORGE_HELPER_INDEX"]) if os.environ.get("OPFORGE_HELPER_INDEX") \
        else cache_dir() / "index.sqlite"


def words(text: str) -> str:
    """A CamelCase name's words: `DeviceGuardImplInterface` as `Device Guard Impl Interface`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", text)


def symbol_keys(symbol: str, kind: str = "") -> set[str]:
    """The names a question may give a symbol by: whole, or its last one or two dotted parts; a yaml entry
    (`sum.dim_IntList`) by its operator, whose overload is no name of its own."""
    parts = symbol.lower().split(".")
    if kind == "entry":
        return {symbol.lower(), parts[0]}
    return {symbol.lower(), parts[-1], ".".join(parts[-2:])}


def create(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    if not db.execute("SELECT name FROM sqlite_master WHERE name='meta'").fetchone():
        db.executescript(_TABLES)
        db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
        db.commit()
    return db


def open_index(path: Path) -> sqlite3.Connection:
    """An index to read; a missing, foreign or corrupt one is the user's to rebuild (exit 2)."""
    if not path.is_file():
        raise InputError(str(path), "no helper index here: build it with `opforge helper index`")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        schema = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        db.execute("SELECT count(*) FROM fts WHERE fts MATCH 'torch'").fetchone()
    except sqlite3.DatabaseError as exc:
        if "locked" in str(exc):
            raise InputError(str(path), "the helper index is being built by another process: ask again when it "
                                        "is done") from exc
        raise InputError(str(path), f"the helper index is corrupt ({exc}): delete it and run "
                                    "`opforge helper index` again") from exc
    if schema is None or schema[0] != str(SCHEMA):
        raise InputError(str(path), "the helper index is of another version: run `opforge helper index` again")
    return db


@dataclass
class Built:
    corpus: str
    files: int
    changed: int
    removed: int
    chunks: int
    seconds: float


def _delete(db: sqlite3.Connection, corpus: str, path: str) -> None:
    db.execute("INSERT INTO fts(fts, rowid, names, summary, text) "
               "SELECT 'delete', id, names, summary, text FROM chunks WHERE corpus=? AND path=?", (corpus, path))
    db.execute("DELETE FROM symbols WHERE chunk IN (SELECT id FROM chunks WHERE corpus=? AND path=?)", (corpus, path))
    db.execute("DELETE FROM chunks WHERE corpus=? AND path=?", (corpus, path))


def _insert(db: sqlite3.Connection, corpus: str, path: str, passages: list[ch.Chunk]) -> None:
    for c in passages:
        names = f"{c.symbol} {words(c.symbol)} {path}"  # the name as written and as words
        cur = db.execute("INSERT INTO chunks(corpus, path, symbol, kind, line, end_line, names, text, summary) "
                         "VALUES (?,?,?,?,?,?,?,?,?)",
                         (corpus, path, c.symbol, c.kind, c.line, c.end_line, names, c.text, c.summary))
        db.execute("INSERT INTO fts(rowid, names, summary, text) VALUES (?,?,?,?)",
                   (cur.lastrowid, names, c.summary, c.text))
        db.executemany("INSERT INTO symbols VALUES (?,?)",
                       [(k, cur.lastrowid) for k in symbol_keys(c.symbol, c.kind)])


def build(db: sqlite3.Connection, corpus: str, root: str, files: Iterable[File],
          progress: Callable[[str], None] | None = None) -> Built:
    """Bring one corpus up to date: new and changed files chunked again, vanished ones dropped."""
    start = time.perf_counter()
    known = dict(db.execute("SELECT path, hash FROM files WHERE corpus=?", (corpus,)).fetchall())
    seen, changed = set(), 0
    with db:
        for f in files:
            seen.add(f.path)
            digest = hashlib.sha1(f.data).hexdigest()
            if progress:
                progress(f.path)
            if known.get(f.path) == digest:
                continue
            changed += 1
            if f.path in known:  # a changed file's old passages go; a new file has none
                _delete(db, corpus, f.path)
            _insert(db, corpus, f.path, ch.chunk(f.path, f.data.decode("utf-8", "replace")))
            db.execute("INSERT OR REPLACE INTO files VALUES (?,?,?)", (corpus, f.path, digest))
        gone = set(known) - seen
        for path in gone:
            _delete(db, corpus, path)
            db.execute("DELETE FROM files WHERE corpus=? AND path=?", (corpus, path))
        count = db.execute("SELECT count(*) FROM chunks WHERE corpus=?", (corpus,)).fetchone()[0]
        seconds = time.perf_counter() - start
        db.execute("INSERT OR REPLACE INTO corpora VALUES (?,?,?,?,?,?)",
                   (corpus, root, time.time(), seconds, len(seen), count))
    return Built(corpus, len(seen), changed, len(gone), count, round(seconds, 1))


def corpora(db: sqlite3.Connection) -> dict[str, dict]:
    rows = db.execute("SELECT name, root, built, seconds, files, chunks FROM corpora").fetchall()
    return {r[0]: {"root": r[1], "built": r[2], "seconds": r[3], "files": r[4], "chunks": r[5]} for r in rows}
