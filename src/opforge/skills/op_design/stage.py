"""Stage 4, design: DESIGN.md and design.json — the fusion plan, tiling, loops, memory layout and the
verification matrix the tests will run."""

from __future__ import annotations

import json

from opforge import i18n
from opforge.codegen.attention import AttentionStage
from opforge.codegen.attention_grad import AttentionBackwardStage
from opforge.codegen.build import kernels_of, plan_request
from opforge.codegen.eager_dispatch import eager_cost
from opforge.codegen.gemm import GemmStage
from opforge.codegen.plan import KernelPlan
from opforge.codegen.pooling import PoolStage, pool_text
from opforge.codegen.rows import RowPlan
from opforge.i18n import N_, _, ngettext, shown
from opforge.request import Request
from opforge.verify.cases import largest_input, level0_bindings, level0_cases, level1_cases
from opforge.workspace import StageOutcome, Workspace
from opforge.workspace.atomic import write_json_atomic, write_text_atomic


def plan_summary(plan: KernelPlan | RowPlan | GemmStage | AttentionStage | PoolStage) -> dict:
    """What design.json says of a kernel: English whatever the report's language (its `when` values are
    translated where DESIGN.md shows them)."""
    with i18n.using("en"):
        return _summary(plan)


def _summary(plan) -> dict:
    if isinstance(plan, GemmStage):
        return _gemm_summary(plan)
    if isinstance(plan, AttentionStage):
        return _attention_summary(plan)
    if isinstance(plan, PoolStage):
        return {"kernel": plan.name, "layout": "pooling", "pooling": pool_text(plan),
                "reads": [{"name": n, "operand": "window" if n == plan.x else "full"} for n in plan.reads],
                "writes": [{"name": n, "operand": "full", "when": N_("every program, its block of elements")}
                           for n in plan.writes],
                "statements": 0, "runtime_attributes": []}
    if plan.layout == "rows":
        return _row_summary(plan)
    return {
        "kernel": plan.name,
        "layout": "flat",
        "reads": [{"name": a.name, "operand": "full" if a.full else "scalar"} for a in plan.inputs],
        "writes": [{"name": o.name, "operand": "full" if o.full else "scalar",
                    "when": N_("last program (after the reductions)") if o.in_epilogue else N_("every program")}
                   for o in plan.outputs],
        "statements": len(plan.body),
        "reductions": [{"name": r.name, "kind": r.kind, "of": r.source} for r in plan.reductions],
        "epilogue_statements": len(plan.epilogue),
        "runtime_attributes": plan.attrs,
    }


def _gemm_summary(st: GemmStage) -> dict:
    ep = st.epilogue
    return {
        "kernel": st.name,
        "layout": "gemm",
        "product": _product_text(st),
        "batched": st.batched,
        "reads": [{"name": n, "operand": "operand"} for side, n in (("a", st.a), ("b", st.b))
                  if side not in st.prologues]
        + [{"name": n, "operand": f"prologue of {side.upper()}"} for side, pro in st.prologues.items()
           for n in pro.loads + pro.scalars]
        + [{"name": n, "operand": "broadcast"} for n in st.tiles_in]
        + [{"name": n, "operand": "scalar"} for n in st.scalars]
        + [{"name": n, "operand": "row work"} for n in st.row_reads],
        "writes": [{"name": n, "operand": "full", "when": N_("every program, tile by tile")} for n in st.writes],
        "statements": len(ep.body) if ep else 0,
        "epilogue_fused": ep is not None,
        # row work (a softmax, a norm) on the tile where it holds whole rows, else this row plan after the store
        "row_work": st.rows.plan.name if st.rows else None,
        "prologues": {side.upper(): len(pro.plan.body) for side, pro in st.prologues.items()},
        "runtime_attributes": ep.attrs if ep else [],
    }


