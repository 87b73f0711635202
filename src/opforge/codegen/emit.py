"""Triton source from kernel plans: the `<op>_impl.py` module of a workspace.

The module is meant to be read: one kernel per pass, statements named after the traced graph's nodes with
the ATen op each one lowers, masks and offsets explained where they are made, then the launch wrappers,
the `torch.library` operator with its fake and autograd registrations, and one friendly function.
"""

from __future__ import annotations

import re
import textwrap

from opforge.codegen.across import finish, helpers, launch_setup, meet
from opforge.codegen.attention import AttentionStage
from opforge.codegen.emit_attention import ATTENTION_KNOBS, emit_attention_kernel, emit_attention_launcher
from opforge.codegen.emit_gemm import emit_gemm_kernel, emit_gemm_launcher, gemm_knobs
from opforge.codegen.emit_pool import POOL_KNOBS, emit_pool_kernel, emit_pool_launcher
from opforge.codegen.emit_rows import (
    COLUMN_SUMS,
    _size_sources,
    emit_row_kernel,
    emit_row_launcher,
    launcher_signature,
)
from opforge.codegen.gemm import HOST_CATS, VIEW_METHODS, GemmStage, HostView, LibraryStage
from opforge.codegen.ops import HELPERS, load_value, reduce_combine
from opforge.codegen.ops import REDUCE_IDENTITY as _IDENTITY
from opforge.codegen.plan import KernelPlan
from opforge.codegen.pooling import PoolStage
from opforge.codegen.pretty import hanging_call, wrap_source
from opforge.codegen.symbolic import atoms, divisibility_checks, multiple_check, pysrc
from opforge.codegen.trace import INDEX

# The longest row a row kernel keeps in registers, as Liger's kernels do (`opforge bench compile` shows the
# registers and spills of each kernel at such rows).
MAX_BLOCK_C = 65536

PREAMBLE = '''\
from __future__ import annotations

import os

import torch


def _has_accelerator() -> bool:
    npu = getattr(torch, "npu", None)
    return torch.cuda.is_available() or bool(npu is not None and npu.is_available())


# No GPU: this module's kernels run in Triton's interpreter on the CPU. Triton reads TRITON_INTERPRET when a
# kernel is decorated (and when it is first imported, for its own helpers), so unless the caller chose, the
# switch is set here and taken back at the end of this file: the rest of the process keeps the caller's choice.
_INTERPRET_FOR_IMPORT = "TRITON_INTERPRET" not in os.environ and not _has_accelerator()
if _INTERPRET_FOR_IMPORT:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRET = bool(triton.knobs.runtime.interpret)  # what @triton.jit below sees
if _INTERPRET_FOR_IMPORT:  # Triton imports its Gluon modules at a first launch, and they read the switch too
    triton.runtime.jit.mangle_type(0)
# Elements per program. The GPU's values in the interpreter too, so that what is tested is what ships; a test
# harness may set larger blocks there for speed (the interpreter runs programs one after another).
BLOCK = {block}
RBLOCK = 1024  # partial results summed per step when a reduction is finished in order
{ordered_knob}# Row kernels: a program owns BLOCK_R rows and walks them in chunks of at most MAX_BLOCK_C columns; a row
# that fits one chunk stays in registers (persistent), a longer one is walked once per phase (looped). Up to
# {max_block_c} columns: with 32 warps a norm's or a softmax's row that long compiles for sm_90 without spills.
MAX_BLOCK_C = int(os.environ.get("OPFORGE_MAX_BLOCK_C", {max_block_c}))
TILE = int(os.environ.get("OPFORGE_TILE", 4096))  # elements per program and chunk
NUM_WARPS = {num_warps}
# No FMA contraction: a*b+c must round twice, as PyTorch does, for outputs to match it bit for bit.
_LAUNCH = {{}} if INTERPRET else {{"num_warps": NUM_WARPS, "enable_fp_fusion": False}}
# What stage 7 measured fastest on the device, per launch size, as the knobs that differ from the values
# above. Keyed by the sizes rounded up to powers of two: (rows, columns) for a row kernel, (elements,) for a
# flat one, ("gemm", M, N, K) for a product, ("attention", SQ, SK, D) for an attention. A size that was not
# tuned runs the values above.
TUNED: dict[tuple, dict] = {{}}


def _size_key(*sizes: int) -> tuple:
    return tuple(triton.next_power_of_2(max(s, 1)) for s in sizes)


def _knobs(*sizes: int) -> dict:
    return {{{defaults}, **TUNED.get(_size_key(*sizes), {{}})}}


def _launch(knobs: dict) -> dict:
    return {{}} if INTERPRET else {{"num_warps": knobs["NUM_WARPS"], "enable_fp_fusion": False}}


def _row_launch(tile: int, knobs: dict) -> dict:
    if INTERPRET:
        return {{}}
    # wide tiles want more warps, so that a thread holds a few dozen elements of each live value, not hundreds
    warps = 4 if tile <= 2048 else 8 if tile <= 8192 else 16 if tile <= 32768 else 32
    opts = {{"num_warps": knobs.get("ROW_NUM_WARPS", warps), "enable_fp_fusion": False}}
    if "NUM_STAGES" in knobs:
        opts["num_stages"] = knobs["NUM_STAGES"]
    return opts


# The interpreter's bfloat16 casts truncate and flush subnormals, so there the conversions work on the bits;
# a GPU converts in hardware (round to nearest even, subnormals kept).
BF16_ON_BITS = tl.constexpr(INTERPRET)


@triton.jit
def _to_f32(x):
    if BF16_ON_BITS and x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _to_dtype(x, DTYPE: tl.constexpr):
    # float32 -> DTYPE with round-to-nearest-even, as torch's .to()
    x = x.to(tl.float32)
    if BF16_ON_BITS and DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = tl.where(x != x, 0x7FC00000, bits + (((bits >> 16) & 1) + 0x7FFF))  # NaN stays a quiet NaN
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(DTYPE)
'''


