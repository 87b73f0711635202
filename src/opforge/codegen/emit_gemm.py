"""Triton source for the GEMM stages of a staged pass (codegen/gemm.py): the kernel and its launcher.

The kernel is the classic tiled product: each program owns a BLOCK_M × BLOCK_N tile of C, walks K in BLOCK_K
steps, accumulates in float32 with `tl.dot`, and masks every load, so any M, N, K work. Programs are numbered
in groups of GROUP_M tile rows, so that the tiles running together share their B columns in L2. Operands and
outputs are read through their strides (batch, rows, columns), which is how the launcher's transposes and
broadcasts reach the kernel without a copy. An operand computed by pointwise work alone (a weight's
dequantization) is computed on each K step's tile from that work's inputs (the prologue). After the K loop the
tile is still in registers: addmm's bias is added there, and a fused epilogue (the flat planner's statements)
runs on it before the one store.

Split-K (a tuned knob, for skinny products whose tiles are too few to fill the device): SPLIT_K programs share
a tile, each walking its own range of K. Each stores its float32 partial tile, then takes the tile's ticket
(`_last_split`: a barrier, then an acq_rel atomic); the last to take it adds the partials in split order, so
the bits do not depend on which program finished last, and it alone runs the epilogue and stores.
"""

from __future__ import annotations

import textwrap

from opforge.codegen.emit_rows import emit_row_tile, launcher_signature, row_inputs_and_outputs
from opforge.codegen.gemm import GemmStage

GEMM_KNOBS = """\
# GEMM stages: tile sizes, programs grouped by GROUP_M tile rows, warps and pipeline depth of the K loop.
GEMM_BLOCK_M = 128
GEMM_BLOCK_N = 128
GEMM_BLOCK_K = 32
GEMM_GROUP_M = 8
GEMM_NUM_WARPS = 8
GEMM_NUM_STAGES = 3
GEMM_SPLIT_K = 1
_DOT_DTYPE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def _dot_operand(x, DOT_DTYPE: tl.constexpr):
    # the operand rounded to the product's dtype; the interpreter holds bfloat16 as bits, so there the
    # product takes the float32 values of those bits
    x = _to_dtype(_to_f32(x), DOT_DTYPE)
    if BF16_ON_BITS:
        x = _to_f32(x)
    return x


@triton.jit
def _last_split(ticket_ptr, SPLIT_K: tl.constexpr):
    # Every warp's store of this split's partial tile is issued before one thread takes the tile's ticket;
    # acq_rel orders them before it, and the last split's loads of the other partials after it.
    tl.debug_barrier()
    return tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == SPLIT_K - 1


def _gemm_knobs(M: int, N: int, K: int) -> dict:
    return {"GEMM_BLOCK_M": GEMM_BLOCK_M, "GEMM_BLOCK_N": GEMM_BLOCK_N, "GEMM_BLOCK_K": GEMM_BLOCK_K,
            "GEMM_GROUP_M": GEMM_GROUP_M, "GEMM_NUM_WARPS": GEMM_NUM_WARPS, "GEMM_NUM_STAGES": GEMM_NUM_STAGES,
            "GEMM_SPLIT_K": GEMM_SPLIT_K, **TUNED.get(("gemm",) + _size_key(M, N, K), {})}


def _gemm_launch(knobs: dict) -> dict:
    return {} if INTERPRET else {"num_warps": knobs["GEMM_NUM_WARPS"], "num_stages": knobs["GEMM_NUM_STAGES"],
                                 "enable_fp_fusion": False}
"""


def gemm_knobs(rows: bool) -> str:
    """The GEMM knobs' source; with `rows` (a stage with row work after its product) the rows a tile holds whole,
    a knob only such modules have, so that the tuner searches it only where a launch reads it."""
    if not rows:
        return GEMM_KNOBS
    knob = ("GEMM_SPLIT_K = 1\n"
            "# the widest product whose rows one tile holds whole, so that the row work after it (a softmax, a norm)\n"
            "# runs on the tile; wider products are stored for its row kernel (0: always)\n"
            "GEMM_ROWS_N = 256\n")
    return GEMM_KNOBS.replace("GEMM_SPLIT_K = 1\n", knob).replace(
        '"GEMM_SPLIT_K": GEMM_SPLIT_K, ', '"GEMM_SPLIT_K": GEMM_SPLIT_K, "GEMM_ROWS_N": GEMM_ROWS_N,\n            ')


