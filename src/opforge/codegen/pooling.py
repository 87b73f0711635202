"""Pooling as stages of a staged pass: max and average pooling in 1 to 3 spatial dimensions, adaptive or with a
kernel size, stride, padding, dilation and ceil mode, and their backwards (codegen/emit_pool.py writes them).

PyTorch traces every pooling to a few ATen ops (1-D pooling is 2-D pooling of a height-1 view), each with its
window's geometry as literal arguments. The forward runs one lane per output element and walks its window; a
backward runs one lane per *input* element and gathers from the windows that cover it (a max pooling's
gradient where the window's index names that element), so no two programs write one place and the sum needs
no atomics. The glue around a pooling (a ReLU before it, a scale after it) is planned as around a product.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

from opforge.codegen.ops import op_name
from opforge.codegen.plan import Unsupported
from opforge.i18n import _, ngettext, using

# op -> (kind, adaptive, backward, spatial rank)
POOLS = {
    "aten.max_pool2d_with_indices.default": ("max", False, False, 2),
    "aten.max_pool3d_with_indices.default": ("max", False, False, 3),
    "aten.max_pool2d_with_indices_backward.default": ("max", False, True, 2),
    "aten.max_pool3d_with_indices_backward.default": ("max", False, True, 3),
    "aten.avg_pool2d.default": ("avg", False, False, 2),
    "aten.avg_pool3d.default": ("avg", False, False, 3),
    "aten.avg_pool2d_backward.default": ("avg", False, True, 2),
    "aten.avg_pool3d_backward.default": ("avg", False, True, 3),
    "aten._adaptive_avg_pool2d.default": ("avg", True, False, 2),
    "aten._adaptive_avg_pool3d.default": ("avg", True, False, 3),
    "aten._adaptive_avg_pool2d_backward.default": ("avg", True, True, 2),
    "aten._adaptive_avg_pool3d_backward.default": ("avg", True, True, 3),
    "aten.adaptive_max_pool2d.default": ("max", True, False, 2),
    "aten.adaptive_max_pool3d.default": ("max", True, False, 3),
    "aten.adaptive_max_pool2d_backward.default": ("max", True, True, 2),
    "aten.adaptive_max_pool3d_backward.default": ("max", True, True, 3),
}


@dataclass
class PoolStage:
    """One pooling op as a Triton kernel; its values named as in the pass.

    Forward: `x` (N, C, *S) or (C, *S) pooled to `out` (N, C, *O), a max pooling's flat spatial index of each
    output's element in `indices`. Backward: the gradient of `x` in `out` from the upstream `grad` (and, for a
    max, the forward's `indices`). `out` or `indices` is None where nothing reads it."""

    name: str  # names the kernel: _{op}_{name}_kernel
    op: str  # ATen overload
    kind: str  # "max" | "avg"
    adaptive: bool
    backward: bool
    rank: int  # spatial dimensions
    x: str
    out: str | None
    indices: str | None
    grad: str | None = None
    kernel: tuple = ()  # per spatial dimension (not adaptive)
    stride: tuple = ()
    padding: tuple = ()
    dilation: tuple = ()
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor: int | None = None  # avg_pool's divisor_override
    output_size: tuple = ()  # adaptive pooling's output sizes: ints, or None to read them off `grad`
    like: str | None = None  # input whose dtype `out` takes (None: a float32 buffer)
    in_shape: tuple = ()  # x's shape (symbolic)
    out_shape: tuple = ()  # the pooled shape (symbolic)

    @property
    def reads(self) -> list[str]:
        """What it loads: a backward reads only the forward input's sizes."""
        if self.backward:
            return [self.grad] + ([self.indices] if self.indices else [])
        return [self.x]

    @property
    def writes(self) -> list[str]:
        return [self.out] if self.backward else [v for v in (self.out, self.indices) if v]

    @property
    def launches(self) -> int:
        return 1

    def window(self, numel) -> int:
        """Elements a window holds (the widest an adaptive one may hold)."""
        if not self.adaptive:
            return math.prod(self.kernel)
        return math.prod(-(-numel([i]) // max(numel([o]), 1)) + 1
                         for i, o in zip(self.in_shape[-self.rank:], self.out_shape[-self.rank:]))

    def flops(self, numel) -> int:
        """One compare or add per element of each output's window (each input's covering windows, backward)."""
        return numel(list(self.out_shape)) * self.window(numel)


def _ints(v, rank: int, what: str, op: str) -> tuple:
    """A size argument as `rank` ints: an int or a one-element list repeats, an empty list is None."""
    if isinstance(v, int):
        return (v,) * rank
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) for x in v):
        raise Unsupported([op], f"a {what} computed at run time (pooling's window is fixed at build time)")
    if len(v) == 1:
        return tuple(v) * rank
    return tuple(v)


def _arg(p, index: int, name: str, default):
    if len(p.args) > index:
        return p.args[index]
    return p.kwargs.get(name, default)


