"""`opforge helper ask`: a question in, ranked citations and a short answer out.

  route     an error message or log in the question names the skill that diagnoses it (routes.yaml)
  knowledge the knowledge base's cards whose asks hold the question's words lend weight to the passages they cite
            (knowledge.py: the bridge from a developer's words to the source's names)
  symbols   names the question gives (`rename_privateuse1_backend`, `Library.impl`, `add.Tensor`, GB0042) looked up
            in the exact symbol table
  search    the question's words, BM25-ranked over each passage's names and text (FTS5)
  support   a passage supports the question when it holds the words that carry most of its weight (by inverse
            document frequency): a question whose rare words no passage holds is answered "nothing supports it"
  answer    the best passages' own summaries, each with its file and line; with a model configured, the model
            writes the answer from those passages alone and may refuse
"""

from __future__ import annotations

import functools
import math
import re
import sqlite3
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from opforge.i18n import _
from opforge.skills.helper import knowledge
from opforge.skills.helper.chunks import module_name
from opforge.skills.helper.index import WEIGHTS

SUPPORT = 0.3  # the share of the question's word weight the best passage must hold
UNHEARD_SUPPORT = 0.4  # ... when a question word is one no source and no card uses: the passage alone vouches
PLACEHOLDER = r"my\w+|\w*foo\w*"  # the user's own names: torch.mydev, TestFooCUDA
CANDIDATES = 200  # passages BM25 hands to the reranking
CORPUS_NAMED = {  # a question that names a corpus asks about it: torch_npu's own code over torch's, and so on
    "torch-npu": r"torch[_-]npu|\bnpu\b|ascend|hccl|torchair",
    "opforge": r"opforge|test-triage|graph-diagnose|graph diagnose|api-consistency|op-adapt|ci-fix|pr-analysis",
}
ASKED_CORPUS = 2.5
UNASKED_BACKEND = 0.6  # torch-npu's passages in answer to a question that names no backend: upstream's question
ASKED_KIND = [  # what a question asks for by its words: a setting, a class, a yaml entry
    (r"\b(setting|config|configuration|flag|option)s?\b", "setting"),
    (r"\b(base )?class(es)?\b", "class"),
    (r"\b(yaml|schema|overload)\b", "entry"),
]
ASKED = 1.4
# the registry's hints hold every compile word: its entries answer a question about a graph break, not any other
GRAPH_BREAK_ASKED = r"graph.?break|\bGB\d+|\bsays\b|\breports\b|stopped tracing|Unsupported"
UNASKED = 0.6
UNDOCUMENTED = 0.6  # a passage with no docstring or comment of its own is rarely the API asked about
NATIVE = " AND c.path LIKE '%native_functions.yaml'"
KNOWN = 1.0  # the best matching card's bonus to the passages it cites, as a share of the best passage's score
CARD_POOL = 20  # cards BM25 finds for a question, reranked by the share of its word weight they hold ...
CARD_SHARE = 0.5  # ... raised to this power
CARDS = 5  # cards weighed per question; each lends in proportion to its reranked score against the best card's
CARD_NEAR = 0.6  # cards scoring below this share of the best card's lend nothing
CARD_HELD = 0.2  # the share of the question's word weight a card must hold to lend anything
CARD_SURE = 0.3  # ... and to vouch that the question is supported
KEY_BELOW = 0.35  # a first passage holding this much of the question is not asked to hold its rarest words too
BACKEND_RARE = 2  # a question naming torch_npu whose this many rarest words no torch_npu source holds is refused
QUOTE_RUN = 3  # the fewest words of quoted error text that are looked up as a phrase
KEY_WORDS = 3  # the question's rarest words, one of which the first citation (or a card citing it) must hold
CARD_TRUSTED = 0.4  # a card citing the first passage that holds this much of it vouches for its subject too
CARD_FULL = 0.7  # a card holding less of the question's word weight than this lends in proportion
CITE_DECAY = 0.8  # a card's later cites are its secondary answers: each lends this much of the one before
SURE, MENTIONED = 0.6, 0.15  # an exact name's bonus, as a share of the best BM25 score: asked about, or mentioned
STOP = set("""a an and are as at be by can do does for from how i if in into is it its my of on or should so that the
their then there these this to use used using via was we what when where which who why will with without you your
me about get set make does doesn done any some one way there here tell show give gives need want work works
""".split())
KIND_BONUS = {"function": 1.0, "class": 1.0, "setting": 0.8, "entry": 1.0, "graph-break": 1.0, "section": 0.9,
              "module": 0.9}


