"""PRECISION.md's per-output summary: each headline extreme with the case, dtype, magnitude and tolerance
it belongs to, and whether it passed.

A max ULP of 900 million reads as an alarm until one sees that it sits at a reference value near zero,
where float32's ulps are tiny and the element passes by atol; a max abs error of 3e34 reads as one until
one sees a reference of 1e37 there. So every extreme is shown with its case id, dtype, the
reference's magnitude at that element (the output's max |ref| where the record does not locate it), the
tolerance of that comparison (the limit at the element: atol + rtol·|ref|) and the verdict.
"""

from __future__ import annotations

from opforge.skills.op_api.markdown import cell

HEADER = ["| output | cases | compared exactly | extreme | value | case | dtype | reference there | tolerance there | "
          "verdict |", "|---|---|---|---|---|---|---|---|---|---|"]


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
    return r["dtype"] if not out or out == r["dtype"] else f"{r['dtype']} (output {out})"


def _reference(key: str, o: dict) -> str:
    at = _element(key, o)
    if at is not None:
        return f"|ref| = {_g(abs(at['truth']))} at {tuple(at['index'])}"
    if "max_abs_truth" in o:
        return f"max |ref| of the output = {_g(o['max_abs_truth'])}"
    return "not recorded"


def _tolerance(key: str, o: dict) -> str:
    if o.get("exact"):
        return "bit-exact against the golden's float32 path"
    if "atol" not in o:
        return "not recorded"
    text = f"atol {_g(o['atol'])} + rtol {_g(o['rtol'])}·|ref|"
    at = _element(key, o)
    if at is not None:
        text += f" = {_g(o['atol'] + o['rtol'] * abs(at['truth']))}"
    return text


def _verdict(key: str, o: dict, value) -> str:
    """Whether the extreme passed, and by which term: atol (where the reference is small or near zero), rtol,
    or their sum; a failure says how far past the limit it is."""
    if o.get("exact"):
        return "passed: bit-identical" if value == 0 else "**failed**: not bit-identical"
    elsewhere = "" if o.get("passed") else " (**the output failed elsewhere in this case**)"
    if value == 0:
        return f"passed: no error{elsewhere}"
    at = _element(key, o)
    if at is None or "atol" not in o:
        return ("passed" if o.get("passed") else "**failed**") + " (the output's verdict in this case)"
    err, ref, atol = at["abs_err"], abs(at["truth"]), o["atol"]
    by_rel = o["rtol"] * ref
    if err > atol + by_rel:
        return f"**failed**: error {_g(err)} is {_g(err / (atol + by_rel))}× the limit{elsewhere}"
    rel = f", {_g(err / ref)} of |ref|" if ref else ""
    term = "by rtol" if err <= by_rel else "by atol" if err <= atol else "within atol + rtol·|ref|"
    if key == "max_ulp":
        text = f"passed {term}: {value:,} ulps here are an error of {_g(err)}{rel}"
        if err <= atol and ref <= atol:
            text += " (the reference is near zero, where ulps are tiny)"
        return text + elsewhere
    return f"passed {term}: error {_g(err)}{rel}{elsewhere}"


def per_output_lines(cases: list[dict]) -> list[str]:
    """The "Per output" section: two rows per output, its max abs error and its max ULP, each located."""
    lines = ["## Per output (worst over all cases)", "",
             "Each extreme with the case and dtype it comes from, the reference's magnitude at that element, the "
             "tolerance it was judged against there (the case's: SPEC's, with atol widened for reductions and for "
             "the reference's own float32 error) and its verdict. A large ULP count where the reference is near "
             "zero is a small absolute error, within atol; a large absolute error can be a small relative one. "
             "The eager section below compares dtypes for information; it carries no verdict.", "", *HEADER]
    for name, w in located_extremes(cases).items():
        first = True
        for key, label in (("max_abs", "max abs error"), ("max_ulp", "max ULP")):
            x = w[key]
            r, o = x["case"], x["output"]
            head = f"| {cell(name)} | {w['cases']} | {w['exact_cases']} |" if first else "| | | |"
            first = False
            lines.append(f"{head} {label} | {_value(key, x['value'])} | {cell(r['case'])} | {cell(_dtype(r, o))} | "
                         f"{cell(_reference(key, o))} | {cell(_tolerance(key, o))} | "
                         f"{cell(_verdict(key, o, x['value']))} |")
    return lines
