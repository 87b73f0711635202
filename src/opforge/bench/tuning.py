"""Autotuning of a generated impl module through its module-level knobs, and the write-back of the best config.

Knobs: BLOCK (elements per program, pointwise), TILE and MAX_BLOCK_C (row kernels' tile and chunk; a row that
fits one chunk is reduced in registers, a longer one in a loop), NUM_WARPS (pointwise launches), the row
launches' num_warps / num_stages (through `_row_launch`), and the reduction strategy across programs
(ORDERED_PARTIALS: same-address atomics, or one partial per program summed in order; MAX_PROGRAMS: the grid of
such kernels, each program walking several blocks), where the impl has one.
A candidate changes one knob of the best config so far, one step of each knob in turn (coordinate search).
Each candidate is re-verified for precision before its time counts; the search stops after `max_rounds`, after
`patience` rounds without gain, or at the target.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from opforge.workspace.atomic import write_text_atomic

SPACE = {
    "TILE": [1024, 2048, 4096, 8192, 16384],
    "MAX_BLOCK_C": [2048, 4096, 8192, 16384, 32768, 65536],
    "BLOCK": [256, 512, 1024, 2048, 4096],
    "NUM_WARPS": [2, 4, 8],
    "ROW_NUM_WARPS": [None, 4, 8, 16],
    "NUM_STAGES": [None, 1, 2, 3],
    "ORDERED_PARTIALS": [False, True],
    "MAX_PROGRAMS": [512, 1024, 2048, 4096, 8192],
}
PLAIN_KNOBS = ("TILE", "MAX_BLOCK_C", "BLOCK", "NUM_WARPS", "ORDERED_PARTIALS", "MAX_PROGRAMS")  # module constants
ROW_KNOBS = ("ROW_NUM_WARPS", "NUM_STAGES")


def current_config(module) -> dict:
    cfg = {k: getattr(module, k) for k in PLAIN_KNOBS if hasattr(module, k)}
    if hasattr(module, "_row_launch"):
        cfg.update(ROW_NUM_WARPS=None, NUM_STAGES=None)
    return cfg


def apply_config(module, cfg: dict) -> None:
    """Set the knobs on the loaded module; launches read them at call time."""
    for k in PLAIN_KNOBS:
        if k in cfg:
            setattr(module, k, cfg[k])
    launch = getattr(module, "_LAUNCH", None)
    if isinstance(launch, dict) and launch and "NUM_WARPS" in cfg:  # empty under the interpreter
        module._LAUNCH = {**launch, "num_warps": cfg["NUM_WARPS"]}
    if hasattr(module, "_row_launch"):
        base = getattr(module, "_opforge_row_launch", module._row_launch)
        module._opforge_row_launch = base
        warps, stages = cfg.get("ROW_NUM_WARPS"), cfg.get("NUM_STAGES")

        def row_launch(tile: int, _base=base) -> dict:
            opts = dict(_base(tile))
            if opts and warps:
                opts["num_warps"] = warps
            if opts and stages:
                opts["num_stages"] = stages
            return opts
        module._row_launch = row_launch


def neighbours(cfg: dict) -> list[dict]:
    """One-knob moves from `cfg`: one step of every knob first, then the other direction, then two steps. With
    3 rounds of patience, knob after knob would never reach the later knobs."""
    out = []
    for step in (1, -1, 2, -2):
        for k, values in SPACE.items():
            if k not in cfg or cfg[k] not in values:
                continue
            j = values.index(cfg[k]) + step
            if 0 <= j < len(values):
                out.append({**cfg, k: values[j]})
    return out


def autotune(module, measure: Callable[[], float], verify: Callable[[], str | None], *, target_ms: float | None = None,
             max_rounds: int = 10, patience: int = 3, on_round: Callable[[dict], None] | None = None) -> dict:
    """Coordinate search. `measure()` times the current module config (ms, lower is better); `verify()` returns
    None when the config passes precision, else why not. Returns {best, best_ms, baseline_ms, history, stop}."""
    best = current_config(module)
    best_ms = measure()
    baseline_ms = best_ms
    history, tried = [], {_key(best)}
    without_gain = 0
    stop = "search space exhausted"
    rounds = 0
    while rounds < max_rounds:
        if target_ms is not None and best_ms <= target_ms:
            stop = "perf target reached"
            break
        cand = next((c for c in neighbours(best) if _key(c) not in tried), None)
        if cand is None:
            break
        tried.add(_key(cand))
        rounds += 1
        apply_config(module, cand)
        rec = {"round": rounds, "config": cand}
        try:
            why = verify()
        except Exception as exc:  # a config the compiler rejects (too many registers, shared memory)
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if why:
            rec.update(status="rejected", reason=why[:200])
        else:
            ms = measure()
            rec.update(status="measured", ms=ms)
            if ms < best_ms * 0.99:  # gains inside timing noise do not count
                best, best_ms = cand, ms
                rec["improved"] = True
        if not rec.get("improved"):
            without_gain += 1
        else:
            without_gain = 0
        history.append(rec)
        if on_round:
            on_round(rec)
        if without_gain >= patience:
            stop = f"{patience} rounds without gain"
            break
    else:
        stop = f"{max_rounds} rounds"
    apply_config(module, best)
    return {"best": best, "best_ms": best_ms, "baseline_ms": baseline_ms, "history": history, "stop": stop}


def _key(cfg: dict) -> tuple:
    return tuple(sorted(cfg.items()))


_CONST = re.compile(rf"^(?P<name>{'|'.join(PLAIN_KNOBS)}) = (?P<rest>.*)$")


def _replace_last_int(expr: str, value: int) -> str:
    code, sep, comment = expr.partition("  #")
    ints = list(re.finditer(r"\b\d+\b", code))
    if not ints:
        return expr
    m = ints[-1]  # the value, or the default of an env override: `int(os.environ.get("OPFORGE_TILE", N))`
    return code[:m.start()] + str(value) + code[m.end():] + sep + comment


def write_back(impl_path: Path, cfg: dict) -> list[str]:
    """Write the tuned knobs into the impl file's constant lines (and `_row_launch`'s return); atomic.
    Returns the names changed."""
    lines = Path(impl_path).read_text().splitlines(keepends=True)
    changed = []
    in_row_launch = False
    for i, line in enumerate(lines):
        m = _CONST.match(line.rstrip("\n"))
        if m and m["name"] in cfg:
            value = cfg[m["name"]]
            rest = repr(value) if isinstance(value, bool) else _replace_last_int(m["rest"], int(value))
            new = f"{m['name']} = {rest}\n"
            if new != line:
                lines[i] = new
                changed.append(m["name"])
        warps, stages = cfg.get("ROW_NUM_WARPS"), cfg.get("NUM_STAGES")
        if line.startswith("def _row_launch"):
            in_row_launch = True
        elif in_row_launch and line.startswith("    warps = ") and warps:  # the heuristic by tile, tuned away
            lines[i] = f"    warps = {int(warps)}  # tuned\n"
            changed.append("ROW_NUM_WARPS")
        elif in_row_launch and line.startswith("    return {") and '"num_warps"' in line:
            if stages:
                rest = line.strip()[len("return {"):]
                lines[i] = f'    return {{"num_stages": {int(stages)}, {rest}  # tuned\n'
                changed.append("NUM_STAGES")
            in_row_launch = False
    if changed:
        write_text_atomic(impl_path, "".join(lines))
    return changed