@dataclass
class Citation:
    corpus: str
    path: str
    line: int
    end_line: int
    symbol: str
    kind: str
    snippet: str
    summary: str
    score: float


@functools.cache
def routes() -> list[dict]:
    return yaml.safe_load((Path(__file__).with_name("routes.yaml")).read_text())


def route(question: str) -> dict | None:
    for r in routes():
        pattern = r["pattern"] if isinstance(r["pattern"], str) else "|".join(r["pattern"])
        m = re.search(pattern, question)
        if m:
            command = r["command"]
            for key, value in m.groupdict().items():
                if value:
                    command = command.replace(key.upper(), value.removeprefix("aten::"))
            return {"skill": r["skill"], "command": command, "why": r["why"], "matched": m.group(0)[:120]}
    return None


def identifiers(question: str) -> list[tuple[str, float]]:
    """What the question names, with how surely it asks about it: backticked text and `aten::op` surely, dotted,
    snake_case and CamelCase names and GB ids less (a question mentions `torch.compile` in passing)."""
    found = [(t.split("(")[0].strip(), SURE) for t in re.findall(r"`([^`]+)`", question)]  # a call: its name
    said = re.search(r"\b(\w+) overload\b", question)  # "(dim_IntList overload)", "in its self overload"
    for m in re.finditer(r"aten::(\w+)(\.\w+)?", question):
        overload = m.group(2) or (f".{said.group(1)}" if said and said.group(1) not in ("default", "its", "the")
                                  else "")
        found.append(("aten::" + m.group(1) + overload, SURE))
        if re.search(r"\bout=|\bout variant", question) and not m.group(2):
            found.append(("aten::" + m.group(1) + ".out", SURE))  # an op's out= variant is its .out overload
    for token in re.findall(r"(?<!::)\b[A-Za-z_][\w.]*\w", question):
        if "_" in token or "." in token or re.search(r"[a-z][A-Z]", token) or re.fullmatch(r"GB\d+", token):
            found.append((token, MENTIONED))
    return found


def question_words(question: str) -> list[str]:
    out = []
    for w in re.findall(r"[A-Za-z][A-Za-z0-9]+|\d+", question):
        w = w.lower()
        if w not in STOP and w not in out:
            out.append(w)
    return out


def _quoted(question: str) -> list[list[str]]:
    """The runs of words of the error text a question quotes (in single or double quotes), split where the user's
    own names stand, since the source printed a placeholder there: "Invalid device, must be foo device" ->
    [Invalid, device, must, be]."""
    runs = []
    for m in re.finditer(r"\"([^\"]{12,})\"|(?<!\w)'([^']{12,})'(?!\w)", question):
        run: list[str] = []
        for w in re.findall(r"[A-Za-z0-9]+", m.group(1) or m.group(2)) + ["foo"]:  # a last name ends the last run
            if re.fullmatch(PLACEHOLDER, w.lower()):
                runs += [run] if len(run) >= QUOTE_RUN else []
                run = []
            else:
                run.append(w)
    return runs


def _private(symbol: str, path: str) -> bool:
    """A Python symbol whose own name, or its class's, starts with `_` (dunder methods are public)."""
    if not path.endswith(".py"):
        return False
    own = symbol.removeprefix(module_name(path)).strip(".")
    return any(part.startswith("_") and not part.endswith("__") for part in own.split(".") if part)


def _fts(word: str) -> str:
    return '"' + word.replace('"', "") + '"'