def _attention_summary(st: AttentionStage) -> dict:
    side = [{"name": n, "operand": "broadcast" if k == "tile" else "scalar"}
            for n, k in zip(st.side, st.kinds) if k != "size"]
    if isinstance(st, AttentionBackwardStage):
        return {
            "kernel": st.name,
            "layout": "attention backward",
            "attention": _attention_text(st),
            "reads": [{"name": n, "operand": "operand"} for n in (st.q, st.k, st.v, st.grad)] + side
            + ([{"name": st.sinks, "operand": "one value per head"}] if st.sinks else []),
            "writes": [{"name": st.node, "operand": "full", "when": N_("the dQ kernel, its block of queries")},
                       {"name": st.dk, "operand": "full", "when": N_("the dK/dV kernel, its block of keys")},
                       {"name": st.dv, "operand": "full", "when": N_("the dK/dV kernel, its block of keys")}]
            + ([{"name": st.dsinks, "operand": "one value per head", "when": N_("its own kernel")}]
               if st.dsinks else []),
            "statements": len([n for n in st.score.graph.nodes if n.op == "call_function"]),
            "runtime_attributes": st.attrs,
        }
    return {
        "kernel": st.name,
        "layout": "attention",
        "attention": _attention_text(st),
        "reads": [{"name": n, "operand": "operand"} for n in (st.q, st.k, st.v)] + side
        + ([{"name": st.sinks, "operand": "one value per head"}] if st.sinks else []),
        "writes": [{"name": st.node, "operand": "full", "when": N_("every program, its block of queries")}],
        "statements": len([n for n in st.score.graph.nodes if n.op == "call_function"]),
        "runtime_attributes": st.attrs,
    }


def _product_text(st: GemmStage) -> str:
    """The product a GEMM kernel computes, as a formula."""
    if st.bias:
        return _("{out} = {a} · {b} ({beta:g}·{bias} + {alpha:g}·product)").format(
            out=st.node, a=st.a, b=st.b, beta=st.beta, bias=st.bias, alpha=st.alpha)
    return f"{st.node} = {st.a} · {st.b}"


def _attention_text(st: AttentionStage) -> str:
    """The attention a kernel computes, as a formula (in the current language where it has words)."""
    if isinstance(st, AttentionBackwardStage):
        grads = f"{st.q}, {st.k}, {st.v}{', ' + st.sinks if st.sinks else ''}"
        return _("d({grads}) of softmax(score({q} · {k}ᵀ)) · {v}, probabilities recomputed tile by tile").format(
            grads=grads, q=st.q, k=st.k, v=st.v)
    if st.sinks:
        return _("{out} = softmax(score({q} · {k}ᵀ)) with sinks {sinks} · {v}").format(
            out=st.node, q=st.q, k=st.k, v=st.v, sinks=st.sinks)
    return f"{st.node} = softmax(score({st.q} · {st.k}ᵀ)) · {st.v}"


_WHEN = {"full": N_("every program, tile by tile"), "row": N_("every program, one value per row"),
         "col": N_("the column-sum kernel (after the column reductions)"),
         "scalar": N_("last program (after the reductions)")}


def _row_summary(plan: RowPlan) -> dict:
    return {
        "kernel": plan.name,
        "layout": "rows",
        "iteration": {"rows": plan.n_rows, "cols": plan.n_cols},
        "reads": [{"name": a.name, "operand": a.layout} for a in plan.inputs],
        "writes": [{"name": o.name, "operand": o.store,
                    "when": _WHEN[o.store] if o.in_epilogue or o.store in ("full", "row") else N_("program 0")}
                   for o in plan.outputs],
        "statements": len(plan.body),
        "row_phases": plan.phases,
        "looped_walks": plan.walks,
        "reductions": [{"name": r.name, "kind": r.kind, "axis": r.axis, "of": r.source.name,
                        "elements": r.count, **({"online_with": r.online.name} if r.online else {})}
                       for r in plan.reductions],
        "epilogue_statements": len(plan.epilogue),
        "runtime_attributes": plan.attrs,
    }


