"""Tests in shards: each shard is a pytest process of its own, run here or as a Ray task, the same function both
ways so that the executors cannot disagree.

A shard's process appends each finished test to a record (plugin.py). If the process dies (a crash in the
backend, or the watchdog killing a test that stopped making progress), the shard keeps what was recorded, names
the test that started without ending as crashed or hung, and goes on with the tests after it in a new process:
one test's crash loses no other result.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PLUGIN = "opforge.skills.test_triage.plugin"


@dataclass
class Shard:
    index: int
    tests: list[str]
    file: str  # the test file, absolute
    env: dict[str, str] = field(default_factory=dict)  # laid over the worker's environment
    timeout: float = 120.0  # a test making no progress this long is killed
    junit: bool = True


def pytest_command(file: str, junit: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN, "--tb=short",
           "-o", "addopts=", "--rootdir", str(Path(file).parent), file]
    return cmd + ([f"--junitxml={junit}"] if junit else [])


def _read(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the line a dying process was writing
            pass
    return out


def _run_process(cmd, env, cwd, record: Path, timeout: float) -> tuple[int | None, str, str]:
    """Runs one pytest process; kills its process group when the record has not grown for `timeout` seconds.
    Returns (exit code or None when killed, how it ended, its output's tail)."""
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        size, last = -1, time.monotonic()
        while proc.poll() is None:
            time.sleep(0.2)
            now_size = record.stat().st_size if record.is_file() else 0
            if now_size != size:
                size, last = now_size, time.monotonic()
            elif time.monotonic() - last > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                log.seek(0)
                return None, f"made no progress in {timeout:g} s and was killed", log.read()[-4000:]
        log.seek(0)
        rc = proc.returncode
        how = f"was killed by signal {-rc} ({signal.Signals(-rc).name})" if rc < 0 else f"exited with {rc}"
        return rc, how, log.read()[-4000:]


def run_shard(shard: Shard) -> dict:
    """Runs a shard's tests to the end, through crashes. Returns {"index", "results": [per test], "junit": [xml
    text per process], "processes": [how each ended], "log": output tail}. Results are JSON-ready."""
    env = {**os.environ, **shard.env}
    results: dict[str, dict] = {}
    junits, processes, log = [], [], ""
    remaining = list(shard.tests)
    with tempfile.TemporaryDirectory(prefix="opforge-shard-") as tmp:
        attempt = 0
        while remaining:
            attempt += 1
            record, select = Path(tmp) / f"record{attempt}.jsonl", Path(tmp) / f"select{attempt}.txt"
            junit = Path(tmp) / f"junit{attempt}.xml" if shard.junit else None
            select.write_text("\n".join(remaining) + "\n", encoding="utf-8")
            penv = {**env, "OPFORGE_TRIAGE_RECORD": str(record), "OPFORGE_TRIAGE_SELECT": str(select)}
            rc, how, log = _run_process(pytest_command(shard.file, str(junit) if junit else None), penv,
                                        str(Path(shard.file).parent), record, shard.timeout)
            processes.append(how)
            entries = _read(record)
            if junit is not None and junit.is_file():
                junits.append(junit.read_text(encoding="utf-8"))
            started = None
            for e in entries:
                if e["event"] == "start":
                    started = e["test"]
                elif e["event"] == "result":
                    results[e["test"]] = e
                    started = None if started == e["test"] else started
                elif e["event"] in ("import_error", "device_error", "collect_error"):
                    return {"index": shard.index, "results": list(results.values()), "junit": junits,
                            "processes": processes, "log": log, "error": e}
            done = [t for t in remaining if t in results]
            if started is not None and started not in results:
                hung = rc is None
                results[started] = {"event": "result", "test": started, "outcome": "failed",
                                    "exception": "Timeout" if hung else "Crash",
                                    "message": f"the test's process {how}", "frames": [], "duration": 0.0,
                                    "text": log}
                done.append(started)
            if not done:  # the process ended before any selected test ran: nothing more will
                for t in remaining:
                    results[t] = {"event": "result", "test": t, "outcome": "error", "exception": "NotRun",
                                  "message": f"the shard's process {how} before the test ran", "frames": [],
                                  "duration": 0.0, "text": log}
                break
            remaining = [t for t in remaining if t not in results]
    return {"index": shard.index, "results": [results[t] for t in shard.tests if t in results], "junit": junits,
            "processes": processes, "log": log}


def split(tests: Sequence[str], shards: int) -> list[list[str]]:
    """Tests dealt round-robin into at most `shards` shards (fewer where there are fewer tests)."""
    n = max(1, min(shards, len(tests)))
    return [list(tests[i::n]) for i in range(n)] if tests else []


def shard_count(tests: int, workers: int, shard_size: int | None = None) -> int:
    """Two shards a worker, so that a slow shard does not hold the end of the run alone, but none under 50
    tests: each process pays about five seconds to import torch, the backend and op_db before its first test."""
    if shard_size:
        return max(1, -(-tests // shard_size))
    return max(1, min(2 * workers, tests // 50))


def run_local(shards: list[Shard], workers: int, done: Callable[[dict], None] | None = None) -> list[dict]:
    from concurrent.futures import ThreadPoolExecutor, as_completed

    out = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_shard, s) for s in shards]
        for f in as_completed(futures):
            out.append(f.result())
            if done:
                done(out[-1])
    return sorted(out, key=lambda r: r["index"])


def run_ray(shards: list[Shard], workers: int, address: str | None = None,
            done: Callable[[dict], None] | None = None) -> list[dict]:
    """Each shard a Ray task (one CPU each). Without `address` a local Ray is started for the run and stopped
    after it; with one, the tasks go to that cluster, whose nodes need this package and the backend."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR")
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(run_shard)
        pending = {task.remote(s): s.index for s in shards}
        out = []
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                index = pending.pop(ref)
                try:
                    out.append(ray.get(ref))
                except Exception as e:  # the task itself died (its node, its worker): that shard is reported
                    out.append({"index": index, "results": [], "junit": [], "processes": [],
                                "log": "", "error": {"event": "task_error", "error": f"{type(e).__name__}: {e}"}})
                if done:
                    done(out[-1])
        return sorted(out, key=lambda r: r["index"])
    finally:
        if started:
            ray.shutdown()
