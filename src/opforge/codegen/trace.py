"""Trace a request's reference into ATen graphs: the forward, and the joint forward+backward.

Both graphs are traced with symbolic shapes (`make_fx(tracing_mode="symbolic")`) in float32, the compute
dtype of every generated kernel. Float attributes become run-time kernel arguments: the reference is traced
twice, once with the defaults and once with perturbed values, and every constant that moved is bound to
the attribute that moved it. A constant that moved without matching an attribute was computed in Python
from one, which a kernel cannot follow; that is refused with the attribute named.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Callable

import sympy
import torch
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext, is_concrete_int

from opforge.codegen.attention import side_kind
from opforge.codegen.attention_grad import RunFused, TracedAttention, fused_forward, prepare_joint
from opforge.codegen.decompose import (
    DECOMPOSITIONS,
    SizeSafeFunctionals,
    drop_full_slices,
    factor_column_sums,
    fold_reshapes,
    group_channel_views,
    interleaved_gradients,
    lifted_scalars,
    negated_sizes,
    pairs_to_strided_slices,
    reverse_scans,
    rewrite_inplace,
    rewrite_variance,
    shape_only_selects,
    sink_row_views,
    split_to_slices,
    split_value_index,
    unit_reductions,
    views_onto_inputs,
)
from opforge.codegen.symbolic import graph_shapes, group_divisions, pysrc, renamed, shape_env_of, shape_exprs
from opforge.errors import InputError
from opforge.request import REQUEST_FILE, Request, dim_size, dim_symbols

# distinct sizes > 1 so that no symbol is specialised to 0 or 1 and no two symbols collide
_EXAMPLE_SIZES = (5, 7, 11, 13, 17, 19, 23)
_LARGER_SIZES = (17, 19, 23, 29, 31, 37, 41)
# torch's broadcast failure: two sizes that had to be equal (or 1)
_BROADCAST = re.compile(r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


class TraceError(InputError):
    """The reference cannot be traced: it raises, returns no tensors, or branches on data."""


@dataclass
class AttrRef:
    """A graph constant that is really the value of a float attribute."""

    name: str

    def __repr__(self) -> str:
        return self.name


# Names the generated kernels and launchers bind for themselves (masks, loop indices, sizes, the modules they
# import), and those GEMM and attention kernels bind besides (operands a and b, the online softmax's m and l):
# an input of one of these names is renamed inside the module (kernel_names).
RESERVED = frozenset({
    # flat and row kernels, their launchers and the module's imports
    "pid", "offs", "mask", "rmask", "pmask", "rows", "cols", "n_rows", "n_cols", "n_elements", "start", "span",
    "split", "split_id", "splits", "parts", "partials", "n_parts", "colpart", "ticket", "tile", "first", "terms",
    "wide", "workspace", "stride", "ptr", "grid", "col_grid", "knobs", "opts", "warps", "props", "device",
    "precision", "dot", "ordered", "rank", "lead", "outs", "grads", "wanted", "names", "ctx", "deterministic",
    "torch", "triton", "tl", "os", "math"})
PRODUCT_RESERVED = RESERVED | {
    # GEMM kernels
    "a", "b", "c", "c0", "a_hi", "a_lo", "b_hi", "b_lo", "c_hi", "c_lo", "k0", "kk", "rk", "rm", "rn", "pid_m",
    "pid_n", "tiles_m", "tiles_n", "group", "inside", "accumulator", "M", "N", "K",
    # attention kernels
    "bh", "bid", "batch", "bkv", "rb", "rd", "rdv", "rows_", "cols_", "scores", "d_scores", "m", "m_new", "l",
    "p", "r", "pdp", "dp", "ds", "dq", "do", "delta", "lse", "sink", "o_sum", "kt", "vt", "q4", "k4", "v4", "d4",
    "key", "at", "acc", "g", "h", "n"}


def kernel_names(inputs: list[str], products: bool) -> dict[str, str]:
    """Each input's name inside the generated module: its own, unless the kernels or launchers bind that name
    themselves (a bias called `b` beside a GEMM's operand `b`, with `products`); the op's signature keeps the
    request's names."""
    taken = PRODUCT_RESERVED if products else RESERVED
    out = {}
    for n in inputs:
        inner = n
        while inner in taken or inner in out.values() or (inner != n and inner in inputs):
            inner += "_in"
        out[n] = inner
    return out


INDEX = "torch.int64"  # an output's `like` when it holds indices (argmax, max.dim's), as torch returns them


@dataclass
class TracedOp:
    forward: torch.fx.GraphModule
    # The joint forward+backward graph, traced when `joint` is first read: where the backward is planned from
    # `fused_joint`, a plan does not read the reference's own joint and does not pay for its trace.
    joint_probe: Callable[[], torch.fx.GraphModule | None]
    input_names: list[str]
    output_names: list[str]
    grad_inputs: list[str]  # inputs that receive a gradient, in order
    output_like: dict[str, str | None]  # output -> input whose dtype it takes (None: fixed float32; INDEX: int64)
    runtime_attrs: list[str]  # float attributes passed to kernels at run time
    example_binding: dict[str, int] = field(default_factory=dict)
    # The leading-dimensions probe (runs the reference twice in float64): called when `leading` is first read, so
    # that a plan, which does not read it, does not pay for it.
    leading_probe: Callable[[], dict | None] = lambda: None
    # The joint traced again with each attention region as one op and its backward as another
    # (codegen/attention_grad.py): what the backward is planned from. `joint` stays the reference's own graph.
    fused_joint: torch.fx.GraphModule | None = None

    @functools.cached_property
    def joint(self) -> torch.fx.GraphModule | None:
        return self.joint_probe()

    @functools.cached_property
    def leading(self) -> dict | None:
        """With leading dimensions (x of (B, S, H) for a request's (N, H)): the inputs whose first dimension is the
        rows, and for each output whether it has them too. None: the reference means something else by them."""
        return self.leading_probe()

    @property
    def backward_graph(self) -> torch.fx.GraphModule | None:
        return self.fused_joint if self.fused_joint is not None else self.joint

    @property
    def kernel_names(self) -> dict[str, str]:
        from opforge.codegen.gemm import has_products  # gemm's planners import this module's AttrRef

        return kernel_names(self.input_names, has_products(self.forward))

    @property
    def kernel_inputs(self) -> list[str]:
        return [self.kernel_names[n] for n in self.input_names]

    @property
    def grad_outputs(self) -> list[str]:
        """The outputs the backward takes a gradient of: all but indices."""
        return [o for o in self.output_names if self.output_like[o] != INDEX]

    @property
    def kernel_grad_inputs(self) -> list[str]:
        return [self.kernel_names[n] for n in self.grad_inputs]


def _binding(req: Request, sizes: tuple) -> dict[str, int]:
    return {sym: sizes[i % len(sizes)] for i, sym in enumerate(req.symbols)}


def example_binding(req: Request) -> dict[str, int]:
    return _binding(req, _EXAMPLE_SIZES)


def example_inputs(req: Request, binding: dict[str, int], dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for spec in req.inputs:
        if spec.index:  # class labels and the like: integers from their range
            low, high = req.input_range(spec, binding)
            shape = req.input_shape(spec, binding)
            t = torch.randint(low, high, shape, generator=gen, dtype=getattr(torch, spec.dtypes[0]))
            tensors.append(t.to(device))
            continue
        t = torch.randn(req.input_shape(spec, binding), generator=gen, dtype=torch.float64)
        # strictly positive values keep references with logs, roots or scales well defined while tracing
        t = t.abs() + 0.5 if spec.shape and all(d == 1 for d in spec.shape) else t
        tensors.append(t.to(dtype=dtype, device=device))
    return tensors


def _outputs_tuple(result, where: str) -> tuple[torch.Tensor, ...]:
    outs = result if isinstance(result, (tuple, list)) else (result,)
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise TraceError(where, "the reference must return a tensor or a tuple of tensors")
    return tuple(outs)


def _perturb(value: float) -> float:
    return value * 1.3125 + 0.171875 if value != 0 else 0.171875


def run_reference(req: Request, fn, tensors, attrs):
    """Call the reference; any exception it raises is the user's problem, reported in one line."""
    where = f"{req.reference_file}:{req.reference_func}"
    try:
        return _outputs_tuple(fn(*tensors, **attrs), where)
    except InputError:
        raise
    except Exception as exc:
        raise TraceError(where, f"the reference raised {type(exc).__name__}: {exc}") from None


def _fake_args(req: Request, args) -> list:
    """The tensors make_fx traces with, made fake here instead of by make_fx: a size the request writes as a
    number (a 3x3 kernel, a module's channels) stays that number, where make_fx would give it a symbol of its
    own and every size derived from it a longer expression to simplify and guard. Other sizes, and those of the
    outputs' gradients after the inputs, are symbols, one per distinct value, as make_fx makes them."""
    mode = FakeTensorMode(allow_fallback_kernels=False, shape_env=ShapeEnv())
    fakes = []
    for i, t in enumerate(args):
        dims = req.inputs[i].shape if i < len(req.inputs) else [None] * t.dim()
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC if isinstance(d, int) else DimDynamic.DUCK
                                                          for d in dims])
        fake = mode.from_tensor(t, source=ConstantSource(f"input{i}"), symbolic_context=context)
        with mode:  # the reference's device: its ops and the graph's values are the CPU's
            fakes.append(fake.to("cpu"))
    return fakes


