"""Stage 2, API exploration: every ATen op of both graphs mapped to Triton, and the cost model.

An op without a lowering, or a pattern the planner cannot fuse, ends the run as BLOCKED_API with the
offending ops named in API_REPORT.md.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from opforge.bench.roofline import classify, describe
from opforge.codegen.attention_grad import AttentionBackwardStage
from opforge.codegen.build import device_events, graph_binding, kernels_of, numel_of, plan_request, shape_numel
from opforge.codegen.eager_dispatch import eager_cost
from opforge.codegen.gemm import HOST_VIEWS, LIBRARY, PRODUCTS, HostView, einsum_problem
from opforge.codegen.ops import OP_TABLE, VIEW, op_name
from opforge.codegen.plan import Unsupported, unsupported_ops
from opforge.codegen.pooling import POOLS, pool_text
from opforge.codegen.trace import kernel_names, trace_request
from opforge.i18n import N_, _
from opforge.request import Request
from opforge.skills.op_api.markdown import cell
from opforge.workspace import StageOutcome, Workspace
from opforge.workspace.atomic import write_json_atomic, write_text_atomic

ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int64": 8, "int32": 4, "int8": 1, "bool": 1}

# The words of API_REPORT.md's tables: api_report.json keeps the English, the report shows them translated.
KINDS = {"pointwise": N_("pointwise"), "reduction": N_("reduction"), "column": N_("column"), "scan": N_("scan"),
         "shift": N_("shift"), "constant": N_("constant"), "symbolic": N_("symbolic"), "view": N_("view"),
         "product": N_("product"), "library": N_("library"), "pooling": N_("pooling"),
         "unsupported": N_("unsupported")}
GEMM_TRITON = N_("tl.dot (a GEMM stage)")
LIBRARY_TRITON = N_("the vendor library, called through torch (a library stage)")
POOL_TRITON = N_("windowed loads (a pooling stage; the backward gathers)")
VIEW_TRITON = N_("strides (taken by the launcher)")
# OP_TABLE's primitives that say something in words (codegen/ops.py); the others are code and read as they are
PRIMITIVES = (N_("(none)"), N_("(float)"), N_("broadcast"), N_("literal"), N_("size argument"),
              N_("product of size arguments"), N_("load at a column offset or stride"),
              N_(".to (integers: tl.floor/tl.ceil toward zero)"), N_("tl.arange (the column index)"),
              N_("tl.div_rn where held exact, else /"), N_("tl.sqrt_rn where held exact, else tl.sqrt"),
              N_("tl.sqrt_rn for ±1/2, else tl.exp2/log2"), N_("tl.exp, a polynomial near 0"),
              N_("tl.sum + atomic_add | ordered partials"), N_("tl.max + atomic_max | ordered partials"),
              N_("tl.min + atomic_min | ordered partials"), N_("tl.max, tl.min over columns (the first, NaN first)"),
              N_("tl.min, tl.min over columns (the first, NaN first)"), N_("tl.reduce(_mul) over columns"),
              N_("tl.where over a column range or stride"), N_("tl.where over column ranges"),
              N_("tl.where over interleaved columns"))
PASSES = {"forward": N_("forward"), "backward": N_("backward")}
BOUNDS = {"compute": N_("compute"), "memory": N_("memory")}
NO_LOWERING = "no Triton lowering for"  # api_report.json's unsupported_reason when an op has no lowering


def _input_bytes(req: Request, name: str, eb: int) -> int:
    """Bytes per element of an input (by its name in the request or in the module): the op's dtype, or an
    index input's own integer width."""
    inner = kernel_names([s.name for s in req.inputs], products=True)
    spec = next((s for s in req.inputs if name in (s.name, inner[s.name])), None)
    return ELEM_BYTES[spec.dtypes[0]] if spec is not None and spec.index else eb


