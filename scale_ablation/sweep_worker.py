r"""One worker of `sweep --workers=P` (`scale_ablation.sweeping.workers`): its share of the
sweep's runs trained in this process, as the sweep's own in-process runner trains them.

  python -m scale_ablation.sweep_worker SHARE.pkl

The sweep starts it, pinned to its cores, with the share's run directories handed over; it is
not a command for a user. Exit codes: 0 every run of the share ended (completed, diverged or
failed: each run's files say which), 3 preempted (the sweep reruns it).
"""

from __future__ import annotations

import logging as stdlib_logging
import os

from absl import logging

from scale_ablation import command_line
from scale_ablation.model import plugins
from scale_ablation.records import checkpoints
from scale_ablation.sweeping import workers
from scale_ablation.sweeping.progress import Progress
from scale_ablation.sweeping.sweep_runners import hold_runs, run_in_process
from scale_ablation.training import hooks, runtime


def main(argv: list[str]) -> int:
    share, points = workers.read_share(argv[1])
    logging.set_verbosity(logging.WARNING)
    # The process edge, as the sweep's own: everything process-wide is set here.
    runtime.normalise_environment(verbose=share.get("verbose", False))
    checkpoints.quiet_failed_restores()
    stdlib_logging.raiseExceptions = False
    plugins.load(tuple(share.get("imports", ())))
    sweep_dir = share["sweep_dir"]
    runtime.enable_compilation_cache(os.path.join(sweep_dir, "run"))
    locks = hold_runs(sweep_dir, points)  # handed over by the sweep before this started
    try:
        complete = run_in_process(
            sweep_dir, points, Progress(len(points), 0), together=share["together"],
            extra_hooks=hooks.hooks_from_environment(dict(os.environ)),
            extend=share["extend"], compile_ahead=share["compile_ahead"],
            max_members=share["max_members"])
    finally:
        for lock in locks.values():
            lock.release(remove_created=True)
    return 0 if complete else 3


if __name__ == "__main__":
    command_line.start(main, positionals=1, usage="python -m scale_ablation.sweep_worker SHARE.pkl")