def _py_shape(shape: list, dims: dict) -> str:
    """A shape as a Python tuple, its symbols read off the inputs (`dims`: symbol -> 'x.shape[0]')."""
    parts = [str(d) if isinstance(d, int) else pysrc(d, dims) for d in shape]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def kernel_name(op: str, plan: KernelPlan) -> str:
    return f"_{op}_{plan.name}_kernel"


def emit_kernel(op: str, plan: KernelPlan) -> str:
    ins = [f"{a.name}_ptr" for a in plan.inputs]
    outs = [f"{o.name}_ptr" for o in plan.outputs]
    red = plan.reduces_across_programs
    params = ins + outs + (["acc_ptr", "partials_ptr", "ticket_ptr"] if red else []) + ["n_elements"]
    params += plan.attrs + ["BLOCK: tl.constexpr"]
    if red:
        params += ["RBLOCK: tl.constexpr", "DETERMINISTIC: tl.constexpr"]
    lines = ["@triton.jit", f"def {kernel_name(op, plan)}(", *[f"    {p}," for p in params], "):"]
    reads = ", ".join(a.name for a in plan.inputs)
    writes = ", ".join(o.name for o in plan.outputs)
    lines.append(f'    """{plan.name}: reads {reads} once, writes {writes} once."""')
    b = lines.append
    b("    pid = tl.program_id(0)")
    # with reductions, at most MAX_PROGRAMS programs walk the blocks pid, pid + num_programs, ...: scalars are
    # computed once before the walk, and each reduction's block shares are combined in registers
    pad = "        " if red else "    "
    for a in plan.inputs:
        if not a.full:
            b(f"    {a.name} = {load_value(f'{a.name}_ptr', boolean=a.boolean)}  # one value for the whole tensor")
    for s in plan.body:
        if red and not s.block:
            b(f"    {s.target} = {s.expr}  # {s.comment}")
    for r in plan.reductions:
        b(f"    {r.name}_run = {_IDENTITY[r.kind]}")
    if red:
        b("    for start in range(pid.to(tl.int64) * BLOCK, n_elements, tl.num_programs(0) * BLOCK):")
        b("        offs = start + tl.arange(0, BLOCK)  # int64: tensors past 2**31 elements must not wrap")
    else:
        b("    # int64 offsets: tensors past 2**31 elements must not wrap")
        b("    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)")
    b(f"{pad}mask = offs < n_elements  # the last block runs past the end")
    for a in plan.inputs:
        if a.full:
            b(f"{pad}{a.name} = {load_value(f'{a.name}_ptr + offs', 'mask', a.boolean)}")
    for s in plan.body:
        if not red or s.block:
            b(f"{pad}{s.target} = {s.expr}  # {s.comment}")
    for o in plan.outputs:
        if o.in_epilogue:
            continue
        if o.full:
            val = o.value if o.block else f"{o.value} + tl.zeros((BLOCK,), tl.float32)"
            b(f"{pad}tl.store({o.name}_ptr + offs, _to_dtype({val}, {o.name}_ptr.dtype.element_ty), mask=mask)")
    for r in plan.reductions:
        b(f"{pad}{r.name}_run = {reduce_combine(r.kind, f'{r.name}_run', f'{r.name}_part')}")
    for o in plan.outputs:
        if not o.in_epilogue and not o.full:
            b("    if pid == 0:")
            b(f"        tl.store({o.name}_ptr, _to_dtype({o.value}, {o.name}_ptr.dtype.element_ty))")
    for r in plan.reductions:
        b(f"    {r.name}_part = {r.name}_run")
    if red:
        lines += meet(plan.reductions, "    ")
        lines += finish(plan.reductions, "        ", lambda r: "n_elements.to(tl.float32)")
        for s in plan.epilogue:
            b(f"        {s.target} = {s.expr}  # {s.comment}")
        for o in plan.outputs:
            if o.in_epilogue:
                b(f"        tl.store({o.name}_ptr, _to_dtype({o.value}, {o.name}_ptr.dtype.element_ty))")
    return "\n".join(lines) + "\n"