def _op_rows(traced) -> list[dict]:
    fwd = Counter(op_name(n.target) for n in traced.forward.graph.nodes if n.op == "call_function")
    bwd = Counter(op_name(n.target) for n in traced.joint.graph.nodes if n.op == "call_function") \
        if traced.joint is not None else Counter()
    rows = []
    for op in sorted(set(fwd) | set(bwd)):
        rule = OP_TABLE.get(op)
        if rule is None and op in PRODUCTS:
            kind, triton, exact = "product", GEMM_TRITON, False
        elif rule is None and op in LIBRARY:
            kind, triton, exact = "library", LIBRARY_TRITON, False
        elif rule is None and op in POOLS:
            kind, triton, exact = "pooling", POOL_TRITON, \
                POOLS[op][0] == "max" and not POOLS[op][2]
        elif rule is None and op in HOST_VIEWS:
            kind, triton, exact = "view", VIEW_TRITON, True
        else:
            kind, triton, exact = (rule.kind, rule.primitive, rule.exact) if rule else ("unsupported", "—", None)
        rows.append({"op": op, "forward": fwd.get(op, 0), "joint": bwd.get(op, 0), "kind": kind, "triton": triton,
                     "exact": exact})
    return rows


def _pass_bytes(gm, req, binding, wanted: list[int], n_inputs: int, eb: int) -> int:
    """Minimum bytes of one fused pass: each tensor it reads once, each output it writes once."""
    numel = numel_of(gm, req, binding)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"][:n_inputs]
    out = next(n for n in gm.graph.nodes if n.op == "output")
    results = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    reads = sum(numel(p) * _input_bytes(req, s.name, eb) for p, s in zip(placeholders, req.inputs))
    reads += eb * sum(numel(p) for p in placeholders[len(req.inputs):])  # upstream gradients
    return reads + sum(numel(results[i]) * (8 if results[i].meta["val"].dtype == torch.int64 else eb) for i in wanted)


def _launches(plan, gm, req, binding) -> dict:
    """Fused launches per call, every device event counted: kernels, memsets and fills."""
    ev = device_events(plan, graph_binding(gm, req, binding))
    return {"fused_kernels": ev["kernels"] + ev["memsets"], "fused_memsets": ev["memsets"]}


def _chain_bytes(plan, gm, req, binding, eb: int) -> int:
    """What a chain of kernels moves: each kernel reads its inputs and writes its outputs (the handed-over
    float32 values included), so inputs read by several kernels count each time."""
    subs = graph_binding(gm, req, binding)
    total = 0
    for k in plan.kernels:
        total += sum(shape_numel(a.shape, subs) * (4 if a.name in plan.temps else _input_bytes(req, a.name, eb))
                     for a in k.inputs)
        total += sum(shape_numel(o.shape, subs) * (4 if o.name in plan.temps else eb) for o in k.outputs)
    return total


def _staged_bytes(plan, gm, req, binding, eb: int) -> int:
    """What a pass of GEMM and glue stages moves: each stage reads its inputs and writes its outputs, values
    handed between stages as float32, the pass's inputs and outputs in their own dtypes."""
    subs = graph_binding(gm, req, binding)
    views = {s.target: s for s in plan.steps if isinstance(s, HostView)}
    indices = {st.indices for st in plan.pools if st.indices}  # max pooling's positions: int64
    total = 0
    for name, _rw in plan.moves():
        base = name
        while base in views:  # a view moves the bytes of what it views
            base = views[base].args[0]
        size = (8 if base in indices else _input_bytes(req, base, eb) if base in plan.input_names
                else eb if name in plan.results or name in plan.in_dtype else 4)
        total += shape_numel(plan.shapes[name], subs) * size
    return total


def _flops(plan, gm, req, binding, n_elem: int) -> int:
    """Floating-point operations of one pass: 2·M·N·K a product, one a pointwise op and element."""
    if plan.layout != "staged":
        return len(plan.body + plan.epilogue) * n_elem
    subs = graph_binding(gm, req, binding)
    total = 0
    for st in plan.gemms:
        n, k = shape_numel(st.shape, subs), shape_numel([st.k], subs)
        total += 2 * n * k + (len(st.epilogue.body) * n if st.epilogue else 0)
        total += len(st.rows.plan.body + st.rows.plan.epilogue) * n if st.rows else 0
        for side, pro in st.prologues.items():  # one statement per operand element: M·K for A, K·N for B
            other = st.shape[-1] if side == "a" else st.shape[-2]
            total += len(pro.plan.body) * n * k // max(1, shape_numel([other], subs))
    stages = plan.attentions + plan.libraries + plan.pools
    total += sum(st.flops(lambda shape: shape_numel(shape, subs)) for st in stages)
    return total + sum(len(p.body + p.epilogue) * n_elem for p in plan.glue)


