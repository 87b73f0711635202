"""The verification matrix of an operator and the check of one case against its golden.

A case names a shape binding, a dtype, a distribution and what to break (edge values, scalars that make
halves exact, scalars below eps, NaN/Inf, non-default attributes). Its seed is drawn when it runs, so a
kernel cannot be tuned to known inputs; the seed is recorded so a failure can be replayed.

Policy (DESIGN.md, "Verification policy"):
- outputs built only from exact ops are compared bit for bit with the golden's float32 path cast to the
  dtype, and their error against float64 is reported;
- other outputs are compared with float64 truth within the dtype tolerance; an output that reduces K
  elements gets `tolerance_for(..., reduced_elems=K)`, and its atol also admits 2·√K·eps32·|value|
  (float32 rounding of K terms as a random walk) and 4x the error that the reference's own float32 path
  makes (a graph that cancels, like a difference of two large sums, is no more accurate in the reference
  than in the kernel). One sample of that error can come out lucky, so an output of fewer than
  SPREAD_NUMEL elements also admits 10x the RMS of the reference's float32 error over SPREAD_SAMPLES
  copies of the inputs nudged by one ulp each (a fresh draw of its rounding). Where that float32 path
  overflows to Inf/NaN
  and float64 does not, a kernel that overflows too must do so as the float32 path does, and one that
  stays finite is held to float64.

Eager PyTorch run in the case's dtype is recorded beside the kernel, as information only: its error against
float64 and how many elements of the kernel's result differ from it. The kernel computes in float32 and
rounds once per output; eager in bfloat16/float16 rounds every intermediate, so the two differ by about an
ulp in many elements while the kernel lies closer to float64. No verdict depends on eager.
"""

from __future__ import annotations

import json
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch

from opforge.request import dim_size
from opforge.verify.inputs import edge_values, fresh_seed, make_tensor, with_edges
from opforge.verify.metrics import compare, ulp_distance
from opforge.verify.steps import ShiftedLibrary, library_rel, library_truth, shifted_runs, step_rel, step_truth
from opforge.verify.tolerance import Tolerance, parse_dtype, tolerance_for

RECORD_ENV = "OPFORGE_PRECISION_RECORD"  # a JSONL file that every checked case is appended to
POW2_SCALAR = 2.0 ** -5
SPREAD_NUMEL = 64  # below this many elements an output's float32 error is sampled, not read off its max
SPREAD_SAMPLES = 16
# An impl ships the GPU's block sizes, and Triton's interpreter runs them too, one program after another in
# Python: a case whose largest input is over SHIPPED_BLOCKS_UP_TO elements (the P0 shapes, Level 1's largest)
# runs there with INTERPRETER_BLOCKS instead, for speed only, and its record says so. Smaller cases run the
# shipped blocks over several programs, as the GPU does; on a GPU every case runs them.
SHIPPED_BLOCKS_UP_TO = 1 << 16
INTERPRETER_BLOCKS = {"BLOCK": 32768, "TILE": 65536}
LEVEL1_ELEMENTS = 1 << 22  # Level 1 is about odd sizes, not large ones: its largest input is kept under this


def quick_p0(p0: list[dict], numel: Callable[[dict], int], limit: int = SHIPPED_BLOCKS_UP_TO) -> list[dict]:
    """The P0 bindings scaled down for a quick run (`opforge op run --quick`): the largest size halved until
    the largest input (`numel(binding)`) has at most `limit` elements, so that the interpreter runs each case
    in seconds, with the shipped blocks, still over several programs. Duplicates are dropped."""
    out = []
    for b in p0:
        b = dict(b)
        while numel(b) > limit and max(b.values()) > 1:
            big = max(b, key=b.get)
            b[big] = (b[big] + 1) // 2
        if b not in out:
            out.append(b)
    return out


def largest_input(spec: dict) -> Callable[[dict], int]:
    """The elements of SPEC's largest input at a binding."""
    return lambda b: max(math.prod(dim_size(d, b) for d in i["shape"]) for i in spec["inputs"])


def level0_bindings(spec: dict, quick: bool) -> list[dict]:
    """The shapes Level 0 runs at: SPEC's p0, or for a quick run those scaled down (stage 4 and the gate
    G5-TEST-COVERAGE both ask here)."""
    if not quick:
        return spec["p0_shapes"]
    return quick_p0(spec["p0_shapes"], largest_input(spec))