def emit_launcher(op: str, plan: KernelPlan, dims: dict, fn_name: str, tensor_args: list[str],
                  runtime_attrs: list[str]) -> str:
    """A Python function that allocates outputs and launches the kernel; torch does no math here.

    It takes every tensor and run-time attribute of the operator (so both passes share one signature) and
    returns a tuple of the kernel's outputs.
    """
    full = [a for a in plan.inputs if a.full]
    sig = launcher_signature(tensor_args, runtime_attrs)
    out = [f"def {fn_name}({sig}):"]
    b = out.append
    used = [a.name for a in plan.inputs]
    for u in used:
        b(f"    {u} = {u}.contiguous()")
    ref = full[0].name if full else used[0]
    b(f"    n_elements = {ref}.numel()")
    for a in plan.inputs:
        want = "n_elements" if a.full else "1"
        b(f"    _expect_numel({a.name!r}, {a.name}, {want})")
    out += divisibility_checks([d for o in plan.outputs for d in o.shape], dims)
    dev = f"{ref}.device"
    for o in plan.outputs:
        b(f"    {o.name} = torch.empty({_py_shape(o.shape, dims)}, dtype={o.dtype}, device={dev})")
    b("    knobs = _knobs(n_elements)  # tuned for this size, or the defaults")
    b('    BLOCK = knobs["BLOCK"]')
    out += launch_setup("triton.cdiv(n_elements, BLOCK)", plan.reductions, dev,
                        'knobs["MAX_PROGRAMS"]' if plan.reductions else None)
    args = [a.name for a in plan.inputs] + [o.name for o in plan.outputs]
    extra = ""
    if plan.reduces_across_programs:
        args += ["acc", "partials", "ticket"]
        extra = ", RBLOCK=RBLOCK, DETERMINISTIC=ordered"
    args += ["n_elements"] + plan.attrs
    b(f"    {kernel_name(op, plan)}[grid]({', '.join(args)}, BLOCK=BLOCK{extra}, **_launch(knobs))")
    b(f"    return ({''.join(o.name + ', ' for o in plan.outputs).rstrip()})")
    return "\n".join(out) + "\n"


def _kernel_source(op: str, plan) -> str:
    if plan.layout == "staged":
        return "\n\n".join(emit_gemm_kernel(op, s) + (f"\n\n{_kernel_source(op, s.rows.plan)}" if s.rows else "")
                           if isinstance(s, GemmStage) else
                           emit_attention_kernel(op, s) if isinstance(s, AttentionStage) else
                           emit_pool_kernel(op, s) if isinstance(s, PoolStage) else
                           _kernel_source(op, s.plan) for s in plan.steps
                           if not isinstance(s, (HostView, LibraryStage)))
    if plan.chained:
        return "\n\n".join(_kernel_source(op, k) for k in plan.kernels)
    if plan.layout == "rows":
        return emit_row_kernel(op, plan, kernel_name(op, plan))
    return emit_kernel(op, plan)


