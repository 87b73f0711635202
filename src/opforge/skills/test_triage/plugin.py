"""The pytest plugin every test-triage process loads (`-p opforge.skills.test_triage.plugin`).

It imports the backend before any test module (torch.testing's device-type tests list the backends present when
they are first imported), keeps the tests a shard was given, and appends one JSON line per test to a record as the
test ends: a process that dies mid-shard leaves every finished test's result behind, and the test it died in is
the one that started without ending. Its environment:

  OPFORGE_TRIAGE_IMPORT   modules to import first, comma-separated
  OPFORGE_TRIAGE_DEVICE   the device under triage: a process where torch does not know it stops at once
  OPFORGE_TRIAGE_RECORD   the JSON-lines file to append to
  OPFORGE_TRIAGE_SELECT   a file of node ids, one a line: the tests to keep (all when unset)
  OPFORGE_TRIAGE_COLLECT  when set, collection only: each test's description is recorded and none runs
"""
from __future__ import annotations

import importlib
import json
import os
import re
import traceback

import pytest

_TEXT_LIMIT = 6000


def _append(entry: dict) -> None:
    path = os.environ.get("OPFORGE_TRIAGE_RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()


def pytest_configure(config) -> None:
    for name in filter(None, os.environ.get("OPFORGE_TRIAGE_IMPORT", "").split(",")):
        try:
            importlib.import_module(name)
        except BaseException as e:  # a backend that does not load is the run's answer, not a traceback
            _append({"event": "import_error", "module": name, "error": f"{type(e).__name__}: {e}".strip()})
            pytest.exit(f"--import {name}: {type(e).__name__}: {e}", returncode=3)
    device = os.environ.get("OPFORGE_TRIAGE_DEVICE")
    if device:
        import torch

        known = {"cpu", *(["cuda"] if torch.cuda.is_available() else [])}
        if hasattr(torch, torch._C._get_privateuse1_backend_name()):
            known.add(torch._C._get_privateuse1_backend_name())
        if device not in known:
            _append({"event": "device_error", "error": f"no device {device!r} here (the devices torch knows: "
                                                       f"{', '.join(sorted(known))})"})
            pytest.exit(f"no device {device!r}", returncode=3)


def describe(item) -> dict:
    """A test's node id with what its name says under device-type instantiation: the device, the generic test
    (class.method, as upstream's skips name it), the OpInfo and dtype, and its CPU twin's node id."""
    out = {"test": item.nodeid, "device": None, "generic": None, "op": None, "dtype": None, "twin": None}
    cls, generic = getattr(item, "cls", None), getattr(getattr(item, "function", None), "__wrapped__", None)
    suite_op = getattr(getattr(item, "function", None), "opforge_op", None)
    if suite_op is not None:  # a suite of ours that runs one class on whichever device it is given
        out.update(device=cls.opforge_device, generic=f"{cls.__name__}.{item.name}", op=suite_op,
                   dtype=item.function.opforge_dtype, twin=item.nodeid if cls.opforge_device != "cpu" else None)
        return out
    device = getattr(cls, "device_type", None)
    if device is None or generic is None or "." not in generic.__qualname__:
        return out
    generic_cls, method = generic.__qualname__.split(".")[0], generic.__name__
    m = re.fullmatch(rf"(?:_(?P<op>.+?))?_{re.escape(device)}(?:_(?P<dtype>[a-z]+\d*))?", item.name[len(method):])
    if not cls.__name__.startswith(generic_cls) or not item.name.startswith(method) or m is None:
        return out
    twin = None
    if device != "cpu":
        twin_name = method + (f"_{m.group('op')}" if m.group("op") else "") + "_cpu" + \
            (f"_{m.group('dtype')}" if m.group("dtype") else "")
        twin = "::".join([*item.nodeid.split("::")[:-2], generic_cls + "CPU", twin_name])
    op = m.group("op") and re.sub(r"_(train|eval)_mode$", "", m.group("op"))  # a ModuleInfo's two modes: one module
    out.update(device=device, generic=f"{generic_cls}.{method}", op=op, dtype=m.group("dtype"), twin=twin)
    return out


def pytest_collection_modifyitems(session, config, items) -> None:
    select = os.environ.get("OPFORGE_TRIAGE_SELECT")
    if select:
        with open(select, encoding="utf-8") as f:
            wanted = [line.strip() for line in f if line.strip()]
        by_id = {item.nodeid: item for item in items}
        items[:] = [by_id[t] for t in wanted if t in by_id]
    if os.environ.get("OPFORGE_TRIAGE_COLLECT"):
        for item in items:
            _append({"event": "collected", **describe(item)})
        items[:] = []


def pytest_collectreport(report) -> None:
    if report.failed:
        _append({"event": "collect_error", "where": report.nodeid, "text": str(report.longrepr)[-_TEXT_LIMIT:]})


def pytest_runtest_logstart(nodeid, location) -> None:
    _append({"event": "start", "test": nodeid})


def _root_cause(exc: BaseException) -> BaseException:
    """The first exception of a chain: device-type tests re-raise a sample's failure as a plain Exception."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if cause is None:
            break
        exc = cause
    return exc


_RANK_FAILED = re.compile(r"Process (?P<rank>\d+) exited with error code \d+ and exception:\n(?P<tb>.*)", re.S)
_RANK_TIMED_OUT = re.compile(r"Process \d+ terminated or timed out after [\d.]+ seconds")
_TB_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)', re.M)
_TB_LAST = re.compile(r"^(?P<exc>[A-Za-z_][\w.]*)(?:: (?P<msg>.*))?$")


def _rank_cause(message: str) -> dict | None:
    """A multi-process test's failure is the main process's RuntimeError quoting a rank's traceback (or saying
    that a rank timed out): the rank's own exception is the cause."""
    if _RANK_TIMED_OUT.search(message):
        return {"exception": "Timeout", "message": _RANK_TIMED_OUT.search(message).group(0), "frames": []}
    m = _RANK_FAILED.search(message)
    if m is None:
        return None
    lines = m.group("tb").split("\n")
    frames = [[f.group("file"), int(f.group("line")), f.group("func")] for f in _TB_FRAME.finditer(m.group("tb"))]
    # the exception line is the first after the last frame's source line that is not indented
    last = max((i for i, line in enumerate(lines) if _TB_FRAME.match(line)), default=0)
    for i in range(last + 1, len(lines)):
        head = _TB_LAST.match(lines[i])
        if head and not lines[i].startswith(" "):
            text = "\n".join([head.group("msg") or "", *lines[i + 1:]]).strip()
            text = text.split("\n\nTo execute this test")[0]
            return {"exception": head.group("exc").rsplit(".", 1)[-1], "message": text[:_TEXT_LIMIT],
                    "frames": frames, "rank": int(m.group("rank"))}
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.excinfo is not None and report.failed:
        root = _root_cause(call.excinfo.value)
        frames = traceback.extract_tb(root.__traceback__)
        report.opforge_cause = {
            "exception": type(root).__name__,
            "message": str(root)[:_TEXT_LIMIT],
            "frames": [[f.filename, f.lineno, f.name] for f in frames],
        }
        rank = _rank_cause(str(root)) if isinstance(root, RuntimeError) else None
        if rank:
            report.opforge_cause.update(rank)
        sample = re.search(r"Caused by sample input at index (\d+)", str(call.excinfo.value))
        if sample:  # the @ops wrapper names the OpInfo sample that failed
            report.opforge_cause["sample"] = int(sample.group(1))
    return report


_RESULT: dict[str, dict] = {}


def pytest_runtest_logreport(report) -> None:
    """A test's outcome is its worst phase's: an error in setup or teardown, a failure of its call."""
    entry = _RESULT.setdefault(report.nodeid, {"event": "result", "test": report.nodeid, "outcome": "passed",
                                               "duration": 0.0})
    entry["duration"] += report.duration
    if hasattr(report, "wasxfail"):
        entry["outcome"] = "xfailed" if report.skipped else "xpassed"
    elif report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
        entry.update(getattr(report, "opforge_cause", {}) or {"exception": "Failed", "message": "", "frames": []})
        entry["text"] = str(report.longrepr)[-_TEXT_LIMIT:]
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        entry["message"] = reason.removeprefix("Skipped: ")[:500]
    if report.when == "teardown":
        _append(_RESULT.pop(report.nodeid))
