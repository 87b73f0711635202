"""Shape expressions of traced graphs: canonical form, equality, and Python source for kernels and launchers.

`make_fx(tracing_mode="symbolic")` gives every dimension a sympy expression over its own symbols (s0, s1,
…) and records equalities it learnt while tracing (a broadcast that needs NG == M // 32) as replacements in
its ShapeEnv. Expressions are canonicalised through those replacements before they are compared, and
printed with the request's symbol names so that generated code reads `N * M`, not `s0 * s1`.
"""

from __future__ import annotations

import operator
import re

import sympy
import torch
from sympy.printing.str import StrPrinter
from torch.utils._sympy.functions import FloorDiv


def shape_exprs(val) -> list:
    """A traced value's sizes: sympy expressions where symbolic, ints where static."""
    return [d.node.expr if isinstance(d, torch.SymInt) else int(d) for d in val.shape]


def shape_env_of(gm: torch.fx.GraphModule):
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        for d in getattr(val, "shape", ()):
            if isinstance(d, torch.SymInt):
                return d.node.shape_env
    return None


def expr_of(d, env=None) -> sympy.Expr:
    """A dimension (int or SymInt) as a canonical sympy expression."""
    if isinstance(d, (torch.SymInt, torch.SymFloat)):
        e = d.node.expr
    elif isinstance(d, sympy.Basic):
        e = d
    else:
        return sympy.Integer(int(d))
    return env.replace(e) if env is not None else e


def operand(src: str) -> str:
    """Python source as an operand of * or //: a name, a number or one bracketed group as it is, anything else
    in brackets (`rows * (L + 2*R)`, never `rows * L + 2*R`)."""
    if src.isidentifier() or src.isdigit():
        return src
    depth = 0
    for k, ch in enumerate(src):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and k < len(src) - 1:
            return f"({src})"
    return src if src.startswith("(") else f"({src})"


def shape_of(node, env=None) -> list[sympy.Expr]:
    return [expr_of(d, env) for d in node.meta["val"].shape]


def product(dims) -> sympy.Expr:
    n = sympy.Integer(1)
    for d in dims:
        n = n * d
    return sympy.expand(n)


def hint(expr, env) -> int | None:
    """The value an expression had while tracing (the example sizes)."""
    if env is None:
        return int(expr) if expr.is_number else None
    values = getattr(env, "backed_var_to_val", None)  # torch >= 2.13; older releases call it var_to_val
    try:
        return int(expr.xreplace(values if values is not None else env.var_to_val))
    except (TypeError, ValueError):
        return None


def same(a, b, env) -> bool:
    """Equal as expressions, or, where the trace's guards carry the relation, equal at the example sizes."""
    a, b = sympy.sympify(a), sympy.sympify(b)
    if sympy.expand(a - b) == 0:
        return True
    ha, hb = hint(a, env), hint(b, env)
    return ha is not None and ha == hb


class _Printer(StrPrinter):
    """sympy -> Python integer arithmetic (torch's FloorDiv / Mod helpers included)."""

    def _operand(self, e):
        # Python reads a // b*c as (a // b)*c: an operand that is not a name or a number keeps its brackets
        return self._print(e) if e.is_Atom else f"({self._print(e)})"

    def _print_FloorDiv(self, e):
        return f"({self._operand(e.args[0])} // {self._operand(e.args[1])})"

    _print_CleanDiv = _print_FloorDiv
    _print_IntTrueDiv = _print_FloorDiv

    def _print_PythonMod(self, e):
        return f"({self._operand(e.args[0])} % {self._operand(e.args[1])})"

    _print_Mod = _print_PythonMod

    def _print_Rational(self, e):
        return f"({e.p} / {e.q})"

    def _print_Pow(self, e):
        # N**2 (two dimensions of one size): Triton's compiler has no ** on integers, so a product of factors
        base, exp = e.args
        if exp.is_Integer and 1 < int(exp) <= 8:
            return "*".join([self._operand(base)] * int(exp))
        return super()._print_Pow(e)

    def _print_floor(self, e):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return f"({self._operand(num)} // {self._operand(den)})" if den != 1 else self._print(num)


def tidy(src: str) -> str:
    """A size expression assembled as text (a column offset such as `0 + (D - (D//2)) - (D//2)`), simplified
    and printed again; left as it is when it is not plain integer arithmetic on names."""
    names = {n: sympy.Symbol(n, integer=True, positive=True) for n in re.findall(r"[A-Za-z_]\w*", src)}
    try:
        e = eval(compile(src, "<size>", "eval"), {"__builtins__": {}}, names)  # only names, ints, + - * // ( )
    except Exception:
        return src
    return _Printer().doprint(sympy.simplify(e)) if isinstance(e, (sympy.Basic, int)) else src


def pysrc(expr, names: dict) -> str:
    """Python source of a shape expression, with graph symbols renamed. `names` maps a symbol to a name, or to
    an expression over named symbols (a 'G*32' dimension is 32*G), which lets torch's FloorDiv simplify.
    A group size that view(..., -1, c) left as a // (a // c) is printed as c (`group_divisions`)."""
    return _Printer().doprint(exact_groups(renamed(expr, names)))


