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
  than in the kernel); where that float32 path overflows to Inf/NaN
  and float64 does not, a kernel that overflows too must do so as the float32 path does, and one that
  stays finite is held to float64.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from opforge.verify.inputs import edge_values, fresh_seed, make_tensor, with_edges
from opforge.verify.metrics import compare
from opforge.verify.tolerance import Tolerance, parse_dtype, tolerance_for

RECORD_ENV = "OPFORGE_PRECISION_RECORD"  # a JSONL file that every checked case is appended to
POW2_SCALAR = 2.0 ** -5


def level0_cases(dtypes: list[str], p0: list[dict]) -> list[dict]:
    return [{"id": f"L0-{dt}-{_shape_id(b)}", "level": 0, "binding": b, "dtype": dt, "distribution": "normal"}
            for dt in dtypes for b in p0]


def _shape_id(binding: dict) -> str:
    return "x".join(f"{k}{v}" for k, v in binding.items())


def level1_cases(dtypes: list[str], symbols: list[str], attrs: dict[str, float]) -> list[dict]:
    """Shapes that are not block multiples, one element, empty; each distribution; the breakers."""
    def bind(*sizes):
        # the sizes go to the last symbols (the rows and columns of most operators); earlier ones (batch, heads)
        # get 2, so that a rank-4 operator's case stays as small as a rank-2 one's
        lead = len(symbols) - len(sizes)
        return {s: (sizes[i - lead] if i >= lead else (2 if min(sizes) > 1 else min(sizes)))
                for i, s in enumerate(symbols)}

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
    for c in cases:
        tags = [c["distribution"]] + [k for k in ("edges", "nonfinite") if c.get(k)]
        tags += [c["scalars"]] if c.get("scalars") else []
        tags += ["attrs"] if c.get("attrs") else []
        c["id"] = f"L1-{c['dtype']}-{_shape_id(c['binding'])}-{'-'.join(tags)}"
        c["level"] = 1
    return cases


def build_inputs(golden, case: dict, seed: int) -> list[torch.Tensor]:
    """Inputs of one case, in the case's dtype, from the golden's declared input specs."""
    dtype = parse_dtype(case["dtype"])
    tensors = []
    made = golden.make_inputs(case["binding"], dtype, seed, case["distribution"])
    for t, spec in zip(made, golden.INPUTS):
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


def find_case(design: dict, case_id: str) -> dict:
    """A case of the verification matrix (design.json) by its id."""
    v = design["verification"]
    return next(c for c in v["level0"] + v["level1"] if c["id"] == case_id)


def _call_impl(impl, op: str, tensors, attrs, grad_outputs, grad_inputs, names):
    ins = [t.clone().requires_grad_(n in grad_inputs) for t, n in zip(tensors, names)]
    outs = getattr(impl, op)(*ins, **attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = ()
    if grad_outputs is not None:
        wrt = [t for t, n in zip(ins, names) if n in grad_inputs]
        grads = torch.autograd.grad(outs, wrt, grad_outputs)
    return ins, [o.detach() for o in outs], [g.detach() for g in grads]


def check_case(impl, golden, case: dict, spec: dict, seed: int | None = None) -> dict:
    """Run one case through the delivered op and the golden; returns the result (metrics per output).

    `spec` is the SPEC front matter (op_name, tolerance, exact_outputs, reduced_outputs, backward).
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
    except Exception as exc:
        if case["level"] == 0:  # the shapes that matter must be defined: that is the request's fault
            raise
        # a matrix case the reference itself does not define (an empty amax): nothing to hold the kernel to
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return _record(case, seed, True, [], skipped=f"the reference raises here: {type(exc).__name__}: {msg}")
    g_outs = grad_outputs([o.shape for o in truth], dtype, seed) if backward else None
    ins, outs, grads = _call_impl(impl, spec["op_name"], tensors, attrs, g_outs, grad_inputs, names)

    produced = dict(zip(golden.OUTPUT_NAMES, outs))
    wanted = {n: (truth[i], path32[i]) for i, n in enumerate(golden.OUTPUT_NAMES)}
    if backward:
        gt = golden.backward(tensors, g_outs, compute_dtype=torch.float64, **attrs)
        g32 = golden.backward(tensors, g_outs, compute_dtype=torch.float32, **attrs)
        for k, n in enumerate(grad_inputs):
            produced[f"grad_{n}"] = grads[k]
            wanted[f"grad_{n}"] = (gt[k], g32[k])

    named_inputs = dict(zip(names, tensors))
    n_elements = max((t.numel() for t in tensors), default=0)
    results = []
    for name, actual in produced.items():
        t64, t32 = wanted[name]
        if name in spec.get("exact_outputs", []):
            tol = Tolerance(0.0, 0.0, exact=True)
            res = compare(actual, t32.to(dtype), tol, inputs=named_inputs, name=name)
            res["vs_float64"] = _brief(compare(actual, t64, tolerance_for(dtype, spec.get("tolerance")),
                                               name=name))
        else:
            k = reduced_elems(name, spec, case["binding"], n_elements)
            base = tolerance_for(dtype, spec.get("tolerance"), reduced_elems=k)
            ref_err = _finite_max_abs(t32.double() - t64)
            # float32 rounding of K summed terms walks like √K·eps·|value|: one sample of it (ref_err) can come
            # out lucky, so the model's own size is admitted too (it is 0 for outputs that reduce nothing)
            walk = 2.0 * math.sqrt(k) * torch.finfo(torch.float32).eps * _finite_max_abs(t64) if k > 1 else 0.0
            tol = Tolerance(base.atol + 4.0 * ref_err + walk, base.rtol)
            # where the reference's own float32 path overflows, the kernel may overflow the same way; a kernel
            # that stays finite there is held to float64 like everywhere else (more robust is not wrong)
            overflow = ~torch.isfinite(t32) & torch.isfinite(t64)
            truth = torch.where(overflow & ~torch.isfinite(actual.double()), t32.double(), t64)
            res = compare(actual, truth, tol, inputs=named_inputs, name=name)
            res["float32_overflow_positions"] = int(overflow.sum())
            res["reference_fp32_error"] = ref_err
        results.append(res)
    results.append(_alias_check(ins, list(produced.values())))
    return _record(case, seed, all(r["passed"] for r in results), results)


def _record(case: dict, seed: int, passed: bool, outputs: list, skipped: str | None = None) -> dict:
    """The case's result, appended to the JSONL file that stage 5 reads into PRECISION.md."""
    record = {"case": case["id"], "level": case["level"], "dtype": case["dtype"], "binding": case["binding"],
              "seed": seed, "passed": passed, "outputs": outputs, **({"skipped": skipped} if skipped else {})}
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
