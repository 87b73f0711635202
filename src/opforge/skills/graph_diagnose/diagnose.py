"""The backend ladder and the conclusion: run the script as it is, then with its torch.compile backends
swapped for eager, aot_eager, aot_eager_decomp_partition (each adds one layer: Dynamo, AOTAutograd, the
decompositions and the partitioner), and without compiling at all; the first step that fails names the layer,
and the error's signature (signatures.yaml) the conclusion and the next action."""

from __future__ import annotations

import functools
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from opforge.i18n import N_, Msg
from opforge.skills.graph_diagnose.child import CHECK_ENV, DROP_ENV, OPCHECK_ENV
from opforge.skills.graph_diagnose.logs import GB_ID, events

LADDER = ("eager", "aot_eager", "aot_eager_decomp_partition")
# the layer a failure belongs to when it first shows at a step: each step adds one to the one before it
LAYER_OF_STEP = {"eager": "dynamo", "aot_eager": "aot_autograd", "aot_eager_decomp_partition": "aot_autograd",
                 "no-compile": "user"}
USER_FRAME = re.compile(r'from user code:\s*\n\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')


@functools.cache
def _knowledge() -> dict:
    return yaml.safe_load((Path(__file__).with_name("signatures.yaml")).read_text())


@functools.cache
def signatures() -> list[dict]:
    """The error signatures, in order, each with the group (where things go wrong) it came from."""
    return [{**rule, "group": group, "pattern": re.compile(rule["match"], re.S)}
            for group, rules in _knowledge()["signatures"].items() for rule in rules]


def event_finding(ev: dict) -> dict | None:
    """What a finished run's log events amount to: the first kind of event (recompile limit, recompiles,
    graph breaks) that reaches its count, as a conclusion with its evidence and advice; None when none does."""
    for kind, rule in _knowledge()["events"].items():
        found = ev.get(kind) or []
        if kind == "recompiles":  # counted per function: one recompile of each of many functions is no storm
            by_fn: dict = {}
            for r in found:
                by_fn.setdefault((r["function"], r["file"]), []).append(r)
            found = max(by_fn.values(), key=len, default=[])
        if len(found) < rule["at_least"]:
            continue
        first = found[0]
        where = first.get("user_line") or {"file": first["file"], "line": first["line"]}
        words = {"count": len(found), "function": first.get("function") or "the function",
                 "guard": first.get("guard") or "?", "reason": first.get("reason") or "", "limit": first.get("limit"),
                 "value": first.get("value")}
        return {"conclusion": rule["conclusion"], "layer": rule["layer"], "rule": rule["id"],
                "advice": Msg(rule["advice"], **words), "user_line": where,
                "gb_id": first.get("gb_id"), "guard": first.get("guard")}
    return None


@functools.cache
def graph_break_registry() -> dict:
    """Dynamo's graph-break registry, shipped in the wheel: GB id -> type, explanation and hints."""
    import torch._dynamo

    path = Path(torch._dynamo.__file__).with_name("graph_break_registry.json")
    return json.loads(path.read_text()) if path.exists() else {}


@dataclass
class Step:
    name: str  # as-is, no-compile, or a backend
    status: str  # ok | failed | timeout
    seconds: float
    exit_code: int | None
    exception: dict | None
    backends: list[str] = field(default_factory=list)  # those the script passed to torch.compile
    log: str = ""
    foreign: list[dict] = field(default_factory=list)  # Inductor table entries defined outside torch
    timings: dict = field(default_factory=dict)  # compiled function -> its calls' seconds (OPFORGE_GRAPH_TIME)
    opcheck: dict = field(default_factory=dict)  # custom op -> opcheck's tests and verdicts (no-compile only)


def _child(module: str, argv: list[str], script: Path, timeout: float, memory_gb: float | None,
           env: dict) -> tuple[subprocess.CompletedProcess | None, str, float, dict]:
    """`python -m MODULE RECORD *argv` in the script's folder, the user's environment with `env` over it, a time
    limit and an optional address-space limit. Returns the process (None past the time limit), its output, its
    seconds and the JSON record it wrote ({} if none)."""
    with tempfile.TemporaryDirectory(prefix="opforge-graph-") as tmp:
        record = Path(tmp) / "record.json"
        limit = int(memory_gb * (1 << 30)) if memory_gb else None
        start = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, "-m", module, str(record), *argv], capture_output=True, text=True,
                               timeout=timeout, cwd=script.parent, env={**os.environ, **env},
                               preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
                               if limit else None)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
            return None, out, round(time.perf_counter() - start, 2), {}
        seconds = round(time.perf_counter() - start, 2)
        return r, r.stdout + r.stderr, seconds, json.loads(record.read_text()) if record.exists() else {}


