"""The persistence layer: state file, atomic writes, workspace lock, event log, snapshots."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from opforge.errors import InputError
from opforge.orchestrator.history import HISTORY_DIR, latest_snapshot, list_snapshots, restore, snapshot
from opforge.orchestrator.state import (
    RETRY_BUDGET,
    STAGES,
    STATE_FILE,
    BudgetExceeded,
    State,
    load_state,
    save_state,
)
from opforge.workspace.atomic import (
    LOCK_FILE,
    sha256_file,
    workspace_lock,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)
from opforge.workspace.events import EVENTS_FILE, log_event, read_events

# -- state ---------------------------------------------------------------------------------------------------


def _busy_state() -> State:
    st = State.new("rmsnorm", "/tmp/req", options={"deterministic": False})
    st.begin(1)
    st.complete(1, {"SPEC.md": "a" * 64, "spec.json": "b" * 64})
    st.freeze_spec("a" * 64)
    st.begin(2)
    st.fail(2, "no such API")
    st.begin(2)
    st.complete(2, {"api_report.json": "c" * 64})
    st.skip(3, "golden supplied")
    st.perf["rounds"] = 2
    st.perf["history"].append({"round": 1, "us": 12.5})
    st.set_terminal("BLOCKED_DESIGN", "no tiling fits")
    return st


def test_round_trip(tmp_path):
    st = _busy_state()
    save_state(tmp_path, st)
    loaded = load_state(tmp_path)
    assert loaded == st
    assert loaded.stages[2].attempts == 2 and loaded.stages[2].status == "completed"
    assert loaded.stages[3].status == "skipped" and loaded.stages[3].reason == "golden supplied"
    assert loaded.terminal == {"status": "BLOCKED_DESIGN", "reason": "no tiling fits"}
    assert loaded.options == {"deterministic": False}
    raw = json.loads((tmp_path / STATE_FILE).read_text())
    assert sorted(raw["stages"]) == [str(k) for k in STAGES]
    assert (tmp_path / STATE_FILE).read_text().endswith("}\n")


def test_next_stage_and_budget():
    st = State.new("op", "req")
    assert st.next_stage() == 1
    for k in STAGES:
        st.begin(k)
        st.complete(k, {})
    assert st.next_stage() is None
    assert st.budget_left(1) == RETRY_BUDGET[1] - 1
    st.perf["rounds"] = 4
    assert st.budget_left(7) == RETRY_BUDGET[7] - 4
    st.reset_from(4, reason="design rejected")
    assert st.next_stage() == 4 and st.current_stage == 4
    assert st.stages[3].status == "completed" and st.stages[5].attempts == 0 and st.stages[5].artifacts == {}
    assert st.perf["rounds"] == 0 and st.rollbacks[-1]["to_stage"] == 4


def test_a_performance_stage_that_keeps_crashing_runs_out_of_attempts():
    """Stage 7's budget is its tuning rounds; a stage that fails before any round must still run out."""
    st = State.new("op", "req")
    for _ in range(RETRY_BUDGET[7]):
        assert st.budget_left(7) > 0
        st.begin(7)
        st.fail(7, "RuntimeError: a crash before the first round")
    assert st.perf["rounds"] == 0 and st.budget_left(7) == 0


@pytest.mark.parametrize("stage, budget", [(1, 3), (5, 5)])
def test_budget_exceeded(stage, budget):
    st = State.new("op", "req")
    for _ in range(budget):
        st.begin(stage)
        st.fail(stage, "nope")
    assert st.budget_left(stage) == 0
    with pytest.raises(BudgetExceeded):
        st.begin(stage)
    assert st.stages[stage].attempts == budget and st.stages[stage].status == "failed"


def test_set_terminal_validates():
    st = State.new("op", "req")
    with pytest.raises(ValueError):
        st.set_terminal("BLOCKED_NOTHING", "x")
    assert st.terminal is None


def test_spec_frozen_and_amend_resets_later_stages():
    st = State.new("op", "req")
    for k in range(1, 5):
        st.begin(k)
        st.complete(k, {f"f{k}": "0" * 64})
    st.freeze_spec("h1")
    st.freeze_spec("h1")  # same hash: fine
    with pytest.raises(RuntimeError):
        st.freeze_spec("h2")
    assert st.spec_hash == "h1"
    st.set_terminal("BLOCKED_DESIGN", "x")
    st.amend_spec("h2", reason="user widened dtypes")
    assert st.spec_hash == "h2"
    assert st.stages[1].status == "completed"
    for k in range(2, 8):
        assert st.stages[k].status == "pending" and st.stages[k].attempts == 0 and not st.stages[k].artifacts
    assert st.terminal is None and st.next_stage() == 2
    assert st.rollbacks[-1]["to_stage"] == 2 and st.rollbacks[-1]["reason"] == "user widened dtypes"


def _write_raw(tmp_path, data: bytes) -> bytes:
    (tmp_path / STATE_FILE).write_bytes(data)
    return data


