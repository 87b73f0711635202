"""`opforge op-test run`: run an adaptation's tests with pytest, rerun each failure, give each a verdict."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from opforge.errors import InputError
from opforge.skills.op_test.verdict import judge, parse_failure

_DTYPES = re.compile(r"^DTYPES = \((?P<body>[^)]*)\)", re.M)


def adaptations(root: Path) -> dict[str, dict]:
    """Each adapted test file (relative to `root`) -> the files of its adaptation and its CHECKLIST dtypes."""
    out = {}
    for path in sorted((root / "adaptations").glob("*/checklist.json")):
        c = json.loads(path.read_text())
        by_class = {f["class"]: f["path"] for f in c.get("files", [])}
        test = by_class.get("test (op-test)")
        if test:
            out[test] = {"kernel": by_class.get("C++ kernel", ""), "yaml": by_class.get("registration yaml", ""),
                         "test": test, "dtypes": c["dtypes"], "op": c["op"]}
    return out


def _test_dtypes(test_file: Path) -> list[str] | None:
    m = _DTYPES.search(test_file.read_text())
    return None if m is None else re.findall(r"torch\.(\w+)", m.group("body"))


def _pytest(args: list[str], root: Path, junit: Path) -> int:
    env = {**os.environ, "OPDEV_ROOT": str(root)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=long", f"--junitxml={junit}",
           "--rootdir", str(root), *args]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800).returncode


def _cases(junit: Path, root: Path):
    """(testcase, its failure or None, its file relative to root, its node id) for each test in the report."""
    for case in ET.parse(junit).getroot().iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        # junit's classname is the module's dotted path, then the class if the test is a method
        parts = case.get("classname", "").split(".")
        for cut in (len(parts), len(parts) - 1):
            file = "/".join(parts[:cut]) + ".py"
            if (root / file).is_file():
                owner = parts[cut:]
                break
        else:
            file, owner = "/".join(parts) + ".py", []
        yield case, problem, file, "::".join([file, *owner, case.get("name")])


def run(root: Path, targets: list[str] | None = None, *, reruns: int = 2, progress=None) -> dict:
    """Run the tests under `root/tests` (or `targets`, relative to root); every failure is rerun `reruns` times
    alone and judged. Returns counts and one verdict per failure."""
    root = root.resolve()
    if not (root / "tests").is_dir() and not targets:
        raise InputError(str(root), "has no tests/ folder: adapt an operator into it first")
    known = adaptations(root)
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "report.xml"
        _pytest(targets or ["tests"], root, junit)
        if not junit.is_file():
            raise InputError(str(root), "pytest wrote no report (collection failed before any test ran)")
        cases = list(_cases(junit, root))
        failures = [c for c in cases if c[1] is not None]
        verdicts = []
        for i, (case, problem, file, nodeid) in enumerate(failures):
            if progress:
                progress(i, len(failures), nodeid)
            failure = parse_failure(nodeid, problem.get("message") or "", problem.text or "")
            passed = False
            for _ in range(reruns):
                again = Path(tmp) / "again.xml"
                if _pytest([nodeid], root, again) == 0:
                    passed = True
                    break
            info = known.get(file, {"kernel": "", "yaml": "", "test": file, "dtypes": None})
            test_dtypes = _test_dtypes(root / file) if (root / file).is_file() else None
            differ = info["dtypes"] is not None and test_dtypes is not None and test_dtypes != info["dtypes"]
            v = judge(failure, passed_on_rerun=passed, test_file=file,
                      files={k: info[k] for k in ("kernel", "yaml", "test")}, dtypes_differ=differ)
            verdicts.append({"test": nodeid, **v})
    return {"root": str(root), "tests": len(cases), "failed": len(failures),
            "passed": len(cases) - len(failures) - sum(1 for c, *_ in cases if c.find("skipped") is not None),
            "verdicts": verdicts}
