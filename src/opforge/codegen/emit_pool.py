"""Triton source for the pooling stages of a staged pass (codegen/pooling.py): the kernel and its launcher.

The forward gives each lane one output element and walks its window: the kernel's extent unrolled (its sizes
are literals of the op), an adaptive window's extent as a loop up to the widest one. Padding is never read:
a window's elements outside the input are masked off, so a max ignores them and an average counts them only
where `count_include_pad` says so. A max follows PyTorch's rule: a greater value or a NaN takes the place, the
window's first element starts it, and its index is the element's flat position in its (n, c) plane.

The backward gives each lane one input element and gathers: for each place the element may take in a window
(k along each dimension) the window that would put it there, if one starts there (a multiple of the stride)
and exists; a max adds that window's gradient where its index names the element, an average its share. Every
lane writes only its own element: no atomics, the same bits each run.
"""

from __future__ import annotations

import math

from opforge.codegen.emit_rows import launcher_signature
from opforge.codegen.pooling import PoolStage
from opforge.codegen.pretty import WIDTH, CodeBuffer, hanging_call

POOL_KNOBS = """\
# pooling stages: output (or input, backward) elements per program, and warps
POOL_BLOCK = 256
POOL_NUM_WARPS = 4
_POOL_LAUNCH = {} if INTERPRET else {"num_warps": POOL_NUM_WARPS, "enable_fp_fusion": False}
"""

_DIMS = {1: "w", 2: "hw", 3: "dhw"}


def pool_kernel_name(op: str, st: PoolStage) -> str:
    return f"_{op}_{st.name}_kernel"


def _affine(var: str, mul: int, add: int) -> str:
    """var * mul + add, without the factors that do nothing."""
    src = var if mul == 1 else f"{var} * {mul}"
    return src if add == 0 else f"{src} + {add}" if add > 0 else f"{src} - {-add}"


def _split_index(b: CodeBuffer, index: str, coords: list[str], sizes: list[str]) -> None:
    """Coordinates of a flat index over (planes, *sizes), innermost last: each a modulo of the index divided by
    the sizes inside it; the plane (n, c) what is left."""
    inner = []
    for c, s in zip(reversed(coords), reversed(sizes)):
        div = f"{index} // {_product(inner)}" if inner else index
        b(f"{c} = {div} % {s}")
        inner.insert(0, s)
    b(f"plane = {index} // {_product(inner)}")


def _product(sizes: list[str]) -> str:
    return sizes[0] if len(sizes) == 1 else f"({' * '.join(sizes)})"


def _flat(coords: list[str], sizes: list[str]) -> str:
    """Row-major flat position of `coords` in a plane of `sizes`: ((id * H) + ih) * W + iw."""
    src = coords[0]
    for c, s in zip(coords[1:], sizes[1:]):
        src = f"({src}) * {s} + {c}" if "+" in src else f"{src} * {s} + {c}"
    return src


def _start(st: PoolStage, d: str) -> str:
    """Where the window of output coordinate o{d} starts along dimension d, padding included."""
    k = _DIMS[st.rank].index(d)
    return _affine(f"o{d}", st.stride[k], -st.padding[k])


def _divisor_lines(b: CodeBuffer, st: PoolStage, dims: str) -> str:
    """Lines computing an average's divisor for the windows at output coordinates o{l}; its source."""
    if st.divisor is not None:
        return str(st.divisor)
    if st.adaptive:
        for dim in dims:
            b(f"c{dim} = ((o{dim} + 1) * {dim.upper()} + O{dim.upper()} - 1) // O{dim.upper()} - "
              f"o{dim} * {dim.upper()} // O{dim.upper()}")
        return " * ".join(f"c{dim}" for dim in dims)
    if not st.ceil_mode and not any(st.padding):  # every window lies inside the input
        return str(math.prod(st.kernel))
    for dim, k, p in zip(dims, st.kernel, st.padding):
        s0 = _start(st, dim)
        if st.count_include_pad:  # the window clipped to the padded input
            b(f"c{dim} = tl.minimum({_affine(s0, 1, k)}, {_affine(dim.upper(), 1, p)}) - ({s0})")
        else:  # to the input
            b(f"c{dim} = tl.minimum({_affine(s0, 1, k)}, {dim.upper()}) - tl.maximum({s0}, 0)")
    return " * ".join(f"c{dim}" for dim in dims)