def _broken_key(d, key_path, value=KeyError):
    node = d
    *parents, last = key_path
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return d


def test_missing_state_file(tmp_path):
    with pytest.raises(InputError) as ei:
        load_state(tmp_path)
    assert ei.value.where == str(tmp_path / STATE_FILE)
    assert "not an opforge workspace" in str(ei.value)
    assert not (tmp_path / STATE_FILE).exists()


@pytest.mark.parametrize("mutate, key", [
    (lambda d: _broken_key(d, ["op_name"]), "op_name"),
    (lambda d: _broken_key(d, ["stages", "3", "attempts"]), "stages.3.attempts"),
    (lambda d: _broken_key(d, ["stages", "6"]), "stages.6"),
    (lambda d: _broken_key(d, ["stages", "2", "status"], "done"), "stages.2.status"),
    (lambda d: _broken_key(d, ["stages", "8"], d["stages"]["1"]), "stages.8"),
    (lambda d: _broken_key(d, ["current_stage"], "3"), "current_stage"),
    (lambda d: _broken_key(d, ["current_stage"], 9), "current_stage"),
    (lambda d: _broken_key(d, ["stages", "1", "attempts"], True), "stages.1.attempts"),
    (lambda d: _broken_key(d, ["terminal"], {"status": "DONE", "reason": "x"}), "terminal.status"),
    (lambda d: _broken_key(d, ["perf", "history"]), "perf.history"),
    (lambda d: _broken_key(d, ["schema_version"], 99), "schema_version"),
])
def test_schema_violation_names_key_and_leaves_file(tmp_path, mutate, key):
    d = mutate(_busy_state().to_dict())
    before = _write_raw(tmp_path, json.dumps(d, indent=2).encode())
    with pytest.raises(InputError) as ei:
        load_state(tmp_path)
    msg = str(ei.value)
    assert ei.value.where == str(tmp_path / STATE_FILE)
    assert key in msg and "\n" not in msg
    assert (tmp_path / STATE_FILE).read_bytes() == before


def test_corrupt_and_truncated_json(tmp_path):
    good = json.dumps(_busy_state().to_dict(), indent=2).encode()
    for data in (b"{not json", good[: len(good) // 2], b""):
        before = _write_raw(tmp_path, data)
        with pytest.raises(InputError) as ei:
            load_state(tmp_path)
        assert ei.value.where == str(tmp_path / STATE_FILE)
        assert "invalid JSON at line" in str(ei.value) and "column" in str(ei.value)
        assert (tmp_path / STATE_FILE).read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == [STATE_FILE]


# -- atomic writes -------------------------------------------------------------------------------------------


def test_atomic_writers(tmp_path):
    write_bytes_atomic(tmp_path / "b", b"\x00\x01")
    write_text_atomic(tmp_path / "t", "héllo")
    write_json_atomic(tmp_path / "j", {"z": 1, "a": [1, 2]})
    assert (tmp_path / "b").read_bytes() == b"\x00\x01"
    assert (tmp_path / "t").read_text(encoding="utf-8") == "héllo"
    assert (tmp_path / "j").read_text() == '{\n  "z": 1,\n  "a": [\n    1,\n    2\n  ]\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "j", "t"]
    assert len(sha256_file(tmp_path / "b")) == 64


def test_atomic_write_failure_removes_temp(tmp_path):
    with pytest.raises(TypeError):
        write_json_atomic(tmp_path / "j", {"x": object()})
    assert list(tmp_path.iterdir()) == []
    write_text_atomic(tmp_path / "j", "old")

    with pytest.raises(TypeError):
        write_bytes_atomic(tmp_path / "j", "not bytes")  # type: ignore[arg-type]
    assert (tmp_path / "j").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["j"]


_WRITER = textwrap.dedent("""
    import sys
    from opforge.workspace.atomic import write_json_atomic
    path, i = sys.argv[1], 0
    write_json_atomic(path, {"i": i, "pad": ""})
    print("ready", flush=True)
    while True:
        i += 1
        write_json_atomic(path, {"i": i, "pad": "x" * ((i % 5) * 200_000)})
""")


def test_atomic_write_survives_sigkill(tmp_path):
    target = tmp_path / "target.json"
    rng = random.Random(1234)
    deadline = time.monotonic() + 60  # a guard against a hang, not a timing check
    seen = set()
    for _ in range(10):
        assert time.monotonic() < deadline, "kill rounds took too long"
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)], stdout=subprocess.PIPE)
        try:
            assert proc.stdout.readline().strip() == b"ready"
            time.sleep(rng.uniform(0.0, 0.08))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=5)
            proc.stdout.close()
        data = json.loads(target.read_text())
        assert isinstance(data["i"], int) and set(data["pad"]) <= {"x"}
        assert len(data["pad"]) == (data["i"] % 5) * 200_000
        seen.add(data["i"])
    assert max(seen) > 0  # the kills landed inside the write loop, not before it


# -- lock ----------------------------------------------------------------------------------------------------


