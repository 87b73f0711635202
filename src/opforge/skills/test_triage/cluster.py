"""Failures grouped by what would fix them, each group with its root cause (rules.yaml) and evidence.

A failure's signature is its root exception's type and message with the numbers, addresses and paths that vary
between samples taken out, and its causal frame: the innermost frame outside torch, the standard library and
pytest, which is the test's own line or the backend's Python. Failures of one rule cluster by the operator the
rule names (the missing kernel), else by the OpInfo and signature, else by the causal frame and signature.
"""
from __future__ import annotations

import re
import sysconfig
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

RULES_FILE = Path(__file__).with_name("rules.yaml")


@dataclass(frozen=True)
class Rule:
    id: str
    category: str
    why: str
    exception: str = ""
    message: str = ""
    generic: str = ""
    where: str = ""
    cpu_also: bool = False
    by: str = "signature"


@cache
def rules() -> tuple[Rule, ...]:
    return tuple(Rule(**r) for r in yaml.safe_load(RULES_FILE.read_text())["rules"])


def normalise(message: str) -> str:
    """The message's first line with what varies between samples replaced: addresses, numbers, quoted paths."""
    first = next((line for line in message.strip().splitlines() if line.strip()), "")
    if len(first) > 120 and ". " in first:  # the dispatcher's long explanation after its first sentence
        first = first[: first.index(". ") + 1]
    first = re.sub(r"0x[0-9a-fA-F]+", "ADDR", first)
    first = re.sub(r"(?<![\w:])-?\d+(\.\d+)?(e[+-]?\d+)?", "N", first)
    first = re.sub(r"(/[\w.-]+)+\.py", "<file>", first)
    return re.sub(r"\s+", " ", first).strip()[:300]


@cache
def _outside() -> tuple[str, ...]:
    import _pytest
    import pluggy
    import torch

    return (str(Path(torch.__file__).parent), sysconfig.get_paths()["stdlib"], str(Path(_pytest.__file__).parent),
            str(Path(pluggy.__file__).parent))


def causal_frame(frames: list) -> str:
    """file:line function of the innermost frame that is neither torch's, the standard library's nor pytest's."""
    for file, line, func in reversed(frames or []):
        if not file.startswith(_outside()):
            return f"{file}:{line} {func}"
    return ""


def _in_test_file(frames: list, test: str) -> bool:
    if not frames:
        return False
    return Path(frames[-1][0]).name == Path(test.split("::")[0]).name


def classify(failure: dict, info: dict, cpu_also: bool) -> tuple[Rule, str | None]:
    """The first rule that holds for a failed test, with the operator its message names (if the rule names one)."""
    exception, message = failure.get("exception", ""), failure.get("message", "")
    for rule in rules():
        if rule.cpu_also and not cpu_also:
            continue
        if rule.exception and not re.fullmatch(rule.exception, exception):
            continue
        m = re.search(rule.message, message) if rule.message else None
        if rule.message and m is None:
            continue
        if rule.generic and not re.fullmatch(rule.generic, info.get("generic") or ""):
            continue
        if rule.where == "test" and not _in_test_file(failure.get("frames"), failure["test"]):
            continue
        return rule, (m.group("op") if m is not None and "op" in m.groupdict() else None)
    raise AssertionError("rules.yaml ends with a rule that matches any failure")


@dataclass
class Facts:
    """What reruns told about a failed test."""
    reruns: int = 0
    passed_on_rerun: int = 0
    cpu_twin: str | None = None  # the CPU twin's outcome, None when it has none or it was not run


def representatives(tests: list[str], n: int) -> list[str]:
    """Up to `n` of a cluster's tests, evenly spread over it (its tests come in dtype and test order)."""
    if len(tests) <= n:
        return list(tests)
    return [tests[round(i * (len(tests) - 1) / (n - 1))] for i in range(n)] if n > 1 else tests[:1]


def clusters(failures: list[dict], infos: dict[str, dict], facts: dict[str, Facts] | None = None) -> list[dict]:
    """Failed tests grouped and classified, biggest first. `facts` (reruns and CPU twins, of the clusters'
    representatives) make a cluster flaky when a rerun passed, and upstream's when every CPU twin run failed."""
    facts = facts or {}
    groups: dict[tuple, dict] = {}
    for f in failures:
        info = infos.get(f["test"], {})
        rule, named_op = classify(f, info, cpu_also=False)
        signature = f"{f.get('exception', '')}: {normalise(f.get('message', ''))}"
        frame = causal_frame(f.get("frames"))
        if named_op:  # aten::neg, aten::neg.out and aten::neg_ are one yaml line: one cluster
            named_op = re.sub(r"\.\w+$", "", named_op).rstrip("_")
            key = (rule.id, named_op)
        elif info.get("op"):
            key = (rule.id, info["op"]) if rule.by == "op" else (rule.id, info["op"], signature)
        else:
            key = (rule.id, frame, signature)
        g = groups.setdefault(key, {
            "category": rule.category, "rule": rule.id, "why": rule.why, "operator": named_op or info.get("op"),
            "signature": signature, "causal_frame": frame, "message": f.get("message", "")[:600],
            "first": f, "tests": [], "generics": set(), "dtypes": set(), "ops": set()})
        g["tests"].append(f["test"])
        for k, v in (("generics", info.get("generic")), ("dtypes", info.get("dtype")), ("ops", info.get("op"))):
            if v:
                g[k].add(v)
    out = []
    for g in groups.values():
        first = g.pop("first")
        g.update({k: sorted(g[k]) for k in ("generics", "dtypes", "ops")})
        confirmed = {t: facts[t] for t in g["tests"] if t in facts}
        g["reruns"] = sum(f.reruns for f in confirmed.values())
        g["passed_on_rerun"] = sum(f.passed_on_rerun for f in confirmed.values())
        g["flaky"] = g["passed_on_rerun"] > 0
        twins = [f.cpu_twin for f in confirmed.values() if f.cpu_twin is not None]
        g["cpu_twins"] = {o: twins.count(o) for o in sorted(set(twins))}
        if twins and all(o in ("failed", "error") for o in twins):
            rule, _ = classify(first, infos.get(first["test"], {}), cpu_also=True)
            g.update(category=rule.category, rule=rule.id, why=rule.why)
        g["size"] = len(g["tests"])
        out.append(g)
    out.sort(key=lambda g: (-g["size"], g["category"], g["operator"] or "", g["signature"]))
    for i, g in enumerate(out, 1):
        g["id"] = f"C{i:03d}"
    return out