def _make_fx(req: Request, f, args):
    where = f"{req.reference_file}:{req.reference_func}"
    try:
        # fake tensors' dispatch cache costs more than it saves on symbolic shapes traced once (half the time of
        # an attention block's joint)
        with SizeSafeFunctionals() as mode, torch._dynamo.config.patch(fake_tensor_cache_enabled=False):
            gm = make_fx(f, tracing_mode="symbolic", decomposition_table=DECOMPOSITIONS)(*_fake_args(req, args))
        gm.meta["einsums"] = mode.einsums
    except InputError:
        raise
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if "data-dependent" in msg or "GuardOnDataDependent" in type(exc).__name__:
            msg = "it branches on tensor values (data-dependent control flow cannot be fused)"
        raise TraceError(where, f"tracing the reference failed: {type(exc).__name__}: {msg}") from None
    _refuse_fixed_sizes(req, gm, where)
    return gm


def _refuse_fixed_sizes(req: Request, gm: torch.fx.GraphModule, where: str) -> None:
    """A size the request declares symbolic must stay a symbol in the trace: a reference that reads it as a
    Python int (int(x.shape[0]), a C++ operator calling numel()) fixes it at the probe value, and a kernel
    built from that graph would compute the probe's shape for every input."""
    for spec, ph in zip(req.inputs, gm.graph.find_nodes(op="placeholder")):
        val = ph.meta.get("val")
        for dim, size in zip(spec.shape, getattr(val, "shape", ())):
            if not isinstance(dim, int) and is_concrete_int(size):
                raise TraceError(where, f"the trace fixed dimension {dim} of {spec.name} at {int(size)}: the "
                                        "reference reads it as a Python int (int(), .item(), a size in Python "
                                        "control flow), or ties it to a size the request writes as a number (a "
                                        "weight's channels); use tensor sizes as they are, so that it stays "
                                        f"symbolic, or write {dim} as the number it must be")


