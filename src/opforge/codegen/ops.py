"""ATen operators the deterministic engine lowers to Triton, as data.

Each rule says what kind of node an overload is (pointwise, reduction, view, constant), the Triton
expression it becomes, and whether that expression is bit-exact with PyTorch's float32 CPU kernel (IEEE
+ - * / with round-to-nearest, comparisons, selects, rounding, clamps). Outputs computed only from exact
ops are compared exactly against the float32 golden; the others within tolerance against float64.
An overload not in this table is refused in stage 2 by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

POINTWISE, REDUCTION, VIEW, CONSTANT = "pointwise", "reduction", "view", "constant"
SHIFT = "shift"  # slices and concatenations along the last dimension: the same rows, other columns
SYMBOLIC = "symbolic"  # arithmetic on sizes, evaluated from the kernel's size arguments
COLUMN = "column"  # the column index (arange over the last dimension): gathers and scatters of one element per row
SCAN = "scan"  # prefix (or suffix) scans along a row's columns: a running sum, product or log-sum-exp


@dataclass(frozen=True)
class OpRule:
    kind: str
    emit: Callable[..., str] | None  # (args..., **kwargs) of already-rendered operands -> expression
    exact: bool
    primitive: str  # the Triton primitive(s), for the API report


# Jit helpers that OP_TABLE's expressions call; a module gets those its kernels call (codegen/emit.py).
HELPERS = {
    "_round_half_even": '''
@triton.jit
def _round_half_even(x):
    # torch.round: halves go to the even neighbour. Built from floor so that it is exact everywhere.
    f = tl.floor(x)
    frac = x - f  # exact: a float's fraction is representable
    f_odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    r = tl.where((frac > 0.5) | ((frac == 0.5) & f_odd), f + 1.0, f)
    return tl.where(r == 0.0, x * 0.0, r)  # keep the sign of zero: round(-0.4) is -0.0
''',
    "_logaddexp": '''
@triton.jit
def _logaddexp(a, b):
    # log(exp(a) + exp(b)), the combine of logcumsumexp: from the larger, so that nothing overflows; equal
    # arguments (both -inf or both inf among them) add log 2 instead of subtracting infinities
    m = tl.maximum(a, b)
    d = tl.where(a == b, 0.0, -tl.abs(a - b))
    return m + tl.log(1.0 + tl.exp(d))
''',
    "_arg_best": '''
@triton.jit
def _arg_best(v, cols, mask, IS_MAX: tl.constexpr):
    # each row's largest (IS_MAX) or smallest value among the masked-in columns, and the first column holding
    # it; a NaN beats every number and the first NaN wins, as torch's argmax and argmin take them
    if IS_MAX:
        w = tl.where(mask & (v == v), v, -float("inf"))
        best = tl.max(w, axis=1)[:, None]
    else:
        w = tl.where(mask & (v == v), v, float("inf"))
        best = tl.min(w, axis=1)[:, None]
    first = tl.min(tl.where(mask & (w == best), cols, 2147483647), axis=1)[:, None]
    first_nan = tl.min(tl.where(mask & (v != v), cols, 2147483647), axis=1)[:, None]
    has_nan = first_nan < 2147483647
    return tl.where(has_nan, float("nan"), best), tl.where(has_nan, first_nan, first)
''',
    "_arg_take": '''
@triton.jit
def _arg_take(best, index, chunk_best, chunk_index, IS_MAX: tl.constexpr):
    # a later chunk's best replaces the running one only when strictly better (a tie keeps the first column)
    # or when it is the row's first NaN
    if IS_MAX:
        better = chunk_best > best
    else:
        better = chunk_best < best
    take = better | ((chunk_best != chunk_best) & (best == best))
    return tl.where(take, chunk_best, best), tl.where(take, chunk_index, index)
''',
    "_mul": '''
@triton.jit
def _mul(a, b):
    return a * b
''',
    "_tanh": '''
@triton.jit
def _tanh(x):
    # 1 - 2/(exp(2t) + 1) cancels near 0 (4.6% off at 1e-6), so below 0.55 an odd polynomial takes over,
    # a least-squares fit of tanh(t)/t in t*t within 1.3 ulp in float32; exp overflowing to inf gives 1.
    t = tl.abs(x)
    u = t * t
    p = t * (1.0 + u * (-0.33333319 + u * (0.13332662 + u * (-0.053860210 + u * (0.021104177 + u * -0.0063200351)))))
    r = tl.where(t < 0.55, p, 1.0 - 2.0 / (tl.exp(2.0 * t) + 1.0))
    return tl.where((x != x) | (x == 0.0), x, tl.where(x < 0.0, -r, r))  # NaN and the sign of zero kept
''',
}


def _bin(sym):
    return lambda a, b, alpha=None, **_: f"{a} {sym} {b}" if alpha in (None, 1, 1.0) else f"{a} {sym} {b} * {alpha}"


def _clamp(a, lo=None, hi=None, **_):
    # torch.clamp propagates NaN; Triton's minimum/maximum would drop it
    expr = a
    if lo is not None:
        expr = f"tl.maximum({expr}, {lo})"
    if hi is not None:
        expr = f"tl.minimum({expr}, {hi})"
    return f"tl.where({a} != {a}, {a}, {expr})"


def _nan_max(a, b, **_):
    # a NaN either side is the result, as torch's; one test per side, since either may be a constant (a Python
    # float, whose comparison is a Python bool)
    return f"tl.where({a} != {a}, {a}, tl.where({b} != {b}, {b}, tl.maximum({a}, {b})))"


def _nan_min(a, b, **_):
    return f"tl.where({a} != {a}, {a}, tl.where({b} != {b}, {b}, tl.minimum({a}, {b})))"


def _pow(a, e, **_):
    try:
        v = float(e)
    except ValueError:  # a run-time attribute: a general power, defined for positive bases
        return f"tl.exp2(tl.log2({a}) * {e})"
    if v == 1:
        return a
    if v == 0:  # 1 everywhere, inf and NaN included, as torch gives: shaped like the base, not computed from it
        return f"tl.where({a} == {a}, 1.0, 1.0)"
    if v == int(v) and 0 < v <= 4:  # small integer powers as products: exact signs, no log of negatives
        return "(" + " * ".join([a] * int(v)) + ")"
    if v == -1:
        return f"1.0 / {a}"
    if v == 0.5:
        return f"tl.sqrt({a})"
    if v == -0.5:
        return f"1.0 / tl.sqrt({a})"
    if v == int(v):  # other integer powers keep the sign of odd powers of negatives
        odd = "-1.0" if int(v) % 2 else "1.0"
        return f"tl.where({a} < 0, {odd}, 1.0) * tl.exp2(tl.log2(tl.abs({a})) * {e})"
    return f"tl.exp2(tl.log2({a}) * {e})"


_INT_DTYPES = ("torch.int64", "torch.int32", "torch.int16", "torch.int8", "torch.uint8")


def _cast(a, dtype=None, **_):
    # compute stays float32: a cast to a narrower float is a rounding step, to float32 is a no-op, to an integer
    # type a truncation
    narrow = {"torch.bfloat16": "tl.bfloat16", "torch.float16": "tl.float16"}.get(str(dtype))
    if narrow:
        return f"_to_dtype({a}, {narrow}).to(tl.float32)"
    if str(dtype) == "torch.bool":
        return f"({a} != 0)"
    if str(dtype) in _INT_DTYPES:
        # torch truncates toward zero; out of the integer type's range (NaN, inf) the C++ cast is undefined
        # behaviour, so torch defines no value there and the kernel keeps the truncated float
        return f"tl.where({a} < 0, tl.ceil({a}), tl.floor({a}))"
    return a


def _div(a, b, ieee=True, **_):
    # IEEE division costs a slow path on GPUs; only outputs held bit-exact need it (see ieee_nodes)
    return f"tl.div_rn({a}, {b})" if ieee else f"{a} / {b}"


def _cmp(sym):
    return lambda a, b, **_: f"{a} {sym} {b}"


_P = POINTWISE
OP_TABLE: dict[str, OpRule] = {
    # arithmetic
    "aten.add.Tensor": OpRule(_P, _bin("+"), True, "+"),
    "aten.add.Scalar": OpRule(_P, _bin("+"), True, "+"),
    "aten.sub.Tensor": OpRule(_P, _bin("-"), True, "-"),
    "aten.sub.Scalar": OpRule(_P, _bin("-"), True, "-"),
    "aten.rsub.Scalar": OpRule(_P, lambda a, b, **_: f"{b} - {a}", True, "-"),
    "aten.mul.Tensor": OpRule(_P, _bin("*"), True, "*"),
    "aten.mul.Scalar": OpRule(_P, _bin("*"), True, "*"),
    "aten.div.Tensor": OpRule(_P, _div, True, "tl.div_rn where held exact, else /"),
    "aten.div.Scalar": OpRule(_P, _div, True, "tl.div_rn where held exact, else /"),
    "aten.neg.default": OpRule(_P, lambda a, **_: f"-{a}", True, "-"),
    "aten.abs.default": OpRule(_P, lambda a, **_: f"tl.abs({a})", True, "tl.abs"),
    "aten.reciprocal.default": OpRule(_P, lambda a, ieee=True, **_: _div("1.0", a, ieee), True,
                                      "tl.div_rn where held exact, else /"),
    "aten.pow.Tensor_Scalar": OpRule(_P, _pow, False, "*, tl.sqrt_rn, tl.exp2/log2"),
    "aten.sqrt.default": OpRule(_P, lambda a, ieee=True, **_: f"tl.sqrt_rn({a})" if ieee else f"tl.sqrt({a})", True,
                                "tl.sqrt_rn where held exact, else tl.sqrt"),
    "aten.rsqrt.default": OpRule(_P, lambda a, **_: f"1.0 / tl.sqrt({a})", False, "tl.sqrt, /"),
    "aten.exp.default": OpRule(_P, lambda a, **_: f"tl.exp({a})", False, "tl.exp"),
    "aten.log.default": OpRule(_P, lambda a, **_: f"tl.log({a})", False, "tl.log"),
    # log1p / expm1 from log and exp without losing small arguments (Goldberg's correction by u - 1)
    "aten.log1p.default": OpRule(
        _P, lambda a, **_: f"tl.where((1.0 + {a}) == 1.0, {a}, tl.log(1.0 + {a}) * ({a} / ((1.0 + {a}) - 1.0)))",
        False, "tl.log, tl.where"),
    "aten.expm1.default": OpRule(
        _P, lambda a, **_: f"tl.where(tl.exp({a}) == 1.0, {a}, tl.where(tl.exp({a}) - 1.0 == -1.0, -1.0, "
                           f"(tl.exp({a}) - 1.0) * ({a} / tl.log(tl.exp({a})))))", False, "tl.exp, tl.log"),
    "aten.exp2.default": OpRule(_P, lambda a, **_: f"tl.exp2({a})", False, "tl.exp2"),
    "aten.log2.default": OpRule(_P, lambda a, **_: f"tl.log2({a})", False, "tl.log2"),
    "aten.tanh.default": OpRule(_P, lambda a, **_: f"_tanh({a})", False, "tl.exp, a polynomial near 0"),
    "aten.sigmoid.default": OpRule(_P, lambda a, **_: f"1.0 / (1.0 + tl.exp(-{a}))", False, "tl.exp, /"),
    "aten.erf.default": OpRule(_P, lambda a, **_: f"tl.math.erf({a})", False, "tl.math.erf"),
    "aten.sin.default": OpRule(_P, lambda a, **_: f"tl.sin({a})", False, "tl.sin"),
    "aten.cos.default": OpRule(_P, lambda a, **_: f"tl.cos({a})", False, "tl.cos"),
    # rounding
    "aten.round.default": OpRule(_P, lambda a, **_: f"_round_half_even({a})", True, "tl.floor, tl.where"),
    "aten.floor.default": OpRule(_P, lambda a, **_: f"tl.floor({a})", True, "tl.floor"),
    "aten.ceil.default": OpRule(_P, lambda a, **_: f"tl.ceil({a})", True, "tl.ceil"),
    "aten.sgn.default": OpRule(
        _P, lambda a, **_: f"tl.where({a} > 0, 1.0, tl.where({a} < 0, -1.0, {a}))", True, "tl.where"),
    "aten.sign.default": OpRule(
        _P, lambda a, **_: f"tl.where({a} > 0, 1.0, tl.where({a} < 0, -1.0, {a}))", True, "tl.where"),
    # clamps and selects
    "aten.clamp.default": OpRule(_P, _clamp, True, "tl.maximum, tl.minimum, tl.where"),
    "aten.clamp_min.default": OpRule(_P, lambda a, lo, **_: _clamp(a, lo), True, "tl.maximum, tl.where"),
    "aten.clamp_max.default": OpRule(_P, lambda a, hi, **_: _clamp(a, None, hi), True, "tl.minimum, tl.where"),
    "aten.maximum.default": OpRule(_P, _nan_max, True, "tl.maximum, tl.where"),
    "aten.minimum.default": OpRule(_P, _nan_min, True, "tl.minimum, tl.where"),
    "aten.where.self": OpRule(_P, lambda c, a, b, **_: f"tl.where({c}, {a}, {b})", True, "tl.where"),
    "aten.masked_fill.Scalar": OpRule(_P, lambda a, m, v, **_: f"tl.where({m}, {v}, {a})", True, "tl.where"),
    "aten.masked_fill.Tensor": OpRule(_P, lambda a, m, v, **_: f"tl.where({m}, {v}, {a})", True, "tl.where"),
    "aten.clamp.Tensor": OpRule(_P, _clamp, True, "tl.maximum, tl.minimum, tl.where"),
    "aten.clamp_min.Tensor": OpRule(_P, lambda a, lo, **_: _clamp(a, lo), True, "tl.maximum, tl.where"),
    "aten.clamp_max.Tensor": OpRule(_P, lambda a, hi, **_: _clamp(a, None, hi), True, "tl.minimum, tl.where"),
    "aten.isnan.default": OpRule(_P, lambda a, **_: f"({a} != {a})", True, "!="),
    "aten.isinf.default": OpRule(_P, lambda a, **_: f"(tl.abs({a}) == float('inf'))", True, "tl.abs, =="),
    "aten.bitwise_and.Tensor": OpRule(_P, lambda a, b, **_: f"({a}) & ({b})", True, "&"),
    "aten.bitwise_or.Tensor": OpRule(_P, lambda a, b, **_: f"({a}) | ({b})", True, "|"),
    "aten.bitwise_not.default": OpRule(_P, lambda a, **_: f"({a}) == 0", True, "=="),
    # NaN and -0.0 pass through, as torch's; -inf is 0, not -inf · 0
    "aten.relu.default": OpRule(_P, lambda a, **_: f"tl.where(({a} >= 0) | ({a} != {a}), {a}, 0.0)", True,
                                "tl.where"),
    # comparisons and logic (int1 in registers)
    "aten.gt.Scalar": OpRule(_P, _cmp(">"), True, ">"),
    "aten.gt.Tensor": OpRule(_P, _cmp(">"), True, ">"),
    "aten.ge.Scalar": OpRule(_P, _cmp(">="), True, ">="),
    "aten.ge.Tensor": OpRule(_P, _cmp(">="), True, ">="),
    "aten.lt.Scalar": OpRule(_P, _cmp("<"), True, "<"),
    "aten.lt.Tensor": OpRule(_P, _cmp("<"), True, "<"),
    "aten.le.Scalar": OpRule(_P, _cmp("<="), True, "<="),
    "aten.le.Tensor": OpRule(_P, _cmp("<="), True, "<="),
    "aten.eq.Scalar": OpRule(_P, _cmp("=="), True, "=="),
    "aten.eq.Tensor": OpRule(_P, _cmp("=="), True, "=="),
    "aten.ne.Scalar": OpRule(_P, _cmp("!="), True, "!="),
    "aten.ne.Tensor": OpRule(_P, _cmp("!="), True, "!="),
    "aten.logical_and.default": OpRule(_P, lambda a, b, **_: f"({a}) & ({b})", True, "&"),
    "aten.logical_and_.default": OpRule(_P, lambda a, b, **_: f"({a}) & ({b})", True, "&"),
    "aten.logical_or.default": OpRule(_P, lambda a, b, **_: f"({a}) | ({b})", True, "|"),
    "aten.logical_or_.default": OpRule(_P, lambda a, b, **_: f"({a}) | ({b})", True, "|"),
    "aten.logical_not.default": OpRule(_P, lambda a, **_: f"({a}) == 0", True, "=="),
    "aten._to_copy.default": OpRule(_P, _cast, True, ".to (integers: tl.floor/tl.ceil toward zero)"),
    # constants
    "aten.full_like.default": OpRule(CONSTANT, lambda a, v, **_: f"{v}", True, "literal"),
    "aten.scalar_tensor.default": OpRule(CONSTANT, lambda v, **_: f"{v}", True, "literal"),
    "aten.zeros_like.default": OpRule(CONSTANT, lambda a, **_: "0.0", True, "literal"),
    "aten.ones_like.default": OpRule(CONSTANT, lambda a, **_: "1.0", True, "literal"),
    "aten.full.default": OpRule(CONSTANT, lambda shape, v, **_: f"{v}", True, "literal"),
    "aten.new_zeros.default": OpRule(CONSTANT, lambda a, size, **_: "0.0", True, "literal"),
    "aten.new_full.default": OpRule(CONSTANT, lambda a, size, v, **_: f"{v}", True, "literal"),
    # views keep the flat element order, so they are free in registers
    "aten.detach.default": OpRule(VIEW, None, True, "(none)"),
    "aten.alias.default": OpRule(VIEW, None, True, "(none)"),
    "aten.clone.default": OpRule(VIEW, None, True, "(none)"),
    "aten.view.default": OpRule(VIEW, None, True, "(none)"),
    "aten.reshape.default": OpRule(VIEW, None, True, "(none)"),
    "aten._unsafe_view.default": OpRule(VIEW, None, True, "(none)"),
    "aten.expand.default": OpRule(VIEW, None, True, "broadcast"),
    "aten.unsqueeze.default": OpRule(VIEW, None, True, "(none)"),
    "aten.squeeze.dim": OpRule(VIEW, None, True, "(none)"),
    "aten.squeeze.dims": OpRule(VIEW, None, True, "(none)"),
    "aten.squeeze.default": OpRule(VIEW, None, True, "(none)"),
    # reductions (a block-local tl.sum/max/min, then across blocks: atomics or ordered partials)
    "aten.sum.dim_IntList": OpRule(REDUCTION, None, False, "tl.sum + atomic_add | ordered partials"),
    "aten.sum.default": OpRule(REDUCTION, None, False, "tl.sum + atomic_add | ordered partials"),
    "aten.mean.dim": OpRule(REDUCTION, None, False, "tl.sum, * (1 / n)"),
    "aten.mean.default": OpRule(REDUCTION, None, False, "tl.sum, * (1 / n)"),
    "aten.amax.default": OpRule(REDUCTION, None, True, "tl.max + atomic_max | ordered partials"),
    "aten.amin.default": OpRule(REDUCTION, None, True, "tl.min + atomic_min | ordered partials"),
    "aten.prod.dim_int": OpRule(REDUCTION, None, False, "tl.reduce(_mul) over columns"),
    "aten.argmax.default": OpRule(REDUCTION, None, True, "tl.max, tl.min over columns (the first, NaN first)"),
    "aten.argmin.default": OpRule(REDUCTION, None, True, "tl.min, tl.min over columns (the first, NaN first)"),
    # last-dimension slices, concatenations and interleaves (row planner): loads at moved columns
    "aten.slice.Tensor": OpRule(SHIFT, None, True, "load at a column offset or stride"),
    "aten.cat.default": OpRule(SHIFT, None, True, "tl.where over column ranges"),
    "aten.slice_backward.default": OpRule(SHIFT, None, True, "tl.where over a column range or stride"),
    "aten.stack.default": OpRule(SHIFT, None, True, "tl.where over interleaved columns"),
    # the column index: gather / scatter of one element per row become selects on it (codegen/decompose.py)
    "aten.arange.default": OpRule(COLUMN, None, True, "tl.arange (the column index)"),
    "aten.arange.start": OpRule(COLUMN, None, True, "tl.arange (the column index)"),
    # scans along the columns (row planner): a row's chunks in order, a running carry between them
    "aten.cumsum.default": OpRule(SCAN, None, False, "tl.cumsum"),
    "opforge.reverse_cumsum.default": OpRule(SCAN, None, False, "tl.cumsum(reverse=True)"),
    "aten.cumprod.default": OpRule(SCAN, None, False, "tl.cumprod"),
    "aten.logcumsumexp.default": OpRule(SCAN, None, False, "tl.associative_scan(_logaddexp)"),
    "opforge.reverse_logcumsumexp.default": OpRule(SCAN, None, False, "tl.associative_scan(_logaddexp, reverse=True)"),
    # sizes: Python arithmetic on shapes, done on the kernel's integer size arguments
    "aten.sym_size.int": OpRule(SYMBOLIC, None, True, "size argument"),
    "aten.sym_numel.default": OpRule(SYMBOLIC, None, True, "product of size arguments"),
    "operator.mul": OpRule(SYMBOLIC, None, True, "*"),
    "operator.add": OpRule(SYMBOLIC, None, True, "+"),
    "operator.sub": OpRule(SYMBOLIC, None, True, "-"),
    "operator.floordiv": OpRule(SYMBOLIC, None, True, "//"),
    "operator.truediv": OpRule(SYMBOLIC, None, True, "/"),
    "torch.sym_float": OpRule(SYMBOLIC, None, True, "(float)"),
    "operator.pow": OpRule(SYMBOLIC, None, False, "tl.sqrt_rn for ±1/2, else tl.exp2/log2"),
}

REDUCE_KIND = {
    "aten.sum.dim_IntList": "sum", "aten.sum.default": "sum", "aten.mean.dim": "mean",
    "aten.mean.default": "mean", "aten.amax.default": "max", "aten.amin.default": "min",
    "aten.argmax.default": "argmax", "aten.argmin.default": "argmin", "aten.prod.dim_int": "prod",
}
INDEX_KINDS = ("argmax", "argmin")  # reductions to a column index: along rows only
ROW_ONLY_KINDS = (*INDEX_KINDS, "prod")  # no atomic combines them across programs
# How partial results of each kind meet, in generated Triton: the identity, the atomic, and two partials combined
# (a mean is summed, then divided).
REDUCE_IDENTITY = {"sum": "0.0", "mean": "0.0", "max": "-float('inf')", "min": "float('inf')", "prod": "1.0"}
REDUCE_ATOMIC = {"sum": "tl.atomic_add", "max": "tl.atomic_max", "min": "tl.atomic_min"}


# Scans by what they combine: (identity, the scan of a chunk along its columns, the chunk's total per row, two
# partial results combined), in generated Triton; {x} is the chunk, {r} the argument of a scan that runs backwards.
SCAN_KIND = {
    "aten.cumsum.default": "sum", "opforge.reverse_cumsum.default": "sum", "aten.cumprod.default": "prod",
    "aten.logcumsumexp.default": "logsumexp", "opforge.reverse_logcumsumexp.default": "logsumexp",
}
SCAN_FORMS = {
    "sum": ("0.0", "tl.cumsum({x}, axis=1{r})", "tl.sum({x}, axis=1)[:, None]", "{a} + {b}"),
    "prod": ("1.0", "tl.cumprod({x}, axis=1{r})", "tl.reduce({x}, 1, _mul)[:, None]", "{a} * {b}"),
    "logsumexp": ("-float('inf')", "tl.associative_scan({x}, 1, _logaddexp{r})",
                  "tl.reduce({x}, 1, _logaddexp)[:, None]", "_logaddexp({a}, {b})"),
}


def is_mask(node) -> bool:
    """A boolean graph value (a mask input, a comparison handed over from another kernel)."""
    val = node.meta.get("val") if hasattr(node, "meta") else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.bool


def load_value(at: str, mask: str = "", boolean: bool = False) -> str:
    """A tensor element loaded into registers: float32, or a condition for a mask, whatever the buffer holds."""
    masked = f", mask={mask}, other=0" if mask else ""
    if boolean:
        return f"tl.load({at}{masked}) != 0"
    return f"_to_f32(tl.load({at}{masked}{'.0' if mask else ''}))"


def is_reverse_scan(key: str) -> bool:
    return key.startswith("opforge.reverse_")


# PyTorch's formulas write a suffix scan as flip(scan(flip(x))); decompose.reverse_scans rewrites that into these
# ops, so that a kernel scans backwards instead of reading its row back to front.
@torch.library.custom_op("opforge::reverse_cumsum", mutates_args=())
def reverse_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.flip(dim).cumsum(dim).flip(dim)


@torch.library.custom_op("opforge::reverse_logcumsumexp", mutates_args=())
def reverse_logcumsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.flip(dim).logcumsumexp(dim).flip(dim)


@reverse_cumsum.register_fake
@reverse_logcumsumexp.register_fake
def _same_shape(x, dim):
    return torch.empty_like(x)


def reduce_combine(kind: str, acc: str, part: str) -> str:
    """Two partial results combined; a NaN in either wins, as in torch's amax and amin."""
    if kind in ("sum", "mean"):
        return f"{acc} + {part}"
    return (_nan_max if kind == "max" else _nan_min)(acc, part)


