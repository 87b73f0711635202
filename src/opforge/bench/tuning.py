"""Autotuning of a generated impl module through its module-level knobs, and the write-back of the best config.

Knobs: BLOCK (elements per program, pointwise), TILE and MAX_BLOCK_C (row kernels' tile and chunk; a row that
fits one chunk is reduced in registers, a longer one in a loop), NUM_WARPS (pointwise launches), the row
launches' num_warps / num_stages (ROW_NUM_WARPS, NUM_STAGES), and the reduction strategy across programs
(ORDERED_PARTIALS: same-address atomics, or one partial per program summed in order; MAX_PROGRAMS: the grid of
such kernels, each program walking several blocks), where the impl has one; ROW_SPLIT (programs that share a
row, for few long rows) where a row kernel allows it.
A generated impl reads its knobs per launch size (`_knobs(*sizes)`: its TUNED table, else the module values):
a search then sets, and writes back, the entries of the sizes the measured call launches, so that one shape's
best config does not become every other shape's.
A candidate changes one knob of the best config so far, one step of each knob in turn (coordinate search).
Each candidate is re-verified for precision before its time counts; the search stops after `max_rounds`, after
`patience` rounds without gain, or at the target.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Callable

from opforge.workspace.atomic import write_text_atomic

SPACE = {
    "TILE": [1024, 2048, 4096, 8192, 16384],
    "MAX_BLOCK_C": [2048, 4096, 8192, 16384, 32768, 65536],
    "ROW_SPLIT": [1, 2, 4, 8, 16],  # early: within 3 rounds of patience, where few long rows want it
    "BLOCK": [256, 512, 1024, 2048, 4096],
    "NUM_WARPS": [2, 4, 8],
    "ROW_NUM_WARPS": [None, 4, 8, 16],
    "NUM_STAGES": [None, 1, 2, 3],
    "ORDERED_PARTIALS": [False, True],
    "MAX_PROGRAMS": [512, 1024, 2048, 4096, 8192],
    # a product's tile, its programs' order (GROUP_M tile rows share B's columns in L2) and its K loop's pipeline
    "GEMM_BLOCK_M": [32, 64, 128, 256],
    "GEMM_BLOCK_N": [32, 64, 128, 256],
    "GEMM_BLOCK_K": [16, 32, 64, 128],
    "GEMM_GROUP_M": [1, 4, 8, 16],
    "GEMM_NUM_WARPS": [4, 8],
    "GEMM_NUM_STAGES": [2, 3, 4, 5],
    "GEMM_SPLIT_K": [1, 2, 4, 8, 16],  # programs sharing a tile's K: skinny products with too few tiles
    "GEMM_ROWS_N": [0, 128, 256, 512],  # the widest rows whose row work runs on the tile (0: stored, then a row kernel)
    # an attention's queries per program, keys per step of its walk, warps and pipeline depth
    "ATTN_BLOCK_M": [32, 64, 128],
    "ATTN_BLOCK_N": [32, 64, 128],
    "ATTN_NUM_WARPS": [4, 8],
    "ATTN_NUM_STAGES": [1, 2, 3],
}
GEMM_KNOBS = ("GEMM_BLOCK_M", "GEMM_BLOCK_N", "GEMM_BLOCK_K", "GEMM_GROUP_M", "GEMM_NUM_WARPS", "GEMM_NUM_STAGES",
              "GEMM_SPLIT_K", "GEMM_ROWS_N")
ATTN_KNOBS = ("ATTN_BLOCK_M", "ATTN_BLOCK_N", "ATTN_NUM_WARPS", "ATTN_NUM_STAGES")
# module constants
PLAIN_KNOBS = ("TILE", "MAX_BLOCK_C", "BLOCK", "NUM_WARPS", "ORDERED_PARTIALS", "MAX_PROGRAMS", "ROW_SPLIT",
               *GEMM_KNOBS, *ATTN_KNOBS)
# What the launches of one kind read, by their TUNED key: (rows, columns), (elements,), ("gemm", M, N, K) or
# ("attention", SQ, SK, D).
READ_BY = {2: {"TILE", "MAX_BLOCK_C", "ROW_NUM_WARPS", "NUM_STAGES", "ORDERED_PARTIALS", "MAX_PROGRAMS", "ROW_SPLIT"},
           1: {"BLOCK", "NUM_WARPS", "ORDERED_PARTIALS", "MAX_PROGRAMS"},
           "gemm": set(GEMM_KNOBS), "attention": set(ATTN_KNOBS)}


def read_by(key: tuple) -> set:
    """The knobs the launches at a TUNED key read."""
    return READ_BY[key[0] if key and isinstance(key[0], str) else len(key)]


class _KeysSeen(dict):
    """A TUNED table that records the keys the launches look up."""

    def __init__(self, table: dict):
        super().__init__(table)
        self.seen: list[tuple] = []

    def get(self, key, default=None):
        if key not in self.seen:
            self.seen.append(key)
        return super().get(key, default)


def launch_keys(module, call: Callable[[], object]) -> list[tuple]:
    """The TUNED keys (sizes as the module rounds them) that the launches of `call()` read: where a config
    tuned on that call must be written. Empty for a module without a per-size table."""
    table = getattr(module, "TUNED", None)
    if not isinstance(table, dict):
        return []
    module.TUNED = spy = _KeysSeen(table)
    try:
        call()
    finally:
        module.TUNED = table
    return spy.seen


def current_config(module, keys: list[tuple] = ()) -> dict:
    """The knobs the launches at `keys` run with: the module's values, and what TUNED holds for those sizes."""
    cfg = {k: getattr(module, k) for k in PLAIN_KNOBS if hasattr(module, k)}
    if not keys:
        return cfg
    read = set().union(*(read_by(k) for k in keys))
    cfg.update(ROW_NUM_WARPS=None, NUM_STAGES=None)  # None: `_row_launch`'s warps by tile, Triton's stages
    cfg = {k: v for k, v in cfg.items() if k in read}  # a knob no launch of the call reads is not searched
    for key in reversed(keys):  # the first key that holds a knob gives its value
        cfg.update({k: v for k, v in module.TUNED.get(key, {}).items() if k in cfg and k in read_by(key)})
    return cfg