def _trace_pair(req: Request, fn, tensors, outs=None, forwards=None):
    """Trace with default and with perturbed float attributes; returns both graphs. With the reference's outputs
    (`outs`, for their shapes), the joint: the forward and the inputs' gradients. `forwards`: two functions of the
    inputs to trace instead of the reference (the forward graphs traced at each), for the joint."""
    grads = outs is not None
    names = [s.name for s in req.inputs]
    grad_idx = [i for i, s in enumerate(req.inputs) if s.requires_grad]

    def build(attrs, forward=None):
        call = forward or (lambda ts: run_reference(req, fn, ts, attrs))
        if not grads:
            return lambda *ts: call(ts)

        def joint(*args):
            ts = [t.detach().requires_grad_(i in grad_idx) for i, t in enumerate(args[:len(names)])]
            results = call(ts)
            g_outs = args[len(names):]  # one per floating output: indices take no gradient
            floats = [o for o in results if o.is_floating_point()]
            grads_ = torch.autograd.grad(floats, [ts[i] for i in grad_idx], g_outs, allow_unused=True)
            grads_ = [torch.zeros_like(ts[i]) if g is None else g for i, g in zip(grad_idx, grads_)]
            return (*results, *grads_)
        return joint

    defaults = req.attr_defaults
    moved = {a.name: (_perturb(a.default) if a.type == "float" and a.default is not None else a.default)
             for a in req.attributes}
    args = list(tensors)
    if grads:  # the outputs' gradients, shaped and strided as the outputs (their values are never read)
        args += [torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device="meta") for o in outs
                 if o.is_floating_point()]
    g_a = _make_fx(req, build(defaults, forwards and forwards[0]), args)
    # the second trace finds the constants that follow a float attribute: without one it would be the first again
    floats = moved != defaults
    g_b = _make_fx(req, build(moved, forwards and forwards[1]), args) if floats else g_a
    for gm in (g_a, g_b) if floats else (g_a,):  # the same rewrites on both keep their nodes in step
        rewrite_variance(gm)
        rewrite_inplace(gm)
        negated_sizes(gm)
        lifted_scalars(gm)
        shape_only_selects(gm)
        split_to_slices(gm)
        pairs_to_strided_slices(gm)
        drop_full_slices(gm)
        reverse_scans(gm)
        split_value_index(gm)
        unit_reductions(gm)  # after split_value_index: a max over one element is amax and argmax by then
        factor_column_sums(gm)
        fold_reshapes(gm)
        interleaved_gradients(gm)  # after fold_reshapes: the sizes it compares are read off the views
        sink_row_views(gm)
        views_onto_inputs(gm)
        group_channel_views(gm)
    return g_a, g_b