def generic_binding(spec: dict) -> dict:
    """Distinct, unremarkable sizes (33, 37, 41, ...) for tests that need some shape, scaled down like a quick
    P0 so that the largest input stays small: five symbols of 4-D attention inputs would be 10⁸ elements."""
    start = {s: 33 + 4 * i for i, s in enumerate(spec["dynamic_axes"])}
    return quick_p0([start], largest_input(spec))[0]


def level0_cases(dtypes: list[str], p0: list[dict]) -> list[dict]:
    return [{"id": f"L0-{dt}-{_shape_id(b)}", "level": 0, "binding": b, "dtype": dt, "distribution": "normal"}
            for dt in dtypes for b in p0]


def _shape_id(binding: dict) -> str:
    return "x".join(f"{k}{v}" for k, v in binding.items())


def level1_cases(dtypes: list[str], symbols: list[str], attrs: dict[str, float],
                 numel: Callable[[dict], int] | None = None) -> list[dict]:
    """Shapes that are not block multiples, one element, empty; each distribution; the breakers. With `numel`
    (the largest input's elements at a binding), a binding over LEVEL1_ELEMENTS is scaled down as a quick P0 is:
    a symbol that sizes several dimensions (a volume's depth, height and width) makes a 129 a 129³."""
    def bind(*sizes):
        # the sizes go to the last symbols (the rows and columns of most operators); earlier ones (batch, heads)
        # get 2, so that a rank-4 operator's case stays as small as a rank-2 one's
        lead = len(symbols) - len(sizes)
        b = {s: (sizes[i - lead] if i >= lead else (2 if min(sizes) > 1 else min(sizes)))
             for i, s in enumerate(symbols)}
        return quick_p0([b], numel, LEVEL1_ELEMENTS)[0] if numel else b

    odd = [bind(1), bind(3, 5), bind(37, 129), bind(129, 1031)]
    cases = []
    for dt in dtypes:
        for b in odd:
            cases.append({"binding": b, "dtype": dt, "distribution": "normal"})
        cases.append({"binding": bind(0, 7), "dtype": dt, "distribution": "normal"})  # empty
        for dist in ("uniform_small", "uniform_large", "outliers"):
            cases.append({"binding": bind(33, 65), "dtype": dt, "distribution": dist})
        cases.append({"binding": bind(17, 257), "dtype": dt, "distribution": "uniform_small", "edges": True,
                      "scalars": "pow2"})
        cases.append({"binding": bind(17, 65), "dtype": dt, "distribution": "normal", "scalars": "below_eps"})
        cases.append({"binding": bind(9, 33), "dtype": dt, "distribution": "normal", "nonfinite": True})
        if attrs:
            moved = {k: (v / 16.0 if abs(v) > 1 else v * 10.0) for k, v in attrs.items()}
            cases.append({"binding": bind(19, 67), "dtype": dt, "distribution": "normal", "attrs": moved})
    out = {}
    for c in cases:
        tags = [c["distribution"]] + [k for k in ("edges", "nonfinite") if c.get(k)]
        tags += [c["scalars"]] if c.get("scalars") else []
        tags += ["attrs"] if c.get("attrs") else []
        c["id"] = f"L1-{c['dtype']}-{_shape_id(c['binding'])}-{'-'.join(tags)}"
        c["level"] = 1
        out.setdefault(c["id"], c)  # two bindings scaled down to one are one case
    return list(out.values())


def build_inputs(golden, case: dict, seed: int) -> list[torch.Tensor]:
    """Inputs of one case, in the case's dtype, from the golden's declared input specs."""
    dtype = parse_dtype(case["dtype"])
    tensors = []
    made = golden.make_inputs(case["binding"], dtype, seed, case["distribution"])
    for t, spec in zip(made, golden.INPUTS):
        if spec.get("index_dtype"):
            if case.get("edges") and spec.get("edges"):  # the declared specials (an ignore_index) at a few places
                picks = torch.tensor(spec["edges"] * 3, dtype=torch.float64)
                t = with_edges(t, picks, seed=seed + 2)
            tensors.append(t)
            continue
        scalar = all(d == 1 for d in spec["shape"])  # declared (1, 1): a per-tensor scalar
        if scalar and case.get("scalars") == "pow2":
            t = torch.full(t.shape, POW2_SCALAR, dtype=dtype)
        elif scalar and case.get("scalars") == "below_eps":
            t = torch.full(t.shape, 1e-6, dtype=dtype)
        elif not scalar and case.get("edges"):
            # edge values scaled by the power-of-two scalar, so a division by it gives exact halves
            edges = edge_values(dtype) * (POW2_SCALAR if case.get("scalars") == "pow2" else 1.0)
            t = with_edges(t, edges.to(dtype).double(), seed=seed + 1)
        if not scalar and case.get("nonfinite") and t.numel() >= 3:
            flat = t.view(-1)
            flat[0], flat[1], flat[2] = float("nan"), float("inf"), float("-inf")
        tensors.append(t)
    return tensors