def run_step(script: Path, args: list[str], step: str, timeout: float, memory_gb: float | None = None,
             env: dict | None = None, label: str | None = None) -> Step:
    """The script in a child process with one step of the ladder (named `label` in the result); the user's
    environment otherwise."""
    r, log, seconds, outcome = _child("opforge.skills.graph_diagnose.child", [step, str(script), *args], script,
                                      timeout, memory_gb, env or {})
    if r is None:
        return Step(label or step, "timeout", seconds, None, None, log=log)
    exc = outcome.get("exception")
    if exc is None and r.returncode != 0 and not outcome:  # killed before it could write (a signal, the OOM killer)
        exc = {"type": "signal" if r.returncode < 0 else "exit", "message": f"the process ended with {r.returncode}"
               + (f": {r.stderr.strip().splitlines()[-1]}" if r.stderr.strip() else ""), "frames": []}
    status = "ok" if r.returncode == 0 else "failed"
    return Step(label or step, status, seconds, r.returncode, exc, outcome.get("backends", []), log,
                outcome.get("foreign", []), outcome.get("timings", {}), outcome.get("opcheck", {}))


def run_bisect(script: Path, args: list[str], timeout: float, memory_gb: float | None) -> tuple[Step, dict | None]:
    """torch's CompilerBisector on the script in a child process (bisect.py): the backend, subsystem and the
    application of it (a decomposition, a pass, a lowering) from which the results differ."""
    r, log, seconds, outcome = _child("opforge.skills.graph_diagnose.bisect", [str(script), *args], script, timeout,
                                      memory_gb, {"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"})
    if r is None:
        return Step("bisect", "timeout", seconds, None, None), None
    return Step("bisect", "ok" if r.returncode == 0 else "failed", seconds, r.returncode, None, log=log), \
        outcome.get("result")


def _logs_env() -> dict:
    """TORCH_LOGS with graph breaks and recompiles added to what the user asked for."""
    asked = [x for x in os.environ.get("TORCH_LOGS", "").split(",") if x.strip()]
    return {"TORCH_LOGS": ",".join(dict.fromkeys(asked + ["graph_breaks", "recompiles"]))}


def match_signature(exception: dict | None) -> tuple[dict | None, dict]:
    """The first rule whose pattern is in the exception's text, and the evidence its named groups caught; then,
    with a learned torch_npu profile, torchair's own errors."""
    if not exception:
        return None, {}
    text = f"{exception['type']}: {exception['message']}"
    for rule in signatures():
        m = rule["pattern"].search(text)
        if m:
            return rule, {k: v for k, v in m.groupdict().items() if v}
    return _npu_rule(text)


def _npu_rule(text: str) -> tuple[dict | None, dict]:
    from opforge.skills.graph_diagnose import npu_profile

    profile = npu_profile.load()
    found = npu_profile.match(profile, text) if profile else None
    if not found:
        return None, {}
    words = _knowledge()["torch_npu"]
    if found["id"] == "torchair-raised":  # a message of the graph modes' own: its kind by what it speaks of
        rule = next(dict(r, layer=None) for r in words["raised"] if re.search(r["match"], found["text"]))
        found["id"] = f"torchair-{rule['kind']}"
    else:
        kind = "ge-converter-not-implemented" if found["id"] == "ge-converter-not-implemented" else "message"
        rule = dict(words[kind])
    if found.get("message_id") in words["environment_messages"]:
        rule["conclusion"] = "environment"
    names = {"version": profile.get("version"), "operator": found.get("operator") or "the op",
             "file": found["source"]["file"], "line": found["source"]["line"],
             "message_id": found.get("message_id")}
    # the advice is complete here, a Msg: `_advice` fills only a signature's template
    return {**rule, "id": found["id"], "advice": Msg(rule["advice"], **names)}, \
        {k: v for k, v in {"operator": found.get("operator"), "torch_npu_source": found["source"]}.items() if v}


def user_line(exception: dict, script: Path | None = None) -> dict | None:
    """Where in the user's code: Dynamo's "from user code" block, else the innermost frame outside the
    installed packages (the script's folder first)."""
    m = USER_FRAME.search(exception.get("message", ""))
    if m:
        return {"file": m["file"], "line": int(m["line"])}
    frames = [f for f in exception.get("frames", []) if "site-packages" not in f["file"]
              and not f["file"].startswith("<") and "opforge/skills/graph_diagnose" not in f["file"]]
    mine = [f for f in frames if script and Path(f["file"]).resolve().parent == script.resolve().parent] or frames
    if not mine:
        return None
    f = mine[-1]
    return {"file": f["file"], "line": f["line"], "function": f["function"], "code": f["code"]}