# how DESIGN.md names a kernel's reads and writes: one template per kind of operand
_READ = {"flat": N_("{name} (a full tile)"), "full": N_("{name} (a full tile)"),
         "broadcast": N_("{name} (a tile, broadcast by its strides)"), "row": N_("{name} (one value per row)"),
         "col": N_("{name} (one value per column)"), "scalar": N_("{name} (one value)"),
         "operand": N_("{name} (operand)"), "window": N_("{name} (window)"), "row work": N_("{name} (row work)"),
         "one value per head": N_("{name} (one value per head)")}
_WRITE = {"full": N_("{name} (full, {when})"), "row": N_("{name} (row, {when})"), "col": N_("{name} (col, {when})"),
          "scalar": N_("{name} (scalar, {when})"), "one value per head": N_("{name} (one value per head, {when})")}
_HEADING = {"gemm": N_("### {kernel} kernel (gemm)"), "attention": N_("### {kernel} kernel (attention)"),
            "attention backward": N_("### {kernel} kernel (attention backward)"),
            "pooling": N_("### {kernel} kernel (pooling)"), "rows": N_("### {kernel} kernel (rows)"),
            "flat": N_("### {kernel} kernel (flat)")}


def _read_text(r: dict) -> str:
    op = r["operand"]
    if op.startswith("prologue of "):
        return _("{name} (prologue of {side})").format(name=r["name"], side=op.removeprefix("prologue of "))
    return _(_READ[op]).format(name=r["name"]) if op in _READ else f"{r['name']} ({op})"


def _write_text(w: dict) -> str:
    op = w["operand"]
    if op in _WRITE:
        return _(_WRITE[op]).format(name=w["name"], when=_(w["when"]))
    return f"{w['name']} ({op}, {_(w['when'])})"