def emit_pool_kernel(op: str, st: PoolStage) -> str:
    return _backward_kernel(op, st) if st.backward else _forward_kernel(op, st)


def _forward_kernel(op: str, st: PoolStage) -> str:
    dims = _DIMS[st.rank]
    sizes, outs = [d.upper() for d in dims], [f"O{d.upper()}" for d in dims]
    ptrs = ["x_ptr"] + ["out_ptr"] * bool(st.out) + ["indices_ptr"] * bool(st.indices)
    widest = [f"K{d.upper()}" for d in dims] if st.adaptive else []
    params = ptrs + ["total", "C"] + sizes + outs + widest + ["sx_n", "sx_c"] + [f"sx_{d}" for d in dims] + \
        ["BLOCK: tl.constexpr"]
    b = CodeBuffer()
    b("@triton.jit")
    b(f"def {pool_kernel_name(op, st)}({', '.join(params)}):")
    with b.indent():
        what = "max" if st.kind == "max" else "average"
        b(f"# One lane per output element, in the output's (N, C, {', '.join(outs)}) order: the {what} of its window,")
        if st.adaptive:
            b("# [o * size // out_size, ceil((o + 1) * size / out_size)) along each dimension.")
        else:
            b(f"# kernel {st.kernel}, stride {st.stride}, padding {st.padding}"
              + (f", dilation {st.dilation}." if st.kind == "max" else "."))
        b("o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)")
        b("live = o < total")
        _split_index(b, "o", [f"o{d}" for d in dims], outs)
        b("x_plane = x_ptr + plane // C * sx_n + plane % C * sx_c")
        if st.adaptive:
            for d in dims:
                b(f"{d}0 = o{d} * {d.upper()} // O{d.upper()}")
                b(f"{d}1 = ((o{d} + 1) * {d.upper()} + O{d.upper()} - 1) // O{d.upper()}")
        if st.kind == "max":
            b("best = tl.full([BLOCK], float(\"-inf\"), tl.float32)")
            b("best_at = tl.full([BLOCK], -1, tl.int64)")
        else:
            b("summed = tl.zeros([BLOCK], tl.float32)")
        checks = []
        for k, d in enumerate(dims):
            if st.adaptive:
                b(f"for k{d} in range(0, K{d.upper()}):")
                b.level += 1
                b(f"i{d} = {d}0 + k{d}")
                checks.append(f"(i{d} < {d}1)")
                continue
            b(f"for k{d} in tl.static_range({st.kernel[k]}):")
            b.level += 1
            b(f"i{d} = {_start(st, d)} + {_affine(f'k{d}', st.dilation[k], 0)}")
            if st.padding[k]:
                checks.append(f"(i{d} >= 0)")
            if st.padding[k] or st.ceil_mode:
                checks.append(f"(i{d} < {d.upper()})")
        offset = " + ".join(f"i{d} * sx_{d}" for d in dims)
        if checks:
            b(f"inside = live & {' & '.join(checks)}")
        mask = "inside" if checks else "live"
        b(f"v = _to_f32(tl.load(x_plane + {offset}, mask={mask}, other=0.0))")
        if st.kind == "max":
            b("# a greater value or a NaN takes the place; the window's first element starts it")
            b(f"take = {mask} & ((v > best) | (v != v) | (best_at < 0))")
            b("best = tl.where(take, v, best)")
            b(f"best_at = tl.where(take, {_flat([f'i{d}' for d in dims], sizes)}, best_at)")
        else:
            b("summed += v")
        b.level -= st.rank
        if st.kind == "max":
            if st.out:
                b("tl.store(out_ptr + o, _to_dtype(best, out_ptr.dtype.element_ty), mask=live)")
            if st.indices:
                b("tl.store(indices_ptr + o, best_at, mask=live)")
        else:
            count = _divisor_lines(b, st, dims)
            value = f"summed / {count}" if count.isdigit() else f"summed / ({count}).to(tl.float32)"
            b(f"tl.store(out_ptr + o, _to_dtype({value}, out_ptr.dtype.element_ty), mask=live)")
    return b.text()