def _row(r) -> Citation:
    corpus, path, line, end, symbol, kind, text, summary = r[:8]
    return Citation(corpus, path, line, end, symbol, kind, "\n".join(text.splitlines()[:12]), summary, 0.0)


_COLUMNS = "c.corpus, c.path, c.line, c.end_line, c.symbol, c.kind, c.text, c.summary, c.id"


def _spelled(db: sqlite3.Connection, name: str, outside: str = "") -> bool:
    """Whether a source (but not corpus `outside`) defines `name` or spells it out, in code, a comment or a
    docstring."""
    return (db.execute("SELECT 1 FROM symbols s JOIN chunks c ON c.id = s.chunk WHERE s.name = ? AND c.corpus != ? "
                       "LIMIT 1", (name.lower(), outside)).fetchone() is not None
            or db.execute("SELECT 1 FROM fts CROSS JOIN chunks c ON c.id = fts.rowid WHERE fts MATCH ? "
                          "AND c.corpus != ? LIMIT 1",
                          (_fts(name.strip("_").replace("_", " ")), outside)).fetchone() is not None)


def _made_up(db: sqlite3.Connection, ident: str, quoted: bool = False) -> bool:
    """An API the question names that no source defines or mentions: `torch.npu.flux_capacitor_sync`, an option
    `npu_kv_offload_policy`, an environment variable. Only a many-word name counts: `torch.mydev` is how users write
    their own device's module, and `my_op` their own operator; a two-word name counts when the question quotes it."""
    root, dot, _rest = ident.partition(".")
    last = ident.rsplit(".", 1)[-1]
    name = last.strip("_")
    if re.search(PLACEHOLDER, name.lower()):
        return False
    if ident.startswith("torch.npu."):
        # torch.npu is torch_npu's device module: what it offers, torch_npu defines (torch.cuda's names do not count)
        return db.execute("SELECT 1 FROM symbols s JOIN chunks c ON c.id = s.chunk WHERE s.name = ? "
                          "AND c.corpus = 'torch-npu' LIMIT 1", (last.lower(),)).fetchone() is None
    if re.fullmatch(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+", ident):  # an environment variable or a macro
        return not _spelled(db, ident)
    if root in ("torch", "torch_npu") and dot and "_" in name:  # opforge's docs name made-up APIs as examples
        return not _spelled(db, last, outside="opforge")
    if "." in ident or name.count("_") < (1 if quoted else 2) or not re.fullmatch(r"[a-z0-9_]+", name):
        return False
    return not _spelled(db, last)


def _lacking(db: sqlite3.Connection, idf: dict[str, float], heard: list[str], own_names: set[str]) -> list[str]:
    """The rarest words of a question about torch_npu, when no torch_npu source holds any of them: it asks for
    something torch_npu lacks (another device's feature, hardware the code never touches). Numbers say little.
    `heard` keeps the question's order, so words as rare as each other are taken the same way every run."""
    rarest = sorted((w for w in heard if w not in own_names and not w.isdigit()), key=lambda w: -idf[w])[:BACKEND_RARE]
    # CROSS JOIN keeps SQLite from walking every torch_npu passage to test it against the word
    held = [w for w in rarest if db.execute("SELECT 1 FROM fts CROSS JOIN chunks c ON c.id = fts.rowid WHERE "
                                          "fts MATCH ? AND c.corpus = 'torch-npu' LIMIT 1", (_fts(w),)).fetchone()]
    return rarest if len(rarest) == BACKEND_RARE and not held else []


def _prior(symbol: str, path: str, kind: str, summary: str) -> float:
    """How likely a passage is what a developer asks for, before reading it: public API over private helpers,
    documented code over undocumented, code over tests."""
    weight = KIND_BONUS.get(kind, 1.0)
    if _private(symbol, path):
        weight *= 0.7
    if not summary:
        weight *= UNDOCUMENTED
    if "/tests/" in path or path.rsplit("/", 1)[-1].startswith("test_") or symbol.rsplit(".", 1)[-1].startswith("test"):
        weight *= 0.6
    return weight


def search(db: sqlite3.Connection, question: str, k: int = 5, corpora: list[str] | None = None) -> dict:
    """The k best passages for a question, whether any supports it, and the route of an error in it."""
    where = f" AND c.corpus IN ({','.join('?' * len(corpora))})" if corpora else ""
    params = list(corpora or [])
    words = question_words(question)
    own_names = {w for w in words if re.fullmatch(PLACEHOLDER, w)}
    total = db.execute("SELECT count(*) FROM chunks").fetchone()[0] or 1
    idf, unheard, heard = {}, [], []
    for w in words:
        df = db.execute("SELECT count(*) FROM fts WHERE fts MATCH ?", (_fts(w),)).fetchone()[0]
        idf[w] = math.log((total - df + 0.5) / (df + 0.5) + 1)
        if df:
            heard.append(w)
        if not df and w not in own_names and not knowledge.match([w], 1):
            unheard.append(w)

    bm25: dict[int, float] = {}
    rows: dict[int, tuple] = {}
    match = " OR ".join(_fts(w) for w in words)
    if match:
        for r in db.execute(f"SELECT {_COLUMNS}, -bm25(fts, ?, ?, ?) FROM fts JOIN chunks c ON c.id = fts.rowid "
                            f"WHERE fts MATCH ?{where} ORDER BY bm25(fts, ?, ?, ?) LIMIT ?",
                            [*WEIGHTS, match, *params, *WEIGHTS, CANDIDATES]):
            rows[r[8]], bm25[r[8]] = r, r[9]
    top = max(bm25.values(), default=1.0)

    bonus: dict[int, float] = {}
    named = identifiers(question)
    asked: set[int] = set()  # passages the question names outright: `Library.impl`, aten::mul.out
    for ident, sure in named:
        op = ident.startswith("aten::")  # an ATen operator is declared in native_functions.yaml, nowhere else
        for r in db.execute(f"SELECT {_COLUMNS} FROM symbols s JOIN chunks c ON c.id = s.chunk "
                            f"WHERE s.name = ?{where}{NATIVE if op else ''} LIMIT 20",
                            [ident.removeprefix("aten::").lower(), *params]):
            rows.setdefault(r[8], r)
            bonus[r[8]] = max(bonus.get(r[8], 0.0), sure * top)
            if sure == SURE and re.fullmatch(r"[\w.:]+", ident) and re.search(r"[_.:]|[a-z][A-Z]", ident):
                asked.add(r[8])
    for phrase in _quoted(question):  # quoted error text: passages that hold it whole
        query = '"' + " ".join(phrase) + '"'
        for r in db.execute(f"SELECT {_COLUMNS} FROM fts JOIN chunks c ON c.id = fts.rowid WHERE fts MATCH ?{where} "
                            "LIMIT 20", [query, *params]):
            rows.setdefault(r[8], r)
            bonus[r[8]] = bonus.get(r[8], 0.0) + SURE * top
    known_cards, vouched, lent = [], False, {}
    weight = sum(idf.values())
    # BM25 over the cards weighs a word by how rare it is among cards ("own" is), the share of the question's word
    # weight a card holds by how rare it is in the sources: a card must do well on both
    held_share = [(card, score, held, sum(idf[w] for w in held) / weight if weight else 0.0)
                  for card, score, held in knowledge.match(words, CARD_POOL)]
    cards = sorted(((c, score * share ** CARD_SHARE, held, share) for c, score, held, share in held_share),
                   key=lambda x: -x[1])[:CARDS]
    for card, score, held, share in cards:
        cited = [i for i in (knowledge.resolve(db, c) for c in card["cites"] if not corpora or c["corpus"] in corpora)
                 if i is not None]
        if score < CARD_NEAR * cards[0][1] or share < CARD_HELD or not cited:
            continue
        vouched |= share >= CARD_SURE
        known_cards.append({"card": card, "cites": cited, "held": held, "share": share})
        for n, i in enumerate(cited):
            lent[i] = lent.get(i, 0.0) + score / cards[0][1] * CITE_DECAY ** n * min(1.0, share / CARD_FULL)
        marks = ",".join("?" * len(cited))
        for r in db.execute(f"SELECT {_COLUMNS} FROM chunks c WHERE c.id IN ({marks})", cited):
            rows.setdefault(r[8], r)
    missing = [i for i in rows if i not in bm25]
    if missing and match:
        marks = ",".join("?" * len(missing))
        for rowid, score in db.execute(f"SELECT rowid, -bm25(fts, ?, ?, ?) FROM fts WHERE fts MATCH ? AND rowid IN "
                                       f"({marks})", [*WEIGHTS, match, *missing]):
            bm25[rowid] = score

    named_corpora = {c for c, pattern in CORPUS_NAMED.items() if re.search(pattern, question, re.I)}
    asked_kinds = {kind for pattern, kind in ASKED_KIND if re.search(pattern, question, re.I)}
    unasked = set() if re.search(GRAPH_BREAK_ASKED, question, re.I) else {"graph-break"}
    scored = {i: (bm25.get(i, 0.0) + bonus.get(i, 0.0)) * _prior(r[4], r[1], r[5], r[7])
              * (ASKED_CORPUS if r[0] in named_corpora else 1.0) * (ASKED if r[5] in asked_kinds else 1.0)
              * (UNASKED if r[5] in unasked else 1.0)
              for i, r in rows.items()}
    # a card's weight is a judgment already made about its passages: a share of the best passage's whole score,
    # which the priors do not discount
    best_scored = max(scored.values(), default=0.0)
    for i, share in lent.items():
        scored[i] += KNOWN * best_scored * share
    for i in asked:  # a passage the question names outright outweighs what a card suggests
        scored[i] += KNOWN * best_scored
    if "torch-npu" not in named_corpora:
        for i, r in rows.items():
            if r[0] == "torch-npu":
                scored[i] *= UNASKED_BACKEND
    ranked = sorted(scored, key=lambda i: -scored[i])[:k]

    # the question's words the best passage holds: its coverage, and whether it holds what the question is about
    first_holds = {w for w in words if db.execute("SELECT 1 FROM fts WHERE rowid = ? AND fts MATCH ?",
                                                  (ranked[0], _fts(w))).fetchone()} if ranked else set()

    citations = []
    for i in ranked:
        c = _row(rows[i])
        c.score = round(scored[i], 3)
        citations.append(c)
    best = sum(idf[w] for w in first_holds) / weight if weight else 0.0
    quoted = set(re.findall(r"""['"`](\w+)['"`]""", question))
    unknown = [i for i, _sure in named if _made_up(db, i, quoted=i in quoted)]
    # a card vouches for how developers ask about what the sources hold; a word no source and no card uses says the
    # question is about something else, unless the first passage holds more of the question by itself (the sources
    # include this file: an example of such a word written here would be heard)
    vouched &= not unheard
    lacking = _lacking(db, idf, heard, own_names) if "torch-npu" in named_corpora else []
    supported = (bool(ranked) and not unknown and not lacking
                 and (vouched or best >= (UNHEARD_SUPPORT if unheard else SUPPORT)
                      or bonus.get(ranked[0], 0.0) >= SURE * top))
    backing = [k for k in known_cards if ranked and ranked[0] in k["cites"]]  # the cards citing the first passage
    trusted = any(k["share"] >= CARD_TRUSTED for k in backing)
    if supported and KEY_WORDS and not bonus.get(ranked[0]) and not trusted and best < KEY_BELOW:
        # the question's rarest words name what it is about: an answer whose first passage, and every card citing
        # it, holds none of them is about something else
        vouched_words = first_holds.union(*(k["held"] for k in backing))
        rarest = sorted((w for w in words if w not in own_names), key=lambda w: -idf[w])
        supported = any(w in vouched_words for w in rarest[:KEY_WORDS])
    # the cards that vouch for the first citation: their answer leads the reply
    known = [{"id": k["card"]["id"], "answer": k["card"]["answer"]} for k in backing] if supported else []
    return {"question": question, "supported": supported, "coverage": round(best, 3), "words": words,
            "unknown": unknown, "unheard": unheard, "backend_lacks": lacking, "knowledge": known,
            "route": route(question), "citations": [asdict(c) for c in citations] if supported else [],
            "unsupported_candidates": [] if supported else [asdict(c) for c in citations[:3]]}


def answer_text(found: dict) -> str:
    """The answer from the citations' own words, each claim with its file and line."""
    lines = []
    if found["route"]:
        r = found["route"]
        lines.append(_("This looks like an error for {skill} ({why}). Run: `{command}`").format(
            skill=r["skill"], why=_(r["why"]), command=r["command"]))
    if found.get("unknown"):
        lines.append(_("No indexed source defines {names}: nothing supports an answer to this question.").format(
            names=", ".join(f"`{u}`" for u in found["unknown"])))
        return "\n".join(lines)
    if not found["supported"] and found.get("backend_lacks"):
        lines.append(_("No torch_npu source mentions {words}: nothing supports an answer to this question.").format(
            words=", ".join(f"“{w}”" for w in found["backend_lacks"])))
        return "\n".join(lines)
    if not found["supported"] and found.get("unheard"):
        lines.append(_("No indexed source mentions {words}: nothing supports an answer to this question.").format(
            words=", ".join(f"“{w}”" for w in found["unheard"])))
        return "\n".join(lines)
    if not found["supported"]:
        lines.append(_("Nothing in the indexed sources supports an answer to this question (the best passage holds "
                       "{coverage:.0%} of its key words).").format(coverage=found["coverage"]) if found["words"]
                     else _("Nothing in the indexed sources supports an answer to this question."))
        return "\n".join(lines)
    best, *more = found["citations"]
    where = "`{symbol}` ({corpus}: {path}:{line})"
    lines.extend(k["answer"] for k in found.get("knowledge", [])[:1])
    lines.append(where.format(**best) + (f": {best['summary']}" if best["summary"] else "."))
    for c in more[:2]:
        lines.append(_("See also {where}").format(where=where.format(**c))
                     + (f": {c['summary'][:200]}" if c["summary"] else "."))
    return "\n".join(lines)


def snippet_for(citation: dict) -> str | None:
    """Code that shows the cited thing for real: its docstring's example, or its signature and where Python finds
    it. Only the torch and opforge corpora are importable here (torch-npu is read as data)."""
    if citation["corpus"] not in ("torch", "opforge") or citation["kind"] not in ("function", "class", "setting"):
        return None
    example = [line.strip()[4:] for line in citation["snippet"].splitlines() if line.strip().startswith(">>> ")]
    if example:
        return "\n".join(example)
    parts = citation["symbol"].split(".")
    return (f"import importlib, inspect\n"
            f"parts = {parts!r}\n"
            f"for i in range(len(parts) - 1, 0, -1):\n"
            f"    try:\n"
            f"        obj = importlib.import_module('.'.join(parts[:i]))\n"
            f"        break\n"
            f"    except ImportError:\n"
            f"        continue\n"
            f"for part in parts[i:]:\n"
            f"    obj = getattr(obj, part)\n"
            f"print({citation['symbol']!r}, '=', repr(obj)[:200])\n"
            f"if callable(obj):\n"
            f"    try:\n"
            f"        print('signature:', inspect.signature(obj))\n"
            f"    except (TypeError, ValueError):\n"
            f"        pass\n"
            f"    print('defined in:', inspect.getsourcefile(obj), inspect.getsourcelines(obj)[1])\n"
            if len(parts) > 1 else None)


def run_snippet(code: str, timeout_s: float = 60.0) -> dict:
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"code": code, "exit_code": None, "output": f"stopped after {timeout_s:.0f} s"}
    return {"code": code, "exit_code": proc.returncode, "output": (proc.stdout + proc.stderr)[-4000:]}