def tuned_entry(module, cfg: dict, key: tuple | None = None) -> dict:
    """The knobs of `cfg` that differ from the module's values (of those the launches at `key` read): a TUNED
    entry."""
    read = read_by(key) if key is not None else cfg
    return {k: v for k, v in cfg.items() if v is not None and v != getattr(module, k, None) and k in read}


def apply_config(module, cfg: dict, keys: list[tuple] = ()) -> None:
    """Set the knobs on the loaded module; launches read them at call time. With `keys`, only the launches at
    those sizes change (their TUNED entries); the module's values, which every other size runs, stay."""
    if keys:
        module.TUNED = {**module.TUNED, **{key: tuned_entry(module, cfg, key) for key in keys}}
        return
    for k in PLAIN_KNOBS:
        if k in cfg:
            setattr(module, k, cfg[k])
    launch = getattr(module, "_LAUNCH", None)
    if isinstance(launch, dict) and launch and "NUM_WARPS" in cfg:  # empty under the interpreter
        module._LAUNCH = {**launch, "num_warps": cfg["NUM_WARPS"]}


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


def autotune(module, measure: Callable[[], float], verify: Callable[[], str | None], *, keys: list[tuple] = (),
             target_ms: float | None = None, max_rounds: int = 10, patience: int = 3,
             on_round: Callable[[dict], None] | None = None) -> dict:
    """Coordinate search. `measure()` times the current module config (ms, lower is better); `verify()` returns
    None when the config passes precision, else why not. With `keys` (launch_keys of the measured call) each
    candidate is set as the TUNED entry of those sizes only. Returns {best, best_ms, baseline_ms, history,
    stop}."""
    best = current_config(module, keys)
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
        apply_config(module, cand, keys)
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
    apply_config(module, best, keys)
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
    """Write the tuned knobs into the impl file's constant lines (an impl without a TUNED table: one config for
    every size); atomic. Returns the names changed."""
    lines = Path(impl_path).read_text().splitlines(keepends=True)
    changed = []
    for i, line in enumerate(lines):
        m = _CONST.match(line.rstrip("\n"))
        if m and m["name"] in cfg:
            value = cfg[m["name"]]
            rest = repr(value) if isinstance(value, bool) else _replace_last_int(m["rest"], int(value))
            new = f"{m['name']} = {rest}\n"
            if new != line:
                lines[i] = new
                changed.append(m["name"])
    if changed:
        write_text_atomic(impl_path, "".join(lines))
    return changed


_TABLE = "TUNED: dict[tuple, dict] = {"


def write_tuned(impl_path: Path, entries: dict[tuple, dict]) -> list[str]:
    """Write tuned entries into the impl file's TUNED table (one line per size; an empty entry, the defaults,
    removes the size); atomic. Returns the keys changed, as text."""
    lines = Path(impl_path).read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(_TABLE))
    end = start if lines[start].rstrip().endswith("}") else next(
        i for i in range(start, len(lines)) if lines[i].rstrip() == "}")
    table = ast.literal_eval("".join(lines[start:end + 1]).split("=", 1)[1].strip())
    changed = [str(k) for k, v in entries.items() if table.get(k, {}) != v]
    for key, entry in entries.items():
        if entry:
            table[key] = entry
        else:
            table.pop(key, None)
    if not changed:
        return []
    body = "".join(f"    {k!r}: {v!r},\n" for k, v in sorted(table.items(), key=lambda kv: repr(kv[0])))
    lines[start:end + 1] = [f"{_TABLE}\n{body}}}\n" if table else f"{_TABLE}}}\n"]
    write_text_atomic(impl_path, "".join(lines))
    return changed
