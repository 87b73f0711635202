"""Error metrics of an output against its truth, computed in float64 on the CPU.

NaN at the same place in both counts as a match, as do equal infinities; a NaN or infinity in only one
is a mismatch. Aggregates (max, mean, RMSE) are over the elements finite in both.
"""

from __future__ import annotations

import torch

from opforge.verify.tolerance import Tolerance

_INT = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
        torch.bfloat16: torch.int16}


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """ULPs between a and b in a's dtype: bit patterns mapped onto an ordered integer line (integers, indices:
    their difference)."""
    dt = a.dtype
    if not dt.is_floating_point:
        return (a.to(torch.int64) - b.to(torch.int64)).abs()
    ia = a.contiguous().view(_INT[dt]).to(torch.int64)
    ib = b.to(dt).contiguous().view(_INT[dt]).to(torch.int64)
    bits = torch.finfo(dt).bits

    def ordered(i):
        i = i & ((1 << bits) - 1)  # the unsigned pattern
        sign = i >> (bits - 1)
        mag = i & ((1 << (bits - 1)) - 1)
        return torch.where(sign == 1, -mag, mag)  # -0 and +0 both map to 0

    return (ordered(ia) - ordered(ib)).abs()


def compare(actual: torch.Tensor, truth: torch.Tensor, tol: Tolerance, *, inputs: dict | None = None,
            worst_k: int = 5, name: str = "out") -> dict:
    res = {"name": name, "shape": list(actual.shape), "dtype": str(actual.dtype).replace("torch.", ""),
           "numel": actual.numel(), "exact": tol.exact, "atol": tol.atol, "rtol": tol.rtol}
    if tuple(actual.shape) != tuple(truth.shape):
        return {**res, "passed": False, "reason": f"shape {tuple(actual.shape)} != {tuple(truth.shape)}"}
    if tol.exact and actual.dtype != truth.dtype:
        return {**res, "passed": False, "reason": f"dtype {actual.dtype} != {truth.dtype}"}
    zero = {"max_abs": 0.0, "max_rel": 0.0, "mismatch_ratio": 0.0, "mismatches": 0, "mare": 0.0, "mere": 0.0,
            "rmse": 0.0, "max_ulp": 0, "nan_mismatch": 0, "worst": []}
    if actual.numel() == 0:
        return {**res, **zero, "passed": True}
    a = actual.detach().cpu().double()
    t = truth.detach().cpu().double()
    a_nan, t_nan = torch.isnan(a), torch.isnan(t)
    nan_bad = a_nan ^ t_nan
    a_inf, t_inf = torch.isinf(a), torch.isinf(t)
    inf_bad = (a_inf | t_inf) & ~(a_nan | t_nan) & (a != t)
    finite = torch.isfinite(a) & torch.isfinite(t)
    err = torch.where(finite, (a - t).abs(), torch.zeros_like(a))
    if tol.exact:
        same_bits = ulp_distance(actual.detach().cpu(), truth.detach().cpu()) == 0
        bad = ~(same_bits | (a_nan & t_nan) | ((a == t) & ~finite))
    else:
        bad = (finite & (err > tol.atol + tol.rtol * t.abs())) | nan_bad | inf_bad
    ft, fe = t[finite], err[finite]
    rel = torch.where(ft != 0, fe / ft.abs(), fe)
    ulp = ulp_distance(actual.detach().cpu()[finite], truth.detach().cpu().to(actual.dtype)[finite])
    mean_t = ft.abs().mean() if ft.numel() else torch.tensor(0.0)
    res.update({
        "max_abs": float(fe.max()) if fe.numel() else 0.0,
        "max_rel": float(rel.max()) if rel.numel() else 0.0,
        "mismatches": int(bad.sum()),
        "mismatch_ratio": float(bad.sum()) / a.numel(),
        "mare": float(rel.mean()) if rel.numel() else 0.0,
        "mere": float(fe.mean() / mean_t) if ft.numel() and mean_t > 0 else 0.0,
        "rmse": float(fe.pow(2).mean().sqrt()) if fe.numel() else 0.0,
        "max_ulp": int(ulp.max()) if ulp.numel() else 0,
        "nan_mismatch": int(nan_bad.sum()),
        "passed": int(bad.sum()) == 0,
        # where the extremes lie, so a report can name the magnitude they belong to (a huge ULP count at a
        # value near zero is within atol, not an alarm)
        "max_abs_truth": float(ft.abs().max()) if ft.numel() else 0.0,
        "max_abs_at": _element(a, t, err, finite, fe.argmax()) if fe.numel() else None,
        "max_ulp_at": _element(a, t, err, finite, ulp.argmax()) if ulp.numel() else None,
    })
    # worst elements: mismatching non-finite first, then by absolute error
    score = torch.where(nan_bad | inf_bad, torch.full_like(err, float("inf")), err).reshape(-1)
    k = min(worst_k, score.numel())
    top = torch.topk(score, k).indices if k else []
    worst = []
    for flat in top.tolist() if k else []:
        idx = list(torch.unravel_index(torch.tensor(flat), a.shape)) if a.dim() else []
        idx = [int(i) for i in idx]
        entry = {"index": idx, "actual": float(a.reshape(-1)[flat]), "truth": float(t.reshape(-1)[flat]),
                 "abs_err": float(err.reshape(-1)[flat])}
        if inputs:
            entry["inputs"] = {n: float(v.detach().reshape(-1)[flat]) for n, v in inputs.items()
                               if tuple(v.shape) == tuple(actual.shape)}
        worst.append(entry)
    res["worst"] = worst
    return res


def _element(a: torch.Tensor, t: torch.Tensor, err: torch.Tensor, finite: torch.Tensor, k) -> dict:
    """The k-th element finite in both (a position among `finite`): its index, value, truth and error."""
    flat = int(finite.reshape(-1).nonzero()[int(k)])
    idx = [int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape)] if a.dim() else []
    return {"index": idx, "actual": float(a.reshape(-1)[flat]), "truth": float(t.reshape(-1)[flat]),
            "abs_err": float(err.reshape(-1)[flat])}