def framework_frame(exception: dict) -> dict | None:
    """The innermost frame inside torch: where a framework failure surfaced."""
    inside = [f for f in exception.get("frames", []) if "/torch/" in f["file"]]
    return inside[-1] if inside else None


def graph_break(exception: dict | None) -> dict | None:
    """The registry entry of the graph break an exception's message links to, if any."""
    m = GB_ID.search(exception.get("message", "")) if exception else None
    return registry_entry(f"GB{m[1]}") if m else None


def registry_entry(gb_id: str) -> dict:
    entry = (graph_break_registry().get(gb_id) or [{}])[0]
    return {"id": gb_id, "type": entry.get("Gb_type"), "explanation": entry.get("Explanation"),
            "hints": entry.get("Hints", [])}


def _line_text(where: dict | None) -> str:
    if not where or not where.get("file"):
        return ""
    if where.get("code"):
        return where["code"]
    try:
        return Path(where["file"]).read_text().splitlines()[where["line"] - 1].strip()
    except (OSError, IndexError):
        return ""


def diagnose(script: Path, args: list[str], *, backend: str | None = None, timeout: float = 120.0,
             memory_gb: float | None = None, check: bool = False, progress=None) -> dict:
    """Run the ladder on one script and conclude. Returns the result as result.json holds it (the steps' logs
    under `steps`, each with its text). `check`: each compiled call is compared with eager on its inputs."""
    def step(name: str, extra: dict | None = None, label: str | None = None) -> Step:
        if progress:
            progress(label or name)
        env = {**(_logs_env() if name == "as-is" else {}), **({CHECK_ENV: "1"} if check else {}), **(extra or {})}
        s = run_step(script, args, name, timeout, memory_gb, env=env, label=label)
        steps.append(s)
        return s

    steps: list[Step] = []
    first = step("as-is")
    ev = events(first.log)
    if first.status == "ok":
        finding = event_finding(ev)
        result = _result(script, args, steps, None, "clean", None, {}, None)
        if finding:
            result = _event_result(result, finding, ev)
        elif ev["graph_breaks"] or ev["recompiles"]:
            result["next_action"] = Msg(N_("Nothing to fix: the script runs to the end as it is ({breaks} graph "
                                           "break(s), {recompiles} recompile(s), below what makes a finding)."),
                                        breaks=len(ev["graph_breaks"]), recompiles=len(ev["recompiles"]))
        return {**result, "events": ev}
    plain = step("no-compile", {OPCHECK_ENV: "1"})  # and the custom ops it runs checked by opcheck
    compiled = bool(first.backends) or plain.status == "ok"
    failing = first
    if plain.status != "ok" and (not compiled or _same_failure(plain, first)):
        failing = plain  # it fails without torch.compile too: not a graph-mode problem
        layer = "runtime" if plain.status == "timeout" else "user"
    else:
        layer = None
        for name in LADDER:
            if name == backend:
                break
            s = step(name)
            if s.status != "ok":
                failing, layer = s, LAYER_OF_STEP[name]
                break
        if layer is None:  # every generic step passes: the script's own backend is where it fails
            layer = backend or (first.backends[0] if first.backends else "inductor")
        # Inductor's decompositions serve aot_eager_decomp_partition too: what a script or a backend registered
        # into its tables is a suspect from that step on, confirmed when the script runs clean without it
        foreign = failing.foreign or first.foreign
        if failing.name in ("as-is", "aot_eager_decomp_partition") and foreign:
            # the caches would hand back the graph compiled with them: they key on the graph, not the tables
            without = step("as-is", {DROP_ENV: "1", "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"},
                           label="without-foreign")
            if without.status == "ok":
                result = _result(script, args, steps, failing, None, None, {}, layer)
                return {**_foreign_result(result, foreign), "events": ev}
    rule, caught = match_signature(failing.exception)
    if rule is not None and rule["id"] == "wrong-result" and failing.name != "no-compile":
        if progress:
            progress("bisect")
        bisect_step, found = run_bisect(script, args, timeout, memory_gb)
        steps.append(bisect_step)
        if found and found.get("subsystem"):
            result = _result(script, args, steps, failing, None, rule, caught, layer)
            return {**_bisect_result(result, found), "events": ev}
    result = _result(script, args, steps, failing, None, rule, caught, layer)
    failed = {op: {t: v for t, v in tests.items() if v != "SUCCESS"} for op, tests in plain.opcheck.items()}
    if any(failed.values()):  # what opcheck says of the custom ops: a missing or wrong registration, by test
        result["evidence"]["opcheck"] = {op: tests for op, tests in failed.items() if tests}
    return {**result, "events": ev}


