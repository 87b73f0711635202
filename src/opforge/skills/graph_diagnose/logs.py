"""TORCH_LOGS text as structured events: graph breaks (with the user's line and the registry's GB id),
recompiles (with the guard that failed), the recompile limit, and the first causal error of a traceback.

A record is a run of lines with one glog header (`W1207 04:09:25.605000 6317 torch/_dynamo/x.py:1994] [0/8]
[__recompiles] ...`): the level, time, process, the logging site, the frame id, the artifact name."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HEADER = re.compile(r"^(?P<level>[VIWEDC])(?P<date>\d{4}) (?P<time>[\d:.]+) +(?P<pid>\d+) (?P<site>\S+:\d+)\] "
                    r"(?:\[(?P<frame>[^\]]+)\] )?(?:\[__(?P<artifact>\w+)\] )?(?P<msg>.*)$")
USER_AT = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<function>\S+))?')
BREAK_AT = re.compile(r"Graph break in user code at (?P<file>.+?):(?P<line>\d+)\s*$")
GB_ID = re.compile(r"/gb/gb(\d{4})\.html", re.I)
RECOMPILING = re.compile(r"Recompiling function (?P<function>\S+) in (?P<file>.+?):(?P<line>\d+)")
GUARD = re.compile(r"^\s*- (?P<frame>\d+/\d+): (?P<guard>.+?)(?:\s{2,}#.*)?$")
LIMIT = re.compile(r"hit config\.(?P<limit>recompile_limit|cache_size_limit|accumulated_recompile_limit) "
                   r"\((?P<value>\d+)\)")
EXC_LINE = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Unsupported|Failed|Exit|Interrupt))"
                      r"(?::\s?(?P<message>.*))?$")


@dataclass
class Record:
    level: str
    site: str
    frame: str | None
    artifact: str | None
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def records(text: str) -> tuple[list[Record], list[str]]:
    """The log's glog records, and the lines outside them (tracebacks, the script's own output)."""
    out: list[Record] = []
    plain: list[str] = []
    key = None
    for line in text.splitlines():
        m = HEADER.match(line)
        if not m:
            plain.append(line)
            key = None
            continue
        k = (m["pid"], m["time"], m["site"], m["frame"], m["artifact"])
        if k != key:
            out.append(Record(m["level"], m["site"], m["frame"], m["artifact"]))
            key = k
        out[-1].lines.append(m["msg"])
    return out, plain


def _user_line(text: str, after: str | None = None) -> dict | None:
    """The innermost user frame of a record's stack (the last `File ..., line ...` after `after`)."""
    if after and after in text:
        text = text.split(after, 1)[1]
    found = [m for m in USER_AT.finditer(text) if "site-packages" not in m["file"]]
    if not found:
        return None
    m = found[-1] if after is None else found[0]
    return {"file": m["file"], "line": int(m["line"]), "function": m["function"]}


def graph_break_of(lines: list[str], frame: str | None) -> dict | None:
    """A graph-break report (a `graph_breaks` log record, or a trace's `dynamo_graph_break_reason` payload):
    where in the user's code, the reason (its first line after the header) and the registry's GB id."""
    m = BREAK_AT.search(lines[0]) if lines else None
    if not m:
        return None
    reason = next((ln.strip() for ln in lines[1:] if ln.strip() and not ln.startswith("Graph Break Reason")), "")
    gb = GB_ID.search("\n".join(lines))
    return {"frame": frame, "file": m["file"], "line": int(m["line"]), "reason": reason,
            "gb_id": f"GB{gb[1]}" if gb else None}


def events(text: str) -> dict:
    """Graph breaks, recompiles, recompile-limit hits and the first causal error in a TORCH_LOGS text."""
    recs, plain = records(text)
    breaks, recompiles, limits = [], [], []
    for r in recs:
        t = r.text
        if r.artifact == "graph_breaks" and (b := graph_break_of(r.lines, r.frame)):
            breaks.append(b)
        elif r.artifact == "recompiles" and (m := RECOMPILING.search(t)):
            guards = [g["guard"].strip() for ln in r.lines if (g := GUARD.match(ln))]
            recompiles.append({"frame": r.frame, "function": m["function"], "file": m["file"],
                               "line": int(m["line"]), "guard": guards[0] if guards else None,
                               "user_line": _user_line(t, "User stack trace:")})
        elif m := LIMIT.search(t):
            fn = re.search(r"function: '(?P<function>[^']+)' \((?P<file>.+?):(?P<line>\d+)\)", t)
            last = re.search(r"last reason: (?P<frame>\d+/\d+): (?P<guard>.+?)(?:\s{2,}#|$)", t, re.M)
            limits.append({"frame": r.frame, "limit": m["limit"], "value": int(m["value"]),
                           "function": fn["function"] if fn else None,
                           "file": fn["file"] if fn else None, "line": int(fn["line"]) if fn else None,
                           "guard": last["guard"].strip() if last else None,
                           "user_line": _user_line(t, "User stack trace:")})
    return {"graph_breaks": breaks, "recompiles": recompiles, "recompile_limits": limits,
            "error": first_error("\n".join(plain))}