def _bind_attributes(req: Request, g_a: torch.fx.GraphModule, g_b: torch.fx.GraphModule) -> set[str]:
    """Replace constants of g_a that follow a float attribute by AttrRef; returns the attributes used."""
    floats = {a.name: (a.default, _perturb(a.default)) for a in req.attributes
              if a.type == "float" and a.default is not None}
    nodes_a, nodes_b = list(g_a.graph.nodes), list(g_b.graph.nodes)
    where = f"{req.reference_file}:{req.reference_func}"
    if [n.target for n in nodes_a] != [n.target for n in nodes_b]:
        raise TraceError(where, "the traced graph changes with the attribute values (Python control flow on "
                                "an attribute); attributes must only feed tensor operations")
    used: set[str] = set()

    def bind(a, b):
        if isinstance(a, (list, tuple)):
            return type(a)(bind(x, y) for x, y in zip(a, b))
        if isinstance(a, float) and isinstance(b, float) and a != b and not (math.isnan(a) and math.isnan(b)):
            for name, (d, p) in floats.items():
                if a == d and b == p:
                    used.add(name)
                    return AttrRef(name)
            raise TraceError(where, f"constant {a!r} is computed in Python from an attribute; pass the "
                                    "attribute itself to torch operations so the kernel can take it at run time")
        return a

    for na, nb in zip(nodes_a, nodes_b):
        na.args = bind(na.args, nb.args)
        na.kwargs = {k: bind(v, nb.kwargs.get(k)) for k, v in na.kwargs.items()}
    return used


def _probe_bindings(req: Request) -> list[dict]:
    return [_binding(req, sizes) for sizes in (_EXAMPLE_SIZES, _LARGER_SIZES)]


def _candidate_bindings(req: Request):
    """Small distinct sizes first, then larger ones (a size the reference derives, such as a pooled width, can
    meet another input's size by chance, and make_fx would tie the two); then the p0 shapes whose sizes are
    distinct, for references whose sizes are related (a group size that must divide a row). Distinct sizes keep
    make_fx from merging two symbols."""
    yield from _probe_bindings(req)
    for b in sorted(req.p0, key=lambda b: sum(b.values())):
        if len(set(b.values())) == len(b) and all(v > 1 for v in b.values()):
            yield dict(b)


def trace_request(req: Request) -> TracedOp:
    """The reference traced at the first candidate sizes where it traces and ties no sizes together that the
    request's shapes leave free. A relation that holds at every candidate is the reference's own: refused."""
    fn = req.load_reference()
    first_error = relation = None
    for binding in _candidate_bindings(req):
        try:
            traced = _trace_at(req, fn, binding)
        except TraceError as exc:
            first_error = first_error or exc
            continue
        try:
            check_size_relations(req, traced)
            return traced
        except TraceError as exc:
            relation = relation or exc
    raise relation or first_error