def _kernel_md(plan) -> list[str]:
    s = plan_summary(plan)
    reads = ", ".join(_read_text(r) for r in s["reads"])
    writes = ", ".join(_write_text(w) for w in s["writes"])
    heading = _(_HEADING[s["layout"]]) if s["layout"] in _HEADING else "### {kernel} kernel ({layout})"
    lines = [heading.format(kernel=s["kernel"], layout=s["layout"]), "",
             _("- reads {reads}, each once;").format(reads=reads),
             _("- writes {writes}, each once;").format(writes=writes),
             _("- {n} fused statements;").format(n=s["statements"])]
    if s["layout"] == "gemm":
        product = _("- batched product {product}: BLOCK_M × BLOCK_N tiles, K walked in BLOCK_K steps into a float32 "
                    "accumulator (tl.dot), programs grouped by GROUP_M tile rows; operands read through their "
                    "strides (transposes are views);") if s["batched"] else \
            _("- product {product}: BLOCK_M × BLOCK_N tiles, K walked in BLOCK_K steps into a float32 accumulator "
              "(tl.dot), programs grouped by GROUP_M tile rows; operands read through their strides (transposes "
              "are views);")
        lines.insert(2, product.format(product=_product_text(plan)))
        for side, n in s["prologues"].items():
            lines.append(ngettext("- {side} is computed on each K step's tile from its prologue's inputs ({n} "
                                  "pointwise statement, a dequantization for one): {side} is never in memory;",
                                  "- {side} is computed on each K step's tile from its prologue's inputs ({n} "
                                  "pointwise statements, a dequantization for one): {side} is never in memory;",
                                  n).format(side=side, n=n))
        if s["epilogue_fused"]:
            lines.append(_("- the pointwise work after the product runs on the tile in registers (epilogue): the "
                           "product is never written;"))
        lines.append("")
        return lines
    if s["layout"] == "attention":
        lines.insert(2, _("- attention {attention}: a program owns BLOCK_M queries of one (batch, head) and walks the "
                          "keys in BLOCK_N blocks, the scores of a block one tl.dot into float32, the score body on "
                          "them in registers, an online softmax (running max and sum, the output rescaled when the "
                          "max grows); the scores are never written;").format(attention=_attention_text(plan)))
        lines.append("")
        return lines
    if s["layout"] == "attention backward":
        lines.insert(2, _("- attention backward, {attention}: one program per BLOCK_M queries walks the keys twice, "
                          "first for each query's log-sum-exp and Δ = Σ P·dP (online, as the forward's softmax), then "
                          "for dQ += dS·K; then one program per BLOCK_N keys of a K/V head walks the queries of every "
                          "head that reads it (dV += Pᵀ·dO, dK += dSᵀ·Q). P = exp(s − lse), dP = dO·Vᵀ and dS = P ∘ "
                          "(dP − Δ) times the score body's derivative live in registers only; a sink's gradient is "
                          "−Σ exp(sink − lse)·Δ, summed per head in a fixed order;").format(
                              attention=_attention_text(plan)))
        lines.append("")
        return lines
    if s["layout"] == "pooling":
        lines.insert(2, _("- {pooling} Windows that reach past the input's edge read only their elements inside it "
                          "(masked loads);").format(pooling=pool_text(plan, None)))
        lines.append("")
        return lines
    if s["layout"] == "rows":
        it = s["iteration"]
        lines.insert(2, _("- iteration space: {rows} rows × {cols} columns; a program owns BLOCK_R rows;").format(
            rows=it["rows"], cols=it["cols"]))
        by_axis: dict = {}
        for r in s["reductions"]:
            by_axis.setdefault(r["axis"], []).append(_("{kind}({of}) → {name} over {elements}").format(
                kind=r["kind"], of=r["of"], name=r["name"], elements=r["elements"]))
        if by_axis.get("row"):
            lines.append(_("- row reductions in {phases} phase(s) (a reduction that needs another's result waits for "
                           "the next phase): {reductions}. A row that fits one chunk is reduced in registers from one "
                           "load; a longer one is walked once per phase, the values recomputed from the inputs chunk "
                           "by chunk instead of being stored;").format(phases=s["row_phases"],
                                                                       reductions="; ".join(by_axis["row"])))
            online = [_("{name} with {other}").format(name=r["name"], other=r["online_with"])
                      for r in s["reductions"] if r.get("online_with")]
            if online:
                lines.append(_("- online softmax: {pairs} — a sum of exp(a − max a) is accumulated in the walk that "
                               "finds the max, each column's running sum rescaled by exp(old max − new max), so a "
                               "looped row is walked {walks} time(s), one fewer per pair;").format(
                                   pairs=", ".join(online), walks=s["looped_walks"]))
        if by_axis.get("col"):
            lines.append(_("- column reductions: {reductions}. Each program sums its rows per column; the row kernel "
                           "runs about one program per SM (the device's count), each storing one float32 row of "
                           "partials, and a second kernel adds the rows in program order (bit-reproducible without "
                           "deterministic=True), then stores the column outputs;").format(
                               reductions="; ".join(by_axis["col"])))
        if by_axis.get("full"):
            lines.append(_("- full reductions: {reductions}, finished by the last program ({n} statements after "
                           "them);").format(reductions="; ".join(by_axis["full"]), n=s["epilogue_statements"]))
        lines.append("")
        return lines
    if plan.reductions:
        red = ", ".join(f"{r['kind']}({r['of']}) → {r['name']}" for r in s["reductions"])
        lines += [_("- full reductions in the same pass: {reductions}. Each block reduces its share in registers; the "
                    "shares meet in float32 accumulators (atomics) or, deterministic, in a per-program partials "
                    "buffer that the last program sums in program order. An acq_rel ticket counter tells a program "
                    "whether it is the last; that program runs the {n}-statement scalar epilogue and stores the "
                    "reduced outputs.").format(reductions=red, n=s["epilogue_statements"])]
    lines.append("")
    return lines


def _tiling(plan) -> dict:
    if plan.layout == "staged":
        return {"layout": "staged", "gemm": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8,
                                             "num_warps": 8, "num_stages": 3},
                "grid": "(cdiv(M, BLOCK_M) · cdiv(N, BLOCK_N), batch)"}
    if plan.layout == "rows":
        return {"layout": "rows", "grid": "cdiv(n_rows, BLOCK_R)", "BLOCK_C": "min(next_pow2(n_cols), 65536)",
                "BLOCK_R": "max(1, TILE // BLOCK_C)", "TILE": 4096, "num_warps": 4}
    return {"layout": "flat", "BLOCK": 1024, "num_warps": 4, "grid": "cdiv(n_elements, BLOCK)"}


