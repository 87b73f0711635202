"""Triton source for the attention stages of a staged pass (codegen/attention.py): the kernel and its launcher.

One program owns BLOCK_M queries of one (batch, head) and walks the keys in BLOCK_N blocks: the scores of a
block are one `tl.dot` into float32, the score body runs on them in registers (scale, bias, position masks),
and an online softmax keeps each query's running max m and sum of exponentials l, rescaling the output
accumulator by exp(m_old − m_new) whenever the max grows. The S×S scores never reach memory. A sink is one more
logit per head that only joins the denominator: the walk starts from m = sink, l = 1. Grouped-query heads read
K and V at head h // GROUPS.
"""

from __future__ import annotations

import textwrap

import torch

from opforge.codegen.emit_rows import launcher_signature
from opforge.codegen.ops import OP_TABLE, op_name
from opforge.codegen.plan import Unsupported, _literal

ATTENTION_KNOBS = """\
# attention stages: queries per program, keys per step of the walk, warps and pipeline depth
ATTN_BLOCK_M = 64
ATTN_BLOCK_N = 64
ATTN_NUM_WARPS = 4
ATTN_NUM_STAGES = 2


def _attention_launch() -> dict:
    return {} if INTERPRET else {"num_warps": ATTN_NUM_WARPS, "num_stages": ATTN_NUM_STAGES,
                                 "enable_fp_fusion": False}
"""

_SCORE_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default",
                "aten.unsqueeze.default", "aten.clone.default", "aten.detach.default", "aten.alias.default"}


def attention_kernel_name(op: str, st) -> str:
    return f"_{op}_{st.name}_kernel"


def score_statements(st) -> tuple[list[str], str]:
    """The score body as statements on the tile `scores` (query positions `rows`, key positions `cols`), and
    the variable holding its result."""
    gm = st.score
    var, lines = {}, []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    var[placeholders[0]] = "scores"
    for p, name in zip(placeholders[1:], st.side):
        var[p] = name
    tile = tuple(str(d) for d in placeholders[0].meta["val"].shape[-2:])

    def render(a):
        return var[a] if isinstance(a, torch.fx.Node) else _literal(a)

    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        key = op_name(n.target)
        if key in _SCORE_VIEWS:  # the same (query, key) position: views only add or merge leading dimensions
            if tuple(str(d) for d in n.meta["val"].shape[-2:]) != tile and n.meta["val"].numel() != 1 and \
                    tuple(str(d) for d in n.args[0].meta["val"].shape[-2:]) != tuple(
                        str(d) for d in n.meta["val"].shape[-2:]):
                raise Unsupported([key], f"{n.name} moves the scores' query or key positions")
            var[n] = var[n.args[0]]
            continue
        if key in ("aten.full.default", "aten.new_full.default", "aten.ones.default", "aten.zeros.default",
                   "aten.scalar_tensor.default"):
            value = {"aten.full.default": lambda: n.args[1], "aten.new_full.default": lambda: n.args[2],
                     "aten.ones.default": lambda: 1.0, "aten.zeros.default": lambda: 0.0,
                     "aten.scalar_tensor.default": lambda: n.args[0]}[key]()
            var[n] = _literal(float(value))
            continue
        if key in ("aten.triu.default", "aten.tril.default"):
            d = n.args[1] if len(n.args) > 1 else 0
            keep = f"cols - rows >= {d}" if key == "aten.triu.default" else f"cols - rows <= {d}"
            lines.append(f"{n.name} = tl.where({keep}, {var[n.args[0]]}, 0.0)  # {key}: by position")
            var[n] = n.name
            continue
        rule = OP_TABLE[key]
        args = [render(a) for a in n.args]
        kwargs = {k: render(v) for k, v in n.kwargs.items() if k not in ("pin_memory", "layout", "device",
                                                                       "memory_format", "dtype")}
        expr = rule.emit(*args, **kwargs, ieee=True)
        if expr.isidentifier():
            var[n] = expr
            continue
        lines.append(f"{n.name} = {expr}  # {key}")
        var[n] = n.name
    out = gm.graph.find_nodes(op="output")[0].args[0]
    return lines, var[out]


