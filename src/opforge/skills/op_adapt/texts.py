"""The sentences a CHECKLIST holds: a conflict's detail and resolution, a constraint's rule, the backward's source.

checklist.json keeps them in English, written from the templates below; `shown()` reads one back into its template
and fields, so CHECKLIST.md, the API page and the summary show it in the chosen language, whether the CHECKLIST was
made in this run or read back from checklist.json (a --modify)."""

from __future__ import annotations

import re
from functools import lru_cache

from opforge.i18n import N_, _

TORCH_ONLY_DTYPES = N_("torch supports {dtypes}; the vendor kernel {kernel} does not")
REFUSED = N_("not adapted: the operator refuses them")
VENDOR_ONLY_DTYPES = N_("the vendor kernel accepts {dtypes}; torch's OpInfo does not test them")
UNTESTED = N_("not adapted: no reference behaviour to test against")
BACKWARD_LACKS = N_("the backward runs {op}, which opdev lacks: {why}")
GRADIENTS_FAIL = N_("gradients will fail on the device until it is adapted")
BACKWARD_LACKED = N_("the backward runs {ops}, which opdev lacked")
ALONGSIDE = N_("adapted alongside, from the vendor's kernels")
DTYPE_RULE = N_("`{tensor}` has one of the supported dtypes: {dtypes}")
BROADCAST_RULE = N_("the shapes of {tensors} broadcast together")
SAME_SHAPE_RULE = N_("{tensors} have the same shape")
NOT_DIFFERENTIABLE = N_("none: not differentiable in torch")
TRACED = N_("the reference's autograd, traced")

TEMPLATES = (TORCH_ONLY_DTYPES, REFUSED, VENDOR_ONLY_DTYPES, UNTESTED, BACKWARD_LACKS, GRADIENTS_FAIL,
             BACKWARD_LACKED, ALONGSIDE, DTYPE_RULE, BROADCAST_RULE, SAME_SHAPE_RULE, NOT_DIFFERENTIABLE, TRACED)


@lru_cache(maxsize=None)
def _patterns() -> list[tuple[str, re.Pattern]]:
    out = []
    for template in TEMPLATES:
        parts = re.split(r"\{(\w+)\}", template)
        regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>.+?)" for i, p in enumerate(parts))
        out.append((template, re.compile(regex, re.S)))
    return out


def shown(text: str) -> str:
    """`text`, one of TEMPLATES filled in English, in the current language; any other text as it is."""
    for template, pattern in _patterns():
        m = pattern.fullmatch(text)
        if m:
            return _(template).format(**m.groupdict())
    return text
