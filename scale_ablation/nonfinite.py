"""Where a diverged run's first non-finite number appeared.

  python -m scale_ablation.nonfinite RUN_DIR     # one diverged run
  python -m scale_ablation.nonfinite SWEEP_DIR   # each diverged run of a sweep, by name

The replay itself is `scale_ablation.training.nonfinite_replay`; its docstring says how it works.
"""

from __future__ import annotations

import os
import sys

from absl import flags, logging

from scale_ablation import command_line
from scale_ablation.model import plugins
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training.nonfinite_replay import diagnose


def diverged_runs(sweep_dir: str) -> list[str]:
    """The run directories in `sweep_dir` whose summary.json says diverged, by name."""
    names = sorted(os.listdir(sweep_dir)) if os.path.isdir(sweep_dir) else []
    paths = [os.path.join(sweep_dir, name) for name in names]
    return [path for path in paths if os.path.isdir(path)
            and (RunFiles(path).read_summary() or {}).get("status") == "diverged"]


USAGE = "python -m scale_ablation.nonfinite [--imports=MODULE_OR_FILE,...] RUN_DIR|SWEEP_DIR"


def main(argv: list[str]) -> int:
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    if len(argv) != 2:
        print(f"usage: {USAGE}", file=sys.stderr)
        return 2
    path = argv[1]
    is_run = os.path.exists(os.path.join(path, "summary.json"))
    workdirs = [path] if is_run else diverged_runs(path)
    if not workdirs:
        print(f"error: {path} holds no run and no diverged run of a sweep", file=sys.stderr)
        return 2
    try:
        plugins.load(_IMPORTS.value)
        for workdir in workdirs:
            lines = diagnose(workdir)
            print("\n".join(lines if is_run else [f"== {os.path.basename(workdir)}", *lines]),
                  flush=True)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


_IMPORTS = plugins.imports_flag()

if __name__ == "__main__":
    command_line.start(main, positionals=1, usage=USAGE)