def emit_attention_kernel(op: str, st) -> str:
    tiles = [n for n, kind in zip(st.side, st.kinds) if kind == "tile"]
    scalars = [n for n, kind in zip(st.side, st.kinds) if kind == "scalar"]
    sizes = [n for n, kind in zip(st.side, st.kinds) if kind == "size"]
    params = ["q_ptr", "k_ptr", "v_ptr", "out_ptr"] + [f"{n}_ptr" for n in tiles + scalars]
    params += (["sinks_ptr"] if st.sinks else []) + ["H", "GROUPS", "SQ", "SK", "D", "DV"]
    params += [f"{t}_{s}" for t in ("q", "k", "v") for s in ("sb", "sh", "sm", "sd")]
    params += ["out_sbh", "out_sm", "out_sd"] + [f"{n}_{s}" for n in tiles for s in ("sb", "sh", "sm", "sn")]
    params += (["sinks_sh"] if st.sinks else []) + sizes + st.attrs
    params += ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_D: tl.constexpr", "BLOCK_DV: tl.constexpr",
               "DOT_DTYPE: tl.constexpr", "PRECISION: tl.constexpr"]
    body, result = score_statements(st)
    what = "softmax(score(Q·Kᵀ)" + (" with a sink per head" if st.sinks else "") + ")·V"
    lines = ["@triton.jit", f"def {attention_kernel_name(op, st)}(", *[f"    {p}," for p in params], "):",
             f'    """{st.name}: {st.node} = {what}, one pass over the keys."""']
    b = lines.append
    b("    pid_m, bh = tl.program_id(0), tl.program_id(1)")
    b("    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)")
    b("    kv = h // GROUPS  # grouped-query heads share K and V")
    b("    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # query positions")
    b("    rd, rdv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)")
    b("    q = tl.load(q_ptr + b * q_sb + h * q_sh + rows[:, None] * q_sm + rd[None, :] * q_sd,")
    b("                mask=(rows[:, None] < SQ) & (rd[None, :] < D), other=0.0)")
    b("    q = _dot_operand(q, DOT_DTYPE)")
    for n in scalars:
        b(f"    {n} = _to_f32(tl.load({n}_ptr))  # one value for the whole tensor")
    if st.sinks:
        b("    # the sink joins the denominator only: the walk starts as if it had seen one key of logit `sink`")
        b("    m = tl.full((BLOCK_M,), 0.0, tl.float32) + _to_f32(tl.load(sinks_ptr + h * sinks_sh))")
        b("    l = tl.full((BLOCK_M,), 1.0, tl.float32)")
    else:
        b("    m = tl.full((BLOCK_M,), -float('inf'), tl.float32)  # running max of each query's scores")
        b("    l = tl.full((BLOCK_M,), 0.0, tl.float32)  # running sum of exp(score - m)")
    b("    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)")
    b("    for start in range(0, SK, BLOCK_N):")
    b("        cols = start + tl.arange(0, BLOCK_N)  # key positions")
    b("        kt = tl.load(k_ptr + b * k_sb + kv * k_sh + cols[None, :] * k_sm + rd[:, None] * k_sd,")
    b("                     mask=(cols[None, :] < SK) & (rd[:, None] < D), other=0.0)")
    b("        scores = tl.dot(q, _dot_operand(kt, DOT_DTYPE), input_precision=PRECISION)")
    b("        rows_, cols_ = rows[:, None], cols[None, :]")
    if tiles:
        b("        inside = (rows_ < SQ) & (cols_ < SK)")
    for n in tiles:
        b(f"        {n} = _to_f32(tl.load({n}_ptr + b * {n}_sb + h * {n}_sh + rows_ * {n}_sm + cols_ * {n}_sn,")
        b("                             mask=inside, other=0.0))")
    for s in body:
        b("        " + s.replace("cols - rows", "cols_ - rows_"))
    b(f"        scores = tl.where(cols_ < SK, {result}, -float('inf'))  # keys past the end take no weight")
    b("        m_new = tl.maximum(m, tl.max(scores, 1))")
    b("        # a query whose keys so far are all masked keeps m = -inf: shift by 0 there, not by -inf")
    b("        shift = tl.where(m_new == -float('inf'), 0.0, m_new)")
    b("        p = tl.exp(scores - shift[:, None])")
    b("        alpha = tl.exp(m - shift)")
    b("        l = l * alpha + tl.sum(p, 1)")
    b("        vt = tl.load(v_ptr + b * v_sb + kv * v_sh + cols[:, None] * v_sm + rdv[None, :] * v_sd,")
    b("                     mask=(cols[:, None] < SK) & (rdv[None, :] < DV), other=0.0)")
    b("        acc = acc * alpha[:, None] + tl.dot(_dot_operand(p, DOT_DTYPE), _dot_operand(vt, DOT_DTYPE),")
    b("                                            input_precision=PRECISION)")
    b("        m = m_new")
    b("    out = acc / l[:, None]  # a query with every key masked: 0 / 0, NaN as torch's softmax gives")
    b("    tl.store(out_ptr + bh.to(tl.int64) * out_sbh + rows[:, None] * out_sm + rdv[None, :] * out_sd,")
    b("             _to_dtype(out, out_ptr.dtype.element_ty), mask=(rows[:, None] < SQ) & (rdv[None, :] < DV))")
    return "\n".join(lines) + "\n"