def _bisect_result(result: dict, found: dict) -> dict:
    """CompilerBisector named the subsystem, and the application of it, from which the results differ."""
    rule = _knowledge()["experiments"]["bisected"]
    op = re.search(r"op='(?P<op>[\w.:]+)', overload='(?P<overload>\w+)'", found.get("debug_info") or "")
    operator = f"{op['op']}.{op['overload']}" if op else None
    evidence = {**result["evidence"], "bisect": found, **({"operator": operator} if operator else {})}
    advice = Msg(rule["advice"], backend=found["backend"], subsystem=found["subsystem"],
                 number=found["bisect_number"], what=found.get("debug_info") or "")
    return {**result, "conclusion": rule["conclusion"], "layer": LAYER_OF_STEP.get(found["backend"], found["backend"]),
            "located": True, "rule": "bisected", "evidence": evidence, "next_action": advice}


def _foreign_result(result: dict, foreign: list[dict]) -> dict:
    """The failure goes away without the Inductor table entries defined outside torch: they are its cause."""
    rule = _knowledge()["experiments"]["foreign-entry"]
    first = foreign[0]
    where = {"file": first["file"], "line": first["line"]}
    evidence = {**result["evidence"], "operator": first["op"], "foreign": foreign,
                "registered_at": _with_code(where)}
    advice = Msg(rule["advice"], table=first["table"], operator=first["op"], file=first["file"], line=first["line"])
    return {**result, "conclusion": rule["conclusion"], "layer": rule["layer"], "located": True,
            "rule": "foreign-entry", "evidence": evidence, "next_action": advice}


def _event_result(result: dict, finding: dict, ev: dict) -> dict:
    """A run that finishes but whose logs show graph breaks or recompiles: a finding about its graphs."""
    where = _with_code(finding["user_line"])
    gb = registry_entry(finding["gb_id"]) if finding.get("gb_id") else None
    evidence = {"step": "as-is", "exception": None, "user_line": where,
                **({"guard": finding["guard"]} if finding.get("guard") else {})}
    return {**result, "conclusion": finding["conclusion"], "layer": finding["layer"], "located": None,
            "rule": finding["rule"], "evidence": evidence, "graph_break": gb, "next_action": finding["advice"],
            "failing_step": "as-is", "runs": True}


def _same_failure(a: Step, b: Step) -> bool:
    if a.status == "timeout" or b.status == "timeout":
        return a.status == b.status
    return bool(a.exception and b.exception and a.exception["type"] == b.exception["type"])


def _result(script, args, steps, failing, verdict, rule, caught, ladder_layer) -> dict:
    base = {"script": str(script), "args": args,
            "steps": [{"step": s.name, "status": s.status, "seconds": s.seconds, "exit_code": s.exit_code,
                       "exception": _short(s.exception), "log": s.log} for s in steps]}
    if verdict == "clean":
        return {**base, "conclusion": "clean", "layer": None, "located": None, "rule": None, "evidence": {},
                "graph_break": None, "next_action": Msg(N_("Nothing to fix: the script runs to the end as it is, "
                                                           "without graph breaks or recompiles.")), "runs": True}
    exc = failing.exception
    where = _with_code(user_line(exc, script)) if exc else None
    evidence = {"step": failing.name, "exception": _short(exc), "user_line": where, **caught}
    if failing.status == "timeout":
        conclusion = "user_code" if failing.name == "no-compile" else "framework_bug"
        layer = ladder_layer
        advice = (Msg(N_("The script did not finish within the time limit at step {step} (without compiling too): "
                         "the hang is in the script itself."), step=failing.name) if failing.name == "no-compile"
                  else Msg(N_("The script did not finish within the time limit at step {step}; it finishes without "
                              "compiling: a compile-time or compiled-code hang in {layer}. Rerun with "
                              "TORCH_LOGS=+dynamo,graph_breaks to see where it stops."),
                           step=failing.name, layer=ladder_layer))
        rule_id, located = "timeout", False
    elif rule is not None:
        conclusion = rule["conclusion"]
        layer = rule["layer"] or ladder_layer
        advice, rule_id, located = _advice(rule, caught), rule["id"], None
        if conclusion == "framework_bug":
            located = True
    else:  # a failure in a layer no rule explains: the framework, found at the ladder's step
        conclusion, layer, rule_id = "framework_bug", ladder_layer, None
        frame = framework_frame(exc) if exc else None
        located = frame is not None
        if frame:
            evidence["framework_frame"] = frame
        advice = Msg(N_("It fails first at step {step} ({layer}) with an error no known signature explains: report "
                        "it with repro.py; until then run with backend '{backend}', which works."),
                     step=failing.name, layer=ladder_layer, backend=_last_passing(failing.name))
    if conclusion == "framework_bug" and failing.name == "no-compile":
        conclusion = "user_code"
    return {**base, "conclusion": conclusion, "layer": layer, "located": located if conclusion == "framework_bug"
            else None, "rule": rule_id, "evidence": evidence, "graph_break": graph_break(exc),
            "next_action": advice, "failing_step": failing.name, "runs": False}