def pool_stage(name: str, p, names: dict, result_like: dict, needed: set) -> PoolStage:
    """The stage computing pooling node `p` of a pass (`names`: each value's name in the pass; `needed`: the
    values the pass reads, so that a max's values or indices nobody reads are not stored)."""
    op = op_name(p.target)
    kind, adaptive, backward, rank = POOLS[op]
    getitems = {u.args[1]: u for u in p.users
                if u.op == "call_function" and u.target is operator.getitem and u in needed}
    x = p.args[1] if backward else p.args[0]
    grad = p.args[0] if backward else None
    stage = dict(name=name, op=op, kind=kind, adaptive=adaptive, backward=backward, rank=rank, x=names[x],
                 grad=names[grad] if grad is not None else None, in_shape=tuple(x.meta["val"].shape))
    if backward:
        stage.update(out=names[p], like=result_like.get(p), out_shape=tuple(grad.meta["val"].shape))
        stage["indices"] = names[p.args[-1]] if kind == "max" else None
    else:
        value = getitems.get(0) if kind == "max" else p
        stage.update(out=names[value] if value is not None else None,
                     indices=names[getitems[1]] if kind == "max" and 1 in getitems else None,
                     like=result_like.get(value) if value is not None else None,
                     out_shape=tuple((value if value is not None else getitems[1]).meta["val"].shape))
    if adaptive:
        if not backward:
            stage["output_size"] = _ints(p.args[1], rank, "output size", op)
        return PoolStage(**stage)
    base = 2 if backward else 1  # the window's arguments follow the tensors
    kernel = _ints(p.args[base], rank, "kernel size", op)
    stride = _ints(p.args[base + 1] if len(p.args) > base + 1 else [], rank, "stride", op) or kernel
    padding = _ints(p.args[base + 2] if len(p.args) > base + 2 else 0, rank, "padding", op)
    if kind == "max":
        dilation = _ints(_arg(p, base + 3, "dilation", 1), rank, "dilation", op)
        ceil_mode = bool(_arg(p, base + 4, "ceil_mode", False))
        stage.update(dilation=dilation, ceil_mode=ceil_mode)
    else:
        stage.update(dilation=(1,) * rank, ceil_mode=bool(_arg(p, base + 3, "ceil_mode", False)),
                     count_include_pad=bool(_arg(p, base + 4, "count_include_pad", True)),
                     divisor=_arg(p, base + 5, "divisor_override", None))
        if stage["divisor"] is not None and not isinstance(stage["divisor"], int):
            raise Unsupported([op], "a divisor computed at run time")
    return PoolStage(**stage, kernel=kernel, stride=stride, padding=padding)


def pool_text(st: PoolStage, lang: str | None = "en") -> str:
    """One sentence saying what a pool stage computes, for the reports: in `lang`, English by default (the design
    summaries keep it in their JSON), None for the current language."""
    with using(lang):
        return _pool_sentence(st)


def _pool_sentence(st: PoolStage) -> str:
    if st.adaptive:
        what = ngettext("adaptive max pooling over {rank} dimension", "adaptive max pooling over {rank} dimensions",
                        st.rank) if st.kind == "max" else \
            ngettext("adaptive avg pooling over {rank} dimension", "adaptive avg pooling over {rank} dimensions",
                     st.rank)
    else:
        what = ngettext("max pooling over {rank} dimension", "max pooling over {rank} dimensions", st.rank) \
            if st.kind == "max" else \
            ngettext("avg pooling over {rank} dimension", "avg pooling over {rank} dimensions", st.rank)
    what = what.format(rank=st.rank)
    if st.adaptive:
        window = _(" to {size}").format(size=st.output_size) if st.output_size else ""
    elif st.kind == "max":
        window = (_(" (kernel {kernel}, stride {stride}, padding {padding}, dilation {dilation}, ceil mode)")
                  if st.ceil_mode else _(" (kernel {kernel}, stride {stride}, padding {padding}, dilation {dilation})"))
    else:
        window = (_(" (kernel {kernel}, stride {stride}, padding {padding}, ceil mode)") if st.ceil_mode
                  else _(" (kernel {kernel}, stride {stride}, padding {padding})"))
    window = window.format(kernel=st.kernel, stride=st.stride, padding=st.padding, dilation=st.dilation)
    if st.backward and st.kind == "max":
        text = _("the gradient of {what}{window}: {out} from {grad}, one lane per input element gathering from the "
                 "windows that hold it where their index names it.")
    elif st.backward:
        text = _("the gradient of {what}{window}: {out} from {grad}, one lane per input element gathering from the "
                 "windows that hold it.")
    else:
        text = _("{what}{window}: {writes} from {x}, one lane per output element walking its window.")
    return text.format(what=what, window=window, out=st.out, grad=st.grad, writes=", ".join(st.writes), x=st.x)