def _joint_solvable(req: Request, traced: TracedOp) -> None:
    """The joint graph's input sizes are expressions of its symbols (a convolution's backward writes x's height
    as the kernel's plus the gradient's, less one); they must still take the sizes of other shapes the request
    allows. A gradient's size that met an input's at the probe sizes (a convolution's output width equal to
    the input's height) ties two of them, and the sizes of another binding then have no solution."""
    gm = traced.backward_graph
    probes = _probe_bindings(req)
    if gm is None or traced.example_binding not in probes:  # at the request's own shapes: related sizes
        return
    other = probes[1 - probes.index(traced.example_binding)]
    equations = []
    for spec, node in zip(req.inputs, [n for n in gm.graph.nodes if n.op == "placeholder"]):
        for size, e in zip(req.input_shape(spec, other), shape_exprs(node.meta["val"])):
            if not isinstance(e, int):
                equations.append(sympy.Eq(e, size))
    unknowns = sorted(set().union(*(eq.free_symbols for eq in equations)), key=str)
    try:
        solvable = bool(sympy.solve(equations, unknowns, dict=True)) if unknowns else True
    except (NotImplementedError, TypeError, ValueError):  # floor divisions and the like: nothing to tell
        return
    if not solvable:
        raise TraceError(f"{req.reference_file}:{req.reference_func}",
                         "the backward's sizes are tied together at the probe sizes")


def _gradient_sizes_met(req: Request, traced: TracedOp) -> None:
    """An upstream gradient whose size met an input's by chance at the probe sizes (a pooled depth of 5 beside
    N = 5) was given that input's symbol by make_fx: the backward would then read N where it means the pooled
    depth. Refused, so that the trace is taken again at other sizes."""
    gm = traced.backward_graph
    if gm is None or traced.example_binding not in _probe_bindings(req):  # the request's shapes: related sizes
        return
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = {e for n in placeholders[:len(req.inputs)] for e in shape_exprs(n.meta["val"])
              if isinstance(e, sympy.Symbol)}
    results = list(gm.graph.find_nodes(op="output")[0].args[0])
    names = symbol_map(gm, req, products=True)  # 'G*4' is 4*G: a size the shapes tie is no chance meeting
    for grad, result in zip(placeholders[len(req.inputs):], results):
        if not hasattr(result, "meta") or not isinstance(result.meta.get("val"), torch.Tensor):
            continue
        for g, o in zip(shape_exprs(grad.meta["val"]), shape_exprs(result.meta["val"])):
            if g in inputs and not _same_size(renamed(g, names), renamed(o, names)):
                raise TraceError(f"{req.reference_file}:{req.reference_func}",
                                 f"the gradient of an output of size {o} was traced with the size of an input ({g})")


# Two sets of distinct primes, sizes at which an expression of up to eight symbols is tried: a relation that holds at
# both (or two expressions equal at both) is no coincidence of the values chosen
_PRIMES = ((5, 7, 11, 13, 17, 19, 23, 29), (31, 37, 41, 43, 47, 53, 59, 61))


def _same_size(a, b) -> bool:
    """Whether two size expressions are one size: equal once simplified, or, for the floor divisions sympy leaves
    as they are (N**2 // N, from a view of (N·N, ...) back to (N, N, ...)), equal at two sets of distinct primes."""
    if sympy.simplify(a - b) == 0:
        return True
    free = sorted(sympy.sympify(a - b).free_symbols, key=str)
    return all(_at(a - b, dict(zip(free, primes))) == 0 for primes in _PRIMES)