def _backward_kernel(op: str, st: PoolStage) -> str:
    dims = _DIMS[st.rank]
    sizes, outs = [d.upper() for d in dims], [f"O{d.upper()}" for d in dims]
    maxed = st.kind == "max"
    ptrs = ["grad_ptr"] + ["indices_ptr"] * maxed + ["out_ptr"]
    covering = [f"J{d.upper()}" for d in dims] if st.adaptive else []
    strides = ["sg_n", "sg_c"] + [f"sg_{d}" for d in dims]
    if maxed:
        strides += ["si_n", "si_c"] + [f"si_{d}" for d in dims]
    params = ptrs + ["total", "C"] + sizes + outs + covering + strides + ["BLOCK: tl.constexpr"]
    b = CodeBuffer()
    b("@triton.jit")
    b(f"def {pool_kernel_name(op, st)}({', '.join(params)}):")
    with b.indent():
        b(f"# One lane per input element, in the input's (N, C, {', '.join(sizes)}) order: the sum of the "
          "gradients of")
        if maxed:
            b("# the windows that hold it and whose max it is (their index names it).")
        else:
            b("# the windows that hold it, each divided by its own divisor.")
        b("i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)")
        b("live = i < total")
        _split_index(b, "i", [f"i{d}" for d in dims], sizes)
        b("g_plane = grad_ptr + plane // C * sg_n + plane % C * sg_c")
        if maxed:
            b("at_plane = indices_ptr + plane // C * si_n + plane % C * si_c")
            b(f"here = {_flat([f'i{d}' for d in dims], sizes)}")
        b("summed = tl.zeros([BLOCK], tl.float32)")
        checks = []
        for k, d in enumerate(dims):
            if st.adaptive:
                if k == 0:
                    b("# the windows holding the element: from the first that ends past it, J at most per dimension")
                b(f"for j{d} in range(0, J{d.upper()}):")
                b.level += 1
                b(f"o{d} = i{d} * O{d.upper()} // {d.upper()} + j{d}")
                checks += [f"(o{d} < O{d.upper()})", f"(o{d} * {d.upper()} // O{d.upper()} <= i{d})"]
                continue
            s, p, dil = st.stride[k], st.padding[k], st.dilation[k]
            b(f"for k{d} in tl.static_range({st.kernel[k]}):")
            b.level += 1
            b(f"t{d} = {_affine(f'i{d}', 1, p)} - {_affine(f'k{d}', dil, 0)}"
              + "  # where a window holding it at k starts, padded" * (k == 0))
            b(f"o{d} = t{d} // {s}" if s != 1 else f"o{d} = t{d}")
            checks.append(f"(t{d} >= 0)")
            if s != 1:
                checks.append(f"(t{d} % {s} == 0)")
            checks.append(f"(o{d} < O{d.upper()})")
        b(f"covers = live & {' & '.join(checks)}")
        g_off = " + ".join(f"o{d} * sg_{d}" for d in dims)
        if maxed:
            i_off = " + ".join(f"o{d} * si_{d}" for d in dims)
            b(f"covers = covers & (tl.load(at_plane + {i_off}, mask=covers, other=-1) == here)")
        b(f"g = _to_f32(tl.load(g_plane + {g_off}, mask=covers, other=0.0))")
        if maxed:
            b("summed += g")
        else:
            count = _divisor_lines(b, st, dims)
            if count.isdigit():
                b(f"summed += g / {count}")
            else:  # a window that does not hold the element may have no elements at all
                b(f"summed += tl.where(covers, g / ({count}).to(tl.float32), 0.0)")
        b.level -= st.rank
        b("tl.store(out_ptr + i, _to_dtype(summed, out_ptr.dtype.element_ty), mask=live)")
    return b.text()


def _out_size(st: PoolStage, k: int, dim: str) -> str:
    """The launcher's source for output size O{dim} from input size {dim}, as torch's pooling_output_shape."""
    size, ks, s, p, d = dim.upper(), st.kernel[k], st.stride[k], st.padding[k], st.dilation[k]
    num = _affine(size, 1, 2 * p - d * (ks - 1) - 1 + (s - 1 if st.ceil_mode else 0))
    src = f"({num}) // {s} + 1" if s != 1 else _affine(size, 1, 2 * p - d * (ks - 1) - 1 + 1)
    return src


