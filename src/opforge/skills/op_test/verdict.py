"""op-test's verdict on a failing test: `test_bug`, `adaptation_bug` (with the file to fix) or `environment`.

A failure that passes when rerun is `environment` whatever it said. A failure that repeats is matched against
RULES, in order, by what it raised and where: the first rule that matches names the verdict and the file.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from opforge.i18n import N_


@dataclass(frozen=True)
class Rule:
    id: str
    verdict: str  # test_bug | adaptation_bug | environment
    exception: str  # regex on the exception's type
    message: str  # regex on its message ("" matches any)
    where: str  # "test": the innermost frame is in the test file; "elsewhere"; "any"
    file: str  # the file to fix; {kernel}, {yaml}, {test}, {op} are filled from the adaptation
    why: str


# Rules as data, grouped by what they protect; the first match wins.
RULES = (
    # the test's own code is wrong: it fails before it reaches the operator, or expects what the CHECKLIST does not
    Rule("test-code-error", "test_bug", r"NameError|SyntaxError|IndentationError|AttributeError|TypeError|ImportError",
         "", "test", "{test}", N_("the test's own code raised before the operator's result was judged")),
    Rule("test-dtypes", "test_bug", r".*", "", "dtypes-differ", "{test}",
         N_("the test's dtype list differs from the CHECKLIST's")),
    # the environment: the backend was not built or could not load, the machine ran out of something
    Rule("backend-missing", "environment", r"ModuleNotFoundError|ImportError|OSError|BuildError",
         r"opforge|_opdev_C|opdev", "any", "", N_("the backend could not be built or loaded here")),
    Rule("resources", "environment", r"MemoryError|TimeoutError|Timeout|ConnectionError", "", "any", "",
         N_("the machine ran out of memory or time")),
    # the adaptation is wrong
    Rule("not-registered", "adaptation_bug", r"NotImplementedError",
         r"Could not run 'aten::\S+' with arguments from the '\w+' backend", "any", "{yaml}",
         N_("an operator the test reaches has no kernel registered for the device")),
    Rule("vendor-refused", "adaptation_bug", r"RuntimeError", r"vk\w+ failed with vendor status", "any", "{kernel}",
         N_("the kernel passed the vendor library something it refuses")),
    Rule("check-missing", "adaptation_bug", r"Failed", r"DID NOT RAISE", "any", "{kernel}",
         N_("a CHECKLIST constraint is not enforced by the kernel")),
    Rule("check-message", "adaptation_bug", r"AssertionError", r"Regex pattern did not match", "any", "{kernel}",
         N_("the kernel's check raises another message than the CHECKLIST's")),
    Rule("wrong-values", "adaptation_bug", r"AssertionError", r"not close|not equal|mismatch", "any", "{kernel}",
         N_("the device's result differs from the CPU's")),
    Rule("wrong-metadata", "adaptation_bug", r"AssertionError", "", "any", "{kernel}",
         N_("the device's result and the Meta result differ in shape, dtype, strides or device")),
    Rule("kernel-error", "adaptation_bug", r"RuntimeError", "", "any", "{kernel}",
         N_("the operator raised on the device")),
)

_LOCATION = re.compile(r"^(?P<file>[^\s:][^:]*\.py):(?P<line>\d+): (?P<exc>[\w.]+)", re.M)


@dataclass
class Failure:
    nodeid: str
    exception: str  # the exception's type, without its module
    message: str
    location: str  # file:line of the innermost frame pytest reported
    text: str  # pytest's report of it


def parse_failure(nodeid: str, message: str, text: str) -> Failure:
    """A failure from a junit-xml report: `message` is pytest's one-line summary, `text` the traceback."""
    locations = list(_LOCATION.finditer(text))
    last = locations[-1] if locations else None
    exc = (last.group("exc") if last else message.split(":", 1)[0]).rsplit(".", 1)[-1]
    msg = message.split(":", 1)[1].strip() if ":" in message else message
    where = f"{last.group('file')}:{last.group('line')}" if last else ""
    return Failure(nodeid, exc, msg, where, text)


def judge(failure: Failure, *, passed_on_rerun: bool, test_file: str, files: dict[str, str],
          dtypes_differ: bool = False) -> dict:
    """The verdict with its evidence. `files` maps {kernel}, {yaml}, {test} to the adaptation's files."""
    evidence = {"exception": failure.exception, "message": failure.message[:300], "location": failure.location}
    if passed_on_rerun:
        return {"verdict": "environment", "rule": "flaky", "file": None, "evidence": evidence,
                "why": N_("it failed, then passed when rerun unchanged")}
    in_test = bool(failure.location) and failure.location.rsplit(":", 1)[0].endswith(test_file.rsplit("/", 1)[-1])
    for rule in RULES:
        if rule.where == "dtypes-differ":
            if not dtypes_differ:
                continue
        elif rule.where == "test" and not in_test:
            continue
        if not re.fullmatch(rule.exception, failure.exception):
            continue
        haystack = failure.message + "\n" + failure.text
        if rule.message and not re.search(rule.message, haystack):
            continue
        return {"verdict": rule.verdict, "rule": rule.id, "file": rule.file.format(**files) or None,
                "evidence": evidence, "why": rule.why}
    return {"verdict": "adaptation_bug", "rule": "unmatched", "file": files.get("kernel"), "evidence": evidence,
            "why": N_("no rule matched; the operator is the first suspect")}