def _advice(rule: dict, caught: dict) -> Msg:
    """A signature's advice, naming what it may: the operator (and its bare name), the module, the setting. (A
    torch_npu signature's advice comes complete.)"""
    if isinstance(rule["advice"], Msg):
        return rule["advice"]
    return Msg(rule["advice"], operator=caught.get("operator", "the operator"),
               name=caught.get("operator", "op").split("::")[-1].split(".")[0],
               module=caught.get("module", "the module"), setting=caught.get("setting", ""))


def _with_code(where: dict | None) -> dict | None:
    """A user line with its source text."""
    return {**where, "code": _line_text(where)} if where else None


def _last_passing(step: str) -> str:
    order = list(LADDER)
    return order[order.index(step) - 1] if step in order and order.index(step) > 0 else "eager"


def _short(exc: dict | None) -> dict | None:
    """The exception as the result shows it: its type and the first lines of its message."""
    if not exc:
        return None
    lines = exc["message"].strip().splitlines()
    return {"type": exc["type"], "message": "\n".join(lines[:6]), "cause": exc.get("cause")}


# where a failure surfaced, by the package of its innermost torch frame or its exception's module
LAYER_OF_PACKAGE = (("torch/_subclasses/fake", "fake"), ("torch/_library", "fake"), ("torch/_meta", "fake"),
                    ("torch/_inductor", "inductor"), ("torch/_functorch", "aot_autograd"),
                    ("torch/_decomp", "aot_autograd"), ("torch/_dynamo", "dynamo"), ("torch/fx", "dynamo"))


def layer_of(exception: dict) -> str | None:
    frame = framework_frame(exception)
    where = (frame or {}).get("file", "") + " " + exception.get("type", "").replace(".", "/")
    return next((layer for pkg, layer in LAYER_OF_PACKAGE if pkg in where), None)


def conclude_log(ev: dict, source: str) -> dict:
    """The conclusion from a log alone: its first causal error by signature (the layer by the rule, else by
    the package it surfaced in), else what its graph breaks and recompiles amount to, else clean."""
    base = {"source": source, "events": ev, "steps": [], "failing_step": None}
    exc = ev.get("error")
    if exc is None:
        finding = event_finding(ev)
        clean = {**base, "conclusion": "clean", "layer": None, "located": None, "rule": None, "evidence": {},
                 "graph_break": None, "next_action": Msg(N_("Nothing to fix in this log: no error, and no graph "
                                                            "breaks or recompiles that make a finding.")), "runs": True}
        if not finding:
            return clean
        found = _event_result(clean, finding, ev)
        return {**found, "failing_step": None, "evidence": {**found["evidence"], "step": None}}
    rule, caught = match_signature(exc)
    where = _with_code(user_line(exc))
    evidence = {"step": None, "exception": _short(exc), "user_line": where, **caught}
    if rule is not None:
        return {**base, "conclusion": rule["conclusion"], "layer": rule["layer"] or layer_of(exc), "located": None,
                "rule": rule["id"], "evidence": evidence, "graph_break": graph_break(exc),
                "next_action": _advice(rule, caught), "runs": False}
    frame = framework_frame(exc)
    if frame:
        evidence["framework_frame"] = frame
    layer = layer_of(exc)
    return {**base, "conclusion": "framework_bug" if layer else "user_code", "layer": layer or "user",
            "located": frame is not None if layer else None, "rule": None, "evidence": evidence,
            "graph_break": graph_break(exc), "runs": False,
            "next_action": Msg(N_("The first error surfaced in {layer} and no known signature explains it: run "
                                  "`opforge graph diagnose` on the script for the backend ladder, and report it with "
                                  "the log."), layer=layer) if layer
            else Msg(N_("The first error is raised by the user's code: fix it there."))}
