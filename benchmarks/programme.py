"""The accelerator programme's size: runs and estimated H200-hours of every experiment file's
default (accelerator) variant, from the planner (`--plan`'s rule) without compiling anything.

  python -m benchmarks.programme [--device=H200]

Members per program are not limited here (the memory analysis would compile every shape on
this machine), so a variant whose members do not all fit one program costs somewhat more than
printed; `python -m scale_ablation.sweep --config=FILE --workdir=DIR --plan --device=H200`
gives one variant's figure with the memory analysis.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile

from absl import app, flags

from scale_ablation import sweep
from scale_ablation.sweeping import planner


def main(argv: list[str]) -> int:
    del argv
    dev = planner.device(flags.FLAGS.device or "H200")  # sweep's --device flag
    runs = hours = 0.0
    with tempfile.TemporaryDirectory() as scratch:  # expand() only names run directories
        for path in sorted(glob.glob("experiments/*.py")):
            with open(path, encoding="utf-8") as source:
                if "def sweep(" not in source.read():
                    continue  # probes and the shared base
            points = sweep.expand(path, os.path.join(scratch, os.path.basename(path)))
            plan = planner.make_plan(points, dev, planner.read_table(dev.kind), memory=False)
            print(f"{path}: {len(points)} runs, {plan.device_hours:.2f} {dev.kind}-hours")
            runs, hours = runs + len(points), hours + plan.device_hours
    print(f"total: {int(runs):,} runs, {hours:.1f} {dev.kind}-hours")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())  # `experiments` is imported from the repository root
    app.run(main)
