"""Generated source laid out as a person would write it: lines past the width broken after the commas of
their outermost call, continuation lines aligned with its opening bracket (the style of the project's own
code, which ruff checks at 120 columns)."""

from __future__ import annotations

import contextlib
import io
import tokenize

WIDTH = 120


def _split_points(line: str) -> tuple[int, list[int]] | None:
    """The outermost bracket that closes on this line with commas directly inside it: the column after it
    and the columns just after those commas. None when there is none (or the line does not tokenize)."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    stack: list[tuple[int, list[int]]] = []  # open bracket column, commas directly inside it
    best = None  # (depth, start, commas)
    for t in toks:
        if t.type != tokenize.OP:
            continue
        if t.string in "([{":
            stack.append((t.end[1], []))
        elif t.string in ")]}" and stack:
            start, commas = stack.pop()
            if commas and (best is None or len(stack) < best[0]):
                best = (len(stack), start, commas)
        elif t.string == "," and stack:
            stack[-1][1].append(t.end[1])
    return best[1:] if best else None


def wrap_line(line: str, width: int = WIDTH) -> list[str]:
    """One line as several, packed greedily, each continuation aligned with the opening bracket."""
    if len(line) <= width:
        return [line]
    found = _split_points(line)
    if not found or found[0] > width - 40:
        return [line]
    start, commas = found
    segs = [line[a:b] for a, b in zip([0, *commas], [*commas, len(line)])]
    out, cur = [], segs[0]
    for s in segs[1:]:
        if len(cur + s) <= width:
            cur += s
        else:
            out.append(cur.rstrip())
            cur = " " * start + s.lstrip()
    out.append(cur)
    if len(out) == 1:
        return out
    return out[:-1] + wrap_line(out[-1], width) if len(out[-1]) > width else out


def wrap_source(source: str, width: int = WIDTH) -> str:
    """Every line of `source` within `width` where a break after a comma can make it so."""
    return "\n".join(piece for line in source.split("\n") for piece in wrap_line(line, width))


def hanging_call(head: str, args: list[str], indent: int, width: int = WIDTH) -> list[str]:
    """`head(args)` at `indent`, its arguments on continuation lines four deeper when one line is too long
    (a call whose bracket opens too far right to align with)."""
    line = " " * indent + f"{head}({', '.join(args)})"
    if len(line) <= width:
        return [line]
    out, cur, pad = [" " * indent + f"{head}("], "", " " * (indent + 4)
    for a in args:
        piece = f"{cur}, {a}" if cur else a
        if cur and len(pad + piece) + 2 > width:
            out.append(f"{pad}{cur},")
            piece = a
        cur = piece
    out.append(f"{pad}{cur})")
    return out


class CodeBuffer:
    """Lines of source at an indentation that `indent()` deepens for the lines written inside it."""

    def __init__(self, level: int = 0):
        self.lines: list[str] = []
        self.level = level

    def __call__(self, line: str) -> None:
        self.lines.append("    " * self.level + line if line else "")

    @contextlib.contextmanager
    def indent(self):
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
