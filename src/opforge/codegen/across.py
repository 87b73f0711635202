"""Where programs meet: how a kernel's programs combine the full reductions each of them took a share of.

Each program adds its share to an accumulator with an atomic or, with DETERMINISTIC, stores it as a partial
of its own; then it takes a ticket, and the program that takes the last one finishes the reductions. The
ticket is the first half of a grid barrier, as Inductor's: `tl.debug_barrier()` makes every warp of the
program issue its atomics and stores before one thread takes the ticket (acq_rel), so the last program sees
what every other program wrote. Both emitters (flat and rows) write these parts through this module only.

NaN: Triton's float atomic_max/min pick an integer atomic by the sign of the value, and a NaN has neither
sign, so it is dropped; tl.max and tl.min drop it too. torch's amax returns NaN, so each max or min
reduction keeps a NaN count in a slot of its own, after the accumulators.
"""

from __future__ import annotations

from opforge.codegen.ops import REDUCE_ATOMIC, REDUCE_IDENTITY, block_reduce, reduce_combine

# The ticket, emitted once per module whose kernels reduce across programs (the only way to take one:
# a gate refuses an atomic compared with the program count that no barrier precedes).
LAST_PROGRAM = '''

@triton.jit
def _last_program(ticket_ptr):
    # Every warp's stores and atomics are issued before one thread takes the ticket; acq_rel orders them
    # before it, and the last program's reads after it.
    tl.debug_barrier()
    return tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == tl.num_programs(0) - 1
'''

# A block's max or min keeping NaN, as torch's amax and amin do (tl.max and tl.min drop it on a GPU); the
# helper ops.block_reduce names.
KEEP_NAN = '''

@triton.jit
def _{kind}_keep_nan(x):
    return tl.where(tl.sum((x != x).to(tl.int32)) > 0, float("nan"), tl.{kind}(x))
'''

_PARTIALS = '''

@triton.jit
def _{kind}_partials(ptr, stride, n, RBLOCK: tl.constexpr):
    # program order, so the same inputs give the same bits on every run
    acc = tl.full((RBLOCK,), {identity}, tl.float32)
    for start in range(0, n, RBLOCK):
        idx = start + tl.arange(0, RBLOCK)
        p = tl.load(ptr + idx * stride, mask=idx < n, other={identity})
        acc = {combine}
    return {finish}
'''


def slot_index(index: str, n: int, slot: int) -> str:
    """`index * n + slot`, written without the `* 1` and `+ 0` that one slot among one would show."""
    out = index if n == 1 else f"{index} * {n}"
    return f"{out} + {slot}" if slot else out


def helpers(kinds: set[str], across: bool) -> str:
    """The jit helpers a module's kernels call: the ticket, NaN-keeping block max/min, ordered partials."""
    out = LAST_PROGRAM if across else ""
    for k in sorted(kinds & {"max", "min"}):
        out += KEEP_NAN.format(kind=k)
    for k in sorted(kinds) if across else ():
        out += _PARTIALS.format(kind=k, identity=REDUCE_IDENTITY[k], combine=reduce_combine(k, "acc", "p"),
                                finish=block_reduce(k, "acc"))
    return out


def _kind(r) -> str:
    return "sum" if r.kind == "mean" else r.kind


def _nan_slots(reds: list) -> dict:
    """Reduction name -> its NaN count's slot in the accumulators: after the reductions' own slots."""
    return {r.name: len(reds) + j for j, r in enumerate(r for r in reds if _kind(r) in ("max", "min"))}