def test_lock_refuses_second_holder_in_thread(tmp_path):
    errors = []

    def other():
        try:
            with workspace_lock(tmp_path):
                errors.append(None)
        except InputError as e:
            errors.append(e)

    with workspace_lock(tmp_path):
        t = threading.Thread(target=other)
        t.start()
        t.join(5)
    assert len(errors) == 1 and isinstance(errors[0], InputError)
    assert errors[0].where == str(tmp_path / LOCK_FILE)
    assert "another opforge process" in str(errors[0])
    with workspace_lock(tmp_path):  # released: free again
        pass


def test_lock_refuses_second_process(tmp_path):
    holder = textwrap.dedent("""
        import sys
        from opforge.workspace.atomic import workspace_lock
        with workspace_lock(sys.argv[1]):
            print("held", flush=True)
            sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"held"
        t0 = time.monotonic()
        with pytest.raises(InputError):
            with workspace_lock(tmp_path, timeout=0.2):
                pass
        assert time.monotonic() - t0 >= 0.15
    finally:
        proc.stdin.close()
        proc.wait(timeout=5)
        proc.stdout.close()
    with workspace_lock(tmp_path, timeout=2):
        pass


# -- events --------------------------------------------------------------------------------------------------


def test_events_survive_torn_last_line(tmp_path):
    log_event(tmp_path, "stage_begin", stage=1)
    log_event(tmp_path, "stage_done", stage=1, artifacts=["SPEC.md"])
    with open(tmp_path / EVENTS_FILE, "ab") as f:
        f.write(b'{"ts": "2024-01-01T00:00:00.000Z", "kind": "stage_be')
    ev = read_events(tmp_path)
    assert [e["kind"] for e in ev] == ["stage_begin", "stage_done"] and ev.skipped == 1
    assert ev[1]["artifacts"] == ["SPEC.md"] and ev[0]["ts"].endswith("Z") and len(ev[0]["ts"]) == 24
    # A write after the torn one starts on its own line and is not lost.
    log_event(tmp_path, "resume")
    ev = read_events(tmp_path)
    assert [e["kind"] for e in ev] == ["stage_begin", "stage_done", "resume"] and ev.skipped == 1


def test_events_empty(tmp_path):
    ev = read_events(tmp_path)
    assert ev == [] and ev.skipped == 0


# -- history -------------------------------------------------------------------------------------------------


def test_snapshot_restore_round_trip(tmp_path):
    (tmp_path / "DESIGN.md").write_text("v1 design")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "design.json").write_text('{"v": 1}')
    rel = snapshot(tmp_path, 4, ["DESIGN.md", "sub/design.json", "absent.txt"])
    assert rel.startswith(f"{HISTORY_DIR}/stage4_")
    manifest = json.loads((tmp_path / rel / "manifest.json").read_text())
    assert manifest["stage"] == 4 and set(manifest["files"]) == {"DESIGN.md", "sub/design.json"}
    (tmp_path / "DESIGN.md").write_text("v2 design")
    (tmp_path / "sub" / "design.json").unlink()
    restored = restore(tmp_path, rel)
    assert sorted(restored) == ["DESIGN.md", "sub/design.json"]
    assert (tmp_path / "DESIGN.md").read_text() == "v1 design"
    assert (tmp_path / "sub" / "design.json").read_text() == '{"v": 1}'
    second = snapshot(tmp_path, 4, ["DESIGN.md"])
    snapshot(tmp_path, 5, ["DESIGN.md"])
    assert [s["dir"] for s in list_snapshots(tmp_path)][:2] == [rel, second]
    assert latest_snapshot(tmp_path, 4)["dir"] == second
    assert latest_snapshot(tmp_path, 6) is None


def test_restore_detects_sha_mismatch(tmp_path):
    (tmp_path / "a.py").write_text("good")
    (tmp_path / "b.py").write_text("good b")
    rel = snapshot(tmp_path, 5, ["a.py", "b.py"])
    (tmp_path / rel / "b.py").write_text("tampered")
    (tmp_path / "a.py").write_text("current")
    with pytest.raises(InputError) as ei:
        restore(tmp_path, rel)
    assert ei.value.where.endswith(os.path.join(rel.split("/")[1], "b.py")) and "sha256" in str(ei.value)
    assert (tmp_path / "a.py").read_text() == "current"  # nothing was written before the check


def test_incomplete_snapshot_ignored(tmp_path):
    (tmp_path / "SPEC.md").write_text("spec")
    rel = snapshot(tmp_path, 1, ["SPEC.md"])
    broken = tmp_path / HISTORY_DIR / "stage1_29991231T235959999999"
    broken.mkdir()
    (broken / "SPEC.md").write_text("half")
    assert [s["dir"] for s in list_snapshots(tmp_path)] == [rel]
    assert latest_snapshot(tmp_path, 1)["dir"] == rel
    with pytest.raises(InputError):
        restore(tmp_path, f"{HISTORY_DIR}/{broken.name}")
    with pytest.raises(InputError):
        restore(tmp_path, "../outside")
