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

from opforge.codegen.attention import SCORE_VIEWS, masked_band
from opforge.codegen.attention_grad import SCORE_VJP, AttentionBackwardStage, score_reading
from opforge.codegen.emit_rows import launcher_signature
from opforge.codegen.ops import OP_TABLE, op_name
from opforge.codegen.plan import Unsupported, _literal

ATTENTION_KNOBS = """\
# attention stages: queries per program, keys per step of the walk, warps and pipeline depth; rows of Q, K, V
# wider than ATTN_ROW_BYTES halve the blocks (a float32 head of 256 at 64 x 64 needs 295 KB of shared memory
# in the dK/dV kernel, past the 227 KB an H200 program may hold)
ATTN_BLOCK_M = 64
ATTN_BLOCK_N = 64
ATTN_ROW_BYTES = 512
ATTN_NUM_WARPS = 4
ATTN_NUM_STAGES = 2


def _attention_knobs(SQ: int, SK: int, D: int) -> dict:
    return {"ATTN_BLOCK_M": ATTN_BLOCK_M, "ATTN_BLOCK_N": ATTN_BLOCK_N, "ATTN_NUM_WARPS": ATTN_NUM_WARPS,
            "ATTN_NUM_STAGES": ATTN_NUM_STAGES, **TUNED.get(("attention",) + _size_key(SQ, SK, D), {})}


def _attention_launch(knobs: dict) -> dict:
    return {} if INTERPRET else {"num_warps": knobs["ATTN_NUM_WARPS"], "num_stages": knobs["ATTN_NUM_STAGES"],
                                 "enable_fp_fusion": False}


# empty, shaped like t, its dimensions laid out in t's order: the gradient of heads viewed out of a
# (B, S, H * D) projection views back as (B, S, H * D)
def _empty_as(t: torch.Tensor, dtype) -> torch.Tensor:
    order = sorted(range(t.dim()), key=t.stride, reverse=True)
    return torch.empty([t.shape[d] for d in order], device=t.device, dtype=dtype).permute(
        [order.index(d) for d in range(t.dim())])
"""

_AXES = ("rows_", "cols_")  # the tile's query and key positions, (BLOCK_M, 1) and (1, BLOCK_N)


def attention_kernel_name(op: str, st) -> str:
    return f"_{op}_{st.name}_kernel"


def score_statements(st) -> tuple[list[str], str]:
    """The score body as statements on the tile `scores` (query positions `rows`, key positions `cols`), and
    the variable holding its result."""
    lines, var = _score_program(st)
    return lines, var[st.score.graph.find_nodes(op="output")[0].args[0]]


def _score_program(st) -> tuple[list[str], dict]:
    """The score body's statements, and the variable (or literal) holding each of its nodes."""
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
        if key in SCORE_VIEWS and var[n.args[0]] in _AXES:  # positions: along the keys unless viewed (n, 1)
            shape = n.meta["val"].shape
            var[n] = "rows_" if len(shape) >= 2 and shape[-1] == 1 and shape[-2] != 1 else "cols_"
            continue
        if key == "aten.arange.default":
            if len(n.args) != 1:
                raise Unsupported([key], f"{n.name}: positions are an arange from 0 in steps of 1")
            var[n] = "cols_"  # a vector broadcasts along the last dimension: the keys
            continue
        if key in SCORE_VIEWS:  # the same (query, key) position: views only add or merge leading dimensions
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
    return lines, var


def score_grad_statements(st, grad: str, wrt: str | None = None) -> tuple[list[str], str]:
    """The score body's derivative: statements taking `grad` (d loss / d result, on the tile) back to the
    scores (or to side input `wrt`, a bias), rule by rule (attention_grad.SCORE_VJP) in reverse order, and the
    variable holding that derivative. Only what that input flows through is differentiated."""
    _, var = _score_program(st)
    placeholders = st.score.graph.find_nodes(op="placeholder")
    scores = placeholders[0] if wrt is None else placeholders[1 + st.side.index(wrt)]
    reading = score_reading(st.score, scores)
    out = st.score.graph.find_nodes(op="output")[0].args[0]
    stem = "d_scores" if wrt is None else f"d_{wrt}"
    flows = {n: [] for n in [scores] + reading}
    flows[out].append(grad)
    lines, taken = [], set()

    def fresh(name: str) -> str:
        name = name if name not in taken else f"{name}_{len(lines)}"
        taken.add(name)
        return name

    def total(node, parts: list[str]) -> str:  # a value read twice: the sum of what each reader hands back
        if len(parts) == 1:
            return parts[0]
        name = fresh(f"d_{node.name}" if node is not scores else stem)
        lines.append(f"{name} = {' + '.join(parts)}")
        return name

    for n in reversed(reading):
        parts = flows.pop(n)
        if not parts:
            continue
        g = total(n, parts)
        key = op_name(n.target)
        if key in SCORE_VIEWS:
            flows[n.args[0]].append(g)
            continue
        rendered = [var[a] if isinstance(a, torch.fx.Node) else _literal(a) for a in n.args]
        kwargs = {k: (var[v] if isinstance(v, torch.fx.Node) else _literal(v)) for k, v in n.kwargs.items()
                  if k == "alpha"}
        for a, d in zip(n.args, SCORE_VJP[key](rendered, var[n], g, **kwargs)):
            if d is None or not isinstance(a, torch.fx.Node) or a not in flows:
                continue
            if not d.isidentifier():  # else the gradient passes as it is (an add's)
                name = fresh(f"d_{a.name}" if a is not scores else stem)
                lines.append(f"{name} = {d}  # {key}'s derivative")
                d = name
            flows[a].append(d)
    return lines, total(scores, flows[scores] or ["0.0"])


