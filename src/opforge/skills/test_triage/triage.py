"""`opforge test-triage run`: device-generic tests on a backend, in shards; failures rerun, their CPU twins run,
clustered and classified.

  collect   one pytest process imports the backend, checks the device and lists the tests (with the OpInfo,
            dtype and CPU twin of each device-type test)
  run       the device's tests in shards (shards.py), here or on Ray
  confirm   each failed test rerun `reruns` times (a pass makes it flaky) and its CPU twin run once (a CPU
            failure makes it upstream's)
  cluster   cluster.py, rules.yaml
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from opforge.errors import InputError
from opforge.skills.test_triage import shards as sh
from opforge.skills.test_triage.cluster import Facts, clusters, representatives

SUITES = {"ops": Path(__file__).parent / "suites" / "ops.py",
          "modules": Path(__file__).parent / "suites" / "modules.py",
          "collectives": Path(__file__).parent / "suites" / "collectives.py"}
FAILED = ("failed", "error")
REPRESENTATIVES = 5  # tests of a cluster rerun and run on the CPU


def suite_file(suite: str) -> Path:
    if suite in SUITES:
        return SUITES[suite]
    path = Path(suite)
    if not path.is_file() or path.suffix != ".py":
        raise InputError("--suite", f"{suite!r} is neither a suite ({', '.join(SUITES)}) nor a Python test file")
    return path.resolve()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip() and not line.startswith("=")]
    errors = [line for line in lines if line.startswith("E ")]
    return (errors[-1][2:].strip() if errors else lines[-1] if lines else "")[:300]


def collect(file: Path, env: dict[str, str]) -> list[dict]:
    """Every test the file defines for this configuration, described (plugin.describe). Bad input (a module
    that does not import, an unknown device, a file that does not import) raises InputError."""
    with tempfile.TemporaryDirectory(prefix="opforge-collect-") as tmp:
        record = Path(tmp) / "collect.jsonl"
        penv = {**os.environ, **env, "OPFORGE_TRIAGE_RECORD": str(record), "OPFORGE_TRIAGE_COLLECT": "1"}
        proc = subprocess.run(sh.pytest_command(str(file)), env=penv, cwd=file.parent, capture_output=True,
                              text=True, timeout=900)
        entries = sh._read(record)
    for e in entries:
        if e["event"] == "import_error":
            raise InputError("--import", f"{e['module']} does not import: {e['error'][:300]}")
        if e["event"] == "device_error":
            raise InputError("--device", e["error"])
        if e["event"] == "collect_error":
            raise InputError(str(file), f"does not import: {_last_line(e['text'])}")
    found = [e for e in entries if e["event"] == "collected"]
    if not found and proc.returncode not in (0, 5):
        raise InputError(str(file), f"pytest could not collect it: {_last_line(proc.stdout + proc.stderr)}")
    return found


def _execute(shard_list, executor, workers, address, done):
    if executor == "ray":
        return sh.run_ray(shard_list, workers, address, done=done)
    return sh.run_local(shard_list, workers, done=done)


def run(*, device: str, imports: list[str], suite: str = "ops", ops: str = "", dtypes: str = "",
        executor: str = "local", workers: int = 2, address: str | None = None, reruns: int = 2,
        timeout: float = 120.0, shard_size: int | None = None, progress=None) -> dict:
    """Runs the triage and returns its result (report.write puts it on disk). `progress(advance, total, what)`
    hears of each shard as it ends."""
    if executor not in ("local", "ray"):
        raise InputError("--executor", f"{executor!r} is not one of local, ray")
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        raise InputError("--executor", "ray is not installed here (pip install 'opforge[ray]')")
    if workers < 1:
        raise InputError("--workers", f"{workers} is not a positive number")
    file = suite_file(suite)
    env = {"OPFORGE_TRIAGE_DEVICE": device, "OPFORGE_TRIAGE_IMPORT": ",".join(imports),
           "OPFORGE_TRIAGE_OPS": ops, "OPFORGE_TRIAGE_DTYPES": dtypes}
    # shards side by side each take their share of the cores, not a thread a core each
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // workers))
    # a multi-process test times its ranks out itself, before the watchdog kills the shard: a classified hang
    env["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(max(5, int(timeout * 0.75)))
    start = time.monotonic()
    collected = collect(file, env)
    phases = {"collect": time.monotonic() - start}
    infos = {c["test"]: c for c in collected}
    generic = any(c["device"] for c in collected)
    tests = [c["test"] for c in collected if c["device"] == device] if generic else [c["test"] for c in collected]
    if not tests:
        what = f"ops {ops!r}" if ops else "this selection"
        raise InputError("--ops" if ops else "--suite", f"{what} selects no test for device {device!r} "
                                                         f"in {file.name} ({len(collected)} collected)")

    def shard_list(groups, junit=True, with_env=None):
        return [sh.Shard(i, g, str(file), with_env or env, timeout, junit) for i, g in enumerate(groups)]

    def tick(what, total):
        def done(r):
            if progress:
                progress(len(r["results"]), total, what)
        return done

    main = _execute(shard_list(sh.split(tests, sh.shard_count(len(tests), workers, shard_size))), executor,
                    workers, address, tick("tests", len(tests)))
    phases["run"] = time.monotonic() - start - sum(phases.values())
    results = {r["test"]: r for s in main for r in s["results"]}
    for t in tests:  # a shard lost whole (its Ray task died) still answers for each of its tests
        if t not in results:
            results[t] = {"event": "result", "test": t, "outcome": "error", "exception": "ShardLost",
                          "message": "its shard ended without a result for it", "frames": [], "duration": 0.0}
    failures = [results[t] for t in tests if results[t]["outcome"] in FAILED]

    # confirm: the representatives of each cluster rerun `reruns` times (a pass makes the cluster flaky), and their
    # CPU twins run once in a process without the backend (all failing there makes the cluster upstream's: the
    # backend's imports may register kernels, a Meta one say, that the CPU would use too)
    reps = [t for c in clusters(failures, infos) for t in representatives(c["tests"], REPRESENTATIVES)]
    facts = {t: Facts() for t in reps}
    twin_of = {infos[t]["twin"]: t for t in reps if infos.get(t, {}).get("twin") in infos}
    cpu_env = {**env, "OPFORGE_TRIAGE_DEVICE": "cpu", "OPFORGE_TRIAGE_IMPORT": "",
               "OPFORGE_TRIAGE_OPS": ",".join(sorted({infos[t]["op"] for t in twin_of.values()})) or ops}
    batch = shard_list([g for _ in range(reruns) for g in sh.split(reps, workers)], junit=False)
    reran = len(batch)  # the shards after these run the CPU twins (whose node ids may be the tests' own)
    batch += shard_list(sh.split(sorted(twin_of), workers), junit=False, with_env=cpu_env)
    for i, shard in enumerate(batch):
        shard.index = i
    confirm = _execute(batch, executor, workers, address,
                       tick("reruns and CPU twins", sum(len(b.tests) for b in batch)))
    for s in confirm:
        for r in s["results"]:
            if s["index"] >= reran:
                facts[twin_of[r["test"]]].cpu_twin = r["outcome"]
            else:
                facts[r["test"]].reruns += 1
                facts[r["test"]].passed_on_rerun += r["outcome"] == "passed"
    phases["confirm"] = time.monotonic() - start - sum(phases.values())
    found = clusters(failures, infos, facts)
    counts = {}
    for t in tests:
        counts[results[t]["outcome"]] = counts.get(results[t]["outcome"], 0) + 1
    return {
        "device": device, "imports": imports, "suite": suite, "file": str(file), "ops": ops, "dtypes": dtypes,
        "executor": executor, "workers": workers, "reruns": reruns, "tests": len(tests), "counts": counts,
        "failed": len(failures), "clusters": found, "wall_s": round(time.monotonic() - start, 1),
        "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "shards": [{"index": s["index"], "tests": len(s["results"]), "processes": s["processes"],
                    "error": s.get("error")} for s in main],
        "results": [results[t] for t in tests], "infos": {t: infos[t] for t in tests},
        "junit": [x for s in main for x in s["junit"]],
        "facts": {t: vars(f) for t, f in facts.items()},
        "python": sys.version.split()[0],
    }


def dumps(result: dict) -> str:
    return json.dumps(result, indent=1)