def check_size_relations(req: Request, traced: TracedOp) -> None:
    """Refuse a reference that ties sizes together in a way the request's shapes do not state (a scale of G
    groups for a weight of M columns cut into groups of 64: M // 64 == G). The kernels read each symbol off
    its own input, so such a relation would go unchecked and the op would cut the rows into other groups. The
    trace's equalities, with the shapes' own relations ('G*64') substituted, must hold at sizes the request
    allows: distinct multiples of every group size (a width a group size does not divide is refused by the
    impl itself, `symbolic.divisibility_checks`)."""
    _gradient_sizes_met(req, traced)
    symbols = {s: sympy.Symbol(s, integer=True, positive=True) for s in req.symbols}
    _no_chance_units(req, traced, symbols)
    for gm in (traced.forward, traced.backward_graph):
        env = shape_env_of(gm) if gm is not None else None
        if env is None:
            continue
        names = symbol_map(gm, req, products=True)
        step = math.lcm(1, *(c for _, c in group_divisions(graph_shapes(gm), names)))
        bindings = [{x: step * p for x, p in zip(symbols.values(), primes)} for primes in _PRIMES]
        # only where the reference runs: a size it derives (a strided convolution's width) may be 0 or less at
        # the smaller ones, and its guards hold only for sizes it takes
        derived = [renamed(e, names) for e in set(graph_shapes(gm)) if getattr(e, "free_symbols", None)]
        bindings = [b for b in bindings if not any(_at(e, b) <= 0 for e in derived)]
        for guard in env.guards:
            if not isinstance(guard.expr, sympy.Eq):
                continue
            lhs, rhs = (renamed(side, names) for side in guard.expr.args)
            if not lhs.free_symbols | rhs.free_symbols <= set(symbols.values()):
                continue  # a size of no input (a gradient's), tied to the inputs' by the trace
            for b in bindings:
                if sympy.Eq(lhs.xreplace(b), rhs.xreplace(b)) is sympy.false:
                    at = ", ".join(f"{k}={v}" for k, v in zip(symbols, b.values()))
                    raise TraceError(f"{req.reference_file}:{req.reference_func}",
                                     f"the reference needs {pysrc(lhs, {})} == {pysrc(rhs, {})}, a relation "
                                     f"between sizes that the request's shapes do not state (it fails at {at}); "
                                     "state it in the shapes, as a product such as 'G*64' for G groups of 64")
    _joint_solvable(req, traced)


def _at(expr, binding: dict) -> float:
    """An expression's value at a binding; NaN (no comparison holds) where symbols are left."""
    v = sympy.sympify(sympy.sympify(expr).xreplace(binding))
    return float(v) if v.is_number else math.nan


def _no_chance_units(req: Request, traced: TracedOp, symbols: dict) -> None:
    """A size derived from the inputs' (a pooled height) that is 1 at the traced sizes but not at others: the
    planners would take it for a dimension of size one that nothing walks. Traced again at other sizes."""
    names = symbol_map(traced.forward, req, products=True)
    at = {symbols[k]: v for k, v in traced.example_binding.items()}
    others = [{symbols[k]: v for k, v in b.items()} for b in _probe_bindings(req)]
    for expr in set(graph_shapes(traced.forward)):
        if not getattr(expr, "free_symbols", None):
            continue
        e = renamed(expr, names)
        if e.free_symbols <= set(at) and _at(e, at) == 1 and any(_at(e, b) > 1 for b in others):
            raise TraceError(f"{req.reference_file}:{req.reference_func}",
                             f"the size {pysrc(e, {})} is 1 at the sizes traced ({traced.example_binding}) only")


def symbol_map(gm, req: Request, products: bool = False) -> dict:
    """Graph shape symbols -> the request's shape symbols, read off the placeholders. With `products`, a
    dimension declared as 'G*32' maps to the expression 32*G, one declared 'L+R*2' to L + 2*R."""
    out = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for spec, node in zip(req.inputs, placeholders):
        for d, e in zip(spec.shape, shape_exprs(node.meta["val"])):
            if isinstance(e, sympy.Symbol) and isinstance(d, str) and d.isidentifier():
                out[e] = d
            elif products and isinstance(e, sympy.Symbol) and isinstance(d, str) and e not in out:
                out[e] = sympy.sympify(d, locals={f: sympy.Symbol(f, integer=True, positive=True)
                                                  for f in dim_symbols(d)})
    return out


def _declared_dims(req: Request, binding: dict) -> dict[int, str]:
    """Size at `binding` -> the shape entry the request wrote for it ('H', 'G*32', 4), where only one has it."""
    found: dict[int, set[str]] = {}
    for spec in req.inputs:
        for d in spec.shape:
            found.setdefault(dim_size(d, binding), set()).add(str(d).replace(" ", ""))
    return {n: next(iter(ds)) for n, ds in found.items() if len(ds) == 1}