def _kinds(st, kind: str) -> list[str]:
    return [n for n, k in zip(st.side, st.kinds) if k == kind]


def _side_params(st, sinks: bool = True) -> tuple[list[str], list[str]]:
    """The score body's pointer parameters (and the sinks'), and its strides, sizes and attributes (after the
    kernel's own)."""
    tiles, scalars = _kinds(st, "tile"), _kinds(st, "scalar")
    sinks = sinks and bool(st.sinks)
    ptrs = [f"{n}_ptr" for n in tiles + scalars] + (["sinks_ptr"] if sinks else [])
    rest = [f"{n}_{s}" for n in tiles for s in ("sb", "sh", "sm", "sn")] + (["sinks_sh"] if sinks else [])
    return ptrs, rest + _kinds(st, "size") + st.attrs


def _score_tile(st, indent: str, head: str = "h") -> list[str]:
    """Statements from the loaded q and kt to `s`, the score body's result on the (rows, cols) tile, keys past
    the end at -inf: the same in the forward walk and both backward walks."""
    body, result = score_statements(st)
    lines = ["scores = tl.dot(q, _dot_operand(kt, DOT_DTYPE), input_precision=PRECISION)",
             "rows_, cols_ = rows[:, None], cols[None, :]"]
    tiles = _kinds(st, "tile")
    if tiles:
        lines.append("inside = (rows_ < SQ) & (cols_ < SK)")
    for n in tiles:
        lines += [f"{n} = _to_f32(tl.load({n}_ptr + b * {n}_sb + {head} * {n}_sh + rows_ * {n}_sm + cols_ * {n}_sn,",
                  "                     mask=inside, other=0.0))"]
    lines += [x.replace("cols - rows", "cols_ - rows_") for x in body]
    lo, hi = masked_band(st.score)
    if lo is None and hi is None:
        lines.append(f"s = tl.where(cols_ < SK, {result}, -float('inf'))  # keys past the end take no weight")
    else:  # and the mask's -inf set, not added: an overflowed score plus -inf would be NaN
        band = " & ".join(["(cols_ < SK)"] + ([f"(cols_ - rows_ >= {lo})"] if lo is not None else [])
                          + ([f"(cols_ - rows_ <= {hi})"] if hi is not None else []))
        lines.append(f"s = tl.where({band}, {result}, -float('inf'))  # keys past the end or the band: no weight")
    return [indent + x for x in lines]


def _load(name: str, ptr: str, index: str, mask: str, indent: str, dot: bool = False) -> list[str]:
    lines = [f"{indent}{name} = tl.load({ptr} + {index},", f"{indent}            mask={mask}, other=0.0)"]
    return lines + ([f"{indent}{name} = _dot_operand({name}, DOT_DTYPE)"] if dot else [])


def _key_walk(st, indent: str) -> list[str]:
    """The loop over key blocks of a program's queries (rows from pid_m·BLOCK_M): only the blocks the mask's
    band reaches (attention.masked_band: causal masks end it at the diagonal, sliding windows start it late)."""
    lo, hi = masked_band(st.score)
    if lo is None and hi is None:
        return [f"{indent}for start in range(0, SK, BLOCK_N):"]
    lines = [f"{indent}# the mask makes scores where {_outside(lo, hi)} -inf: key blocks of only those are skipped"]
    first = "0" if lo is None else _plus("pid_m * BLOCK_M", lo) if lo >= 0 else \
        f"tl.maximum({_plus('pid_m * BLOCK_M', lo)}, 0)"
    end = f"tl.minimum({_plus('(pid_m + 1) * BLOCK_M', hi)}, SK)" if hi is not None else "SK"
    return lines + [f"{indent}for start in range({first}, {end}, BLOCK_N):"]


