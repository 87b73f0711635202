"""The behaviour proof for one step of edits on one file. Each function returns None when the edit is proven
not to change behaviour, or one line saying why it could not be proven.

Python: the module's AST after the step equals the AST before, except for exactly the import aliases the
step was allowed to remove (unused imports), the order of imports inside one contiguous import block when
import sorting ran, and docstrings, which may differ only in whitespace and the listed word replacements.
`import a, b` and `import a` + `import b` are the same bindings, so imports are compared one alias each.

C/C++: the token stream (comments and whitespace dropped, line splices joined, the end of each preprocessor
directive kept as a token) is unchanged. Adjacent string literals are compared joined, as the compiler
joins them, and `>>` as two `>` (what a C++11 template close means).
"""

from __future__ import annotations

import ast
import difflib

from opforge.i18n import N_, Msg
from opforge.skills.ci_fix.regions import c_tokens, char_col, docstring_nodes, split_lines

Pos = tuple[int, int]
DOC_MARK = "\0docstring\0"


class _Canon(ast.NodeTransformer):
    def __init__(self, lines: list[str], removed: set[Pos], sort_imports: bool):
        self.lines, self.removed, self.sort_imports = lines, removed, sort_imports
        self.dropped: set[Pos] = set()

    def _split(self, node):
        keep = []
        for a in node.names:
            pos = (a.lineno, char_col(self.lines[a.lineno - 1], a.col_offset))
            if pos in self.removed:
                self.dropped.add(pos)
            else:
                keep.append(a)
        out = []
        for a in keep:
            if isinstance(node, ast.Import):
                out.append(ast.Import(names=[ast.alias(name=a.name, asname=a.asname)]))
            else:
                out.append(ast.ImportFrom(module=node.module, names=[ast.alias(name=a.name, asname=a.asname)],
                                          level=node.level))
        return out

    visit_Import = _split
    visit_ImportFrom = _split

    def generic_visit(self, node):
        blocks = [name for name, value in ast.iter_fields(node)
                  if isinstance(value, list) and value and all(isinstance(v, ast.stmt) for v in value)]
        super().generic_visit(node)
        for name in blocks:
            value = getattr(node, name)
            if not value and not isinstance(node, ast.Module):
                value = [ast.Pass()]      # a block emptied by removing its imports keeps a `pass`
            setattr(node, name, _sort_runs(value) if self.sort_imports else value)
        return node


def _sort_runs(stmts: list[ast.stmt]) -> list[ast.stmt]:
    out, run = [], []
    for s in stmts + [None]:
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            run.append(s)
            continue
        out += sorted(run, key=ast.dump)
        run = []
        if s is not None:
            out.append(s)
    return out


def _canonical(text: str, removed: set[Pos], sort_imports: bool) -> tuple[str, list[str], set[Pos], set[Pos]]:
    text = text.removeprefix("\ufeff")    # a byte order mark is encoding, not source
    tree = ast.parse(text)
    docs = []
    for node in docstring_nodes(tree):
        docs.append(node.value)
        node.value = DOC_MARK
    canon = _Canon(split_lines(text), removed, sort_imports)
    tree = canon.visit(tree)
    return ast.dump(tree), docs, canon.dropped, removed - canon.dropped


def _first_difference(a: str, b: str) -> str:
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            return Msg(N_("{before!r} became {after!r}"), before=a[max(i1 - 40, 0):i2 + 20],
                       after=b[max(j1 - 40, 0):j2 + 20])
    return Msg(N_("no difference"))


def _explained(before: str, after: str, subs: set[tuple[str, str]]) -> bool:
    """Whether `after` is `before` with whitespace normalised and some of the listed word replacements made."""
    a, b = before.split(), after.split()
    if a == b:
        return True
    if not subs:
        return False
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        old, new = " ".join(a[i1:i2]), " ".join(b[j1:j2])
        if not old or not any(old.replace(w, r) == new for w, r in subs):
            # several replacements can land in one span of words
            fixed = old
            for w, r in subs:
                fixed = fixed.replace(w, r)
            if fixed != new:
                return False
    return True


def prove_python(before: str, after: str, removed: set[Pos] = frozenset(), sort_imports: bool = False,
                 subs: set[tuple[str, str]] = frozenset()) -> str | None:
    try:
        dump_a, docs_a, _imports, missing = _canonical(before, set(removed), sort_imports)
    except SyntaxError as exc:
        return Msg(N_("the file before the edit does not parse with this Python: {error} (line {line})"),
                   error=exc.msg, line=exc.lineno)
    try:
        dump_b, docs_b, _imports, _missing = _canonical(after, set(), sort_imports)
    except SyntaxError as exc:
        return Msg(N_("the edit breaks the syntax: {error} (line {line})"), error=exc.msg, line=exc.lineno)
    if missing:
        return Msg(N_("an import the step was allowed to remove is not where ruff reported it: {positions}"),
                   positions=sorted(missing))
    if dump_a != dump_b:
        return Msg(N_("the AST changed: {difference}"), difference=_first_difference(dump_a, dump_b))
    for d_a, d_b in zip(docs_a, docs_b):
        if not _explained(d_a, d_b, set(subs)):
            return Msg(N_("a docstring changed beyond whitespace and the listed word replacements: {difference}"),
                       difference=_first_difference(d_a, d_b))
    return None


def _c_stream(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for t in c_tokens(text):
        if t.kind == "comment":
            continue
        if t.kind == "punct" and t.text == ">>":
            out += [("punct", ">"), ("punct", ">")]
            continue
        if (t.kind == "string" and t.text.endswith('"') and out and out[-1][0] == "string"
                and out[-1][1].endswith('"')):
            prev = out[-1][1]
            p_prefix, prefix = prev[:prev.index('"')], t.text[:t.text.index('"')]
            if "R" not in p_prefix + prefix and (p_prefix == prefix or not prefix or not p_prefix):
                out[-1] = ("string", (p_prefix or prefix) + prev[len(p_prefix):-1] + t.text[len(prefix) + 1:])
                continue
        out.append((t.kind, t.text))
    return out


def prove_c(before: str, after: str) -> str | None:
    a, b = _c_stream(before), _c_stream(after)
    if a == b:
        return None
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            old = " ".join(t for _k, t in a[i1:i2]) or "nothing"
            new = " ".join(t for _k, t in b[j1:j2]) or "nothing"
            return Msg(N_("the token stream changed: {before!r} became {after!r} (token {n})"), before=old, after=new,
                       n=i1 + 1)
    return Msg(N_("the token stream changed"))


def prove_doc(before: str, after: str, subs: set[tuple[str, str]]) -> str | None:
    if _explained(before, after, set(subs)):
        return None
    return Msg(N_("the text changed beyond the listed word replacements: {difference}"),
               difference=_first_difference(before, after))