def _launcher_source(op: str, plan, dims: dict, fn_name: str, tensor_args: list[str], attrs: list[str]) -> str:
    if plan.layout == "staged":
        return _staged_launcher(op, plan, fn_name, tensor_args, attrs)
    if plan.chained:
        return _chain_launcher(op, plan, fn_name, tensor_args, attrs)
    if plan.layout == "rows":
        return emit_row_launcher(op, plan, kernel_name(op, plan), plan.dims, fn_name, tensor_args, attrs)
    return emit_launcher(op, plan, dims, fn_name, tensor_args, attrs)


def _chain_launcher(op: str, plan, fn_name: str, tensor_args: list[str], attrs: list[str]) -> str:
    """One launcher per kernel, then the pass: each kernel's float32 results feed the kernels after it."""
    parts, calls, have = [], [], list(tensor_args)
    for i, k in enumerate(plan.kernels):
        sub = f"_{fn_name}_{i}"
        parts.append(emit_row_launcher(op, k, kernel_name(op, k), k.dims, sub, have, attrs))
        outs = [o.name for o in k.outputs]
        call_args = ", ".join(have + attrs + ["deterministic=deterministic"])
        calls.append(f"    {', '.join(outs)}{',' if len(outs) == 1 else ''} = {sub}({call_args})")
        have = have + [o for o in outs if o in plan.temps]
    sig = launcher_signature(tensor_args, attrs)
    final = [o.name for o in plan.outputs]
    why = "".join(f"    # {line}\n" for w in plan.why for line in textwrap.wrap(w, 112))
    parts.append(f"def {fn_name}({sig}):\n{why}" + "\n".join(calls) +
                 f"\n    return ({''.join(n + ', ' for n in final).rstrip()})\n")
    return "\n\n".join(parts)


def _staged_launcher(op: str, plan, fn_name: str, tensor_args: list[str], attrs: list[str]) -> str:
    """One launcher per stage, then the pass: views taken with torch, GEMM and glue stages in order, each
    reading the pass's inputs and what the stages before it produced."""
    parts, calls, have = [], [], list(tensor_args)
    for step in plan.steps:
        if isinstance(step, HostView) and step.op in HOST_CATS:  # the one copy a launcher makes itself
            calls.append(f"    {step.target} = torch.cat({', '.join(step.args)})")
            have.append(step.target)
            continue
        if isinstance(step, LibraryStage):  # the vendor library's own kernel, as reproducible as the caller asks
            flags = "enabled=True, deterministic=deterministic, allow_tf32=False"
            calls += [f"    with torch.backends.cudnn.flags({flags}):",
                      *hanging_call(f"{', '.join(step.writes)} = torch.ops.{step.op}", step.args, 8)]
            have += [w for w in step.writes if w not in have]
            continue
        if isinstance(step, HostView):  # a view: no copy, the kernels read it through its strides
            calls.append(f"    {step.target} = {step.args[0]}.{VIEW_METHODS[step.op]}({', '.join(step.args[1:])})")
            have.append(step.target)
            continue
        sub = f"_{op}_{step.name if isinstance(step, (GemmStage, AttentionStage, PoolStage)) else step.plan.name}"
        if isinstance(step, GemmStage):
            rows_call = None
            if step.rows:  # the row kernel for a product too wide for one tile
                rows_sub, rows_have = f"_{op}_{step.rows.plan.name}", have + [step.node]
                parts.append(_launcher_source(op, step.rows.plan, step.rows.plan.dims, rows_sub, rows_have, attrs))
                rows_call = f"{rows_sub}({', '.join(rows_have + attrs + ['deterministic=deterministic'])})"
            parts.append(emit_gemm_launcher(op, step, sub, have, attrs, rows_call))
            outs = step.writes
        elif isinstance(step, AttentionStage):
            parts.append(emit_attention_launcher(op, step, sub, have, attrs))
            outs = step.writes
        elif isinstance(step, PoolStage):
            parts.append(emit_pool_launcher(op, step, sub, have, attrs))
            outs = step.writes
        else:
            parts.append(_launcher_source(op, step.plan, step.plan.dims, sub, have, attrs))
            outs = step.outputs
        call_args = ", ".join(have + attrs + ["deterministic=deterministic"])
        calls.append(f"    {', '.join(outs)}{',' if len(outs) == 1 else ''} = {sub}({call_args})")
        have = have + [o for o in outs if o not in have]
    sig = launcher_signature(tensor_args, attrs)
    views = {s.target for s in plan.steps if isinstance(s, HostView)}
    copies, final = list(plan.copies), []
    for r in plan.results:
        if r in copies:  # it would alias an input or another output
            copies.remove(r)
            final.append(f"torch.clone({r}, memory_format=torch.contiguous_format)")
        else:
            final.append(f"{r}.contiguous()" if r in views else r)
    parts.append(f"def {fn_name}({sig}):\n" + "\n".join(calls) +
                 f"\n    return ({''.join(n + ', ' for n in final).rstrip()})\n")
    return "\n\n".join(parts)