def _saved_json(build) -> dict | None:
    s = build.saved
    if s is None:
        return None
    if s.what == "scans":
        return {"scans": [n.removeprefix("saved_") for n in s.names], "saved": True}
    if s.what == "products":
        return {"products": [n.removeprefix("saved_") for n in s.names], "saved": True,
                "bytes_saved": s.bytes_saved, "flops_saved": s.flops_saved}
    return {"statistics": [n.removeprefix("saved_") for n in s.names], "saved": s.bytes_saved > 0,
            "bytes_saved": s.bytes_saved, "backward_looped_walks": {"recomputed": s.walks[0], "saved": s.walks[1]}}


def _saved_md(build, binding) -> list[str]:
    """What the forward saves for the backward (codegen/saved.py), with its bytes at the deciding shape."""
    s = build.saved
    if s is None:
        return []
    stats = ", ".join(f"`{n.removeprefix('saved_')}`" for n in s.names)
    if s.what == "scans":
        return [_("Scans the backward reads: {stats}. The forward stores them and the backward reads them: its own "
                  "scans run from a row's end, and a row longer than one chunk cannot be walked both ways at "
                  "once.").format(stats=stats), ""]
    if s.what == "products":
        return [_("Matrix products and convolutions the backward needs: {stats}. The forward stores them (a product "
                  "float32, a convolution in the op's dtype, as the library writes it) and the backward reads them: "
                  "at {binding} recomputing them would read {bytes:,} more bytes of operands and redo {flops:,} "
                  "flops.").format(stats=stats, binding=binding, bytes=s.bytes_saved, flops=s.flops_saved), ""]
    if s.bytes_saved > 0:
        return [_("Per-row statistics the backward would recompute: {stats} (one float32 per row each). At {binding} "
                  "a looped row's backward walks it {recomputed} time(s) recomputing them, {saved} reading them; "
                  "saving them moves {bytes:,} fewer bytes per call, so the forward writes them and the backward "
                  "reads them.").format(stats=stats, binding=binding, recomputed=s.walks[0], saved=s.walks[1],
                                        bytes=s.bytes_saved), ""]
    return [_("Per-row statistics the backward would recompute: {stats} (one float32 per row each). At {binding} a "
              "looped row's backward walks it {recomputed} time(s) recomputing them, {saved} reading them; rows of "
              "this shape fit one chunk (read once either way), so saving would move {bytes:,} more bytes: they are "
              "recomputed.").format(stats=stats, binding=binding, recomputed=s.walks[0], saved=s.walks[1],
                                    bytes=-s.bytes_saved), ""]


_TAKES = {"forward": N_("The forward pass takes {n} kernels: a value needs finished reductions for every row, so "
                        "they are finished first and handed over in float32 buffers."),
          "backward": N_("The backward pass takes {n} kernels: a value needs finished reductions for every row, so "
                         "they are finished first and handed over in float32 buffers.")}


def _eager_line(eager: dict, binding, dtype: str) -> str:
    """How many kernels eager launches in each pass, at the deciding shape and dtype."""
    if set(eager) == {"forward", "backward"}:
        return _("Eager runs {forward} kernel(s) in the forward and {backward} kernel(s) in the backward ({binding}, "
                 "{dtype}).").format(forward=eager["forward"]["kernels"], backward=eager["backward"]["kernels"],
                                     binding=binding, dtype=dtype)
    if set(eager) == {"forward"}:
        return _("Eager runs {forward} kernel(s) in the forward ({binding}, {dtype}).").format(
            forward=eager["forward"]["kernels"], binding=binding, dtype=dtype)
    return ("Eager runs " + " and ".join(f"{e['kernels']} kernel(s) in the {p}" for p, e in eager.items()) +
            f" ({binding}, {dtype}).")