def real_src(expr, names: dict) -> str:
    """A shape expression as a float, for pointwise math: sums and products are taken in floating point from
    the first factor on, so that 127·M·N of size arguments (int32 in a kernel) cannot wrap past 2**31."""
    return _real(exact_groups(renamed(expr, names)))


def _real(e) -> str:
    if e.is_Integer:
        return f"{int(e)}.0"
    if e.is_Symbol:
        return f"{e} * 1.0"
    if isinstance(e, sympy.Add):
        return " + ".join(_real(a) for a in e.args)
    if isinstance(e, sympy.Mul):  # the first factor makes the product a float; the rest follow
        head, *rest = e.args
        return " * ".join([_real(head) if head.is_Atom else f"({_real(head)})"]
                          + [str(a) if a.is_Atom else f"({_real(a)})" for a in rest])
    return f"{_Printer()._operand(e)} * 1.0"  # floor divisions and remainders stay integer arithmetic


def renamed(expr, names: dict) -> sympy.Expr:
    e = sympy.sympify(expr)
    return e.xreplace({s: _named(names.get(s, str(s))) for s in e.free_symbols})


def _group_division(x) -> tuple[sympy.Expr, int] | None:
    """(a, c) when x is a // (a // c) for an int c > 0, torch's form of the last size of view(a, -1, c) (it may
    have cancelled a // c to (a/k) // (c/k)). It is c whenever c divides a > 0; for a = 0 it divides by zero,
    and c is still the group the reference means."""
    if not isinstance(x, FloorDiv) or not isinstance(x.args[1], FloorDiv):
        return None
    a, (p, q) = x.args[0], x.args[1].args
    k = sympy.simplify(a / p)
    if q.is_Integer and q > 0 and k.is_Integer and k > 0:
        return a, int(k * q)
    return None


def exact_groups(e: sympy.Expr) -> sympy.Expr:
    """e with every a // (a // c) as c: sizes derived from the group size, not by dividing a size by an
    expression of itself (a ZeroDivisionError for a < c, another grouping when c does not divide a). The
    launchers refuse an `a` that c does not divide (`divisibility_checks`)."""
    return e.replace(lambda x: _group_division(x) is not None, lambda x: sympy.Integer(_group_division(x)[1]))


def group_divisions(exprs, names: dict) -> list[tuple[str, int]]:
    """(source of a, c) for every a // (a // c) in the expressions, renamed: the sizes a that must be
    multiples of c for `exact_groups` to hold."""
    out: list[tuple[str, int]] = []
    for expr in exprs:
        for x in sympy.preorder_traversal(renamed(expr, names)):
            g = _group_division(x)
            if g is not None and (pair := (_Printer().doprint(exact_groups(g[0])), g[1])) not in out:
                out.append(pair)
    return out


def divisibility_checks(exprs, names: dict, indent: str = "    ") -> list[str]:
    """Launcher lines raising a ValueError for a size that a group size does not divide, which torch's view
    refuses too: without them the op would cut the rows into other groups."""
    lines = []
    for a, c in group_divisions(exprs, names):
        lines += multiple_check(f"({a})", c, f" (the reference cuts it into groups of {c})", indent)
    return lines


def multiple_check(size: str, c, why: str = "", indent: str = "    ") -> list[str]:
    """Generated lines raising a one-line ValueError unless `size` (Python source) is a multiple of `c`."""
    name = size[1:-1] if size.startswith("(") and size.endswith(")") else size
    return [f"{indent}if {size} % {c}:",
            f'{indent}    raise ValueError(f"{name}: expected a multiple of {c}{why}, got {{{name}}}")']


def graph_shapes(gm: torch.fx.GraphModule) -> list[sympy.Expr]:
    """Every dimension of every tensor a graph computes, canonical."""
    env = shape_env_of(gm)
    return [d for n in gm.graph.nodes if hasattr(n.meta.get("val"), "shape") for d in shape_of(n, env)]


def _named(v):
    return v if isinstance(v, sympy.Basic) else sympy.Symbol(v, integer=True, positive=True)


def atoms(names: dict) -> list[str]:
    """The size arguments a kernel takes: every name the symbols are expressed in."""
    out: list[str] = []
    for v in names.values():
        for a in (sorted(str(x) for x in v.free_symbols) if isinstance(v, sympy.Basic) else [v]):
            if a not in out:
                out.append(a)
    return out


# Python-level arithmetic on sizes that make_fx records as graph nodes
SYM_OPS = {operator.mul: "*", operator.add: "+", operator.sub: "-", operator.floordiv: "//",
           operator.truediv: "/", operator.pow: "**"}


def is_sym_node(node) -> bool:
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, int, float)) and \
        not isinstance(node.meta.get("val"), bool) and node.op == "call_function"
