"""PRECISION.md's per-output summary: each headline extreme with the case, dtype, magnitude and tolerance
it belongs to, and whether it passed.

A max ULP of 900 million reads as an alarm until one sees that it sits at a reference value near zero,
where float32's ulps are tiny and the element passes by atol; a max abs error of 3e34 reads as one until
one sees a reference of 1e37 there. So every extreme is shown with its case id, dtype, the
reference's magnitude at that element (the output's max |ref| where the record does not locate it), the
tolerance of that comparison (the limit at the element: atol + rtol·|ref|) and the verdict.
"""

from __future__ import annotations

from opforge.i18n import N_, _
from opforge.skills.op_api.markdown import cell

HEADER = [N_("| output | cases | compared exactly | extreme | value | case | dtype | reference there | "
             "tolerance there | verdict |"), "|---|---|---|---|---|---|---|---|---|---|"]
EXTREMES = (("max_abs", N_("max abs error")), ("max_ulp", N_("max ULP")))


def located_extremes(cases: list[dict]) -> dict[str, dict]:
    """Per output, over every case: cases, exact cases, and for "max_abs" and "max_ulp" the case record and
    output result holding the largest value (the first such case on ties)."""
    out: dict[str, dict] = {}
    for r in cases:
        for o in r["outputs"]:
            if o["name"] == "no_alias":
                continue
            w = out.setdefault(o["name"], {"cases": 0, "exact_cases": 0, "max_abs": None, "max_ulp": None})
            w["cases"] += 1
            w["exact_cases"] += int(bool(o.get("exact")))
            for key, cast in (("max_abs", float), ("max_ulp", int)):
                value = cast(o.get(key) or 0)
                if w[key] is None or value > w[key]["value"]:
                    w[key] = {"value": value, "case": r, "output": o}
    return out


def _g(x: float) -> str:
    return f"{x:.3g}"


def _value(key: str, v) -> str:
    return f"{v:,}" if key == "max_ulp" else _g(v)


def _element(key: str, o: dict) -> dict | None:
    """The element where the extreme lies, if the record says (records from before it did: the worst
    element by abs error stands in for max abs). None for an extreme of 0: no element stands out."""
    if not o.get(key):
        return None
    at = o.get(f"{key}_at")
    if at is None and key == "max_abs" and o.get("worst"):
        at = o["worst"][0]
    return at


def _dtype(r: dict, o: dict) -> str:
    out = o.get("dtype")
    if not out or out == r["dtype"]:
        return r["dtype"]
    return _("{dtype} (output {output_dtype})").format(dtype=r["dtype"], output_dtype=out)


def _reference(key: str, o: dict) -> str:
    at = _element(key, o)
    if at is not None:
        return _("|ref| = {ref:.3g} at {index}").format(ref=abs(at["truth"]), index=tuple(at["index"]))
    if "max_abs_truth" in o:
        return _("max |ref| of the output = {ref:.3g}").format(ref=o["max_abs_truth"])
    return _("not recorded")


def _tolerance(key: str, o: dict) -> str:
    if o.get("exact"):
        return _("bit-exact against the golden's float32 path")
    if "atol" not in o:
        return _("not recorded")
    at = _element(key, o)
    if at is None:
        return _("atol {atol:.3g} + rtol {rtol:.3g}·|ref|").format(atol=o["atol"], rtol=o["rtol"])
    return _("atol {atol:.3g} + rtol {rtol:.3g}·|ref| = {limit:.3g}").format(
        atol=o["atol"], rtol=o["rtol"], limit=o["atol"] + o["rtol"] * abs(at["truth"]))


def _verdict(key: str, o: dict, value) -> str:
    """Whether the extreme passed, and by which term: atol (where the reference is small or near zero), rtol,
    or their sum; a failure says how far past the limit it is."""
    if o.get("exact"):
        return _("passed: bit-identical") if value == 0 else _("**failed**: not bit-identical")
    if value == 0:
        return _elsewhere(o, _("passed: no error"))
    at = _element(key, o)
    if at is None or "atol" not in o:
        return (_("passed (the output's verdict in this case)") if o.get("passed")
                else _("**failed** (the output's verdict in this case)"))
    err, ref, atol = at["abs_err"], abs(at["truth"]), o["atol"]
    by_rel = o["rtol"] * ref
    if err > atol + by_rel:
        return _elsewhere(o, _("**failed**: error {err:.3g} is {ratio:.3g}× the limit").format(
            err=err, ratio=err / (atol + by_rel)))
    term = _("by rtol") if err <= by_rel else _("by atol") if err <= atol else _("within atol + rtol·|ref|")
    fields = {"term": term, "err": err, "rel": err / ref if ref else 0.0, "ulps": value}
    if key == "max_ulp":
        if ref:
            text = _("passed {term}: {ulps:,} ulps here are an error of {err:.3g}, {rel:.3g} of |ref|").format(**fields)
        else:
            text = _("passed {term}: {ulps:,} ulps here are an error of {err:.3g}").format(**fields)
        if err <= atol and ref <= atol:
            text = _("{verdict} (the reference is near zero, where ulps are tiny)").format(verdict=text)
        return _elsewhere(o, text)
    if ref:
        return _elsewhere(o, _("passed {term}: error {err:.3g}, {rel:.3g} of |ref|").format(**fields))
    return _elsewhere(o, _("passed {term}: error {err:.3g}").format(**fields))


def _elsewhere(o: dict, verdict: str) -> str:
    """The verdict of the extreme, and a note where the output failed at another element of the case."""
    if o.get("passed"):
        return verdict
    return _("{verdict} (**the output failed elsewhere in this case**)").format(verdict=verdict)


def per_output_lines(cases: list[dict]) -> list[str]:
    """The "Per output" section: two rows per output, its max abs error and its max ULP, each located."""
    lines = [_("## Per output (worst over all cases)"), "",
             _("Each extreme with the case and dtype it comes from, the reference's magnitude at that element, the "
               "tolerance it was judged against there (the case's: SPEC's, with atol widened for reductions and for "
               "the reference's own float32 error) and its verdict. A large ULP count where the reference is near "
               "zero is a small absolute error, within atol; a large absolute error can be a small relative one. "
               "The eager section below compares dtypes for information; it carries no verdict."), "",
             _(HEADER[0]), HEADER[1]]
    for name, w in located_extremes(cases).items():
        first = True
        for key, label in EXTREMES:
            x = w[key]
            r, o = x["case"], x["output"]
            head = f"| {cell(name)} | {w['cases']} | {w['exact_cases']} |" if first else "| | | |"
            first = False
            lines.append(f"{head} {_(label)} | {_value(key, x['value'])} | {cell(r['case'])} | {cell(_dtype(r, o))} | "
                         f"{cell(_reference(key, o))} | {cell(_tolerance(key, o))} | "
                         f"{cell(_verdict(key, o, x['value']))} |")
    return lines
