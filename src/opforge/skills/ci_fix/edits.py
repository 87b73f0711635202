"""Text edits as whole-line blocks: what each fix replaced, in a form a reader (or a test) can replay.

A step is a set of non-overlapping blocks against one input text; applying a file's steps in order to the
original text gives exactly the fixed text.
"""

from __future__ import annotations

import bisect
import difflib
from dataclasses import dataclass

from opforge.skills.ci_fix.regions import split_lines


@dataclass
class Block:
    line: int        # 1-based first line in the step's input (len(lines) + 1 to append)
    before: str      # whole lines
    after: str

    @property
    def last(self) -> int:
        return self.line + max(len(split_lines(self.before)), 1) - 1

    def to_dict(self) -> dict:
        return {"line": self.line, "end_line": self.last, "before": self.before, "after": self.after}


class Text:
    """A text with its line starts, for turning (row, column) positions into offsets."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0]
        for line in split_lines(text):
            self.starts.append(self.starts[-1] + len(line))
        if self.starts[-1] == len(text) and len(self.starts) > 1 and not text.endswith("\n"):
            self.starts.pop()            # the last line has no ending: no line starts after it

    def offset(self, row: int, col: int) -> int:
        """`row` 1-based, `col` 0-based characters; positions past the end clamp to it."""
        if row - 1 >= len(self.starts):
            return len(self.text)
        return min(self.starts[row - 1] + col, len(self.text))

    def row_of(self, off: int) -> int:
        return bisect.bisect_right(self.starts, off)

    def block(self, edits: list[tuple[int, int, str]]) -> Block:
        """The whole-line block that contains character edits (start, end, content) and their result."""
        lo = min(e[0] for e in edits)
        hi = max(e[1] for e in edits)
        n = len(self.text)
        if lo == n and (n == 0 or self.text.endswith("\n")):
            start = lo                   # appending after the last line
        else:
            start = self.starts[self.row_of(lo) - 1]
        k = bisect.bisect_left(self.starts, hi)
        if hi > lo and k < len(self.starts) and self.starts[k] == hi:
            end = hi                     # the edit stops at a line start: that line is not part of it
        else:
            nl = self.text.find("\n", hi)
            end = n if nl < 0 else nl + 1
        end = max(end, start)
        piece, cursor = [], start
        for s, e, content in sorted(edits):
            piece.append(self.text[cursor:s])
            piece.append(content)
            cursor = e
        piece.append(self.text[cursor:end])
        line = self.row_of(start) if start < len(self.text) else len(split_lines(self.text)) + 1
        return Block(line, self.text[start:end], "".join(piece))


def apply_blocks(text: str, blocks: list[Block]) -> str:
    lines = split_lines(text)
    for b in sorted(blocks, key=lambda b: b.line, reverse=True):
        n = len(split_lines(b.before))
        got = "".join(lines[b.line - 1:b.line - 1 + n])
        if got != b.before:
            raise ValueError(f"block at line {b.line} does not match the text it replaces")
        lines[b.line - 1:b.line - 1 + n] = [b.after] if b.after else []
    return "".join(lines)


def overlaps(a: Block, b: Block) -> bool:
    a_end = a.line + len(split_lines(a.before))
    b_end = b.line + len(split_lines(b.before))
    if a.line == b.line:
        return True
    return a.line < b_end and b.line < a_end


def diff_blocks(before: str, after: str) -> list[Block]:
    a, b = split_lines(before), split_lines(after)
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [Block(i1 + 1, "".join(a[i1:i2]), "".join(b[j1:j2]))
            for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal"]


def remap_lines(changed: set[int], before: str, after: str) -> set[int]:
    """The changed-line set carried through an edit: kept lines keep their mark; new text next to a marked
    line, or replacing one, is marked."""
    a, b = split_lines(before), split_lines(after)
    out: set[int] = set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            out.update(j1 + 1 + k for k in range(i2 - i1) if i1 + 1 + k in changed)
        elif any(r in changed for r in range(i1, i2 + 2)):
            out.update(range(j1 + 1, j2 + 1))
    return out


def runs(lines: set[int]) -> list[tuple[int, int]]:
    """Sorted inclusive runs of consecutive line numbers."""
    out: list[tuple[int, int]] = []
    for n in sorted(lines):
        if out and n == out[-1][1] + 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out
