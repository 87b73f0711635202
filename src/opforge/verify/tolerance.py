"""Tolerance policy per dtype.

Defaults are torch.testing.assert_close's; a SPEC may override them per dtype. An output that reduces K
elements accumulates float32 rounding error that grows like sqrt(K) (a random walk of roundings), so its
atol is scaled by sqrt(K); rtol is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

DEFAULT_TOLERANCE = {
    "float16": {"atol": 1e-5, "rtol": 1e-3},
    "bfloat16": {"atol": 1e-5, "rtol": 1.6e-2},
    "float32": {"atol": 1e-5, "rtol": 1.3e-6},
    "float64": {"atol": 1e-7, "rtol": 1e-7},
}
_NAMES = {"float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
          "float64": torch.float64, "double": torch.float64}


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    exact: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in _NAMES:
        raise ValueError(f"unknown dtype {name!r} (expected one of {', '.join(_NAMES)})")
    return _NAMES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def tolerance_for(dtype, spec_tolerance: dict | None = None, *, exact: bool = False,
                  reduced_elems: int = 1) -> Tolerance:
    name = dtype_name(parse_dtype(dtype))
    tol = dict(DEFAULT_TOLERANCE[name])
    tol.update((spec_tolerance or {}).get(name, {}))
    return Tolerance(tol["atol"] * max(1.0, math.sqrt(reduced_elems)), tol["rtol"], exact)
