"""api-consistency: an API or program on a device under test against the CPU.

A case runs on the reference (the CPU, and float64 where meaningful) and on the target; four checks
(functional, determinism, precision, memory) feed written rules that pick one of three exits, and a
second pass localises a defect to the first diverging operator and its call site.

The package imports nothing heavy itself, so that `opforge --help` does not load torch: `RULES` and
`diagnose` live in `opforge.skills.api_consistency.triage`.
"""
