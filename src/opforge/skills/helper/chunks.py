"""A source file cut into the passages the helper cites: each with its symbol, its first and last line, and text.

  Python    one passage per class, function and method (the `ast` module: qualified name, line span), one per
            module-level setting (a config module's assignment with the comment above it), one for the module's
            docstring
  headers   one per top-level declaration: a class, struct, enum, function, or function-like macro (the
            registration macros: `TORCH_LIBRARY_IMPL`), with its namespace-free name
  yaml      one per entry of a list (native_functions.yaml's `- func:`), named by its first key's value
  json      the graph-break registry: one per GB id with its type, explanation and hints
  markdown  one per section, named by its heading

A symbol is what a citation names: a Python object's full dotted name (module from the file's path), a yaml
entry's func name with its overload (`add.Tensor`), a GB id, a heading.
"""

from __future__ import annotations

import ast
import bisect
import json
import re
from dataclasses import dataclass

MAX_LINES = 80  # a passage's text: the head of a long body says what it is about; the index need not hold more


@dataclass(frozen=True)
class Chunk:
    symbol: str
    kind: str
    line: int
    end_line: int
    text: str
    summary: str = ""  # what the passage says of itself: a docstring's first paragraph, the comment above


def first_paragraph(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def _comment(lines: list[str], start: int, line: int) -> str:
    return first_paragraph("\n".join(x.strip().lstrip("#/*! ").strip() for x in lines[start - 1:line - 1]))


def module_name(path: str) -> str:
    """`torch/utils/backend_registration.py` -> `torch.utils.backend_registration`; a package's `__init__.py` is the
    package."""
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _lines(lines: list[str], start: int, end: int) -> str:
    return "\n".join(lines[start - 1:min(end, start - 1 + MAX_LINES)])


def _comment_above(lines: list[str], line: int, gap: int = 0, marks: tuple[str, ...] = ("#",)) -> int:
    """The first line of the comment block right above `line` (1-based; up to `gap` blank lines between), or
    `line` if there is none. A comment line starts with one of `marks`."""
    above = line
    while above > 1 and line - above - 1 < gap and not lines[above - 2].strip():
        above -= 1
    if above == 1 or not lines[above - 2].lstrip().startswith(marks):
        return line
    start = above
    while start > 1 and lines[start - 2].lstrip().startswith(marks):
        start -= 1
    return start


def python(path: str, source: str) -> list[Chunk]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    module = module_name(path)
    out = []
    doc = ast.get_docstring(tree)
    if doc:
        out.append(Chunk(module, "module", 1, tree.body[0].end_lineno or 1, doc, first_paragraph(doc)))

    def visit(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{node.name}"
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                above = _comment_above(lines, start, gap=2)  # torch often explains a def in comments instead
                text = _lines(lines, above, start - 1) + "\n" + _lines(lines, start, node.end_lineno)
                out.append(Chunk(name, kind, start, node.end_lineno or start, text.strip("\n"),
                                 first_paragraph(ast.get_docstring(node)) or _comment(lines, above, start)))
                if isinstance(node, ast.ClassDef):
                    visit(node.body, name)  # methods and nested classes; a function's own closures stay in it
            elif isinstance(node, (ast.If, ast.Try)):  # `if not is_available(): ... else: class DeviceMesh`
                for block in (node.body, node.orelse, getattr(node, "finalbody", []),
                              *(h.body for h in getattr(node, "handlers", []))):
                    visit(block, prefix)

    visit(tree.body, module)

    for node in tree.body:  # settings: `name = value` at module level, with the comment that explains it
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        names = [t.id for t in targets if isinstance(t, ast.Name) and not t.id.startswith("__")]
        if len(names) == 1:
            start = _comment_above(lines, node.lineno)
            out.append(Chunk(f"{module}.{names[0]}", "setting", start, node.end_lineno or node.lineno,
                             _lines(lines, start, node.end_lineno or node.lineno), _comment(lines, start, node.lineno)))
    return out


_DECL = re.compile(r"^(?:template\s*<[^;{]*>\s*)?(?:class|struct|enum(?:\s+class)?|union)\s+(?:\w+\s+)*?"
                   r"(?:C10_API\s+|TORCH_API\s+|\w+_API\s+)?(?P<name>[A-Za-z_]\w*)\s*(?:final\s*)?[:{]", re.M)
_FUNC = re.compile(r"^[ \t]*(?:[\w:<>,*&\[\]]+\s+)+?[*&]*(?P<name>[A-Za-z_]\w*)\s*\([^;{}]*\)\s*(?:const\s*)?"
                   r"(?:noexcept\s*)?(?:override\s*)?[;{]", re.M)

CPP_COMMENT = ("//", "/*", "*")  # a line of a `//` comment or of a `/* ... */` block
_MACRO = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(?P<name>[A-Za-z]\w*)\(", re.M)  # registration macros take arguments


_CPP_TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.S)


def _uncommented(source: str) -> str:
    """The source with its comments blanked (newlines kept, so offsets and lines stay): prose in a comment that
    reads like a declaration ("This function `f` (the ...) is;") is not one."""
    return _CPP_TOKEN.sub(lambda m: m.group() if m.group().startswith('"') else re.sub(r"[^\n]", " ", m.group()),
                          source)


def header(path: str, source: str) -> list[Chunk]:
    """Declarations at any depth of namespaces but not inside another's body (a class's members stay in its
    passage)."""
    lines = source.splitlines()
    newlines = [m.start() for m in re.finditer("\n", source)]  # a match's line: how many newlines precede it
    source = _uncommented(source)
    out, body_end = [], 0

    def line_of(m: re.Match) -> int:  # where the declaration's first word is: a match may begin on blank lines
        return bisect.bisect_left(newlines, m.start() + len(m.group()) - len(m.group().lstrip())) + 1

    spans = [(line_of(m), m.group("name"), "class") for m in _DECL.finditer(source)]
    spans += [(line_of(m), m.group("name"), "function") for m in _FUNC.finditer(source)
              if m.group("name") not in ("if", "for", "while", "switch", "return", "sizeof", "defined")]
    spans += [(line_of(m), m.group("name"), "macro") for m in _MACRO.finditer(source)]
    spans.sort()
    for start, name, kind in spans:
        if start <= body_end:
            continue
        end = _macro_end(lines, start) if kind == "macro" else _block_end(lines, start)
        body_end = end  # a class's members, a function's statements and a macro's body are not declarations
        begin = _comment_above(lines, start, marks=CPP_COMMENT)
        out.append(Chunk(name, kind, begin, end, _lines(lines, begin, end), _comment(lines, begin, start)))
    return out


def _macro_end(lines: list[str], start: int) -> int:
    """The last line of a macro: its definition goes on while a line ends in a backslash."""
    end = start
    while end < len(lines) and lines[end - 1].rstrip().endswith("\\"):
        end += 1
    return end


def _block_end(lines: list[str], start: int) -> int:
    """The line that closes the brace block opened at or after `start` (a declaration ending in `;` is one line)."""
    depth, opened = 0, False
    for i in range(start - 1, len(lines)):
        text = lines[i].split("//")[0]
        if not opened and ";" in text and "{" not in text:
            return i + 1
        depth += text.count("{") - text.count("}")
        opened = opened or "{" in text
        if opened and depth <= 0:
            return i + 1
    return len(lines)


def yaml_entries(path: str, source: str) -> list[Chunk]:
    """A yaml list's entries, each `- key: value` line starting one; named by its `func:` (an operator's schema,
    wherever the entry puts it: torchgen's sorted backend yaml starts with `device_check:`) or else its first value,
    up to the `(`."""
    lines = source.splitlines()
    starts = [i + 1 for i, line in enumerate(lines) if re.match(r"-\s+\w+:", line)]
    if not starts:  # a list of names under a key (`supported:` in a backend yaml): each item is an entry
        starts = [i + 1 for i, line in enumerate(lines) if re.match(r"\s*-\s+\S", line)]
    out = []
    for n, start in enumerate(starts):
        end = (starts[n + 1] - 1) if n + 1 < len(starts) else len(lines)
        while end > start and not lines[end - 1].strip():
            end -= 1
        func = next((line for line in lines[start - 1:end] if re.match(r"-?\s*func:", line.strip())), None)
        first = func or lines[start - 1]
        value = first.split(":", 1)[1].strip() if ":" in first else first.strip().lstrip("- ")
        name = value.split("(")[0].strip().strip("'\"") or f"entry {n + 1}"
        begin = _comment_above(lines, start)
        out.append(Chunk(name, "entry", begin, end, _lines(lines, begin, end), _comment(lines, begin, start)
                         or lines[start - 1].strip("- ")))
    return out


def graph_break_registry(path: str, source: str) -> list[Chunk]:
    try:
        registry = json.loads(source)
    except json.JSONDecodeError:
        return []
    first_line = {}  # each GB id's line, from one pass over the file
    for i, text in enumerate(source.splitlines()):
        m = re.search(r'"(GB\d+)"', text)
        if m:
            first_line.setdefault(m.group(1), i + 1)
    out = []
    for gb_id, entries in registry.items():
        line = first_line.get(gb_id, 1)
        entry = entries[0] if isinstance(entries, list) and entries else entries
        if not isinstance(entry, dict):
            continue
        text = "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in entry.items())
        summary = f"{entry.get('Gb_type', '')}: {entry.get('Explanation', '')}".strip(": ")
        out.append(Chunk(gb_id, "graph-break", line, line, f"{gb_id}\n{text}", summary))
    return out


def markdown(path: str, source: str) -> list[Chunk]:
    lines = source.splitlines()
    heads, fence = [], False
    for i, line in enumerate(lines):
        fence ^= line.lstrip().startswith("```")
        if not fence and re.match(r"#{1,4}\s", line):
            heads.append(i + 1)
    if not heads or heads[0] != 1:
        heads.insert(0, 1)
    out = []
    for n, start in enumerate(heads):
        end = (heads[n + 1] - 1) if n + 1 < len(heads) else len(lines)
        title = lines[start - 1].lstrip("#").strip() if lines and lines[start - 1].startswith("#") else path
        out.append(Chunk(title, "section", start, max(end, start), _lines(lines, start, end),
                         _lead(lines[start:end])))
    return out


def _lead(body: list[str]) -> str:
    """A section's first paragraph of prose: up to a blank line, a code fence, a table or a list."""
    out = []
    for line in body:
        if line.strip().startswith(("```", "|", "- ", "* ", "1. ")) or not line.strip():
            if out:
                break
            continue
        out.append(line.strip())
    return " ".join(out)


def chunk(path: str, source: str) -> list[Chunk]:
    """The passages of a file by its kind; a file of no known kind has none."""
    if path.endswith(".py"):
        return python(path, source)
    if path.endswith((".h", ".hpp", ".cuh")):
        return header(path, source)
    if path.endswith((".yaml", ".yml")):
        return yaml_entries(path, source)
    if path.endswith("graph_break_registry.json"):
        return graph_break_registry(path, source)
    if path.endswith((".md", ".rst", ".txt")):
        return markdown(path, source)
    return []