def _query_walk(st, indent: str) -> list[str]:
    """The loop over query blocks of a program's keys (from `start`), within the mask's band."""
    lo, hi = masked_band(st.score)
    if lo is None and hi is None:
        return [f"{indent}for first in range(0, SQ, BLOCK_M):"]
    lines = [f"{indent}# the mask makes scores where {_outside(lo, hi)} -inf: query blocks of only those are skipped"]
    first = "0" if hi is None else _plus("start", -hi) if hi <= 0 else f"tl.maximum({_plus('start', -hi)}, 0)"
    end = f"tl.minimum({_plus('start + BLOCK_N', -lo)}, SQ)" if lo is not None else "SQ"
    return lines + [f"{indent}for first in range({first}, {end}, BLOCK_M):"]


def _outside(lo: int | None, hi: int | None) -> str:
    return " or ".join(([f"cols - rows < {lo}"] if lo is not None else []) +
                       ([f"cols - rows > {hi}"] if hi is not None else []))


def _plus(expr: str, k: int) -> str:
    return expr if k == 0 else f"{expr} + {k}" if k > 0 else f"{expr} - {-k}"


def _online_start(st) -> list[str]:
    """The one-value inputs, then each query's running max m and sum l of the online softmax: a sink joins the
    denominator only, so the walk starts as if it had seen one key of logit `sink`."""
    lines = [f"    {n} = _to_f32(tl.load({n}_ptr))  # one value for the whole tensor" for n in _kinds(st, "scalar")]
    if st.sinks:
        return lines + ["    m = tl.full((BLOCK_M,), 0.0, tl.float32) + _to_f32(tl.load(sinks_ptr + h * sinks_sh))",
                        "    l = tl.full((BLOCK_M,), 1.0, tl.float32)  # the sink's own term"]
    return lines + ["    m = tl.full((BLOCK_M,), -float('inf'), tl.float32)  # running max of each query's scores",
                    "    l = tl.full((BLOCK_M,), 0.0, tl.float32)  # running sum of exp(score - m)"]


# one step of the online softmax over a block of scores s: the new max, the block's exponentials p and the
# factor alpha that rescales what was summed under the old max
_ONLINE_STEP = ["        m_new = tl.maximum(m, tl.max(s, 1))",
                "        # a query whose keys so far are all masked keeps m = -inf: shift by 0 there, not by -inf",
                "        shift = tl.where(m_new == -float('inf'), 0.0, m_new)",
                "        p = tl.exp(s - shift[:, None])",
                "        alpha = tl.exp(m - shift)",
                "        l = l * alpha + tl.sum(p, 1)"]


_CONSTEXPRS = ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_D: tl.constexpr", "BLOCK_DV: tl.constexpr",
               "DOT_DTYPE: tl.constexpr", "PRECISION: tl.constexpr"]
_QKV_STRIDES = [f"{t}_{s}" for t in ("q", "k", "v") for s in ("sb", "sh", "sm", "sd")]
_Q = "b * q_sb + h * q_sh + rows[:, None] * q_sm + rd[None, :] * q_sd"
_Q_MASK = "(rows[:, None] < SQ) & (rd[None, :] < D)"
_KT = "b * k_sb + kv * k_sh + cols[None, :] * k_sm + rd[:, None] * k_sd"
_KT_MASK = "(cols[None, :] < SK) & (rd[:, None] < D)"


def emit_attention_kernel(op: str, st) -> str:
    if isinstance(st, AttentionBackwardStage):
        return emit_attention_backward_kernels(op, st)
    ptrs, rest = _side_params(st)
    params = ["q_ptr", "k_ptr", "v_ptr", "out_ptr"] + ptrs
    params += ["H", "GROUPS", "SQ", "SK", "D", "DV"] + _QKV_STRIDES
    params += ["out_sbh", "out_sm", "out_sd"] + rest + _CONSTEXPRS
    what = "softmax(score(Q·Kᵀ)" + (" with a sink per head" if st.sinks else "") + ")·V"
    lines = ["@triton.jit", f"def {attention_kernel_name(op, st)}(", *[f"    {p}," for p in params], "):",
             f'    """{st.name}: {st.node} = {what}, one pass over the keys."""']
    b = lines.append
    b("    pid_m, bh = tl.program_id(0), tl.program_id(1)")
    b("    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)")
    b("    kv = h // GROUPS  # grouped-query heads share K and V")
    b("    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # query positions")
    b("    rd, rdv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)")
    lines += _load("q", "q_ptr", _Q, _Q_MASK, "    ", dot=True)
    lines += _online_start(st)
    b("    o_sum = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)  # running Σ exp(score - m)·v")
    lines += _key_walk(st, "    ")
    b("        cols = start + tl.arange(0, BLOCK_N)  # key positions")
    lines += _load("kt", "k_ptr", _KT, _KT_MASK, "        ")
    lines += _score_tile(st, "        ")
    lines += _ONLINE_STEP
    lines += _load("vt", "v_ptr", "b * v_sb + kv * v_sh + cols[:, None] * v_sm + rdv[None, :] * v_sd",
                   "(cols[:, None] < SK) & (rdv[None, :] < DV)", "        ")
    b("        o_sum = o_sum * alpha[:, None] + tl.dot(_dot_operand(p, DOT_DTYPE), _dot_operand(vt, DOT_DTYPE),")
    b("                                                input_precision=PRECISION)")
    b("        m = m_new")
    b("    out = o_sum / l[:, None]  # a query with every key masked: 0 / 0, NaN as torch's softmax gives")
    b("    tl.store(out_ptr + bh.to(tl.int64) * out_sbh + rows[:, None] * out_sm + rdv[None, :] * out_sd,")
    b("             _to_dtype(out, out_ptr.dtype.element_ty), mask=(rows[:, None] < SQ) & (rdv[None, :] < DV))")
    return "\n".join(lines) + "\n"