def _bytes(plan, gm, req, binding, wanted, n_inputs, eb) -> int:
    if plan.layout == "staged":
        return _staged_bytes(plan, gm, req, binding, eb)
    if plan.chained:
        return _chain_bytes(plan, gm, req, binding, eb)
    return _pass_bytes(gm, req, binding, wanted, n_inputs, eb)


def cost_model(req: Request, traced, build) -> list[dict]:
    rows = []
    n_out = len(traced.output_names)
    n_in = len(traced.input_names)
    fn = req.load_reference()
    for binding in req.p0:
        n_elem = max(math.prod(req.input_shape(s, binding)) for s in req.inputs)
        for dt in req.dtypes:
            eb = ELEM_BYTES[dt]
            eager = eager_cost(req, binding, dt, fn)
            f_eager = eager["forward"]
            row = {"binding": binding, "dtype": dt, "elements": n_elem,
                   "forward": {**_launches(build.forward, traced.forward, req, binding),
                               "fused_bytes": _bytes(build.forward, traced.forward, req, binding, list(range(n_out)),
                                                     n_in, eb),
                               "eager_kernels": f_eager["kernels"], "eager_bytes": f_eager["bytes"],
                               "eager_ops": f_eager["ops"],
                               "flops": _flops(build.forward, traced.forward, req, binding, n_elem)}}
            if build.backward:
                b_eager = eager.get("backward", {"kernels": 0, "bytes": 0, "ops": []})
                grads = list(range(n_out, n_out + len(traced.grad_inputs)))
                row["backward"] = {
                    **_launches(build.backward, traced.joint, req, binding),
                    "fused_bytes": _bytes(build.backward, traced.joint, req, binding, grads,
                                         n_in + len(traced.grad_outputs), eb),
                    "eager_kernels": b_eager["kernels"], "eager_bytes": b_eager["bytes"], "eager_ops": b_eager["ops"],
                    "flops": _flops(build.backward, traced.joint, req, binding, n_elem)}
            for p in ("forward", "backward"):
                if p in row:
                    row[p]["arithmetic_intensity"] = round(row[p]["flops"] / max(1, row[p]["fused_bytes"]), 3)
                    row[p]["roofline"] = classify(row[p]["flops"], row[p]["fused_bytes"], dt)
                    plan = build.forward if p == "forward" else build.backward
                    row[p]["row_passes"] = plan.walks
            rows.append(row)
    return rows


