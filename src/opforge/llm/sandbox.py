"""Model-written code runs here: in a child process, in its own session, under a wall-clock limit, with the
environment stripped of credentials. opforge never imports it into its own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass

_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")


def clean_env(extra: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not any(w in k.upper() for w in _SECRET_WORDS)}
    env.update(extra or {})
    return env


@dataclass
class RunResult:
    returncode: int
    output: str
    timed_out: bool

    @property
    def last_line(self) -> str:
        lines = [ln for ln in self.output.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else ""


def run_python(args: list[str], cwd, timeout_s: float, extra_env: dict[str, str] | None = None,
               drop_env: tuple[str, ...] = ()) -> RunResult:
    """`python ARGS` in `cwd`; the whole process group is killed when the limit passes."""
    proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=clean_env(extra_env, drop_env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return RunResult(proc.returncode, out or "", False)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        return RunResult(-9, (out or "") + f"\n(killed after {timeout_s:g} s)", True)