def grad_outputs(shapes, dtype, seed: int) -> list[torch.Tensor]:
    """The upstream gradients a case feeds the backward, drawn from the case's seed."""
    return [make_tensor(tuple(s), dtype, seed=seed + 104729 + i, distribution="normal") for i, s in enumerate(shapes)]


def floating_pairs(outs, grads) -> tuple[list, list]:
    """The outputs that take a gradient, and their upstream gradients: indices (int64) take none."""
    pairs = [(o, g) for o, g in zip(outs, grads) if o.is_floating_point()]
    return [o for o, _ in pairs], [g for _, g in pairs]


def find_case(design: dict, case_id: str) -> dict:
    """A case of the verification matrix (design.json) by its id."""
    v = design["verification"]
    return next(c for c in v["level0"] + v["level1"] if c["id"] == case_id)


@contextmanager
def interpreter_blocks(impl, tensors):
    """Within it, `impl` runs the blocks that a case with these inputs runs (see SHIPPED_BLOCKS_UP_TO); yields
    {"ran": ..., "shipped": ...} where they are INTERPRETER_BLOCKS, else None. The module's constants are
    restored on exit."""
    # `is True`: a wrapper that forwards every attribute (op_perf's OnDevice) runs on a device, not interpreted
    interpreted = getattr(impl, "INTERPRET", False) is True
    if not interpreted or max((t.numel() for t in tensors), default=0) <= SHIPPED_BLOCKS_UP_TO:
        yield None
        return
    shipped = {k: getattr(impl, k) for k in INTERPRETER_BLOCKS if hasattr(impl, k)}
    try:
        for k in shipped:
            setattr(impl, k, INTERPRETER_BLOCKS[k])
        yield {"ran": {k: INTERPRETER_BLOCKS[k] for k in shipped}, "shipped": shipped}
    finally:
        for k, v in shipped.items():
            setattr(impl, k, v)


