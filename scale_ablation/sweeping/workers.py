"""`sweep --workers=P`: P pinned processes, each training its share of the sweep's groups in
process (ensembles of at most `--max_members` runs, as the default runner trains them).

On a CPU, two processes pinned to one core each run the studies' ensembles faster than one
process on both cores (dk_exponent:cpu 342 against 287 runs an hour, the main job 348 against
267: benchmarks/results/arrangements_amd-epyc_2core_2026-12-06.json), and unlike `--parallel`
(a fresh `scale_ablation.main` per run, 5-7 s of start-up each) a worker starts once.

A share is whole groups (`planner.program_key`: the runs one program trains), dealt largest
first to the share with the fewest FLOPs so far, so no program is compiled twice and the shares
end close together. Each worker is `python -m scale_ablation.sweep_worker SHARE.pkl`: the
share's file holds its runs' resolved configs (pickled: a ConfigDict's tuples and references
survive it, JSON's lists would not), so the worker reads no experiment file. The sweep
hands each run's directory lock to its worker before the worker starts (as `--parallel` does),
and reads every run's status from its files when the workers end.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from scale_ablation.records.run_files import FINISHED
from scale_ablation.sweeping import arrangements, planner
from scale_ablation.sweeping.progress import Progress
from scale_ablation.sweeping.sweep_grid import Point, run_status

SHARE_FILE = ".worker_{index}.pkl"  # in the sweep directory, while its worker runs


def shares(todo: Sequence[Point], workers: int) -> list[list[Point]]:
    """`todo` as `workers` shares of whole groups, balanced by training FLOPs (largest group
    first, to the lightest share), each in `todo`'s order; empty shares dropped."""
    groups: dict[tuple, list[Point]] = {}
    for point in todo:
        groups.setdefault(planner.program_key(point.config), []).append(point)
    flops = {key: sum(planner.run_cost(p.name, p.config).train_flops for p in points)
             for key, points in groups.items()}
    loads, members = [0.0] * workers, [set() for _ in range(workers)]
    for key in sorted(groups, key=lambda k: -flops[k]):
        lightest = loads.index(min(loads))
        loads[lightest] += flops[key]
        members[lightest].update(p.name for p in groups[key])
    return [[p for p in todo if p.name in names] for names in members if names]


def write_share(sweep_dir: str, index: int, points: Sequence[Point], settings: dict) -> str:
    """The share's file (its runs' names, overrides and resolved configs, and the runner's
    `settings`); its path."""
    path = os.path.join(sweep_dir, SHARE_FILE.format(index=index))
    runs = [(p.name, p.overrides, p.config) for p in points]
    with open(path, "wb") as f:
        pickle.dump({"sweep_dir": sweep_dir, **settings, "runs": runs}, f)
    return path


def read_share(path: str) -> tuple[dict, list[Point]]:
    """(the runner's settings, the share's points) of a share's file."""
    with open(path, "rb") as f:
        share = pickle.load(f)
    return share, [Point(name, overrides, config) for name, overrides, config in share["runs"]]


def run_in_workers(sweep_dir: str, todo: list[Point], progress: Progress, workers: int,
                   threads: int, settings: dict, outcomes: dict[str, str] | None = None,
                   before_start: Callable[[Point], None] | None = None,
                   env: dict[str, str] | None = None) -> bool:
    """Train `todo` in `workers` processes pinned to `threads` cores each (0: not pinned);
    False if preempted. `settings`: what each worker's in-process runner takes (imports,
    extend, compile_ahead, max_members, together); `before_start(point)` for each run before
    its worker starts; `env` the workers' environment."""
    parts = shares(todo, workers)
    paths = [write_share(sweep_dir, i, part, settings) for i, part in enumerate(parts)]
    running = []
    try:
        with arrangements.pinned_children(threads, len(parts)) as pinned:
            for index, (part, path) in enumerate(zip(parts, paths, strict=True)):
                pin = pinned(lambda point: None if before_start is None else before_start(point))
                for point in part:
                    pin(point)  # the last call's mask is the one the worker starts with
                log = open(os.path.join(sweep_dir, f"worker_{index}.log"), "ab")  # noqa: SIM115
                running.append((subprocess.Popen(
                    [sys.executable, "-m", "scale_ablation.sweep_worker", path], stdout=log,
                    stderr=subprocess.STDOUT, env=env), log))
        logs = ", ".join(f"worker_{i}.log ({len(part)} runs)" for i, part in enumerate(parts))
        print(f"[sweep] {len(parts)} workers, {threads or 'all'} core(s) each; their progress: "
              f"{logs} in {sweep_dir}", flush=True)
        progress.show(running=len(todo))
        return _wait(sweep_dir, running, todo, progress, outcomes)
    finally:
        for path in paths:
            with contextlib.suppress(OSError):
                os.remove(path)


def _wait(sweep_dir: str, running: list, todo: list[Point], progress: Progress,
          outcomes: dict[str, str] | None) -> bool:
    """Until every worker exits (on Ctrl-C, each is told to stop: its runs checkpoint and
    record themselves preempted); then each run's status from its files."""
    try:
        while any(process.poll() is None for process, _ in running):
            time.sleep(0.5)
    except KeyboardInterrupt:
        for process, _ in running:
            process.terminate()
        for process, _ in running:
            process.wait()
        return False
    finally:
        for _, log in running:
            log.close()
    preempted = False
    for point in todo:
        status = run_status(sweep_dir, point)
        preempted |= status == "preempted"
        status = status if status in (*FINISHED, "failed", "preempted") else "failed"
        if outcomes is not None and status != "preempted":
            outcomes[point.name] = status
        if status != "preempted":
            progress.finished(status, point.name)
    progress.show(running=0)
    return not preempted