INTERPRETER_OFF = """

# Every kernel above is decorated: the interpreter switch set at the top of this file is the caller's again.
if _INTERPRET_FOR_IMPORT:
    del os.environ["TRITON_INTERPRET"]
"""

# Only impls that reduce across programs get the knob (the tuner searches what the module has).
ORDERED_KNOB = """\
# Results reduced across programs: atomics, or one partial per program summed in order. deterministic=True
# always orders them (bit-reproducible); ORDERED_PARTIALS does so for every call, when the tuner finds it faster.
ORDERED_PARTIALS = False
# Such kernels run at most MAX_PROGRAMS programs, each walking several blocks and combining its results in
# registers first: atomics and partials then scale with the grid, not with the tensor.
MAX_PROGRAMS = 2048
"""

# Only impls with a row kernel that can share a row among programs get the knob.
SPLIT_KNOB = """\
# Few long rows (fewer row blocks than the device has SMs) can share each row among ROW_SPLIT programs, whose
# partial row results meet in a second kernel. 1: one program per row block; the tuner measures the others.
ROW_SPLIT = 1
"""


# Inputs that may have leading dimensions are viewed as rows before the op, its row outputs given them back.
ROWS_VIEW = '''

def _rows_view(t: torch.Tensor, rank: int) -> tuple[torch.Tensor, tuple | None]:
    """t with its leading dimensions viewed as one row dimension (the request declares `rank` dimensions), and
    those dimensions; a tensor of the declared rank passes unchanged."""
    if t.dim() <= rank:
        return t, None
    return t.reshape(-1, *t.shape[t.dim() - rank + 1:]), tuple(t.shape[:t.dim() - rank + 1])
'''


def _rows_in(leading: dict | None) -> str:
    if not leading:
        return ""
    names = list(leading["inputs"])
    if len(names) == 1:
        return f"    {names[0]}, lead = _rows_view({names[0]}, {leading['inputs'][names[0]]})\n"
    out = "".join(f"    {n}, {n}_lead = _rows_view({n}, {r})\n" for n, r in leading["inputs"].items())
    out += f"    lead = {names[0]}_lead\n"
    same = " or ".join(f"{n}_lead != lead" for n in names[1:])
    out += (f"    if {same}:\n        raise ValueError(\"{', '.join(names)}: leading dimensions differ: \"\n"
            f"                         f\"{'; '.join(f'{{{n}_lead}}' for n in names)}\")\n")
    return out


def _inputs_doc(leading: dict | None, input_shapes: dict) -> str:
    text = f"Inputs: {', '.join(f'{k} {v}' for k, v in input_shapes.items())}."
    if leading:
        names = list(leading["inputs"])
        rows = input_shapes[names[0]][0]
        text += (f" {', '.join(names)} may have more leading dimensions than {rows!r}: together they are the "
                 f"{rows} rows, and the row outputs have them too.")
    text += (" Float attributes are run-time arguments. deterministic=True makes reductions bit-reproducible "
             "run to run (ordered partials).")
    return textwrap.fill(text, 112, subsequent_indent="    ", break_on_hyphens=False)


def _save_context(n_in: int, n_out: int, saved: list[str]) -> str:
    if not saved:
        return f"    ctx.save_for_backward(*inputs[:{n_in}])\n"
    return (f"    ctx.save_for_backward(*inputs[:{n_in}], *output[{n_out}:])  # and the per-row statistics\n"
            f"    ctx.mark_non_differentiable(*output[{n_out}:])\n")


