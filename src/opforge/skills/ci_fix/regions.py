"""Where a position in a source file falls: comment, docstring, string literal, code, or prose of a doc file.

A typo is fixed or left by where it is, so this is the line between documentation and behaviour.
Positions are (1-based row, 0-based character column).
"""

from __future__ import annotations

import ast
import io
import re
import token
import tokenize
from dataclasses import dataclass

Pos = tuple[int, int]


@dataclass(frozen=True)
class Region:
    start: Pos
    end: Pos
    kind: str        # comment | docstring | string | code (code spans of a doc file)


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split on '\\n' only (str.splitlines also splits on form feeds)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def char_col(line: str, byte_col: int) -> int:
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", "replace"))


def docstring_nodes(tree: ast.AST) -> list[ast.Constant]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                out.append(first.value)
    return out


def python_regions(text: str) -> list[Region] | None:
    """Comments and strings of a Python module, docstrings told apart; None when it does not parse."""
    if text.startswith("\ufeff"):
        # a byte order mark is encoding, not source; it stays one column on the first line
        inner = python_regions(text[1:])
        if inner is None:
            return None
        return [Region((r.start[0], r.start[1] + (r.start[0] == 1)), (r.end[0], r.end[1] + (r.end[0] == 1)), r.kind)
                for r in inner]
    try:
        tree = ast.parse(text)
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (SyntaxError, tokenize.TokenError, ValueError):
        return None
    lines = split_lines(text)
    doc_spans = []
    for node in docstring_nodes(tree):
        s = (node.lineno, char_col(lines[node.lineno - 1], node.col_offset))
        e = (node.end_lineno, char_col(lines[node.end_lineno - 1], node.end_col_offset))
        doc_spans.append((s, e))
    regions: list[Region] = []
    fstring_start = getattr(token, "FSTRING_START", None)
    fstring_end = getattr(token, "FSTRING_END", None)
    depth, f_start = 0, None
    for tok in toks:
        if fstring_start is not None and tok.type == fstring_start:
            if depth == 0:
                f_start = tok.start
            depth += 1
        elif fstring_end is not None and tok.type == fstring_end:
            depth -= 1
            if depth == 0:
                regions.append(Region(f_start, tok.end, "string"))
        elif depth:
            continue
        elif tok.type == tokenize.COMMENT:
            regions.append(Region(tok.start, tok.end, "comment"))
        elif tok.type == tokenize.STRING:
            is_doc = any(s <= tok.start and tok.end <= e for s, e in doc_spans)
            regions.append(Region(tok.start, tok.end, "docstring" if is_doc else "string"))
    return regions


# C and C++ ---------------------------------------------------------------------------------------------------

PUNCT = sorted(["%:%:", "...", "<<=", ">>=", "->*", "<=>", "::", "->", "++", "--", "<<", ">>", "<=", ">=", "==",
                "!=", "&&", "||", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "##", ".*", "<:", ":>", "<%",
                "%>", "%:"], key=len, reverse=True)
STR_PREFIX = re.compile(r"(u8|u|U|L)?(R)?([\"'])")
IDENT = re.compile(r"[A-Za-z_$\u0080-\uffff][\w$\u0080-\uffff]*")
NUMBER = re.compile(r"\.?\d(?:[eEpP][+-]|[\w.'])*")


@dataclass(frozen=True)
class CToken:
    kind: str        # comment | string | ident | number | punct | eol (end of a preprocessor directive) | fnmacro
    text: str
    start: int       # character offsets into the text
    end: int


def _string_end(text: str, i: int, quote: str) -> int:
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == quote or c == "\n":
            return i + 1
        i += 1
    return n


def c_tokens(text: str) -> list[CToken]:
    """A C/C++ token stream (maximal munch), comments kept as tokens, whitespace dropped."""
    out: list[CToken] = []
    i, n = 0, len(text)
    line_start, in_directive, after_define = True, False, 0
    while i < n:
        c = text[i]
        if c == "\\" and text.startswith("\n", i + 1):
            i += 2
            continue
        if c == "\\" and text.startswith("\r\n", i + 1):
            i += 3
            continue
        if c == "\n":
            if in_directive:
                out.append(CToken("eol", "", i, i))
                in_directive = False
            line_start, after_define = True, 0
            i += 1
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if text.startswith("//", i):
            j = i
            while j < n and text[j] != "\n":
                j += 2 if text.startswith("\\\n", j) else 1
            out.append(CToken("comment", text[i:j], i, j))
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(CToken("comment", text[i:j], i, j))
            i = j
            continue
        if c == "#" and line_start:
            in_directive = True
        line_start = False
        m = STR_PREFIX.match(text, i)
        if m:
            q = m.group(3)
            if m.group(2) and q == '"':
                close = text.find("(", m.end())
                delim = text[m.end():close] if close >= 0 else ""
                j = text.find(")" + delim + '"', close + 1) if close >= 0 else -1
                j = n if j < 0 else j + len(delim) + 2
            else:
                j = _string_end(text, m.end(), q)
            out.append(CToken("string", text[i:j], i, j))
            i = j
            continue
        m = IDENT.match(text, i)
        if m:
            out.append(CToken("ident", m.group(), i, m.end()))
            # `#define NAME(` with no space is a function-like macro; with a space it is not
            if in_directive and after_define == 2 and m.end() < n and text[m.end()] == "(":
                out.append(CToken("fnmacro", "", m.end(), m.end()))
            if in_directive:
                after_define = 2 if m.group() == "define" and after_define == 1 else 0
            i = m.end()
            continue
        m = NUMBER.match(text, i)
        if m:
            out.append(CToken("number", m.group(), i, m.end()))
            i = m.end()
            continue
        p = next((p for p in PUNCT if text.startswith(p, i)), c)
        out.append(CToken("punct", p, i, i + len(p)))
        if in_directive and p in ("#", "%:"):
            after_define = 1
        i += len(p)
    if in_directive:
        out.append(CToken("eol", "", n, n))
    return out


def c_regions(text: str) -> list[Region]:
    lines = split_lines(text)
    starts, acc = [], 0
    for line in lines:
        starts.append(acc)
        acc += len(line)

    def pos(off: int) -> Pos:
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= off:
                lo = mid
            else:
                hi = mid - 1
        return (lo + 1, off - starts[lo] if starts else off)

    return [Region(pos(t.start), pos(t.end), t.kind) for t in c_tokens(text) if t.kind in ("comment", "string")]


# documentation files ------------------------------------------------------------------------------------------

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def doc_regions(text: str) -> list[Region]:
    """Code in a Markdown or reStructuredText file: fenced blocks and inline code spans."""
    regions, fence_start = [], None
    for row, line in enumerate(split_lines(text), start=1):
        if FENCE.match(line):
            if fence_start is None:
                fence_start = row
            else:
                regions.append(Region((fence_start, 0), (row, len(line)), "code"))
                fence_start = None
            continue
        if fence_start is None:
            regions += [Region((row, m.start()), (row, m.end()), "code") for m in INLINE_CODE.finditer(line)]
    if fence_start is not None:
        regions.append(Region((fence_start, 0), (len(split_lines(text)) + 1, 0), "code"))
    return regions


def kind_at(regions: list[Region], row: int, col: int, end_col: int, default: str) -> str:
    for r in regions:
        if r.start <= (row, col) and (row, end_col) <= r.end:
            return r.kind
    return default
