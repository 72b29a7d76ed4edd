r"""Does compiling the next group ahead help a sweep on this machine, or compete with training?

  python -m benchmarks.compile_ahead [--rounds=2] [--full] [--out FILE.json]

Runs the same grid (dk_sweep.py:quick's three-group slice; `--full`: all of it) cold, each time in
a fresh directory with an empty compilation cache, with `--compile_ahead` and `--nocompile_ahead`
alternating (the order reversed every other round, so drift on a shared machine hits both), and
reports each side's median wall time and compile seconds. On a 2-core CPU the compile-ahead
thread's XLA work shares the cores with the group that trains; on an accelerator host it
overlaps device time. The sweep's default (`--compile_ahead`) should be what this measures as
faster here.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile

from absl import app, flags

from benchmarks import run as bench

_ROUNDS = flags.DEFINE_integer("rounds", 2, "Cold sweeps per side.")
_FULL = flags.DEFINE_bool("full", False, "The whole dk_sweep.py:quick grid, not the slice.")
SIDES = ("--compile_ahead", "--nocompile_ahead")


def one_sweep(spec: str, flag: str) -> dict:
    """A cold sweep of `spec` with `flag`: wall seconds and what it compiled."""
    with tempfile.TemporaryDirectory() as tmp:
        seconds, compiled = bench._timed_sweep(spec, f"{tmp}/sweep", {**os.environ,
                                                                      **bench.SWEEP_ENV}, flag)
    return {"side": flag, "seconds": seconds, "loadavg": bench.loadavg(), **compiled}


def main(argv: list[str]) -> int:
    if _ROUNDS.value < 1:
        print(f"error: --rounds must be >= 1, got {_ROUNDS.value}", file=sys.stderr)
        return 2
    grid = bench.sweep_grid(quick=not _FULL.value)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        spec = bench.write_grid_slice(tmp, grid)
        for index in range(_ROUNDS.value):
            for flag in SIDES if index % 2 == 0 else SIDES[::-1]:
                records.append(one_sweep(spec, flag))
                print(f"round {index} {flag}: {records[-1]['seconds']:.1f} s "
                      f"(load {records[-1]['loadavg']})", flush=True)
    medians = {flag: statistics.median(r["seconds"] for r in records if r["side"] == flag)
               for flag in SIDES}
    result = {"runs": len(grid), "machine": bench.machine(), "median_seconds": medians,
              "ahead_over_not": medians[SIDES[0]] / medians[SIDES[1]], "records": records}
    print(f"{len(grid)} runs: compile ahead {medians[SIDES[0]]:.1f} s, not ahead "
          f"{medians[SIDES[1]]:.1f} s (ratio {result['ahead_over_not']:.3f})")
    out = flags.FLAGS.out  # benchmarks.run's --out, defined when it is imported
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
