"""Kernel lint: what the Triton interpreter cannot show, read off a kernel module's source.

The interpreter runs programs one after another, with Python integers for loop indices, so it cannot show
a race between programs nor an int32 offset that wraps on a GPU. These rules read each `@triton.jit`
function's AST instead; they hold as data (id, what they protect, the rule) and apply to any kernel module,
generated or model-written. A finding is (rule id, function, line, message).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class LintRule:
    id: str
    protects: str
    doc: str
    check: Callable[[ast.FunctionDef], list[tuple[int, str]]]


def _calls(node: ast.AST, name: str) -> list[ast.Call]:
    """Calls of tl.<name> (or triton.language.<name>) under `node`."""
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == name]


def _is_atomic(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr.startswith("atomic_")


# ------------------------------------------------------------------ memory ordering

def ticket_without_barrier(fn: ast.FunctionDef) -> list[tuple[int, str]]:
    """A ticket is an atomic whose result is compared for equality: with the program count (the last program
    of a grid), or with the number of programs that share a tile (split-K's last split). Before one thread takes
    it, `tl.debug_barrier()` must make every warp issue its stores and atomics, with none between the two."""
    atomics_of = {}  # name -> the atomic call assigned to it
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _is_atomic(node.value):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    atomics_of[t.id] = node.value
    tickets = []
    for cmp in [n for n in ast.walk(fn) if isinstance(n, ast.Compare)]:
        if not any(isinstance(op, ast.Eq) for op in cmp.ops):
            continue
        for side in [cmp.left, *cmp.comparators]:
            if isinstance(side, ast.Call) and _is_atomic(side):
                tickets.append(side)
            elif isinstance(side, ast.Name) and side.id in atomics_of:
                tickets.append(atomics_of[side.id])
    barriers = [c.lineno for c in _calls(fn, "debug_barrier")]
    writes = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and (n.func.attr == "store" or n.func.attr.startswith("atomic_"))]
    out = []
    for t in tickets:
        before = [b for b in barriers if b < t.lineno]
        if not before:
            out.append((t.lineno, "a ticket taken with no tl.debug_barrier() before it: other warps' writes may "
                                  "still be in flight when the last program reads them"))
        elif any(max(before) < w < t.lineno for w in writes):
            out.append((t.lineno, "a store or atomic between tl.debug_barrier() and the ticket is not covered "
                                  "by the barrier"))
    return out


# ------------------------------------------------------------------ index overflow

def _has_int64_cast(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "int64" for n in ast.walk(node))


def _grows(expr: ast.AST, tainted: set[str]) -> bool:
    """An int32 value that grows with the grid: a program id or count, or a tainted name, with no int64 cast."""
    if _has_int64_cast(expr):
        return False
    return bool(_calls(expr, "program_id") or _calls(expr, "num_programs")) or any(
        isinstance(n, ast.Name) and n.id in tainted for n in ast.walk(expr))


def _program_tainted(fn: ast.FunctionDef) -> set[str]:
    """Names holding int32 values that grow with the grid (loop indices of a range over them included)."""
    tainted: set[str] = set()
    for _ in range(3):  # assignments may come in any order across loops: a few passes reach the fixed point
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and _grows(node.value, tainted):
                tainted |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Call):
                args = node.iter.args
                if not any(_has_int64_cast(a) for a in args) and any(_grows(a, tainted) for a in args):
                    tainted.add(node.target.id)
    return tainted


def int32_offsets(fn: ast.FunctionDef) -> list[tuple[int, str]]:
    """An offset added to a pointer that multiplies a grid-sized int32 index by a run-time size can pass
    2**31 and wrap: such a product must be made in int64 (`pid.to(tl.int64)`, an int64 range bound)."""
    tainted = _program_tainted(fn)

    def sized(expr: ast.AST) -> bool:  # not a literal: a size or block only known at compile or run time
        return any(isinstance(n, (ast.Name, ast.Call)) for n in ast.walk(expr))

    out, seen = [], set()
    for add in [n for n in ast.walk(fn) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add)]:
        sides = (add.left, add.right)
        if not any(isinstance(s, ast.Name) and s.id.endswith("ptr") for s in sides):
            continue
        for s in sides:
            for m in [n for n in ast.walk(s) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)]:
                if (_grows(m.left, tainted) and sized(m.right)) or (_grows(m.right, tainted) and sized(m.left)):
                    if m.lineno not in seen:
                        seen.add(m.lineno)
                        out.append((m.lineno, f"int32 offset `{ast.unparse(m)}` grows with the grid and may wrap "
                                              "past 2**31: compute it in int64"))
    return out


RULES: list[LintRule] = [
    LintRule("KL-TICKET-BARRIER", "memory ordering", "the last-program ticket is taken right after "
             "tl.debug_barrier()", ticket_without_barrier),
    LintRule("KL-INT64-OFFSET", "index overflow", "pointer offsets that scale a program or loop index by a size "
             "are int64", int32_offsets),
]


def is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "jit":
            return True
    return False


def lint_source(source: str, filename: str = "<impl>") -> list[dict]:
    """Every finding of every rule in the module's jit functions."""
    tree = ast.parse(source, filename=filename)
    found = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and is_jit(n)]:
        for rule in RULES:
            for line, msg in rule.check(fn):
                found.append({"rule": rule.id, "protects": rule.protects, "function": fn.name, "line": line,
                              "message": msg})
    return sorted(found, key=lambda f: f["line"])