def _in_user_terms(req: Request, binding: dict, exc: TraceError) -> TraceError:
    """The reference failed at the probe sizes, which the user never wrote: say it with the request's symbols.
    Two sizes that do not broadcast name the inputs that declare them; any other error gets the sizes' legend."""
    dims = _declared_dims(req, binding)
    m = _BROADCAST.search(exc.what)
    a, b = (dims.get(int(g)) for g in m.groups()) if m else (None, None)
    if a and b:
        holders = []  # the inputs whose declared shapes carry the two dimensions, in request order
        for dim in (a, b):
            spec = next(s for s in req.inputs if dim in [str(d).replace(" ", "") for d in s.shape])
            holders += [spec] if spec not in holders else []
        shapes = " and ".join(f"{s.name}{' has shape' if k == 0 else ''} [{', '.join(map(str, s.shape))}]"
                              for k, s in enumerate(holders))
        torch_words = re.sub(r"\((\d+)\)", lambda g: f"({dims.get(int(g[1]), g[1])})", exc.what.split(": ", 1)[-1])
        return TraceError(f"{REQUEST_FILE}: inputs", f"{shapes}: {a} and {b} must be equal for {exc.where} "
                                                     f"(it raised: {torch_words})")
    if any(re.search(rf"(?<![\d.]){n}(?![\d.])", exc.what) for n in binding.values()):
        legend = ", ".join(f"{k}={v}" for k, v in binding.items())
        return TraceError(exc.where, f"{exc.what} (called with {legend})")
    return exc


def trace_inputs(req: Request, binding: dict[str, int]) -> list[torch.Tensor]:
    """Inputs to trace with, on the meta device: make_fx reads their shapes, strides and dtypes only (a reference
    with large fixed weights is traced without memory for them; `_fake_args` gives them back their device)."""
    return [torch.empty(req.input_shape(spec, binding), dtype=getattr(torch, spec.dtypes[0]) if spec.index
                        else torch.float32, device="meta") for spec in req.inputs]


def _on_meta(tensors, dtype=None) -> list[torch.Tensor]:
    return [torch.empty_strided(t.shape, t.stride(), dtype=dtype if dtype and t.is_floating_point() else t.dtype,
                                device="meta") for t in tensors]


def _trace_at(req: Request, fn, binding: dict) -> TracedOp:
    tensors = trace_inputs(req, binding)
    try:  # on meta tensors: the outputs' number, shapes and dtypes without computing them
        outs = run_reference(req, fn, _on_meta(tensors), req.attr_defaults)
    except TraceError:
        try:  # again on values: the error as the CPU kernels word it (or an op that has no meta kernel)
            outs = run_reference(req, fn, example_inputs(req, binding), req.attr_defaults)
        except TraceError as exc:
            raise _in_user_terms(req, binding, exc) from None
    where = f"{req.reference_file}:{req.reference_func}"
    names = list(req.outputs) if req.outputs else (["out"] if len(outs) == 1 else
                                                   [f"out{i}" for i in range(len(outs))])
    if len(names) != len(outs):
        raise TraceError(f"{REQUEST_FILE}: outputs",
                         f"{len(names)} outputs declared but the reference returns {len(outs)}")
    for o in outs:
        if not o.dtype.is_floating_point and o.dtype != torch.int64:
            raise TraceError(where, f"output dtype {o.dtype} is not supported (floating outputs, and int64 indices)")

    # which outputs follow the input dtype: run once more on meta tensors in bfloat16
    meta_outs = run_reference(req, fn, _on_meta(tensors, torch.bfloat16), req.attr_defaults)
    first = req.inputs[0].name
    output_like = {n: (first if o.dtype == torch.bfloat16 else INDEX if o.dtype == torch.int64 else None)
                   for n, o in zip(names, meta_outs)}

    fwd_a, fwd_b = _trace_pair(req, fn, tensors)
    grad_idx = [i for i, s in enumerate(req.inputs) if s.requires_grad]
    graphs = (fwd_a,) if fwd_b is fwd_a else (fwd_a, fwd_b)
    fused = [fused_forward(g, grad_idx) for g in graphs] if req.backward else []
    if len(fused) == 1:  # one graph when there is no float attribute: its regions serve as both
        fused *= 2
    used = _bind_attributes(req, fwd_a, fwd_b)
    joint_probe, fused_joint = (lambda: None), None
    grad_inputs = [s.name for s in req.inputs if s.requires_grad]

    def trace_joint():
        g_a, g_b = _trace_pair(req, fn, tensors, outs)
        return g_a, _bind_attributes(req, g_a, g_b)

    if req.backward and any(o.is_floating_point() for o in outs):  # indices alone have no gradient
        if not grad_inputs:
            raise TraceError(f"{REQUEST_FILE}: backward", "backward: true but no input requires grad")
        if all(fused):  # the backward is planned from this one: the reference's own joint is traced when read
            fused_joint, attrs = _fused_joint(req, fn, tensors, outs, *fused)
            joint_probe = lambda: trace_joint()[0]  # noqa: E731
        else:
            joint, attrs = trace_joint()
            joint_probe = lambda: joint  # noqa: E731
        used |= attrs
    runtime = [a.name for a in req.attributes if a.name in used]
    return TracedOp(fwd_a, joint_probe, [s.name for s in req.inputs], names, grad_inputs, output_like, runtime,
                    binding, lambda: leading_dimensions(req, fn, binding), fused_joint)