def _kernel(name: str, params: list[str], doc: str) -> list[str]:
    return ["@triton.jit", f"def {name}(", *[f"    {p}," for p in params], "):", f'    """{doc}"""']


def emit_attention_backward_kernels(op: str, st) -> str:
    """dQ with each query's log-sum-exp and Δ, one program per block of queries walking the keys twice; dK and
    dV, one program per block of keys of a K/V head walking its query heads' queries; the sinks' gradient, one
    program per head. Launched in that order: the later two read the first's lse and Δ."""
    ptrs, rest = _side_params(st, sinks=False)
    scalars = _kinds(st, "scalar")
    prefix = f"_{op}_{st.name}"
    strides = _QKV_STRIDES + ["do_sbh", "do_sm", "do_sd"]
    grad_lines, d_scores = score_grad_statements(st, "ds")
    do_load = _load("do", "do_ptr", "bh * do_sbh + rows[:, None] * do_sm + rdv[None, :] * do_sd",
                    "(rows[:, None] < SQ) & (rdv[None, :] < DV)", "", dot=True)
    vt_load = ("vt", "v_ptr", "b * v_sb + kv * v_sh + cols[None, :] * v_sm + rdv[:, None] * v_sd",
               "(cols[None, :] < SK) & (rdv[:, None] < DV)")

    def keys(indent: str) -> list[str]:  # a block of keys, Kᵀ and Vᵀ: the scores' and dP's right operands
        return [f"{indent}cols = start + tl.arange(0, BLOCK_N)  # key positions"] + _load(
            "kt", "k_ptr", _KT, _KT_MASK, indent) + _load(*vt_load, indent)

    def queries(indent: str) -> list[str]:  # a block of queries: Q, dO and their saved log-sum-exp and Δ
        return _load("q", "q_ptr", _Q, _Q_MASK, indent, dot=True) + [indent + x for x in do_load] + [
            f"{indent}lse = tl.load(lse_ptr + bh * SQ + rows, mask=rows < SQ, other=0.0)",
            f"{indent}delta = tl.load(delta_ptr + bh * SQ + rows, mask=rows < SQ, other=0.0)"]

    def probabilities(indent: str, d_scores: bool = True) -> list[str]:  # P from the log-sum-exp, dS, d scores
        return _score_tile(st, indent) + [indent + x for x in [
            "# a probability exactly as the forward's softmax gave it; 0 outside the tile's queries and keys",
            "p = tl.where((rows_ < SQ) & (cols_ < SK), tl.exp(s - lse[:, None]), 0.0)",
            "dp = tl.dot(do, _dot_operand(vt, DOT_DTYPE), input_precision=PRECISION)",
            "ds = p * (dp - delta[:, None])  # the softmax's derivative", *(grad_lines if d_scores else [])]]

    parts = []
    params = ["q_ptr", "k_ptr", "v_ptr", "do_ptr", "lse_ptr", "delta_ptr", "dq_ptr"] + ptrs + (
        ["sinks_ptr"] if st.sinks else [])
    params += ["H", "GROUPS", "SQ", "SK", "D", "DV"] + strides + ["dq_sb", "dq_sh", "dq_sm", "dq_sd"] + rest
    params += (["sinks_sh"] if st.sinks else []) + _CONSTEXPRS
    lines = _kernel(f"{prefix}_dq_kernel", params, f"{st.name}: each query's log-sum-exp and Δ = Σ P·dP, then "
                                                   "dQ = dscores·K, over the keys of a block of queries.")
    b = lines.append
    b("    pid_m, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)")
    b("    b, h = bh // H, bh % H")
    b("    kv = h // GROUPS")
    b("    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # this program's queries")
    b("    rd, rdv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)")
    lines += _load("q", "q_ptr", _Q, _Q_MASK, "    ", dot=True)
    lines += ["    " + x for x in do_load]
    lines += _online_start(st)
    b("    pdp = tl.zeros((BLOCK_M,), tl.float32)  # running Σ exp(s - m)·dP, rescaled with l")
    lines += _key_walk(st, "    ")
    lines += keys("        ")
    lines += _score_tile(st, "        ")
    lines += _ONLINE_STEP
    b("        dp = tl.dot(do, _dot_operand(vt, DOT_DTYPE), input_precision=PRECISION)")
    b("        pdp = pdp * alpha + tl.sum(p * dp, 1)")
    b("        m = m_new")
    b("    lse = m + tl.log(l)")
    b("    delta = pdp / l")
    b("    tl.store(lse_ptr + bh * SQ + rows, lse, mask=rows < SQ)")
    b("    tl.store(delta_ptr + bh * SQ + rows, delta, mask=rows < SQ)")
    b("    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)")
    lines += _key_walk(st, "    ")
    lines += keys("        ")
    lines += probabilities("        ")
    b(f"        dq += tl.dot(_dot_operand({d_scores}, DOT_DTYPE), tl.trans(_dot_operand(kt, DOT_DTYPE)),")
    b("                     input_precision=PRECISION)")
    b("    tl.store(dq_ptr + b * dq_sb + h * dq_sh + rows[:, None] * dq_sm + rd[None, :] * dq_sd,")
    b("             _to_dtype(dq, dq_ptr.dtype.element_ty), mask=(rows[:, None] < SQ) & (rd[None, :] < D))")
    parts.append("\n".join(lines))

    params = ["q_ptr", "k_ptr", "v_ptr", "do_ptr", "lse_ptr", "delta_ptr", "dk_ptr", "dv_ptr"] + ptrs
    params += ["H", "GROUPS", "SQ", "SK", "D", "DV"] + strides
    params += [f"{t}_{s}" for t in ("dk", "dv") for s in ("sb", "sh", "sm", "sd")] + rest + _CONSTEXPRS
    lines = _kernel(f"{prefix}_dkdv_kernel", params,
                    f"{st.name}: dK = Σ dscoresᵀ·Q and dV = Σ Pᵀ·dO over the queries of every head reading this "
                    "K/V head.")
    b = lines.append
    b("    pid_n, bkv = tl.program_id(0), tl.program_id(1)")
    b("    HKV = H // GROUPS")
    b("    b, kv = (bkv // HKV).to(tl.int64), (bkv % HKV).to(tl.int64)")
    b("    start = pid_n.to(tl.int64) * BLOCK_N")
    b("    rd, rdv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)")
    lines += keys("    ")
    for n in scalars:
        b(f"    {n} = _to_f32(tl.load({n}_ptr))")
    b("    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)")
    b("    dv = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)")
    b("    for r in range(0, GROUPS):  # grouped-query heads: every query head of this K/V head adds to dK, dV")
    b("        h = kv * GROUPS + r")
    b("        bh = b * H + h")
    lines += _query_walk(st, "        ")
    b("            rows = first + tl.arange(0, BLOCK_M)  # query positions")
    lines += queries("            ")
    lines += probabilities("            ")
    b("            dv += tl.dot(tl.trans(_dot_operand(p, DOT_DTYPE)), do, input_precision=PRECISION)")
    b(f"            dk += tl.dot(tl.trans(_dot_operand({d_scores}, DOT_DTYPE)), q, input_precision=PRECISION)")
    b("    inside = cols[:, None] < SK")
    b("    tl.store(dk_ptr + b * dk_sb + kv * dk_sh + cols[:, None] * dk_sm + rd[None, :] * dk_sd,")
    b("             _to_dtype(dk, dk_ptr.dtype.element_ty), mask=inside & (rd[None, :] < D))")
    b("    tl.store(dv_ptr + b * dv_sb + kv * dv_sh + cols[:, None] * dv_sm + rdv[None, :] * dv_sd,")
    b("             _to_dtype(dv, dv_ptr.dtype.element_ty), mask=inside & (rdv[None, :] < DV))")
    parts.append("\n".join(lines))

    if st.dbias:
        parts.append(_dbias_kernel(st, prefix, ptrs, strides, rest, queries, keys, probabilities))
    if st.sinks:
        lines = _kernel(f"{prefix}_dsinks_kernel", ["sinks_ptr", "lse_ptr", "delta_ptr", "dsinks_ptr", "B", "H", "SQ",
                                                    "sinks_sh", "dsinks_sh", "BLOCK_M: tl.constexpr"],
                        f"{st.name}: d sink = -Σ exp(sink - lse)·Δ over the batch and queries of its head, in a "
                        "fixed order.")
        lines += ["    h = tl.program_id(0).to(tl.int64)",
                  "    sink = _to_f32(tl.load(sinks_ptr + h * sinks_sh))",
                  "    terms = tl.zeros((BLOCK_M,), tl.float32)",
                  "    for b in range(0, B):",
                  "        for first in range(0, SQ, BLOCK_M):",
                  "            rows = first + tl.arange(0, BLOCK_M)",
                  "            at = (b * H + h) * SQ + rows",
                  "            lse = tl.load(lse_ptr + at, mask=rows < SQ, other=float('inf'))",
                  "            delta = tl.load(delta_ptr + at, mask=rows < SQ, other=0.0)",
                  "            terms += tl.exp(sink - lse) * delta",
                  "    tl.store(dsinks_ptr + h * dsinks_sh, _to_dtype(-tl.sum(terms, 0), dsinks_ptr.dtype.element_ty))"]
        parts.append("\n".join(lines))
    return "\n\n\n".join(parts) + "\n"