def meet(reds: list, pad: str) -> list[str]:
    """Each program's share (`<name>_part`) of every full reduction, stored or added, then the ticket: an `if`
    at `pad` whose body is the last program's."""
    n, nans = len(reds), _nan_slots(reds)
    out = []
    if reds:
        out += [f"{pad}# Across programs: atomics into acc, or (DETERMINISTIC) one partial per program, summed in",
                f"{pad}# program order by the last one.",
                f"{pad}if DETERMINISTIC:"]
        out += [f"{pad}    tl.store(partials_ptr + {slot_index('pid', n, r.slot)}, {r.name}_part)" for r in reds]
        out.append(f"{pad}else:")
    for r in reds:
        out.append(f"{pad}    {REDUCE_ATOMIC[_kind(r)]}(acc_ptr + {r.slot}, {r.name}_part)")
        if r.name in nans:
            out.append(f"{pad}    tl.atomic_add(acc_ptr + {nans[r.name]}, 1.0, mask={r.name}_part != {r.name}_part)"
                       "  # the float atomic drops NaN")
    return out + [f"{pad}if _last_program(ticket_ptr):"]


def finish(reds: list, pad: str, count) -> list[str]:
    """In the last program: each full reduction's value (`count(r)`: the elements a mean divides by)."""
    if not reds:
        return []
    n, nans = len(reds), _nan_slots(reds)
    out = [f"{pad}if DETERMINISTIC:"]
    out += [f"{pad}    {r.name} = _{_kind(r)}_partials(partials_ptr + {r.slot}, {n}, tl.num_programs(0), RBLOCK)"
            for r in reds]
    out.append(f"{pad}else:")
    for r in reds:
        k = _kind(r)
        out.append(f"{pad}    {r.name} = {REDUCE_ATOMIC[k]}(acc_ptr + {r.slot}, {REDUCE_IDENTITY[k]})  # atomic read")
        if r.name in nans:
            out.append(f"{pad}    {r.name} = tl.where(tl.atomic_add(acc_ptr + {nans[r.name]}, 0.0) > 0, "
                       f"float('nan'), {r.name})")
    out += [f"{pad}{r.name} = tl.div_rn({r.name}, {count(r)})" for r in reds if r.kind == "mean"]
    return out


def launch_setup(blocks: str, reds: list, dev: str, cap: str | None = None) -> list[str]:
    """A launcher's grid over `blocks`, capped at `cap` programs for a kernel whose programs each walk several
    blocks, and, for one whose programs meet at a ticket (`reds`: its full reductions), the buffers, laid out
    as meet() and finish() read them. Nothing is copied from the host (a copy would also break CUDA-graph capture) and
    nothing unused is allocated: one zeroed int32 buffer holds the ticket and, for atomics, the float32
    accumulators (zero bits are 0.0; each max or min slot is then filled with its identity, and a zero NaN count
    follows each); ordered partials need no initial value."""
    out = [f"    grid = (max(1, min({blocks}, {cap})),)" if cap else f"    grid = (max(1, {blocks}),)"]
    if not reds:
        return out
    kinds = [_kind(r) for r in reds]
    n_acc = len(kinds) + sum(k in ("max", "min") for k in kinds)
    out += ['    ordered = deterministic or knobs["ORDERED_PARTIALS"]',
           f"    workspace = torch.zeros(1 if ordered else {n_acc + 1}, dtype=torch.int32, device={dev})",
           "    acc, ticket = workspace[:-1].view(torch.float32), workspace[-1:]"]
    fills = [(i, REDUCE_IDENTITY[k]) for i, k in enumerate(kinds) if k in ("max", "min")]
    if fills:
        out.append("    if not ordered:")
        out += [f"        acc[{i}].fill_({v})" for i, v in fills]
    out.append(f"    partials = torch.empty(grid[0] * {len(kinds)} if ordered else 0, dtype=torch.float32, "
               f"device={dev})")
    return out


def device_events(reds: list | None, ordered: bool) -> dict:
    """What launch_setup's buffers cost on the device per call besides the kernels: memsets and fills."""
    if not reds:
        return {"memsets": 0, "fills": 0}
    return {"memsets": 1, "fills": 0 if ordered else sum(_kind(r) in ("max", "min") for r in reds)}
