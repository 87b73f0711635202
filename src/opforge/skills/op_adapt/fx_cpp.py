"""A PyTorch reference, traced to ATen operators, written as C++ calls into ATen: the body of a vendor kernel for
an operator the vendor library does not have yet.

The reference is traced twice, with different shapes and different values for its scalar arguments. The two
graphs must run the same operators; a literal that follows a scalar argument becomes that argument, and a
literal that changes with the shape means the graph depends on it, which this writer refuses.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from opforge.errors import InputError

_DTYPE_CPP = {torch.float32: "at::kFloat", torch.float64: "at::kDouble", torch.float16: "at::kHalf",
              torch.bfloat16: "at::kBFloat16", torch.int64: "at::kLong", torch.int32: "at::kInt",
              torch.bool: "at::kBool", torch.uint8: "at::kByte", torch.int8: "at::kChar", torch.int16: "at::kShort"}


def trace(fn, make_args, where: str):
    """Two traces of `fn`: `make_args(shape, scalar_base)` gives the call's arguments for each."""
    graphs = []
    for shape, base in (((4, 8), 0.0), ((3, 5), 0.5)):
        args = make_args(shape, base)
        try:
            gm = make_fx(fn, tracing_mode="real")(*args)
        except Exception as exc:
            raise InputError(where, f"the reference does not trace to ATen operators: {exc}") from None
        gm.graph.eliminate_dead_code()  # a backward trace recomputes results nobody reads
        graphs.append((gm, args))
    return graphs


def _literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else \
            ("std::numeric_limits<double>::quiet_NaN()" if value != value
             else ("" if value > 0 else "-") + "std::numeric_limits<double>::infinity()")
    if value is None:
        return "::std::nullopt"
    if isinstance(value, torch.dtype) and value in _DTYPE_CPP:
        return _DTYPE_CPP[value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return "std::vector<int64_t>{" + ", ".join(str(v) for v in value) + "}"
    raise ValueError(f"no C++ form for {value!r}")


def emit_body(graphs, params: list[str], scalar_params: dict[int, str], outputs: list[str], where: str) -> list[str]:
    """C++ statements computing the graph from host tensors named by `params` (placeholder order) and copying
    its results into `outputs`. `scalar_params` maps a placeholder index to the C++ name of a scalar argument."""
    from torchgen.api import cpp
    from torchgen.model import FunctionSchema

    (ga, args_a), (gb, args_b) = graphs
    nodes_a, nodes_b = list(ga.graph.nodes), list(gb.graph.nodes)
    if [(n.op, str(n.target)) for n in nodes_a] != [(n.op, str(n.target)) for n in nodes_b]:
        raise InputError(where, "the reference runs different operators for different shapes: it cannot be "
                                "written as one kernel")
    names: dict[str, str] = {}
    lines: list[str] = []
    placeholder = 0

    def value(a, b) -> str:
        if isinstance(a, torch.fx.Node):
            return names[a.name]
        for i, name in scalar_params.items():
            if not isinstance(a, torch.fx.Node) and a == args_a[i] and b == args_b[i] and a != b:
                return name
        if a != b:
            raise InputError(where, f"the reference's graph depends on the input shape ({a!r} vs {b!r}): "
                                    "it cannot be written as one kernel")
        return _literal(a)

    for na, nb in zip(nodes_a, nodes_b):
        if na.op == "placeholder":
            names[na.name] = params[placeholder]
            placeholder += 1
        elif na.op == "call_function" and isinstance(na.target, torch._ops.OpOverload):
            schema = FunctionSchema.parse(str(na.target._schema).split("::", 1)[1])
            provided = []
            flat = list(schema.arguments.flat_positional) + list(schema.arguments.flat_kwarg_only)
            for i, arg in enumerate(flat):
                if i < len(na.args):
                    provided.append(value(na.args[i], nb.args[i]))
                elif arg.name in na.kwargs:
                    provided.append(value(na.kwargs[arg.name], nb.kwargs[arg.name]))
                else:
                    provided.append(None)
            while provided and provided[-1] is None:
                provided.pop()
            call_args = [p if p is not None else cpp.default_expr(flat[i].default, flat[i].type, symint=False)
                         for i, p in enumerate(provided)]
            var = f"t{len(names)}"
            names[na.name] = var
            lines.append(f"at::Tensor {var} = at::{cpp.name(schema)}({', '.join(call_args)});")
        elif na.op == "call_function" and getattr(na.target, "__name__", "") == "getitem":
            raise InputError(where, "the reference uses an operator with several results: not supported yet")
        elif na.op == "output":
            results = na.args[0] if isinstance(na.args[0], (list, tuple)) else [na.args[0]]
            if len(results) != len(outputs):
                raise InputError(where, f"the reference returns {len(results)} tensors; the schema {len(outputs)}")
            for out, r in zip(outputs, results):
                if r is None:
                    continue
                lines.append(f"vk::host({out}).copy_({names[r.name]});")
        else:
            raise InputError(where, f"the reference's trace holds {na.op} {na.target}, which a kernel cannot "
                                    "hold (a constant tensor or a Python call)")
    return lines