def _backward_args(n_in: int, grad_names: list[str], saved: list[str]) -> str:
    if not saved:
        return f"*ctx.saved_tensors, {', '.join(grad_names)}"
    return f"*ctx.saved_tensors[:{n_in}], {', '.join(grad_names)}, *ctx.saved_tensors[{n_in}:]"


def _user_outputs(n_out: int, saved: list[str]) -> str:
    if not saved:
        return ""
    pick = "outs[0]" if n_out == 1 else f"outs[:{n_out}]"
    return f"    outs = {pick}  # the statistics stay with autograd\n"


def _rows_out(leading: dict | None, n_out: int) -> str:
    if not leading:
        return "    return outs\n"
    outs = ["outs"] if n_out == 1 else [f"outs[{i}]" for i in range(n_out)]
    shaped = [f"{o}.reshape(*lead, *{o}.shape[1:])" if rows else o for o, rows in zip(outs, leading["outputs"])]
    if n_out == 1:
        return f"    return outs if lead is None else {shaped[0]}\n"
    return f"    return outs if lead is None else ({', '.join(shaped)})\n"


def _same_value(name: str, value) -> str:
    """Source of the condition that attribute `name` differs from the value the build is specialised to."""
    if value is None:
        return f"{name} is not None"
    if isinstance(value, tuple):
        return f"not isinstance({name}, (list, tuple)) or tuple({name}) != {value!r}"
    return f"{name} != {value!r}"


def _fake_outputs(outputs, size_names: dict, dims: dict, ref: str) -> tuple[list[str], list[str]]:
    """The fake's output tensors, their shapes in the request's size symbols read off the inputs as the launchers
    read them (a 'G*64' dimension is 64*G, never weight.shape[1] divided by an expression of itself), and the
    lines before them: those reads, and the checks that make the fake refuse what the op refuses."""
    named = {s: v for s, v in size_names.items() if s in dims}
    reads = _size_sources(named, dims)
    # a symbol whose names cannot all be read off an input stays that input's dimension
    names = {**dims, **{s: v for s, v in named.items() if all(a in reads for a in atoms({s: v}))}}
    outs = []
    for o in outputs:
        outs.append(f"torch.empty({_py_shape(o.shape, names)}, dtype={o.dtype}, device={ref}.device)")
    checks = divisibility_checks([d for o in outputs for d in o.shape], names)
    text = "\n".join(outs + checks)
    lines = []
    for name, src in reads.items():
        if not re.search(rf"\b{name}\b", text):
            continue
        lines.append(f"    {name} = {src}")
        if " // " in src:  # the launchers' _expect_shape refuses a width that is not a multiple
            dim, div = src.split(" // ")
            lines += multiple_check(dim, div)
    return outs, lines + checks


def _kernel_count(plan) -> str:
    n = len(plan.kernels)
    return "one kernel" if n == 1 else f"{n} kernels"