def gemm_kernel_name(op: str, st: GemmStage) -> str:
    return f"_{op}_{st.name}_kernel"


def row_tile_name(op: str, st: GemmStage) -> str:
    return f"_{op}_{st.name}_rows"


def _row_tile(op: str, st: GemmStage) -> tuple[str, list[str]]:
    """The function running the stage's row work on a tile of whole rows, and its parameters after the tile."""
    return emit_row_tile(st.rows.plan, row_tile_name(op, st), st.node)


def _stores(st: GemmStage) -> list[str]:
    """What the kernel itself stores: the product where it is read later, the epilogue's outputs. With row
    work (which stores its own outputs), the product, also where only the row kernel reads it."""
    return [st.node] if st.rows else st.writes


def _values(st: GemmStage) -> list[str]:
    """The kernel's value for each of `_stores(st)`."""
    outs = ["c"] if st.store_product or st.rows else []
    if st.epilogue is not None:
        outs += [o.value if o.block else f"{o.value} + tl.zeros((BLOCK_M, BLOCK_N), tl.float32)"
                 for o in st.epilogue.outputs]
    return outs


def _tile(name: str) -> str:
    return f"{name}_ptr + bid * {name}_sb + rm[:, None] * {name}_sm + rn[None, :] * {name}_sn"


# where an operand's tile lies: A's rows and K columns, B's K rows and columns
_AT = {"a": ("rm", "kk", "(rm[:, None] < M) & (kk[None, :] < K)"),
       "b": ("kk", "rn", "(kk[:, None] < K) & (rn[None, :] < N)")}


def _operand_params(st: GemmStage) -> tuple[list[str], list[str]]:
    """Pointers, and strides, of the operands: the operand itself, or its prologue's inputs (prefixed a_, b_)."""
    ptrs, strides = [], []
    for side in ("a", "b"):
        pro = st.prologues.get(side)
        if pro is None:
            ptrs.append(f"{side}_ptr")
            strides += [f"{side}_sb", f"{side}_s0", f"{side}_s1"]
            continue
        ptrs += [f"{side}_{n}_ptr" for n in pro.loads + pro.scalars]
        if pro.merge:  # the 3-D value's strides
            strides += [f"{side}_{n}_{x}" for n in pro.loads for x in ("s0", "s1", "s2")]
        else:
            strides += [f"{side}_{n}_{x}" for n in pro.loads for x in ("sb", "s0", "s1")]
    # and the size of the groups a merged axis is cut into
    return ptrs, strides + [f"{side}_group" for side, pro in st.prologues.items() if pro.merge]


def _merged_at(side: str, merge: tuple[int, int]) -> tuple[str, str]:
    """The statement cutting the merged axis's indices into (group, place in the group), and the offset of an
    element of a merged prologue's 3-D input from them and the other axis's index."""
    first, axis = merge
    r0, r1, _ = _AT[side]
    idx = [(r0, "[:, None]"), (r1, "[None, :]")]
    (merged, at_m), (other, at_o) = idx[axis], idx[1 - axis]
    cut = (f"        {side}_grp, {side}_pos = {merged} // {side}_group, {merged} % {side}_group  "
           f"# {side.upper()}'s merged axis")
    parts = {first: f"{side}_grp{at_m}", first + 1: f"{side}_pos{at_m}", 2 - 2 * first: f"{other}{at_o}"}
    return cut, " + ".join(f"{parts[d]} * {{p}}_s{d}" for d in range(3))


def _operand_tile(st: GemmStage, side: str) -> list[str]:
    """The K step's tile of one operand: loaded, or computed by its prologue from its inputs' tiles."""
    r0, r1, inside = _AT[side]
    at = f"bid * {{p}}_sb + {r0}[:, None] * {{p}}_s0 + {r1}[None, :] * {{p}}_s1"
    pro = st.prologues.get(side)
    cut = []
    if pro is not None and pro.merge:
        line, at = _merged_at(side, pro.merge)
        cut = [line]
    if pro is None:
        return [f"        {side} = tl.load({side}_ptr + {at.format(p=side)},",
                f"                    mask={inside}, other=0.0)"]
    lines = [f"        # {side.upper()} computed on the tile from its prologue's inputs: never in memory",
             f"        inside = {inside}"] + cut
    for n in pro.loads:
        terms = [f"{side}_{n}_ptr"] + at.format(p=f"{side}_{n}").split(" + ")
        offset = [" + ".join(terms)] if len(" + ".join(terms)) < 96 else [
            " + ".join(terms[:2]), "+ " + " + ".join(terms[2:])]  # one term a line would be too many
        lines += [f"        {n} = _to_f32(tl.load(", *[f"            {x}" for x in offset[:-1]],
                  f"            {offset[-1]},", "            mask=inside, other=0.0))"]
    for s in pro.plan.body:
        lines.append(f"        {s.target} = {s.expr}  # {s.comment}")
    value = pro.plan.outputs[0].value
    lines.append(f"        {side} = tl.where(inside, {value}, 0.0)  # past the edges: zeros, which add nothing")
    return lines