def run(ws: Workspace, req: Request, state) -> StageOutcome:
    spec = json.loads(ws.path("spec.json").read_text())
    build = plan_request(req)
    p0 = level0_bindings(spec, bool(state.options.get("quick")))  # quick: scaled down, for a first run
    l0 = level0_cases(spec["supported_dtypes"], p0)
    l1 = level1_cases(spec["supported_dtypes"], spec["dynamic_axes"],
                      {k: spec["default_params"][k] for k in spec["runtime_params"]}, largest_input(spec))
    passes = [build.forward] + ([build.backward] if build.backward else [])
    binding, dtype = req.p0[0], req.dtypes[0]
    eager = eager_cost(req, binding, dtype)
    design = {"op_name": req.name, "kernels": [plan_summary(k) for p in passes for k in kernels_of(p)],
              "eager_kernels_replaced": {p: e["kernels"] for p, e in eager.items()},
              "why_more_kernels": [w for p in passes for w in p.why],
              "tiling": _tiling(build.forward),
              "verification": {"level0": l0, "level1": l1}}
    lines = [_("# Design: {op}").format(op=req.name), "", _("## Compute graph"), "",
             _("The forward graph and the joint forward+backward graph traced from the reference (SPEC.md shows "
               "both). They are decomposed, so their nodes are not eager's kernels; API_REPORT.md lists what eager "
               "dispatches."), "",
             "## " + _("Fusion plan"), "",
             _("{kernels} kernel(s) for {passes} pass(es). A pass is one kernel unless a value needs a finished column "
               "or full reduction for every row; a reduction whose result only feeds scalar or per-column work does "
               "not split the pass, because that work runs once in the last program.").format(
                   kernels=len(design["kernels"]), passes=len(passes)), "",
             _eager_line(eager, binding, dtype), ""]
    for p in passes:
        for k in kernels_of(p):
            lines += _kernel_md(k)
        if p.why:
            takes = _(_TAKES[p.name]) if p.name in _TAKES else \
                f"The {p.name} pass takes {{n}} kernels: a value needs finished reductions for every row, so they " \
                "are finished first and handed over in float32 buffers."
            lines += [takes.format(n=len(p.kernels)), "",
                      *[f"- {shown(w)}" for w in p.why], ""]
    if build.backward:
        lines += [_("The backward kernel recomputes the full-size forward values it needs from the inputs instead of "
                    "loading saved intermediates: recomputing costs a few flops per element, saving would cost a "
                    "full-size write in the forward and a read in the backward."), ""]
        lines += _saved_md(build, binding)
        design["saved_statistics"] = _saved_json(build)
    lines += ["## " + _("Tiling and loops"), ""]
    if design["tiling"]["layout"] == "staged":
        lines += [_("- The pass runs in stages: each matrix product is a GEMM kernel, the work between products a flat "
                    "or row kernel as above; values handed between stages are float32 buffers, except a product that "
                    "is itself an output."),
                  _("- GEMM: a 2-D grid of (cdiv(M, 128) · cdiv(N, 128), batch) programs, BLOCK_K = 32, 8 warps, a "
                    "3-deep software pipeline over K; every load masked, so any M, N, K work. 16-bit operands "
                    "multiply on the tensor cores in their dtype; a float32 operand in tf32 (16-bit operators) or "
                    "IEEE float32 (float32 operators)."),
                  *([_("- Convolutions are library stages: the launcher calls `torch.ops.aten.convolution` (and its "
                       "backward), which torch dispatches to the vendor library (cuDNN), deterministic when the "
                       "caller asks, without TF32; the values it reads and writes are in the op's dtype.")]
                    if any(getattr(p, "libraries", None) for p in passes) else []), "",
                  "## " + _("Memory layout"), "",
                  _("- Operands and outputs are read and written through their (batch, row, column) strides: the "
                    "transposes, permutes and reshapes around a product are torch views taken by the launcher, and a "
                    "bias or residual broadcast to the product's shape has stride 0 where it repeats."),
                  _("- Offsets are int64. Accumulators are float32 whatever the dtype."), ""]
    elif design["tiling"]["layout"] == "rows":
        lines += [_("- 1-D grid of `cdiv(n_rows, BLOCK_R)` programs. A chunk is BLOCK_R × BLOCK_C elements: BLOCK_C = "
                    "next_pow2(n_cols) up to 65536 columns, BLOCK_R fills 4096 elements, so short rows are processed "
                    "many at a time. The interpreter runs these sizes too; the tests give it larger ones on large "
                    "shapes only, for speed."),
                  _("- PERSISTENT (n_cols ≤ BLOCK_C): no loop; every input is loaded once and every reduction reduces "
                    "registers. Otherwise each phase loops over the row in BLOCK_C chunks."),
                  _("- Column and full reductions meet across programs; the ordered partial sums loop over programs."),
                  "", "## " + _("Memory layout"), "",
                  _("- Inputs are contiguous (made so at launch). Each is mapped onto (row, column) by its shape: the "
                    "same elements in flat order, a torch broadcast (strides of size-1 and missing dims are 0), or "
                    "one value per row or per column."),
                  _("- Slices and concatenations along the last dimension are column offsets: the value at column c "
                    "of `x[..., a:]` is loaded from column c + a."),
                  _("- Offsets are int64. Compute is float32; stores round to the output dtype to nearest even."),
                  _("- Accumulators are float32 whatever the dtype."), ""]
    else:
        lines += [_("- 1-D grid of `cdiv(n_elements, BLOCK)` programs (at least one, so an empty tensor still finishes "
                    "its reductions); `BLOCK` = 1024 elements and 4 warps. The interpreter runs this size too; the "
                    "tests give it larger blocks on large shapes only, for speed."),
                  _("- No loop in the main body: each program handles one block. The ordered partial sum loops over "
                    "programs in steps of `RBLOCK` = 1024."), "",
                  "## " + _("Memory layout"), "",
                  _("- Inputs are contiguous (made so at launch) and walked as one flat range; per-tensor scalars are "
                    "one load per program."),
                  _("- Offsets are int64. Compute is float32; stores round to the output dtype to nearest even."),
                  _("- Accumulators are float32 whatever the dtype."), ""]
    lines += ["## " + _("Verification matrix"), "",
              _("Level 0: {l0} cases (every SPEC dtype × every p0 shape). Level 1: {l1} cases.").format(
                  l0=len(l0), l1=len(l1)), "",
              *([_("Quick run (`--quick`): Level 0 at the p0 shapes scaled down to {shapes}, the largest input at most "
                   "65,536 elements (the shipped blocks, several programs). Run without --quick to verify the p0 "
                   "shapes themselves.").format(shapes=", ".join(map(str, p0))), ""]
                if p0 != spec["p0_shapes"] else []),
              _("| id | level | dtype | binding | distribution | breakers |"), "|---|---|---|---|---|---|"]
    for c in l0 + l1:
        br = ", ".join(k for k in ("edges", "nonfinite") if c.get(k))
        br = ", ".join(x for x in (br, c.get("scalars") or "", "attrs" if c.get("attrs") else "") if x)
        lines.append(f"| {c['id']} | {c['level']} | {c['dtype']} | {c['binding']} | {c['distribution']} | "
                     f"{br or '—'} |")
    lines += ["", _("Also: outputs never alias inputs; two calls with different inputs give different outputs; "
                    "deterministic backward is bit-reproducible; `torch.library.opcheck`; "
                    "`torch.compile(fullgraph=True)`."), ""]
    write_json_atomic(ws.path("design.json"), design)
    write_text_atomic(ws.path("DESIGN.md"), "\n".join(lines))
    return StageOutcome("completed", f"{len(design['kernels'])} kernel(s), {len(l0)}+{len(l1)} verification cases",
                        artifacts=["DESIGN.md", "design.json"])