def block_reduce(kind: str, block: str) -> str:
    """A block of any shape reduced to one value: tl.sum, or a max/min that keeps NaN (codegen/across.py)."""
    return f"tl.sum({block})" if kind in ("sum", "mean") else f"_{kind}_keep_nan({block})"


def ieee_nodes(graph, outputs) -> set:
    """The nodes an output computed only from bit-exact ops depends on. There division and square root stay
    IEEE (tl.div_rn, tl.sqrt_rn) for the output to match torch bit for bit; elsewhere the fast forms serve."""
    exact: dict = {}
    for n in graph.nodes:
        if n.op == "call_function":
            rule = OP_TABLE.get(op_name(n.target))
            exact[n] = bool(rule and rule.exact) and all(exact.get(s, True) for s in n.all_input_nodes)
        else:
            exact[n] = True
    return upstream(o for o in outputs if isinstance(o, torch.fx.Node) and exact.get(o))


def upstream(nodes) -> set:
    """The fx nodes given (others are skipped) and every node they depend on."""
    seen: set = set()
    stack = [n for n in nodes if isinstance(n, torch.fx.Node)]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


def op_name(target) -> str:
    """'aten.add.Tensor' for torch.ops.aten.add.Tensor; 'operator.mul' for Python arithmetic on sizes."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", str(target))
    return f"{'operator' if module in ('_operator', 'operator') else module}.{name}"



def markdown_table() -> str:
    """The supported op set as the docs show it (docs/ops.md is this text; a test keeps them equal)."""
    lines = ["# Supported ATen operators", "",
             "Generated from `opforge.codegen.ops.OP_TABLE` by `opforge op ops --markdown`. The deterministic "
             "engine lowers exactly these; stage 2 names any other op it meets and stops the run as BLOCKED_API. "
             "Composite ops (softmax, log-softmax, logsumexp, GELU, SiLU, layer norm and their backward formulas) "
             "are split into these by PyTorch's decompositions before planning; variance becomes two means.", "",
             "Bit-exact ops are compared bit for bit against the golden's float32 path when every op on an "
             "output's path is exact.", "",
             "| ATen op | kind | Triton | bit-exact |", "|---|---|---|---|"]
    for name in sorted(OP_TABLE, key=lambda k: (OP_TABLE[k].kind, k)):
        r = OP_TABLE[name]
        triton = r.primitive.replace("|", "\\|")  # a pipe in a cell is escaped: `a | b` is a choice, not a division
        lines.append(f"| `{name}` | {r.kind} | {triton} | {'yes' if r.exact else 'no'} |")
    return "\n".join(lines) + "\n"