def emit_gemm_kernel(op: str, st: GemmStage) -> str:
    """The stage's kernel; with row work, preceded by the function that runs it on the tile."""
    tiles = st.tiles_in + _stores(st)
    operand_ptrs, operand_strides = _operand_params(st)
    params = operand_ptrs + [f"{n}_ptr" for n in tiles + st.scalars] + ["M", "N", "K"] + operand_strides
    params += [f"{n}_{s}" for n in tiles for s in ("sb", "sm", "sn")]
    params += st.attrs + ["partials_ptr", "tickets_ptr"]
    row_src, row_params = _row_tile(op, st) if st.rows else ("", [])
    params += [f"rows_{q}" for q in row_params]  # the row work's own names, kept apart from the kernel's
    params += ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_K: tl.constexpr", "GROUP_M: tl.constexpr",
               "SPLIT_K: tl.constexpr", "DOT_DTYPE: tl.constexpr", "PRECISION: tl.constexpr"]
    params += ["ROWS_IN_TILE: tl.constexpr"] if st.rows else []
    what = "C = A·B" + ("" if not st.bias else " + bias" if st.alpha == st.beta == 1 else
                          f", then {st.beta:g}·bias + {st.alpha:g}·C")
    what += "".join(f", {side.upper()} computed by its prologue" for side in st.prologues)
    what += ", then the epilogue on the tile" if st.epilogue else ""
    what += f", then {st.rows.plan.name}'s row work on the tile when it holds whole rows" if st.rows else ""
    lines = [row_src, ""] if row_src else []  # the row work's function, then the kernel that calls it
    lines += ["@triton.jit", f"def {gemm_kernel_name(op, st)}(", *[f"    {p}," for p in params], "):",
              f'    """{st.name}: {what}; stores {", ".join(st.writes)}."""']
    b = lines.append
    b("    pid, bid, split = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)  # tile, batch, K split")
    b("    # grouped order: GROUP_M consecutive tile rows run together and share B's columns in L2")
    b("    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)")
    b("    group = pid // (GROUP_M * tiles_n)")
    b("    rows = min(tiles_m - group * GROUP_M, GROUP_M)")
    b("    pid_m = group * GROUP_M + (pid % (GROUP_M * tiles_n)) % rows")
    b("    pid_n = (pid % (GROUP_M * tiles_n)) // rows")
    b("    # int64 row and column indices: strides times indices must not wrap past 2**31")
    b("    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)")
    b("    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)")
    b("    rk = tl.arange(0, BLOCK_K)")
    for side, pro in st.prologues.items():
        for n in pro.scalars:
            b(f"    {n} = _to_f32(tl.load({side}_{n}_ptr))  # one value for the whole tensor")
    b("    # this program's share of K: whole BLOCK_K steps, all of K unless the tile is split")
    b("    k_span = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K")
    b("    k_lo = split * k_span")
    b("    accumulator = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)")
    b("    for k0 in range(k_lo, tl.minimum(k_lo + k_span, K), BLOCK_K):")
    b("        kk = k0 + rk  # the last step runs past K: masked to zeros, which add nothing")
    lines += _operand_tile(st, "a") + _operand_tile(st, "b")
    if not st.prologues:
        b("        accumulator = tl.dot(_dot_operand(a, DOT_DTYPE), _dot_operand(b, DOT_DTYPE), accumulator,")
        b("                             input_precision=PRECISION)")
    else:
        # a computed operand is a float32 value, which the reference never rounds: in a 16-bit product it is
        # split into its rounding and the rest (x = hi + lo, each in the dtype) and multiplied twice, so the
        # operand carries twice the dtype's bits, as many MMA steps as one tf32 product
        split = [side for side in ("a", "b") if side in st.prologues]
        for side in ("a", "b"):
            b(f"        {side}_hi = _dot_operand({side}, DOT_DTYPE)")
        b("        accumulator = tl.dot(a_hi, b_hi, accumulator, input_precision=PRECISION)")
        b("        if DOT_DTYPE != tl.float32:  # float32 operands multiply as they are")
        for side in split:
            other = "b" if side == "a" else "a"
            b(f"            # {side.upper()}'s rounding error times {other.upper()}, finite values only: an infinity's "
              "product is the first dot's")
            finite = f"tl.abs({side}) < float('inf')"
            b(f"            {side}_lo = _dot_operand(tl.where({finite}, {side} - _to_f32({side}_hi), 0.0), DOT_DTYPE)")
            b(f"            {other}_fin = tl.where(tl.abs({other}_hi) < float('inf'), {other}_hi, "
              f"tl.zeros_like({other}_hi))")
            pair = ("a_lo", "b_fin") if side == "a" else ("a_fin", "b_lo")
            b(f"            accumulator = tl.dot({pair[0]}, {pair[1]}, accumulator, input_precision=PRECISION)")
    b("    mask = (rm[:, None] < M) & (rn[None, :] < N)")
    b("    if SPLIT_K > 1:")
    b("        # the splits of a tile meet: each stores its partial, the last adds them all in split order")
    b("        tile_id = bid * tl.num_programs(0).to(tl.int64) + pid  # int64: partials are tiles × splits × tile")
    b("        tile = tile_id * SPLIT_K")
    b("        at = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
    b("        tl.store(partials_ptr + (tile + split) * BLOCK_M * BLOCK_N + at, accumulator)")
    b("        # the ticket's answer as a tile mask, all true or all false (the interpreter's `&` of a scalar and")
    b("        # a tile is no mask)")
    b("        last = tl.where(_last_split(tickets_ptr + tile_id, SPLIT_K), at >= 0, at < 0)")
    b("        accumulator = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)")
    b("        for s in tl.static_range(SPLIT_K):")
    b("            accumulator += tl.load(partials_ptr + (tile + s) * BLOCK_M * BLOCK_N + at, mask=last, other=0.0)")
    b("        mask = mask & last  # only the last split runs the epilogue's loads and stores")
    if st.bias:
        bias = f"_to_f32(tl.load({_tile(st.bias)}, mask=mask, other=0.0))"
        alpha = "accumulator" if st.alpha == 1 else f"accumulator * {st.alpha!r}"
        beta = bias if st.beta == 1 else f"{bias} * {st.beta!r}"
        b(f"    c = {beta} + {alpha}")
    else:
        b("    c = accumulator" if st.alpha == 1 else f"    c = accumulator * {st.alpha!r}")
    if st.epilogue is not None:
        b(f"    {st.acc_input} = c")
        for n in st.loads:
            b(f"    {n} = _to_f32(tl.load({_tile(n)}, mask=mask, other=0.0))")
        for n in st.scalars:
            b(f"    {n} = _to_f32(tl.load({n}_ptr))  # one value for the whole tensor")
        for s in st.epilogue.body:
            b(f"    {s.target} = {s.expr}  # {s.comment}")
    if st.rows:
        b("    if ROWS_IN_TILE:  # the tile holds whole rows (N <= BLOCK_N): the row work runs on it")
        b(f"        {row_tile_name(op, st)}(")
        lines.extend(textwrap.wrap(f"c, rm[:, None], {', '.join(f'rows_{q}' for q in row_params)}, "
                                   "BLOCK_R=BLOCK_M, BLOCK_C=BLOCK_N)", 108, initial_indent=" " * 12,
                                   subsequent_indent=" " * 12))
    for name, value in zip(_stores(st), _values(st)):
        store = f"tl.store({_tile(name)}, _to_dtype({value}, {name}_ptr.dtype.element_ty), mask=mask)"
        if name == st.node and st.rows and not st.store_product:
            b("    else:  # stored for the row kernel")
            b(f"        {store}")
        else:
            b(f"    {store}")
    return "\n".join(lines) + "\n"


def _strides3(t: str, batched: bool) -> str:
    """(batch, row, column) strides of a 2-D or 3-D tensor; a 2-D one has batch stride 0."""
    return f"*{t}.stride()" if batched else f"0, *{t}.stride()"


def emit_gemm_launcher(op: str, st: GemmStage, fn_name: str, tensor_args: list[str], attrs: list[str],
                       rows_call: str | None = None) -> str:
    """Allocates the stage's outputs and launches one program per tile (and batch). With row work, `rows_call`
    is the row kernel's launch for a product too wide for one tile."""
    lines = [f"def {fn_name}({launcher_signature(tensor_args, attrs)}):"]
    b = lines.append
    # with row work the product's sizes are named apart: the row work's own sizes keep the request's names
    m, k, n = ("size_m", "size_k", "size_n") if st.rows else ("M", "K", "N")
    a, bb = st.a, st.b
    sizes = {}  # a merged prologue's operand shape, which no tensor has
    operands, strided = [], []  # the kernel's pointers for A and B, and the tensors among them it strides
    for side, name in (("a", st.a), ("b", st.b)):
        pro = st.prologues.get(side)
        if pro is None:
            operands.append(name)
            strided.append(name)
            continue
        # each input broadcast to the prologue's shape and taken through the operand's views
        b(f"    {side}_shape = torch.broadcast_shapes({', '.join(f'{n}.shape' for n in pro.loads + pro.scalars)})")
        for q in pro.loads:
            views = "".join(f".{meth}({', '.join(args)})" for meth, args in pro.views)
            b(f"    {side}_{q} = {q}.expand({side}_shape){views}")
        operands += [f"{side}_{q}" for q in pro.loads] + pro.scalars
        strided += [f"{side}_{q}" for q in pro.loads]
        name = f"{side}_{pro.loads[0]}"
        (a, bb) = (name, bb) if side == "a" else (a, name)
        if pro.merge:
            first, axis = pro.merge
            dims = [f"{side}_shape[0] * {side}_shape[1]", f"{side}_shape[2]"] if first == 0 else \
                [f"{side}_shape[0]", f"{side}_shape[1] * {side}_shape[2]"]
            sizes[name] = f"{side}_dims"
            b(f"    {side}_dims = torch.Size(({', '.join(dims if axis == first else dims[::-1])}))  # the operand's")
    sa, sb = (sizes.get(t, f"{t}.shape") for t in (a, bb))
    ra, rb = (f"len({sizes[t]})" if t in sizes else f"{t}.dim()" for t in (a, bb))
    b(f"    batch = {sa}[0] if {ra} == 3 else 1")
    b(f"    {m}, {k}, {n} = {sa}[-2], {sa}[-1], {sb}[-1]")
    b(f"    if {sb}[-2] != {k} or {rb} != {ra}:")
    b(f"        raise ValueError(f\"{st.node}: cannot multiply {{tuple({sa})}} by {{tuple({sb})}}\")")
    b(f"    shape = ({sa}[0], {m}, {n}) if {ra} == 3 else ({m}, {n})")
    b(f"    knobs = _gemm_knobs({m}, {n}, {k})  # tuned for these sizes, or the defaults")
    row_args = []
    if st.rows:
        plan = st.rows.plan
        _, row_params = _row_tile(op, st)
        b(f"    rows_in_tile = {n} <= knobs[\"GEMM_ROWS_N\"]")
        b("    if rows_in_tile:  # one tile column holds whole rows, no bigger a tile than the knobs' (split-K off)")
        b(f"        block_n = max(16, triton.next_power_of_2({n}))")
        b("        block_m = max(16, min(knobs[\"GEMM_BLOCK_M\"], knobs[\"GEMM_BLOCK_M\"] * knobs[\"GEMM_BLOCK_N\"] "
          "// block_n))")
        b("        knobs = {**knobs, \"GEMM_BLOCK_M\": block_m, \"GEMM_BLOCK_N\": block_n, \"GEMM_SPLIT_K\": 1}")
        # the row work's sizes, read where the row kernel would read them: off the product, here its sizes
        dims = {sym: src.replace(f"{st.node}.shape[0]", m).replace(f"{st.node}.shape[1]", n)
                for sym, src in plan.dims.items()}
        lines.extend(row_inputs_and_outputs(plan, dims, given=st.node, device=f"{a}.device", pad="        "))
        row_args = [q.removesuffix("_ptr") for q in row_params]
        b(f"        rows_args = ({', '.join(row_args)},)  # the row work's arguments")
        b("    else:")
        b(f"        rows_args = (None,) * {len(row_args)}")
    for name in ([st.node] if st.rows and not st.store_product else []) + st.writes:
        if st.rows and name in st.rows.outputs:
            continue
        like = st.like if name == st.node else next(o.like for o in st.epilogue.outputs if o.name == name)
        dtype = f"{like}.dtype" if like else "torch.float32"
        at = "shape if not rows_in_tile else (0, 0)" if name == st.node and st.rows and not st.store_product \
            else "shape"  # the row kernel's float32 product, where it runs
        b(f"    {name} = torch.empty({at}, device={a}.device, dtype={dtype})")
    for t in st.tiles_in:  # broadcast to the product's shape: stride 0
        b(f"    {t}_v = {t}.expand(shape)")
    # 16-bit operands multiply on the tensor cores in their dtype; a float32 operand (a buffer between stages)
    # keeps float32: tf32 when the operator is 16-bit, IEEE float32 when it is float32 (its tolerance)
    # a prologue's operand is in the operator's dtype, as the reference's dequantized weight is
    dtypes = [f"{tensor_args[0]}.dtype" if side in st.prologues else f"{t}.dtype" for side, t in (("a", a), ("b", bb))]
    if dtypes[0] == dtypes[1]:
        b(f"    dot = _DOT_DTYPE[{dtypes[0]}]")
    else:
        b(f"    dot = _DOT_DTYPE[{dtypes[0]}] if {dtypes[0]} == {dtypes[1]} else tl.float32")
    b(f"    precision = \"ieee\" if {tensor_args[0]}.dtype == torch.float32 else \"tf32\"")
    b(f"    tiles, split_k = triton.cdiv({m}, knobs[\"GEMM_BLOCK_M\"]) * triton.cdiv({n}, knobs[\"GEMM_BLOCK_N\"]), "
      "knobs[\"GEMM_SPLIT_K\"]")
    b("    grid = (tiles, batch, split_k)")
    b("    # split-K's float32 partial tiles and one ticket per tile (none when K is not split)")
    b("    split = split_k > 1")
    b("    partials = torch.empty(batch * tiles * split_k * knobs[\"GEMM_BLOCK_M\"] * knobs[\"GEMM_BLOCK_N\"] if split "
      f"else 0, device={a}.device, dtype=torch.float32)")
    b(f"    tickets = torch.zeros(batch * tiles if split else 0, device={a}.device, dtype=torch.int32)")
    views = {t: f"{t}_v" for t in st.tiles_in}
    tiles = st.tiles_in + _stores(st)
    args = operands + [views.get(t, t) for t in tiles] + st.scalars + [m, n, k]
    merged = {f"{side}_{q}": side for side, pro in st.prologues.items() if pro.merge for q in pro.loads}
    args += [f"*{t}.stride()" if t in merged else _strides3(t, st.batched) for t in strided]
    args += [f"{side}_shape[{pro.merge[0] + 1}]" for side, pro in st.prologues.items() if pro.merge]
    args += [_strides3(views.get(t, t), st.batched) for t in tiles]
    args += st.attrs + ["partials", "tickets"] + (["*rows_args"] if st.rows else [])
    b(f"    {gemm_kernel_name(op, st)}[grid](")
    lines += textwrap.wrap(", ".join(args) + ",", 112, initial_indent=" " * 8, subsequent_indent=" " * 8)
    b("        BLOCK_M=knobs[\"GEMM_BLOCK_M\"], BLOCK_N=knobs[\"GEMM_BLOCK_N\"], BLOCK_K=knobs[\"GEMM_BLOCK_K\"],")
    b("        GROUP_M=knobs[\"GEMM_GROUP_M\"], SPLIT_K=split_k, DOT_DTYPE=dot, PRECISION=precision, "
      f"{'' if st.rows else '**_gemm_launch(knobs))'}")
    if st.rows:
        b("        ROWS_IN_TILE=rows_in_tile, **_gemm_launch(knobs))")
    if st.rows:
        outs = st.rows.outputs
        b("    if not rows_in_tile:  # the row work's own kernel, on the stored product")
        b(f"        {', '.join(outs)}{',' if len(outs) == 1 else ''} = {rows_call}")
    b(f"    return {', '.join(st.writes)}{',' if len(st.writes) == 1 else ''}")
    return "\n".join(lines) + "\n"