def _layout_notes(build) -> list[str]:
    """Constraints and tiling, as the planner chose them for this request."""
    staged = [p for p in (build.forward, build.backward) if p is not None and p.layout == "staged"]
    if staged:
        return _staged_notes(staged)
    rows = [k for p in (build.forward, build.backward) if p is not None and p.layout == "rows"
            for k in kernels_of(p)]
    why = [w for p in (build.forward, build.backward) if p is not None for w in p.why]
    out = ["## " + _("Constraints"), "",
           "- " + _("Shapes are run-time arguments; offsets are int64, so tensors past 2³¹ elements index correctly."),
           "- " + _("Loads are upcast to float32, stores round to the output dtype (round-to-nearest-even)."),
           "- " + _("Inputs are made contiguous at launch (a no-op for contiguous tensors).")]
    if not rows:
        out += ["- " + _("Every tensor is either the full operand (one element per output position) or a per-tensor "
                         "scalar, walked as one flat range."), "", "## " + _("Tiling"), "",
                "- " + _("One program per `BLOCK` = 1024 contiguous elements (4 warps): memory-bound work wants "
                         "wide, coalesced, vectorised accesses and enough programs to fill the device."),
                "- " + _("Reductions: a block-local `tl.sum`, then across blocks atomics into float32 accumulators "
                         "or, with `deterministic=True`, one partial per program summed in program order by the last "
                         "program."),
                ""]
        return out
    for p in rows:
        maps = ", ".join(_("{name} ({layout})").format(name=a.name, layout=a.layout) for a in p.inputs)
        out.append("- " + _("{kernel}: iteration space {rows} rows × {columns} columns; inputs {inputs}; {phases} "
                            "row-reduction phase(s).").format(kernel=p.name, rows=p.n_rows, columns=p.n_cols,
                                                             inputs=maps, phases=p.phases))
    out += ["", "## " + _("Tiling"), "",
            "- " + _("Row kernel: a program owns BLOCK_R rows; BLOCK_C = next_pow2(columns) up to 65536, BLOCK_R "
                     "fills 4096 elements. Short rows are processed many per program."),
            "- " + _("A row that fits one chunk is persistent: each input is read once and reduced in registers, so "
                     "the minimum bytes below are what the kernel moves. A longer row is walked once per phase (plus "
                     "the final walk); those extra reads hit L2 when BLOCK_R rows fit it, and the `row_passes` column "
                     "of api_report.json says how many walks there are."),
            "- " + _("Column reductions (a norm's weight gradient): the row kernel runs about one program per SM, "
                     "each summing its rows per column in registers and storing one float32 row of partials; a second "
                     "kernel adds those rows in program order (the same bits every run) and stores the column "
                     "outputs."),
            "- " + _("Full reductions (a loss) are summed per program, then across programs by atomics, or, with "
                     "`deterministic=True`, by the last program in program order.")]
    if why:  # the planner's reasons, in its words
        out += ["- " + _("More than one kernel in a pass, because a value needs finished reductions for every row "
                         "(they are handed over in float32 buffers):"), *[f"  - {w}" for w in why]]
    else:
        out.append("- " + _("One kernel per pass: no value needs a finished column or full reduction for every row."))
    out.append("")
    return out


def _gemm_note(st) -> str:
    """One bullet: what a GEMM stage multiplies, what it computes on its tiles, what it stores."""
    steps = "".join(_(", {side} computed on its tiles from {values}").format(
        side=side.upper(), values=", ".join(p.loads + p.scalars)) for side, p in st.prologues.items())
    if st.epilogue:
        steps += _(", then {n} fused statements on the tile").format(n=len(st.epilogue.body))
    if st.rows:
        steps += _(", then {kernel}'s row work on the tile where it holds whole rows (up to GEMM_ROWS_N columns; "
                   "wider products are stored for its row kernel)").format(kernel=st.rows.plan.name)
    text = _("{name}: batched product {node} = {a} · {b}{steps}; stores {writes}.") if st.batched else \
        _("{name}: product {node} = {a} · {b}{steps}; stores {writes}.")
    return "- " + text.format(name=st.name, node=st.node, a=st.a, b=st.b, steps=steps, writes=", ".join(st.writes))