def emit_module(op: str, description: str, fwd: KernelPlan, bwd: KernelPlan | None, *, inputs: list[str],
                grad_inputs: list[str], output_names: list[str], runtime_attrs: list[str],
                attr_defaults: dict, fixed_attrs: dict, dims: dict, input_shapes: dict,
                no_grad_inputs: tuple[str, ...] = (), deterministic: bool = False, block: int = 1024,
                num_warps: int = 4, leading: dict | None = None, size_names: dict | None = None,
                public_inputs: list[str] | None = None) -> str:
    """The whole impl module. `dims` maps shape symbols to Python expressions like 'weight.shape[0]'.
    `inputs` are the inputs' names inside the module; `public_inputs` the request's, which only the op's own
    signature uses (TracedOp.kernel_names).
    `leading` (trace.leading_dimensions): inputs that may have leading dimensions, viewed as the rows.
    `size_names` (build.symbol_map): shape symbols -> the request's size symbols, for the fake's shapes.
    `no_grad_inputs` are the floating inputs the request built without a gradient: the op refuses one that
    requires grad, which autograd would otherwise hand back a None for."""
    parts = [f'"""{op}: fused Triton kernels, launch wrappers and the torch.library operator.\n\n'
             f"{description}.\n"
             f"Forward: {_kernel_count(fwd)}. Backward: {_kernel_count(bwd) if bwd else 'none (backward: false)'}.\n"
             f"Kernel layout: {fwd.layout} (see the kernels' docstrings).\n"
             f"Generated by opforge's deterministic engine; it imports no golden.\n"
             '"""\n']
    plans = [p for p in (fwd, bwd) if p is not None]
    ordered = any(p.meets_at_ticket for p in plans)
    split = any(p.splits_rows for p in plans)
    knobs = ["BLOCK", "TILE", "MAX_BLOCK_C", "NUM_WARPS"] + (["ORDERED_PARTIALS", "MAX_PROGRAMS"] if ordered else [])
    knobs += ["ROW_SPLIT"] if split else []
    parts.append(PREAMBLE.format(block=block, num_warps=num_warps, max_block_c=MAX_BLOCK_C,
                                 ordered_knob=(ORDERED_KNOB if ordered else "") + (SPLIT_KNOB if split else ""),
                                 defaults=", ".join(f'"{k}": {k}' for k in knobs)))
    parts.append(helpers(set(fwd.reduce_kinds) | set(bwd.reduce_kinds if bwd else []), ordered))
    parts.append(COLUMN_SUMS if any(p.column_sums for p in plans) else "")
    rows = any(st.rows for p in plans if p.layout == "staged" for st in p.gemms)
    parts.append("\n\n" + gemm_knobs(rows) if any(p.layout == "staged" for p in plans) else "")
    parts.append("\n\n" + ATTENTION_KNOBS if any(p.layout == "staged" and p.attentions for p in plans) else "")
    parts.append("\n\n" + POOL_KNOBS if any(p.layout == "staged" and p.pools for p in plans) else "")
    parts.append(ROWS_VIEW if leading else "")
    parts.append('''

def _expect_numel(name: str, t: torch.Tensor, n: int) -> None:
    if t.numel() != n:
        raise ValueError(f"{name}: expected {n} elements for this operator, got shape {tuple(t.shape)}")


def _rows_of(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """t and the distance between its rows, when its columns are contiguous and its leading dimensions
    collapse into one evenly strided row index (a slice x[:, :H] of a wider tensor); else a dense copy."""
    if t.dim() >= 2 and t.stride(-1) == 1 and all(
            t.stride(i) == t.stride(i + 1) * t.shape[i + 1] for i in range(t.dim() - 2)):
        return t, t.stride(-2)
    t = t.contiguous()
    return t, t.shape[-1]


def _expect_shape(name: str, t: torch.Tensor, shape: tuple) -> None:
    if t.dim() != len(shape):  # its sizes were read off the wrong dimensions: say what is wrong first
        raise ValueError(f"{name}: expected {len(shape)} dimensions for this operator, got shape {tuple(t.shape)}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} for this operator, got {tuple(t.shape)}")

''')
    kernels = ["\n" + _kernel_source(op, plan) + "\n" for plan in ((fwd, bwd) if bwd else (fwd,))]
    # a helper is called, or passed to tl.reduce / tl.associative_scan as the combine function
    parts += ["\n" + src for name, src in HELPERS.items() if any(re.search(rf"\b{name}\b", k) for k in kernels)]
    parts += kernels

    attr_sig = ", ".join(f"{a}: float" for a in runtime_attrs)
    tensor_sig = ", ".join(f"{t}: torch.Tensor" for t in inputs)
    # indices (argmax, max.dim's) take no gradient: autograd hands the backward None for them, left unused
    index = {o.name for o in fwd.outputs[:len(output_names)] if o.like == INDEX}
    grad_names = [f"grad_{o}" for o in output_names if o not in index]
    grad_params = [f"grad_{o}" if o not in index else f"_grad_{o}" for o in output_names]

    # the forward's outputs after the user's are per-row statistics kept for the backward (codegen/saved.py)
    saved_names = [o.name for o in fwd.outputs[len(output_names):]]
    # launchers take every runtime attribute so that the op's signature is the same for both passes
    parts.append("\n" + _launcher_source(op, fwd, dims, f"{op}_forward", inputs, runtime_attrs) + "\n")
    if bwd:
        parts.append("\n" + _launcher_source(op, bwd, dims, f"{op}_backward", inputs + grad_names + saved_names,
                                              runtime_attrs) + "\n")

    n_out = len(output_names)
    n_all = n_out + len(saved_names)
    ret_t = "torch.Tensor" if n_all == 1 else f"tuple[{', '.join(['torch.Tensor'] * n_all)}]"
    ref = inputs[0]
    fake_outs, fake_sizes = _fake_outputs(fwd.outputs, size_names or {}, dims, ref)
    fake_ret = fake_outs[0] if n_all == 1 else "(" + ", ".join(fake_outs) + ")"
    call_attrs = "".join(f", {a}" for a in runtime_attrs)
    parts.append(f'''

@torch.library.custom_op("opforge::{op}", mutates_args=())
def _{op}_op({tensor_sig}{', ' + attr_sig if attr_sig else ''}, deterministic: bool) -> {ret_t}:
    outs = {op}_forward({', '.join(inputs)}{call_attrs}, deterministic=deterministic)
    return {'outs[0]' if n_all == 1 else 'outs'}


@_{op}_op.register_fake
def _({', '.join(inputs)}{call_attrs}, deterministic):
{''.join(line + chr(10) for line in fake_sizes)}    return {fake_ret}
''')
    if bwd:
        g_ret = "tuple[" + ", ".join(["torch.Tensor"] * len(grad_inputs)) + "]"
        g_sig = ", ".join(f"{g}: torch.Tensor" for g in grad_names + saved_names)
        fake_g = ", ".join(f"torch.empty_like({g})" for g in grad_inputs)
        parts.append(f'''

@torch.library.custom_op("opforge::{op}_backward", mutates_args=())
def _{op}_backward_op({tensor_sig}, {g_sig}{', ' + attr_sig if attr_sig else ''}, deterministic: bool) -> {g_ret}:
    return tuple({op}_backward({', '.join(inputs + grad_names + saved_names)}{call_attrs}, deterministic=deterministic))


@_{op}_backward_op.register_fake
def _({', '.join(inputs + grad_names + saved_names)}{call_attrs}, deterministic):
    return ({fake_g},)


def _setup_context(ctx, inputs, output):
{_save_context(len(inputs), n_out, saved_names)}    ctx.attrs = inputs[{len(inputs)}:{len(inputs) + len(runtime_attrs)}]
    ctx.deterministic = inputs[-1]


def _backward(ctx, {', '.join(grad_params)}{', *_' if saved_names else ''}):
    grads = iter(_{op}_backward_op({_backward_args(len(inputs), grad_names, saved_names)}, *ctx.attrs,
                                   ctx.deterministic))
    wanted = {tuple(grad_inputs)!r}
    names = {tuple(inputs)!r}
    return (*(next(grads) if n in wanted else None for n in names){", None" * (len(runtime_attrs) + 1)})


_{op}_op.register_autograd(_backward, setup_context=_setup_context)
''')
    kw_sig = ", ".join(f"{a}: float = {attr_defaults[a]!r}" for a in runtime_attrs)
    fixed_sig = "".join(f", {a}={v!r}" for a, v in fixed_attrs.items())
    # a sequence attribute may come as a list or a tuple (torch takes both for a kernel size)
    fixed_check = "".join(
        f"    if {_same_value(a, v)}:\n        raise ValueError(\"{a}: this build is specialised to {a}={v!r}\")\n"
        for a, v in fixed_attrs.items())
    # autograd would silently give None for an input built without a gradient
    grad_check = "".join(
        f"    if torch.is_grad_enabled() and {n}.requires_grad:\n"
        f'        raise ValueError("{n}: this operator was built without a gradient for {n} (requires_grad: "\n'
        f'                         "false in its request); pass {n}.detach() or rebuild with requires_grad: true")\n'
        for n in no_grad_inputs) if bwd else ""
    public = public_inputs or inputs
    call = f"{'outs = ' if leading or saved_names else 'return '}_{op}_op"
    float_attrs = "".join(f", float({a})" for a in runtime_attrs)
    parts.append(f'''

def {op}({', '.join(public)}{', ' + kw_sig if kw_sig else ''}{fixed_sig}, *, deterministic: bool = {deterministic!r}):
    """{textwrap.fill(description + '.', 112, subsequent_indent='    ')}

    {_inputs_doc(leading, input_shapes)}
    """
{fixed_check}{grad_check}{_rows_in(leading)}    {call}({', '.join(public)}{float_attrs},
        {' ' * len(op)}bool(deterministic))
{_user_outputs(n_out, saved_names)}{_rows_out(leading, n_out) if leading or saved_names else ''}''')
    parts.append(INTERPRETER_OFF)
    return wrap_source("".join(parts))