def _dbias_kernel(st, prefix: str, ptrs: list[str], strides: list[str], rest: list[str], queries, keys,
                  probabilities) -> str:
    """d(bias) on one (query, key) tile, summed in order over the batches and heads the bias serves: the program
    walks them, recomputing P and dS. A bias broadcast along the queries or keys (ALiBi's per-head slopes) is
    summed along them too, the tile's share into a float32 slot of its own, and a second kernel adds the slots
    in order: no two programs write one element."""
    m_sum, n_sum = st.bias_sums
    bias_lines, d_bias = score_grad_statements(st, "ds", wrt=st.bias)
    params = ["q_ptr", "k_ptr", "v_ptr", "do_ptr", "lse_ptr", "delta_ptr", "part_ptr"] + ptrs
    params += ["B", "H", "GROUPS", "SQ", "SK", "D", "DV"] + strides
    params += ["part_tm"] * m_sum + ["part_tn"] * n_sum + ["part_sb", "part_sh", "part_sm", "part_sn", "B_SUM",
                                                          "H_SUM"] + rest
    along = " and ".join(axis for axis, summed in (("queries", m_sum), ("keys", n_sum)) if summed)
    lines = _kernel(f"{prefix}_dbias_kernel", params + _CONSTEXPRS,
                    f"{st.name}: d {st.bias} on a (query, key) tile, summed over the B_SUM batches and H_SUM heads "
                    f"that read it" + (f" and the tile's {along}." if along else "."))
    b = lines.append
    b("    pid_m, pid_n = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)")
    b("    own = tl.program_id(2).to(tl.int64)")
    b("    # the first batch and head summed: the tile's own, or 0 where the bias serves them all")
    b("    own_b, own_h = own // (H // H_SUM) * B_SUM, own % (H // H_SUM) * H_SUM")
    b("    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    b("    start = pid_n * BLOCK_N")
    b("    cols = start + tl.arange(0, BLOCK_N)")
    b("    rd, rdv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)")
    b("    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)")
    b("    for b in range(own_b, own_b + B_SUM):")
    b("        for h in range(own_h, own_h + H_SUM):")
    b("            kv = h // GROUPS")
    b("            bh = b * H + h")
    lines += queries("            ")
    lines += keys("            ")
    lines += probabilities("            ", d_scores=False)
    lines += ["            " + x for x in bias_lines]
    b(f"            acc += {d_bias}")
    if m_sum:
        b("    # one value for all queries: the tile's column sums, as row 0")
        b("    acc = tl.sum(tl.where(rows[:, None] < SQ, acc, 0.0), 0)[None, :]")
        b("    rows = tl.zeros((1,), tl.int64)")
    if n_sum:
        b("    # one value for all keys: the row sums, as column 0")
        b("    acc = tl.sum(tl.where(cols[None, :] < SK, acc, 0.0), 1)[:, None]")
        b("    cols = tl.zeros((1,), tl.int64)")
    b("    at = own_b * part_sb + own_h * part_sh + rows[:, None] * part_sm + cols[None, :] * part_sn")
    if m_sum or n_sum:
        b("    at += " + " + ".join(["pid_m * part_tm"] * m_sum + ["pid_n * part_tn"] * n_sum) + "  # the tile's slot")
    b("    inside = (rows[:, None] < SQ) & (cols[None, :] < SK)")
    b("    tl.store(part_ptr + at, _to_dtype(acc, part_ptr.dtype.element_ty), mask=inside)")
    if not (m_sum or n_sum):
        return "\n".join(lines)
    total = _kernel(f"{prefix}_dbias_sum_kernel", ["part_ptr", "dbias_ptr", "SLOTS", "N", "BLOCK: tl.constexpr"],
                    f"{st.name}: d {st.bias} as the sum of its SLOTS slots, in order.")
    total += ["    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
              "    acc = tl.zeros((BLOCK,), tl.float32)",
              "    for slot in range(0, SLOTS):",
              "        acc += tl.load(part_ptr + slot * N + at, mask=at < N, other=0.0)",
              "    tl.store(dbias_ptr + at, _to_dtype(acc, dbias_ptr.dtype.element_ty), mask=at < N)"]
    return "\n".join(lines) + "\n\n\n" + "\n".join(total)


def _launch_prologue(st, tensor_args: list[str], lines: list[str], sinks: bool = True) -> tuple[list[str], list[str]]:
    """The launcher's checks, sizes and score-body arguments, shared by both passes: Q, K, V as 4-D views
    (B, H, S, D), the side tiles broadcast to (B, H, Sq, Sk). Returns the side pointer and the trailing
    arguments of the kernels."""
    b = lines.append
    q, k, v = st.q, st.k, st.v
    b(f"    q4, k4, v4 = {q}, {k}, {v}")
    b("    if q4.dim() == 3:  # (batch·heads, S, D): one batch of that many heads")
    b("        q4, k4, v4 = q4.unsqueeze(0), k4.unsqueeze(0), v4.unsqueeze(0)")
    b("    B, H, SQ, D = q4.shape")
    b("    SK, DV = k4.shape[2], v4.shape[3]")
    b("    if k4.shape[-1] != D or v4.shape[2] != SK or H % max(k4.shape[1], 1) or v4.shape[1] != k4.shape[1]:")
    b(f'        raise ValueError(f"{st.node}: attention of q {{tuple({q}.shape)}}, k {{tuple({k}.shape)}}, '
      f'v {{tuple({v}.shape)}}")')
    tiles, scalars = _kinds(st, "tile"), _kinds(st, "scalar")
    sizes = [(n, st.sizes[n]) for n, kind in zip(st.side, st.kinds) if kind == "size"]
    for t in tiles:  # broadcast to (B, H, Sq, Sk): stride 0 where the scores' dimension is not its own
        b(f"    {t}_v = {t}.expand(B, H, SQ, SK)")
    for n, src in sizes:
        b(f"    {n} = {src}")
    b("    dot = _DOT_DTYPE[q4.dtype]")
    b(f"    precision = \"ieee\" if {tensor_args[0]}.dtype == torch.float32 else \"tf32\"")
    b("    block_d, block_dv = max(16, triton.next_power_of_2(D)), max(16, triton.next_power_of_2(DV))")
    b("    if max(block_d, block_dv) > 256 and not INTERPRET:  # a (64, 512) tile of Q, K or V per program")
    b(f'        raise ValueError(f"{st.node}: head dimensions {{D}} and {{DV}}: the attention kernel takes up to 256")')
    b("    wide = max(block_d, block_dv) * q4.element_size() > ATTN_ROW_BYTES")
    b("    knobs = _attention_knobs(SQ, SK, max(D, DV))  # tuned for these sizes, or the defaults")
    b("    block_m, block_n = knobs[\"ATTN_BLOCK_M\"], knobs[\"ATTN_BLOCK_N\"]")
    b("    if wide:")
    b("        block_m, block_n = block_m // 2, block_n // 2")
    sinks = sinks and bool(st.sinks)
    ptrs = [f"{t}_v" for t in tiles] + scalars + ([st.sinks] if sinks else [])
    rest = [f"*{t}_v.stride()" for t in tiles] + ([f"{st.sinks}.stride(0)"] if sinks else [])
    return ptrs, rest + [n for n, _ in sizes] + st.attrs


def _call(lines: list[str], kernel: str, grid: str, args: list[str], tail: str) -> None:
    lines.append(f"    {kernel}[{grid}](")
    lines += textwrap.wrap(", ".join(args) + ",", 112, initial_indent=" " * 8, subsequent_indent=" " * 8)
    lines.append(f"        {tail})")


_BLOCKS = "BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DV=block_dv, DOT_DTYPE=dot,\n" \
          "        PRECISION=precision, **_attention_launch(knobs)"
_QKV = ["H", "H // max(k4.shape[1], 1)", "SQ", "SK", "D", "DV", "*q4.stride()", "*k4.stride()", "*v4.stride()"]


def emit_attention_launcher(op: str, st, fn_name: str, tensor_args: list[str], attrs: list[str]) -> str:
    """Forward: allocates the (B·H, Sq, Dv) output (and the log-sum-exp) and launches one program per query
    block and (batch, head). Backward: the gradients of Q, K, V (and the sinks) from the four kernels."""
    if isinstance(st, AttentionBackwardStage):
        return _backward_launcher(op, st, fn_name, tensor_args, attrs)
    lines = [f"def {fn_name}({launcher_signature(tensor_args, attrs)}):"]
    b = lines.append
    ptrs, rest = _launch_prologue(st, tensor_args, lines)
    dtype = f"{st.like}.dtype" if st.like else "torch.float32"
    b(f"    {st.node} = torch.empty((B * H, SQ, DV), device=q4.device, dtype={dtype})")
    args = ["q4", "k4", "v4", st.node] + ptrs + _QKV + [f"*{st.node}.stride()"] + rest
    _call(lines, attention_kernel_name(op, st), "(triton.cdiv(SQ, block_m), B * H)", args, _BLOCKS)
    b(f"    return {', '.join(st.writes)},")
    return "\n".join(lines) + "\n"


def _backward_launcher(op: str, st, fn_name: str, tensor_args: list[str], attrs: list[str]) -> str:
    lines = [f"def {fn_name}({launcher_signature(tensor_args, attrs)}):"]
    b = lines.append
    ptrs, rest = _launch_prologue(st, tensor_args, lines, sinks=False)
    for g, like in ((st.node, st.q), (st.dk, st.k), (st.dv, st.v)) + (((st.dsinks, st.sinks),) if st.sinks else ()):
        dtype = f"{st.grad_like[g]}.dtype" if st.grad_like.get(g) else "torch.float32"
        b(f"    {g} = _empty_as({like}, {dtype})")
    b(f"    d4 = [g.unsqueeze(0) if g.dim() == 3 else g for g in ({st.node}, {st.dk}, {st.dv})]")
    b("    # each query's log-sum-exp and Δ, written by the dQ kernel for the two after it")
    b("    lse, delta = torch.empty((2, B * H, SQ), device=q4.device, dtype=torch.float32)")
    prefix = f"_{op}_{st.name}"
    common = ["q4", "k4", "v4", st.grad, "lse", "delta"]
    sinks = [st.sinks] if st.sinks else []
    _call(lines, f"{prefix}_dq_kernel", "(triton.cdiv(SQ, block_m), B * H)",
          common + ["d4[0]"] + ptrs + sinks + _QKV + [f"*{st.grad}.stride()", "*d4[0].stride()"] + rest
          + [f"{st.sinks}.stride(0)"] * bool(st.sinks), _BLOCKS)
    _call(lines, f"{prefix}_dkdv_kernel", "(triton.cdiv(SK, block_n), B * k4.shape[1])",
          common + ["d4[1]", "d4[2]"] + ptrs + _QKV + [f"*{st.grad}.stride()", "*d4[1].stride()", "*d4[2].stride()"]
          + rest, _BLOCKS)
    if st.dbias:
        m_sum, n_sum = st.bias_sums
        b("    # the bias right-aligned to (B, H, SQ, SK): a batch or head dimension of size 1 sums what it serves")
        b(f"    shape4 = (1,) * (4 - {st.bias}.dim()) + tuple({st.bias}.shape)")
        b("    b_sum, h_sum = (max(B, 1) if shape4[0] == 1 else 1), (max(H, 1) if shape4[1] == 1 else 1)")
        b("    grid = (triton.cdiv(SQ, block_m), triton.cdiv(SK, block_n), B // b_sum * (H // h_sum))")
        if m_sum or n_sum:
            b("    # float32 slots, one per tile along the summed queries (keys), added in order below")
            b(f"    part = torch.zeros(({'grid[0]' if m_sum else '1'}, {'grid[1]' if n_sum else '1'}) + shape4, "
              "device=q4.device, dtype=torch.float32)")
        else:
            b("    # a value per (query, key): the kernel writes the gradient (zeros where no batch or head reads it)")
            b(f"    part = (torch.zeros if B * H == 0 else torch.empty)((1, 1) + shape4, device=q4.device, "
              f"dtype={st.bias}.dtype)")
        b(f"    part_v = part.expand(part.shape[:2] + (B, H, {'1' if m_sum else 'SQ'}, {'1' if n_sum else 'SK'}))")
        slots = ["part_v.stride(0)"] * m_sum + ["part_v.stride(1)"] * n_sum
        _call(lines, f"{prefix}_dbias_kernel", "grid",
              common + ["part"] + ptrs + ["B"] + _QKV + [f"*{st.grad}.stride()"] + slots
              + ["*part_v.stride()[2:]", "b_sum", "h_sum"] + rest, _BLOCKS)
        if m_sum or n_sum:
            b(f"    {st.dbias} = torch.empty({st.bias}.shape, device=q4.device, dtype={st.bias}.dtype)")
            b(f"    {prefix}_dbias_sum_kernel[(triton.cdiv({st.dbias}.numel(), 1024),)](")
            b(f"        part, {st.dbias}, part.shape[0] * part.shape[1], {st.dbias}.numel(), BLOCK=1024)")
        else:
            b(f"    {st.dbias} = part.view({st.bias}.shape)")
    if st.sinks:
        _call(lines, f"{prefix}_dsinks_kernel", "(H,)",
              [st.sinks, "lse", "delta", st.dsinks, "B", "H", "SQ", f"{st.sinks}.stride(0)", f"{st.dsinks}.stride(0)"],
              "BLOCK_M=ATTN_BLOCK_M")
    b(f"    return {', '.join(st.writes)},")
    return "\n".join(lines) + "\n"
