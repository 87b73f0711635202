"""Impact of one commit on a backend: signals with evidence, the level they add up to, and what to do.

High: an operator the backend implements or an integration point it relies on changed.
Medium: new operators, or device-generic behaviour it should pick up (schemas, composite kernels, tags and
derivatives of operators it does not implement, decompositions, integration points outside its profile).
Low: tests or infrastructure it reuses. None: nothing it runs (docs, CI, other devices' kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

from opforge.i18n import N_, Joined, Msg
from opforge.skills.pr_analysis.areas import (
    DERIVATIVES,
    NATIVE_FUNCTIONS,
    POINT_SUGGESTIONS,
    POINT_TITLES,
    RANK,
    classify_path,
    content_points,
)
from opforge.skills.pr_analysis.gitlog import BlobReader, Commit, FileChange
from opforge.skills.pr_analysis.profile import Profile
from opforge.skills.pr_analysis.schema_diff import COMPOSITE_KEYS, OpChange, diff_derivatives, diff_native

# Changed lines are searched for integration-point names only in code the backend runs: not in prose, CI,
# tests, or another device's kernels (areas whose own level is None).
_NO_CONTENT_RULES = {"tests"}
MAX_EVIDENCE = 8
_AREA_SUGGESTION = {
    "Medium": N_("Device-generic behaviour changed: run the backend's tests for the affected operators."),
    "Low": N_("Infrastructure the backend reuses: rebuild and rerun its test suite at the next sync."),
}

# (the point is the file's own, the backend relies on it) -> why
_POINT_WHY = {
    (True, True): N_("{point} changed"),
    (True, False): N_("{point} changed (outside the profile)"),
    (False, True): N_("{point} named in changed lines"),
    (False, False): N_("{point} named in changed lines (outside the profile)"),
}


@dataclass
class Signal:
    level: str
    kind: str  # operator | derivative | integration | area
    subject: str  # the overload, integration point or area
    file: str
    lines: list[int]
    why: str
    suggestion: str
    snippet: str = ""

    def to_dict(self) -> dict:
        return {"level": self.level, "kind": self.kind, "subject": self.subject, "file": self.file,
                "lines": _ranges(self.lines), "why": self.why, "suggestion": self.suggestion, "snippet": self.snippet}


def _ranges(lines: list[int]) -> str:
    """1,2,3,7 -> "L1-3, L7" (at most six spans)."""
    if not lines:
        return ""
    nums = sorted(set(lines))
    spans: list[tuple[int, int]] = []
    for n in nums:
        if spans and n == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], n)
        else:
            spans.append((n, n))
    text = ", ".join(f"L{a}" if a == b else f"L{a}-{b}" for a, b in spans[:6])
    return Msg(N_("{lines} (+{n} more)"), lines=text, n=len(spans) - 6) if len(spans) > 6 else text


_COMMENT = ("#", "//", "/*", "* ", "*/")


def cosmetic(fc: FileChange) -> bool:
    """Only comments changed, or only whitespace: the code a backend builds against is the same."""
    if fc.status != "M" or fc.n_added > len(fc.added) or fc.n_removed > len(fc.removed):
        return False

    def code(lines: list[tuple[int, str]]) -> list[str]:
        out = ("".join(t.split()) for _n, t in lines)
        return sorted(x for x in out if x and not x.startswith(_COMMENT))

    return code(fc.added) == code(fc.removed)


def grade_op(ch: OpChange, profile: Profile) -> tuple[str, str, str]:
    """(level, why, suggestion) for one overload change."""
    target = ch.old_op if ch.change == "renamed" else ch.op
    mine = profile.implements(target)
    detail = Joined("; ", ch.details)
    if ch.change == "added":
        why = (Msg(N_("new operator overload {op} (a new overload of an operator the backend implements)"), op=ch.op)
               if profile.has_family(ch.op) else Msg(N_("new operator overload {op}"), op=ch.op))
        return ("Medium", why,
                Msg(N_("Decide whether the backend implements {op}; until then it falls back or decomposes."),
                    op=ch.op))
    if mine and (ch.change in ("removed", "renamed") or ch.schema_differs):
        return ("High", Msg(N_("{op}, implemented by the backend: {detail}"), op=target, detail=detail),
                Msg(N_("Update the backend's registration and kernel of {op} to the new schema ({detail})."),
                    op=target, detail=detail))
    if ch.change in ("removed", "renamed") or ch.schema_differs:
        # The backend reaches this operator through a composite kernel or the fallback: behaviour it inherits.
        if profile.generic:
            return ("Medium", Msg(N_("{op}: {detail}"), op=target, detail=detail),
                    Msg(N_("If the backend implements {op}, follow the new schema."), op=target))
        return ("Medium", Msg(N_("{op} (not implemented by the backend): {detail}"), op=target, detail=detail),
                Msg(N_("No kernel to adapt; check callers of {op} in the backend and its fallback list."), op=target))
    keys = set(ch.dispatch_keys_changed)
    generic_keys = COMPOSITE_KEYS | {"structured_delegate", profile.dispatch_key, f"Autograd{profile.dispatch_key}"}
    levels = []
    if keys & generic_keys:
        lv = "High" if mine else "Medium"
        levels.append((lv, Msg(N_("{op}: {detail}"), op=ch.op, detail=detail),
                       Msg(N_("The device-generic kernel of {op} changed ({keys}): check whether the backend now "
                              "needs its own kernel or can drop it."), op=ch.op,
                           keys=", ".join(sorted(keys & generic_keys)))))
    if "tags_changed" in ch.kinds:
        levels.append(("Medium", Msg(N_("{op}: {detail}"), op=ch.op, detail=detail),
                       Msg(N_("Tags of {op} changed: torch.compile and fake-tensor behaviour follow them."), op=ch.op)))
    if any(k.startswith("field_changed:") for k in ch.kinds):
        levels.append(("Medium" if mine else "Low", Msg(N_("{op}: {detail}"), op=ch.op, detail=detail),
                       Msg(N_("Regenerate the backend's bindings for {op}; its codegen metadata changed."), op=ch.op)))
    if not levels:
        return ("None", Msg(N_("{op}: {detail} (other devices' kernels only)"), op=ch.op, detail=detail),
                Msg(N_("Nothing to adapt.")))
    return max(levels, key=lambda t: RANK[t[0]])


class CommitGrader:
    """Grades commits one by one; whole yaml files come from the blob reader."""

    def __init__(self, profile: Profile, blobs: BlobReader):
        self.profile = profile
        self.blobs = blobs

    def _op_signals(self, fc: FileChange, ops: list[dict]) -> list[Signal]:
        changes = diff_native(self.blobs.read(fc.old_blob), self.blobs.read(fc.new_blob))
        out = []
        for ch in changes:
            level, why, sugg = grade_op(ch, self.profile)
            d = ch.to_dict()
            d.update(impact=level, why=why, suggestion=sugg, implemented=self.profile.implements(ch.old_op or ch.op))
            ops.append(d)
            out.append(Signal(level, "operator", ch.op, fc.path, [ch.line], why, sugg, (ch.new or ch.old or "")[:160]))
        return out

    def _derivative_signals(self, fc: FileChange, ops: list[dict]) -> list[Signal]:
        out = []
        for ch in diff_derivatives(self.blobs.read(fc.old_blob), self.blobs.read(fc.new_blob)):
            mine = self.profile.implements(ch.op)
            if mine:
                level = "High"
                why = Msg(N_("derivative of {op}, implemented by the backend: {detail}"), op=ch.op,
                          detail=Joined("; ", ch.details))
                sugg = Msg(N_("Check the backward of {op} on the device: the formula may call operators the "
                              "backend lacks, and any backend autograd override must match."), op=ch.op)
            else:
                level = "Medium"
                why = Msg(N_("derivative of {op}: {detail}"), op=ch.op, detail=Joined("; ", ch.details))
                sugg = Msg(N_("Device-generic autograd change: run the backend's gradient tests for it."))
            ops.append({"op": ch.op, "change": f"derivative {ch.change}", "kinds": ["derivative_changed"],
                        "details": ch.details, "old": None, "new": None, "old_op": None, "line": ch.line,
                        "schema_differs": False, "dispatch_keys_changed": [], "impact": level, "why": why,
                        "suggestion": sugg, "implemented": mine})
            out.append(Signal(level, "derivative", ch.op, fc.path, [ch.line], why, sugg))
        return out

    def grade(self, commit: Commit) -> dict:
        signals: list[Signal] = []
        ops: list[dict] = []
        areas: list[str] = []
        for fc in commit.files:
            info = classify_path(fc.path)
            for a in info.areas:
                if a not in areas:
                    areas.append(a)
            lines = [n for n, _ in fc.added] or [n for n, _ in fc.removed]
            first = (fc.added or fc.removed or [(0, "")])[0][1].strip()[:160]
            if NATIVE_FUNCTIONS in (fc.path, fc.old_path):
                signals += self._op_signals(fc, ops)
                continue
            if DERIVATIVES in (fc.path, fc.old_path):
                signals += self._derivative_signals(fc, ops)
                continue
            point = info.point or classify_path(fc.old_path).point
            if cosmetic(fc):
                if info.level != "None":
                    why = (Msg(N_("{point}: comments or formatting only"), point=Msg(POINT_TITLES[point]))
                           if point else Msg(N_("comments or formatting only")))
                    signals.append(Signal("Low", "area", point or info.areas[0], fc.path, lines,
                                          why, Msg(_AREA_SUGGESTION["Low"]), first))
                continue
            found = {point: (lines[0] if lines else 0, first)} if point else {}
            if info.level != "None" and not set(info.areas) & _NO_CONTENT_RULES:
                for pid, hit in content_points(fc.added + fc.removed).items():
                    found.setdefault(pid, hit)
            for pid, (ln, text) in found.items():
                mine = self.profile.relies_on(pid)
                signals.append(Signal("High" if mine else "Medium", "integration", pid, fc.path,
                                      lines if pid == point else [ln],
                                      Msg(_POINT_WHY[pid == point, mine], point=Msg(POINT_TITLES[pid])),
                                      Msg(POINT_SUGGESTIONS[pid]), text.strip()[:160]))
            if not found and info.level != "None":
                sugg = _AREA_SUGGESTION.get(info.level)
                signals.append(Signal(info.level, "area", info.areas[0], fc.path, lines,
                                      Msg(N_("{area} change"), area=info.areas[0]), Msg(sugg) if sugg else "", first))
        impact = max((s.level for s in signals), key=RANK.__getitem__, default="None")
        signals.sort(key=lambda s: -RANK[s.level])
        return {"impact": impact, "areas": areas, "signals": signals, "operators": ops,
                "points": sorted({s.subject for s in signals if s.kind == "integration"})}



def summarise(signals: list[Signal], impact: str) -> tuple[list[dict], str]:
    """Evidence (strongest first, bounded) and one suggestion line built from the strongest signals."""
    evidence = [s.to_dict() for s in signals[:MAX_EVIDENCE] if RANK[s.level] > 0 or impact == "None"]
    seen: list[str] = []
    for s in signals:
        if s.level == impact and s.suggestion and s.suggestion not in seen:
            seen.append(s.suggestion)
    suggestion = Joined(" ", seen[:3]) if impact != "None" else Msg(N_("No adaptation needed."))
    return evidence, suggestion