def _staged_notes(plans: list) -> list[str]:
    """Constraints and tiling of passes cut at their matrix products."""
    out = ["## " + _("Constraints"), "",
           "- " + _("Shapes are run-time arguments; GEMM row and column indices are int64, so strides times indices "
                    "cannot wrap past 2³¹."),
           "- " + _("Products accumulate in float32 (`tl.dot`); 16-bit operands multiply on the tensor cores in "
                    "their dtype, a float32 operator's in IEEE float32; values handed between stages are float32 "
                    "buffers."),
           "- " + _("Operands and outputs are read through their strides: transposes, permutes, views and "
                    "broadcasts around a product are views the launcher takes, never copies."),
           "", "## " + _("Tiling"), ""]
    for p in plans:
        out += [_gemm_note(st) for st in p.gemms]
        for st in p.attentions:
            if isinstance(st, AttentionBackwardStage):
                text = _("{name}: attention backward, {writes} from {q}, {k}, {v} and {grad}: per 64 queries, a walk "
                         "over the keys for the log-sum-exp and Δ = Σ P·dP, a second for dQ; per 64 keys of a K/V "
                         "head, a walk over the queries of its heads for dK and dV; the sinks' gradient per head. "
                         "Probabilities are recomputed tile by tile; the scores are never written.") if st.dsinks \
                    else _("{name}: attention backward, {writes} from {q}, {k}, {v} and {grad}: per 64 queries, a "
                           "walk over the keys for the log-sum-exp and Δ = Σ P·dP, a second for dQ; per 64 keys of a "
                           "K/V head, a walk over the queries of its heads for dK and dV. Probabilities are "
                           "recomputed tile by tile; the scores are never written.")
                out.append("- " + text.format(name=st.name, writes=", ".join(st.writes), q=st.q, k=st.k, v=st.v,
                                              grad=st.grad))
                continue
            out.append("- " + _("{name}: attention {node} = softmax(score({q}·{k}ᵀ))·{v}, one program per 64 queries "
                                "of a (batch, head), keys walked 64 at a time with an online softmax; the scores are "
                                "never written.").format(name=st.name, node=st.node, q=st.q, k=st.k, v=st.v))
        for st in p.libraries:
            out.append("- " + _("{name}: {what} by the vendor library (torch.ops.{op}); reads {reads}, writes "
                                "{writes} in the op's dtype.").format(
                name=st.name, what=st.op.split('.')[1].replace('_', ' '), op=st.op, reads=", ".join(st.reads),
                writes=", ".join(st.writes)))
        for st in p.pools:
            out.append("- " + _("{name}: {pooling}").format(name=st.name, pooling=pool_text(st, None)))
        for g in p.glue:
            out.append("- " + _("{name}: glue between products, a {layout} plan.").format(name=g.name,
                                                                                         layout=g.layout))
    out += ["- " + _("A GEMM program owns a BLOCK_M × BLOCK_N = 128 × 128 tile and walks K in BLOCK_K = 32 steps "
                     "(8 warps, 3 pipeline stages); programs run in groups of GROUP_M = 8 tile rows, which share B's "
                     "columns in L2."), ""]
    return out


def _triton(text: str) -> str:
    """A Triton column's cell in the report's language: the words of the lowering translated, code as it is."""
    return _(text) if text in PRIMITIVES or text in (GEMM_TRITON, LIBRARY_TRITON, POOL_TRITON, VIEW_TRITON) else text