def _fused_joint(req: Request, fn, tensors, outs, fused_a: tuple, fused_b: tuple) -> tuple:
    """The joint traced from the forward graphs (default and perturbed attributes) with each attention region
    as `opforge::attention`, so that its backward is one op too; and the float attributes it reads."""
    (gm_a, regions_a), (gm_b, regions_b) = fused_a, fused_b
    placeholders = gm_a.graph.find_nodes(op="placeholder")
    records = []
    for ra, rb in zip(regions_a, regions_b):
        attrs = _bind_attributes(req, ra.score, rb.score)
        kinds = [side_kind(s) for s in ra.side]
        sizes = {f"size_{s.name}": s for s, kind in zip(ra.side, kinds) if kind == "size"}
        records.append(TracedAttention(ra.score, kinds, sizes, placeholders, sorted(attrs)))
    forwards = [lambda ts, gm=gm: tuple(RunFused(gm).run(*ts)) for gm in (gm_a, gm_b)]
    joint, joint_b = _trace_pair(req, fn, tensors, outs, forwards=forwards)
    used = _bind_attributes(req, joint, joint_b)
    prepare_joint(joint, records)
    return joint, used


def leading_dimensions(req: Request, fn, binding: dict) -> dict | None:
    """Whether the reference treats leading dimensions as more rows, as norms, activations and per-row losses
    do: on inputs whose first dimension is the first input's (the rows), given two of them stacked (2, N, ...),
    every output equals the output on the (2N, ...) inputs, reshaped. A reference that means another dimension
    (cross_entropy reads dim 1 of a 3-D input as the classes) or reduces over dim 0 fails the probe."""
    rows = req.inputs[0].shape[0] if req.inputs[0].shape else None
    if not (isinstance(rows, str) and rows.isidentifier()):
        return None
    if any(rows in map(str, s.shape[1:]) for s in req.inputs):
        return None
    leads = [s.name for s in req.inputs if s.shape and s.shape[0] == rows]
    n = binding[rows]
    a, b = example_inputs(req, binding, torch.float64, seed=1), example_inputs(req, binding, torch.float64, seed=2)
    stacked = [torch.stack([x, y]) if s.name in leads else x for s, x, y in zip(req.inputs, a, b)]
    flat = [t.reshape(2 * n, *t.shape[2:]) if s.name in leads else t for s, t in zip(req.inputs, stacked)]
    try:
        with torch.no_grad():
            got, want = fn(*stacked, **req.attr_defaults), fn(*flat, **req.attr_defaults)
    except Exception:  # the reference refuses more dimensions: the op keeps its declared ones
        return None
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    row_outputs = []
    for g, w in zip(got, want):
        has_rows = w.dim() >= 1 and w.shape[0] == 2 * n and tuple(g.shape) == (2, n, *w.shape[1:])
        if not has_rows and g.shape != w.shape:
            return None
        if not torch.allclose(g.reshape(w.shape), w, rtol=1e-12, atol=0.0, equal_nan=True):
            return None
        row_outputs.append(has_rows)
    return {"inputs": {s.name: len(s.shape) for s in req.inputs if s.name in leads},
            "outputs": row_outputs}