def first_error(text: str) -> dict | None:
    """The first traceback's exception: its type, message (the lines up to the next blank line or frame) and
    frames. The first, not the last: a later error is often raised while handling it."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("Traceback (most recent call last):"):
            continue
        frames, j = [], i + 1
        while j < len(lines) and (lines[j].startswith("  ") or not lines[j].strip()):
            if m := USER_AT.search(lines[j]):
                frames.append({"file": m["file"], "line": int(m["line"]), "function": m["function"] or "",
                               "code": lines[j + 1].strip() if j + 1 < len(lines) else ""})
            j += 1
        if j < len(lines) and (m := EXC_LINE.match(lines[j].strip())):
            message = [m["message"] or ""]
            k = j + 1
            while k < len(lines) and not lines[k].startswith(("Traceback", "During handling", "The above")):
                message.append(lines[k])
                k += 1
            return {"type": m["type"], "message": "\n".join(message).strip(), "frames": frames}
    return None


def is_trace_log(path) -> bool:
    """A TORCH_TRACE log (glog lines carrying JSON records), as opposed to TORCH_LOGS text."""
    with open(path, errors="replace") as f:
        head = f.read(20000)
    return '"dynamo_start"' in head or '"has_payload"' in head or '"string_table"' in head


def tlparse_path() -> str | None:
    """tlparse beside this interpreter (its wheel installs the binary into the environment's bin/, which a venv
    run without activation does not have on PATH), else on PATH."""
    import shutil
    import sys
    from pathlib import Path

    beside = Path(sys.executable).parent / "tlparse"
    return str(beside) if beside.is_file() else shutil.which("tlparse")


def trace_events(logs: list, workdir) -> dict:
    """The same events from TORCH_TRACE logs, through tlparse (which resolves the payloads and string tables):
    graph breaks from the `dynamo_graph_break_reason` artifacts, recompiles, failures and compile times from
    each compilation's `compilation_metrics`."""
    import json
    import subprocess
    from pathlib import Path

    tool = tlparse_path()
    if tool is None:
        raise FileNotFoundError("tlparse")
    out = {"graph_breaks": [], "recompiles": [], "recompile_limits": [], "error": None, "compiles": []}
    for i, log in enumerate(logs):
        dest = Path(workdir) / f"tlparse_{i}"
        subprocess.run([tool, str(log), "-o", str(dest), "--no-browser", "--plain-text", "--overwrite"],
                       capture_output=True, text=True, check=True)
        for line in (dest / "raw.jsonl").read_text().splitlines():
            rec = json.loads(line)
            art = rec.get("artifact", {})
            if art.get("name") == "dynamo_graph_break_reason" and rec.get("payload_filename"):
                b = graph_break_of((dest / rec["payload_filename"]).read_text().splitlines(),
                                   f"{rec.get('frame_id')}/{rec.get('frame_compile_id')}")
                if b:
                    out["graph_breaks"].append(b)
            m = rec.get("compilation_metrics")
            if not m:
                continue
            out["compiles"].append({"frame": m.get("compile_id"), "function": m.get("co_name"),
                                    "file": m.get("co_filename"), "line": m.get("co_firstlineno"),
                                    "seconds": m.get("entire_frame_compile_time_s"),
                                    "backend_seconds": m.get("backend_compile_time_s"),
                                    "inductor_seconds": m.get("inductor_compile_time_s"),
                                    "graph_ops": m.get("graph_op_count"), "failed": m.get("fail_type")})
            limit_hit = (m.get("fail_reason") or "").startswith("Dynamo recompile limit exceeded")
            if m.get("recompile_reason") and not limit_hit:
                reason = m["recompile_reason"]
                guard = re.match(r"\d+/\d+: (?P<guard>.+?)(?:\s{2,}#|$)", reason, re.M)
                out["recompiles"].append({"frame": m.get("compile_id"), "function": m.get("co_name"),
                                          "file": m.get("co_filename"), "line": m.get("co_firstlineno"),
                                          "guard": guard["guard"].strip() if guard else reason.splitlines()[0],
                                          "user_line": _user_line(reason, "User stack trace:")})
            if limit_hit:  # the function falls back to eager and the run goes on; its metrics name no code
                last = out["recompiles"][-1] if out["recompiles"] else {}
                out["recompile_limits"].append({**{k: last.get(k) for k in ("function", "file", "line", "guard",
                                                                            "user_line")},
                                                "frame": m.get("compile_id"), "limit": "recompile_limit",
                                                "value": len(out["recompiles"]) + 1})
            elif m.get("fail_type") and out["error"] is None:
                frames = [{"file": m["fail_user_frame_filename"], "line": m["fail_user_frame_lineno"],
                           "function": m.get("co_name") or "", "code": ""}] if m.get("fail_user_frame_filename") \
                    else []
                out["error"] = {"type": m["fail_type"], "message": m.get("fail_reason") or "", "frames": frames}
    return out