def emit_pool_launcher(op: str, st: PoolStage, fn_name: str, tensor_args: list[str], attrs: list[str]) -> str:
    """Views the tensors as (N, C, *spatial) (an unbatched one gains N = 1), reads the sizes, allocates the
    outputs and launches one program per POOL_BLOCK elements."""
    dims = _DIMS[st.rank]
    full = st.rank + 2
    sizes, outs = [d.upper() for d in dims], [f"O{d.upper()}" for d in dims]
    b = CodeBuffer()
    b(f"def {fn_name}({launcher_signature(tensor_args, attrs)}):")
    with b.indent():
        ndim = len(st.in_shape)
        if not st.backward:  # the sizes are read off the declared dimensions
            b(f"if {st.x}.dim() != {ndim}:")
            b(f'    raise ValueError(f"{st.x}: expected {ndim} dimensions for this operator, got shape '
              f'{{tuple({st.x}.shape)}}")')
            b(f"if 0 in {st.x}.shape[-{st.rank + 1}:]:  # as torch: only the batch may be empty")
            b(f'    raise ValueError(f"{st.x}: pooling needs channels and a non-empty window space, got shape '
              f'{{tuple({st.x}.shape)}}")')

        def batched(t: str) -> str:
            """t as the kernel reads it: an unbatched tensor gains N = 1."""
            if ndim == full:
                return t
            b(f"{t}_b = {t}.unsqueeze(0)")
            return f"{t}_b"

        xb = batched(st.x)
        b(f"_, C, {', '.join(sizes)} = {xb}.shape")
        dtype = f"{st.like}.dtype" if st.like else "torch.float32"
        if st.backward:
            gb = batched(st.grad)
            b(f"{', '.join(outs)} = {gb}.shape[2:]")
            ib = [batched(st.indices)] if st.kind == "max" else []  # max: the indices name each window's max
            b(f"{st.out} = torch.empty({st.x}.shape, device={st.x}.device, dtype={dtype})")
            args = [gb, *ib, st.out, f"{st.out}.numel()", "C"] + sizes + outs
            if st.adaptive:
                b("# the most windows one element lies in, along each dimension")
                most = [f"-(-{o} // {s}) + 1" for o, s in zip(outs, sizes)]
                b(f"{', '.join('J' + s for s in sizes)} = {', '.join(most)}")
                args += ["J" + s for s in sizes]
            args += [f"*{t}.stride()" for t in (gb, *ib)]
            total = f"{st.out}.numel()"
        else:
            if st.adaptive:
                b(f"{', '.join(outs)} = {', '.join(map(str, st.output_size))}")
            else:
                for k, d in enumerate(dims):
                    b(f"O{d.upper()} = {_out_size(st, k, d)}")
                    if st.ceil_mode:  # the last window must start inside the input or its left padding
                        b(f"O{d.upper()} -= (O{d.upper()} - 1) * {st.stride[k]} >= "
                          f"{_affine(d.upper(), 1, st.padding[k])}")
            shape = f"(*{st.x}.shape[:-{st.rank}], {', '.join(outs)})"
            if st.out:
                b(f"{st.out} = torch.empty({shape}, device={st.x}.device, dtype={dtype})")
            if st.indices:
                b(f"{st.indices} = torch.empty({shape}, device={st.x}.device, dtype=torch.int64)")
            first = st.out or st.indices
            args = [xb] + [v for v in (st.out, st.indices) if v] + [f"{first}.numel()", "C"] + sizes + outs
            if st.adaptive:
                b("# the widest window along each dimension")
                widest = [f"-(-{s} // {o}) + 1" for s, o in zip(sizes, outs)]
                b(f"{', '.join('K' + s for s in sizes)} = {', '.join(widest)}")
                args += ["K" + s for s in sizes]
            args += [f"*{xb}.stride()"]
            total = f"{first}.numel()"
        b(f"if {total}:  # a grid of no programs is no launch")
        with b.indent():
            b(f"grid = (triton.cdiv({total}, POOL_BLOCK),)")
            for line in hanging_call(f"{pool_kernel_name(op, st)}[grid]", args + ["BLOCK=POOL_BLOCK", "**_POOL_LAUNCH"],
                                     0, WIDTH - 4 * b.level):
                b(line)
        b(f"return {', '.join(st.writes)},")
    return b.text()