def _call_impl(impl, op: str, tensors, attrs, grad_outputs, grad_inputs, names):
    ins = [t.clone().requires_grad_(n in grad_inputs) for t, n in zip(tensors, names)]
    outs = getattr(impl, op)(*ins, **attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = ()
    if grad_outputs is not None:
        wrt = [t for t, n in zip(ins, names) if n in grad_inputs]
        floats, upstream_grads = floating_pairs(outs, grad_outputs)
        grads = torch.autograd.grad(floats, wrt, upstream_grads)
    return ins, [o.detach() for o in outs], [g.detach() for g in grads]


def check_case(impl, golden, case: dict, spec: dict, seed: int | None = None, with_eager: bool = True) -> dict:
    """Run one case through the delivered op and the golden; returns the result (metrics per output).

    `spec` is the SPEC front matter (op_name, tolerance, exact_outputs, reduced_outputs, backward).
    `with_eager=False` leaves out eager's figures, which no verdict reads (a tuning round needs the verdict only).
    """
    seed = fresh_seed() if seed is None else seed
    dtype = parse_dtype(case["dtype"])
    names = list(golden.INPUT_NAMES)
    attrs = dict(golden.ATTRIBUTES)
    attrs.update(case.get("attrs") or {})
    tensors = build_inputs(golden, case, seed)
    backward = bool(spec.get("backward"))
    grad_inputs = list(golden.GRAD_INPUTS) if backward else []

    try:
        truth = golden.forward(*tensors, compute_dtype=torch.float64, **attrs)
        path32 = golden.forward(*tensors, compute_dtype=torch.float32, **attrs)
        g_outs = grad_outputs([o.shape for o in truth], dtype, seed) if backward else None
        wanted = _golden_paths(golden, tensors, g_outs, attrs, grad_inputs, (truth, path32))
    except Exception as exc:
        if case["level"] == 0:  # the shapes that matter must be defined: that is the request's fault
            raise
        # a matrix case the reference itself does not define (an empty amax): nothing to hold the kernel to
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return _record(case, seed, True, [], skipped=f"the reference raises here: {type(exc).__name__}: {msg}")
    with interpreter_blocks(impl, tensors) as blocks:
        ins, outs, grads = _call_impl(impl, spec["op_name"], tensors, attrs, g_outs, grad_inputs, names)
    produced = dict(zip(golden.OUTPUT_NAMES, outs))
    produced.update((f"grad_{n}", grads[k]) for k, n in enumerate(grad_inputs))
    small = [n for n, t in wanted.items() if n not in spec.get("exact_outputs", []) and t[0].numel() < SPREAD_NUMEL]
    spread = _fp32_error_spread(golden, tensors, g_outs, attrs, grad_inputs, small, seed) if small else {}
    eager = _eager_paths(golden, tensors, g_outs, attrs, grad_inputs, wanted, dtype) if with_eager else None

    named_inputs = dict(zip(names, tensors))
    n_elements = max((t.numel() for t in tensors), default=0)
    inexact = [n for n in produced if n not in spec.get("exact_outputs", [])]
    reduced = max((reduced_elems(n, spec, case["binding"], n_elements) for n in inexact), default=1)
    steps = library = None
    if inexact:  # the forward alone says whether the reference rounds, or calls the library, at all
        def run64():
            return _golden_in(torch.float64, golden, tensors, g_outs, attrs, grad_inputs)

        def probe():
            return golden.forward(*tensors, compute_dtype=torch.float64, **attrs)
        steps = shifted_runs(run64, step_rel(reduced), probe=probe)
        if library_rel(dtype):
            library = shifted_runs(run64, library_rel(dtype), probe=probe, shift=ShiftedLibrary)
    results = []
    for name, actual in produced.items():
        t64, t32 = wanted[name]
        if name in spec.get("exact_outputs", []):
            tol = Tolerance(0.0, 0.0, exact=True)
            want = t32.to(dtype) if t32.is_floating_point() else t32  # indices stay int64
            res = compare(actual, want, tol, inputs=named_inputs, name=name)
            tol = tolerance_for(dtype, spec.get("tolerance"))
            res["vs_float64"] = _brief(compare(actual, t64, tol, name=name))
        else:
            k = reduced_elems(name, spec, case["binding"], n_elements)
            base = tolerance_for(dtype, spec.get("tolerance"), reduced_elems=k)
            ref_err = _finite_max_abs(t32.double() - t64)
            # float32 rounding of K summed terms walks like √K·eps·|value|: one sample of it (ref_err) can come
            # out lucky, so the model's own size is admitted too (it is 0 for outputs that reduce nothing)
            walk = 2.0 * math.sqrt(k) * torch.finfo(torch.float32).eps * _finite_max_abs(t64) if k > 1 else 0.0
            tol = Tolerance(base.atol + 4.0 * ref_err + 10.0 * spread.get(name, 0.0) + walk, base.rtol)
            truth, stepped = step_truth(actual, t64, [run[name] for run in steps]) if steps else (t64, 0)
            truth, rounded = library_truth(actual, truth, [run[name] for run in library]) if library else (truth, 0)
            truth, overflow, parted = overflow_truth(actual, truth, t32)
            res = compare(actual, truth, tol, inputs=named_inputs, name=name)
            res["rounding_step_positions"] = stepped
            res["library_rounding_positions"] = rounded
            res["float32_overflow_positions"] = int(overflow.sum())
            res["float32_path_positions"] = int(parted.sum())
            res["reference_fp32_error"] = ref_err
            if name in spread:
                res["reference_fp32_error_rms"] = spread[name]
            # the verdict's truth may take the float32 path where it overflows: side by side with eager, plain float64
            res["vs_float64"] = _brief(compare(actual, t64, tol, name=name))
        if eager is not None:
            res["eager"] = _eager_figures(actual, eager.get(name), t64, tol, name)
        results.append(res)
    results.append(_alias_check(ins, list(produced.values())))
    return _record(case, seed, all(r["passed"] for r in results), results, blocks=blocks)


def overflow_truth(actual: torch.Tensor, t64: torch.Tensor,
                   t32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The truth a result is judged against, where the reference's own float32 path overflows, and where the
    float64 path is non-finite but the float32 path is not, or non-finite otherwise.

    Where float32 overflows the kernel may overflow too, to whichever of ±inf and NaN its order of summation
    gives (a product's sum of +inf and -inf terms is NaN in one order, inf where a fused multiply-add absorbs
    the second); a kernel that stays finite there is held to float64 like everywhere else (more robust is not
    wrong), unless float64's result lies within float32's range: then an intermediate overflowed (a norm's
    sum of squares of values near 1e37), and the formula in float32 gives whatever inf arithmetic makes of it
    (NaN, or 0 where it divides by the inf), which is not judged. Where the two paths part on a non-finite
    float64 value, they ran different implementations (a library convolution skips the zero padding that the
    float64 path multiplies by a NaN weight): a kernel that follows the float32 path there is held to it."""
    a = actual.detach().cpu().double()
    overflow = ~torch.isfinite(t32) & torch.isfinite(t64)
    within = t64.abs() <= torch.finfo(torch.float32).max
    truth = torch.where(overflow & (~torch.isfinite(a) | within), a, t64)
    t32 = t32.double()

    def kind(t):  # 0 finite, 1 +inf, 2 -inf, 3 NaN
        return torch.isinf(t) * (1 + (t < 0)) + 3 * torch.isnan(t)
    parted = ~torch.isfinite(t64) & (kind(t32) != kind(t64))
    truth = torch.where(parted & (kind(a) == kind(t32)), t32, truth)
    return truth, overflow, parted


def _golden_paths(golden, tensors, g_outs, attrs, grad_inputs, forward=None) -> dict:
    """Every output and gradient of the golden as (float64 truth, float32 path), by name."""
    t64 = _golden_in(torch.float64, golden, tensors, g_outs, attrs, grad_inputs, forward and forward[0])
    t32 = _golden_in(torch.float32, golden, tensors, g_outs, attrs, grad_inputs, forward and forward[1])
    return {n: (t64[n], t32[n]) for n in t64}


def _golden_in(dtype, golden, tensors, g_outs, attrs, grad_inputs, forward=None) -> dict:
    """Every output and gradient of the golden computed in `dtype` (the outputs given as `forward`), by name."""
    outs = forward if forward else golden.forward(*tensors, compute_dtype=dtype, **attrs)
    paths = dict(zip(golden.OUTPUT_NAMES, outs))
    if g_outs is not None:
        grads = golden.backward(tensors, g_outs, compute_dtype=dtype, **attrs)
        paths.update((f"grad_{n}", g) for n, g in zip(grad_inputs, grads))
    return paths


def _eager_paths(golden, tensors, g_outs, attrs, grad_inputs, wanted, dtype) -> dict:
    """Every output and gradient of the reference run by eager PyTorch in the case's dtype, by name; an
    exception (an op without a CPU kernel for the dtype) in place of the tensors that could not be had."""
    if dtype == torch.float32:  # the golden's float32 path is eager in float32
        return {n: t32 for n, (_, t32) in wanted.items()}
    if dtype == torch.float64:
        return {n: t64 for n, (t64, _) in wanted.items()}
    paths: dict = {}
    try:
        outs = golden.forward(*tensors, compute_dtype=dtype, **attrs)
        paths.update(zip(golden.OUTPUT_NAMES, outs))
    except Exception as exc:
        paths.update((n, exc) for n in golden.OUTPUT_NAMES)
    if g_outs is not None:
        names = [f"grad_{n}" for n in grad_inputs]
        try:
            paths.update(zip(names, golden.backward(tensors, g_outs, compute_dtype=dtype, **attrs)))
        except Exception as exc:
            paths.update((n, exc) for n in names)
    return paths


def _eager_figures(actual: torch.Tensor, eager, t64: torch.Tensor, tol: Tolerance, name: str) -> dict:
    """Eager's own error against float64 (the same metrics as the kernel's) and where the kernel's result
    differs from eager's: elements not bit-identical (NaN matching NaN), and the largest distance in ulps of
    the kernel's dtype over the elements finite in both."""
    if isinstance(eager, Exception):
        msg = str(eager).strip().splitlines()[0] if str(eager).strip() else ""
        return {"unavailable": f"eager raises: {type(eager).__name__}: {msg}"}
    if eager is None or tuple(eager.shape) != tuple(actual.shape):
        return {"unavailable": "eager gives no result of this shape"}
    figures = {"dtype": str(eager.dtype).replace("torch.", ""),
               "vs_float64": _brief(compare(eager.detach(), t64, tol, name=name))}
    if actual.numel() == 0:
        return {**figures, "vs_fused": {"differing": 0, "differing_ratio": 0.0, "max_ulp": 0}}
    a, e = actual.detach().cpu(), eager.detach().cpu().to(actual.dtype)
    both_nan = torch.isnan(a) & torch.isnan(e)
    finite = torch.isfinite(a) & torch.isfinite(e)
    ulp = ulp_distance(a, e)
    same = both_nan | (finite & (ulp == 0)) | (~finite & (a == e))
    differing = int((~same).sum())
    return {**figures, "vs_fused": {"differing": differing, "differing_ratio": differing / a.numel(),
                                    "max_ulp": int(ulp[finite].max()) if finite.any() else 0}}


def _fp32_error_spread(golden, tensors, g_outs, attrs, grad_inputs, names, seed) -> dict[str, float]:
    """RMS over nudged copies of the inputs of the reference's float32 error (max abs per output).

    A sum that cancels (grad_scale of fake quantization is a difference of two sums hundreds of times its
    size) carries a float32 error that swings by two orders of magnitude with the last bits of the inputs;
    the RMS over SPREAD_SAMPLES draws is its scale, where one draw may be 100x below it."""
    n = SPREAD_SAMPLES if sum(t.numel() for t in tensors) <= 1 << 20 else 4  # p0 shapes: fewer, costlier runs
    sq = dict.fromkeys(names, 0.0)
    for j in range(n):
        gen = torch.Generator().manual_seed(seed + 31 * (j + 1))
        paths = _golden_paths(golden, [_nudge(t, gen) for t in tensors],
                              None if g_outs is None else [_nudge(g, gen) for g in g_outs], attrs, grad_inputs)
        for name in names:
            t64, t32 = paths[name]
            sq[name] += _finite_max_abs(t32.double() - t64) ** 2
    return {name: math.sqrt(v / n) for name, v in sq.items()}


def _nudge(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """t with each finite non-zero element moved one ulp up, down or not at all, at random."""
    if not t.is_floating_point() or t.numel() == 0:
        return t
    step = torch.randint(-1, 2, t.shape, generator=gen)
    up = torch.nextafter(t, torch.full_like(t, math.inf))
    down = torch.nextafter(t, torch.full_like(t, -math.inf))
    moved = torch.where(step > 0, up, torch.where(step < 0, down, t))
    return torch.where(torch.isfinite(t) & (t != 0), moved, t)


def _record(case: dict, seed: int, passed: bool, outputs: list, skipped: str | None = None,
            blocks: dict | None = None) -> dict:
    """The case's result, appended to the JSONL file that stage 5 reads into PRECISION.md."""
    record = {"case": case["id"], "level": case["level"], "dtype": case["dtype"], "binding": case["binding"],
              "seed": seed, "passed": passed, "outputs": outputs, **({"skipped": skipped} if skipped else {}),
              **({"interpreter_blocks": blocks} if blocks else {})}
    path = os.environ.get(RECORD_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")
    return record


def reduced_elems(name: str, spec: dict, binding: dict, n_elements: int) -> int:
    """K of the √K tolerance: what the longest reduction on the output's path sums (SPEC's reduced_extent,
    an expression over the shape symbols); every element when SPEC does not say."""
    if name not in spec.get("reduced_outputs", []):
        return 1
    expr = (spec.get("reduced_extent") or {}).get(name)
    if not expr:
        return n_elements
    return max(1, int(eval(expr, {"__builtins__": {}}, dict(binding))))  # sizes and + - * // only


def _brief(res: dict) -> dict:
    return {k: res.get(k) for k in ("max_abs", "max_rel", "max_ulp", "mismatch_ratio")}


def _finite_max_abs(d: torch.Tensor) -> float:
    d = d[torch.isfinite(d)]
    return float(d.abs().max()) if d.numel() else 0.0


def _alias_check(inputs, outputs) -> dict:
    """A result may not share memory with an input (it would be the input, modified or returned)."""
    def span(t):
        if t.numel() == 0:
            return None
        start = t.untyped_storage().data_ptr()
        return start, start + t.untyped_storage().nbytes()

    clashes = []
    for o in outputs:
        so = span(o)
        for i in inputs:
            si = span(i)
            if so and si and so[0] < si[1] and si[0] < so[1]:
                clashes.append(True)
    return {"name": "no_alias", "passed": not clashes, "exact": True}


def read_records(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