def _md(req, rows, unsupported, why, cost, build) -> str:
    lines = ["# " + _("API report: {name}").format(name=req.name), "", "## " + _("ATen ops → Triton"), "",
             _("| ATen op | forward | joint fwd+bwd | kind | Triton | bit-exact |"), "|---|---|---|---|---|---|"]
    for r in rows:
        ex = "—" if r["exact"] is None else (_("yes") if r["exact"] else _("no"))
        kind = _(KINDS[r["kind"]]) if r["kind"] in KINDS else r["kind"]
        lines.append(f"| `{cell(r['op'])}` | {r['forward']} | {r['joint']} | {kind} | {cell(_triton(r['triton']))} | "
                     f"{ex} |")
    lines.append("")
    if unsupported:
        # the planner's reason stays in its words; the engine's own is translated
        reason = _("no Triton lowering for:") if why == NO_LOWERING else why + ":"
        lines += ["## " + _("Unsupported"), "", reason, "", *[f"- `{op}`" for op in unsupported], "",
                  _("The deterministic engine cannot fuse this request; the run stops as BLOCKED_API."), ""]
        return "\n".join(lines)
    lines += _layout_notes(build)
    lines += ["## " + _("Cost model"), "",
              _("Minimum bytes = each input read once + each output written once. Eager = the ATen kernels eager "
                "PyTorch dispatches for the reference (seen by a TorchDispatchMode, so softmax is one `_softmax`, "
                "not its decomposition; views and allocations launch none), each reading its inputs and writing "
                "its outputs once."), "",
              _("Fused launches count every device event: kernels, and the memsets that zero the buffers where "
                "programs meet."), "",
              _("| shape | dtype | pass | fused launches (memsets) | fused bytes | eager kernels | eager bytes | "
                "eager/fused bytes | flops | flops/byte | bound | floor µs |"),
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cost:
        for p in ("forward", "backward"):
            if p not in c:
                continue
            x = c[p]
            launches = f"{x['fused_kernels']} ({x.get('fused_memsets', 0)})"
            bound = x['roofline']['bound']
            bound = _(BOUNDS[bound]) if bound in BOUNDS else bound
            lines.append(f"| {c['binding']} | {c['dtype']} | {_(PASSES[p])} | {launches} | {x['fused_bytes']:,} | "
                         f"{x['eager_kernels']} | {x['eager_bytes']:,} | {x['eager_bytes'] / x['fused_bytes']:.1f}× | "
                         f"{x['flops']:,} | {x['arithmetic_intensity']} | {bound} | "
                         f"{x['roofline']['floor_us']} |")
    if cost:
        c = cost[0]
        lines += ["", _("Eager kernels at {shape}, {dtype}:").format(shape=c["binding"], dtype=c["dtype"]), ""]
        lines += [f"- {_(PASSES[p])}: " + (", ".join(f"`{op}`" for op in c[p]["eager_ops"]) or _("none"))
                  for p in ("forward", "backward") if p in c]
    lines += ["", describe(), ""]
    compute = sorted({(c["dtype"], p) for c in cost for p in ("forward", "backward")
                      if p in c and c[p]["roofline"]["bound"] == "compute"})
    passes = ", ".join(f"{dt} {_(PASSES[p])}" for dt, p in compute)
    lines += [_("Compute-bound at these shapes: {passes}: the products' tensor-core throughput is the figure of "
                "merit, not bandwidth.").format(passes=passes) if compute else
              _("Every pass is memory-bound at these shapes: the fused kernels' figure of merit is bandwidth against "
                "the device's copy ceiling."), ""]
    return "\n".join(lines)


def explore(req: Request, traced=None, with_cost: bool = True, with_ops: bool = True) -> tuple[dict, object]:
    """Stage 2 in memory: every op of both graphs mapped to Triton (`with_ops`: the table reads the reference's
    own joint, which a plan from the fused-attention joint does not otherwise trace), the plan (None when the
    engine cannot build the request) and, with `with_cost`, the cost model at the P0 shapes. Returns
    (report, build)."""
    traced = traced or trace_request(req)
    rows = _op_rows(traced) if with_ops else []
    backward = traced.backward_graph if req.backward else None
    graphs = [traced.forward] + ([backward] if backward is not None else [])
    unsupported = sorted({op for g in graphs for op in unsupported_ops(g.graph)})
    why = NO_LOWERING
    build = None
    if not unsupported:
        try:
            build = plan_request(req, traced)
        except Unsupported as exc:
            unsupported, why = exc.ops or ["(pattern)"], exc.why
    if unsupported:  # the reference's own words for a product it cannot fuse, before the ATen ops it became
        for eq in traced.forward.meta.get("einsums", []):
            problem = einsum_problem(eq)
            if problem:
                unsupported, why = [f"torch.einsum({eq!r})"] + unsupported, f"torch.einsum({eq!r}) {problem}; {why}"
                break
    cost = cost_model(req, traced, build) if build and with_cost else []
    report = {"op_name": req.name, "ops": rows, "unsupported": unsupported, "unsupported_reason": why if unsupported
              else None, "cost": cost,
              "supported_views": sorted(k for k, r in OP_TABLE.items() if r.kind == VIEW)}
    return report, build


def run(ws: Workspace, req: Request, state) -> StageOutcome:
    report, build = explore(req)
    unsupported, why = report["unsupported"], report["unsupported_reason"]
    write_json_atomic(ws.path("api_report.json"), report)
    write_text_atomic(ws.path("API_REPORT.md"), _md(req, report["ops"], unsupported, why, report["cost"], build))
    if unsupported:
        return StageOutcome("blocked", f"{why}: {', '.join(unsupported)}",
                            artifacts=["API_REPORT.md", "api_report.json"])
    return StageOutcome("completed", f"{len(report['ops'])} ATen ops mapped to Triton, none unsupported",
                        artifacts=["API_REPORT.md", "api_report.json"])
