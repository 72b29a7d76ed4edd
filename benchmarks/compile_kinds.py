r"""Run a command with a compile log open, and write what it compiled, by kind, to a JSON file.

  python -m benchmarks.compile_kinds OUT.json scale_ablation.sweep --config=... --workdir=...

The command (a module run as `python -m MODULE ARGS`) prints its own totals; this adds the
seconds by kind of program (`train_step`, `init`, `eval_step`, ...), which say where a sweep's
compile time goes (`benchmarks.quick_sweep`). Seconds per kind are XLA's (compiling, or loading
from the persistent cache); `seconds` in all adds tracing and lowering, as the sweep's line does.
"""

from __future__ import annotations

import atexit
import collections
import json
import runpy
import sys

from scale_ablation.training.compile_log import CompileLog


def by_kind(log: CompileLog) -> dict:
    """{kind: {"compiled": n, "seconds": s}} over the programs XLA compiled (not loaded)."""
    kinds: dict[str, dict] = collections.defaultdict(lambda: {"compiled": 0, "seconds": 0.0})
    for program in log.compiled():
        kinds[program.name]["compiled"] += 1
        kinds[program.name]["seconds"] += program.seconds
    return dict(sorted(kinds.items(), key=lambda item: -item[1]["seconds"]))


def write(log: CompileLog, path: str) -> None:
    log.__exit__(None, None, None)
    record = {"programs_compiled": len(log.compiled()),
              "programs_loaded": sum(p.from_cache for p in log.programs),
              "seconds": log.seconds, "seconds_waited": log.seconds_waited,
              "by_kind": by_kind(log)}
    with open(path, "w") as f:
        json.dump(record, f, indent=2)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: python -m benchmarks.compile_kinds OUT.json MODULE [ARGS ...]")
    out, module, *args = sys.argv[1:]
    log = CompileLog().__enter__()
    atexit.register(write, log, out)  # the command ends by sys.exit (absl's app.run)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