def emit_attention_launcher(op: str, st, fn_name: str, tensor_args: list[str], attrs: list[str]) -> str:
    """Allocates the (B·H, Sq, Dv) output and launches one program per query block and (batch, head)."""
    lines = [f"def {fn_name}({launcher_signature(tensor_args, attrs)}):"]
    b = lines.append
    q, k, v = st.q, st.k, st.v
    b(f"    if {q}.dim() == 3:  # (batch·heads, S, D): one batch of that many heads")
    b(f"        {q}, {k}, {v} = {q}.unsqueeze(0), {k}.unsqueeze(0), {v}.unsqueeze(0)")
    b(f"    B, H, SQ, D = {q}.shape")
    b(f"    SK, DV = {k}.shape[2], {v}.shape[3]")
    b(f"    if {k}.shape[-1] != D or {v}.shape[2] != SK or H % {k}.shape[1] or {v}.shape[1] != {k}.shape[1]:")
    b(f'        raise ValueError(f"{st.node}: attention of q {{tuple({q}.shape)}}, k {{tuple({k}.shape)}}, '
      f'v {{tuple({v}.shape)}}")')
    dtype = f"{st.like}.dtype" if st.like else "torch.float32"
    b(f"    {st.node} = torch.empty((B * H, SQ, DV), device={q}.device, dtype={dtype})")
    tiles = [n for n, kind in zip(st.side, st.kinds) if kind == "tile"]
    scalars = [n for n, kind in zip(st.side, st.kinds) if kind == "scalar"]
    sizes = [(n, st.sizes[n]) for n, kind in zip(st.side, st.kinds) if kind == "size"]
    for t in tiles:  # broadcast to (B, H, Sq, Sk): stride 0 where the scores' dimension is not its own
        b(f"    {t}_v = {t}.expand(B, H, SQ, SK)")
    for n, src in sizes:
        b(f"    {n} = {src}")
    b(f"    dot = _DOT_DTYPE[{q}.dtype]")
    b(f"    precision = \"ieee\" if {tensor_args[0]}.dtype == torch.float32 else \"tf32\"")
    b("    block_d, block_dv = max(16, triton.next_power_of_2(D)), max(16, triton.next_power_of_2(DV))")
    b("    if max(block_d, block_dv) > 256 and not INTERPRET:  # a (64, 512) tile of Q, K or V per program")
    b(f'        raise ValueError(f"{st.node}: head dimensions {{D}} and {{DV}}: the attention kernel takes up to 256")')
    b("    grid = (triton.cdiv(SQ, ATTN_BLOCK_M), B * H)")
    args = [q, k, v, st.node] + [f"{t}_v" for t in tiles] + scalars + ([st.sinks] if st.sinks else [])
    args += ["H", f"H // {k}.shape[1]", "SQ", "SK", "D", "DV", f"*{q}.stride()", f"*{k}.stride()",
             f"*{v}.stride()", f"*{st.node}.stride()"] + [f"*{t}_v.stride()" for t in tiles]
    args += ([f"{st.sinks}.stride(0)"] if st.sinks else []) + [n for n, _ in sizes] + st.attrs
    b(f"    {attention_kernel_name(op, st)}[grid](")
    lines += textwrap.wrap(", ".join(args) + ",", 112, initial_indent=" " * 8, subsequent_indent=" " * 8)
    b("        BLOCK_M=ATTN_BLOCK_M, BLOCK_N=ATTN_BLOCK_N, BLOCK_D=block_d, BLOCK_DV=block_dv, DOT_DTYPE=dot,")
    b("        PRECISION=precision, **_attention_launch())")
    b(f"    return {st.node},")
    return "\n".join(lines) + "\n"
