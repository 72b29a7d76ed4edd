"""How a sweep's runs train: in this process (compatible runs as one ensemble, the next group
compiled ahead) or one process per run (`--parallel`), each run directory held by the sweep
from the start."""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from absl import logging

from scale_ablation.errors import ConfigError
from scale_ablation.records import locking
from scale_ablation.records.run_files import FINISHED, RunFiles
from scale_ablation.sweeping import planner
from scale_ablation.sweeping.ahead import Ahead
from scale_ablation.sweeping.progress import Progress
from scale_ablation.sweeping.sweep_grid import Point, run_status
from scale_ablation.training import ensemble, hooks, runtime
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training.preemption import PreemptionFlag
from scale_ablation.training.train import train, train_runs


def imports_args(imports: Sequence[str]) -> list[str]:
    """The command-line arguments that make another process import the same modules
    (`--imports`, `model.plugins`)."""
    return [f"--imports={','.join(imports)}"] if imports else []


@dataclasses.dataclass(frozen=True)
class RunFlags:
    """The sweep's flags that each run process of `--parallel` gets too."""

    imports: tuple[str, ...] = ()
    extend: bool = False
    verbose: bool = False

    def args(self) -> list[str]:
        return [*imports_args(self.imports), *(["--extend"] if self.extend else []),
                *(["--verbose"] if self.verbose else [])]


def command(spec: str, sweep_dir: str, point: Point, run_flags: RunFlags = RunFlags()
            ) -> list[str]:
    return [sys.executable, "-m", "scale_ablation.main", f"--config={spec}", *run_flags.args(),
            f"--workdir={os.path.join(sweep_dir, point.name)}",
            f"--config.wandb.group={point.config.wandb.group}", "--config.wandb.job_type=sweep",
            *experiment.override_flags(point.overrides)]


def run_in_process(sweep_dir: str, todo: list[Point], progress: Progress,
                   outcomes: dict[str, str] | None = None, together: bool = True,
                   extra_hooks: Sequence[hooks.Periodic] = (), extend: bool = False,
                   compile_ahead: bool = True, max_members: int = 0) -> bool:
    """Returns False if the sweep was preempted (stop; rerun to continue). Each run's status
    goes into `outcomes` (name -> status) when given. `together`: points that can share one
    program (`ensemble.group`) train as one ensemble, in programs of at most `max_members`
    (0: as many as fit in the device's memory, `split_groups`). `compile_ahead`: each group's
    programs are compiled in a background thread while the group before it trains (`ahead`)."""
    workdirs = [os.path.join(sweep_dir, point.name) for point in todo]
    groups = (split_groups(todo, ensemble.group([p.config for p in todo], workdirs,
                                                [p.checked for p in todo], extend),
                           max_members)
              if together else [[index] for index in range(len(todo))])
    ahead = Ahead() if compile_ahead else None
    try:
        with PreemptionFlag() as preemption:  # a signal between groups stops the sweep too
            complete = _run_groups(sweep_dir, todo, groups, progress, outcomes, extra_hooks,
                                   extend, ahead, preemption)
            # One that came during the last group's last step: every run is done, but the
            # sweep must still stop (its next refinement round would start otherwise).
            return complete and runtime.agreed_signal(preemption.signal) is None
    finally:
        if ahead is not None:
            ahead.wait()


def split_groups(todo: list[Point], groups: list[list[int]], max_members: int = 0,
                 ) -> list[list[int]]:
    """Each ensemble group as programs of at most N members (`planner.programs_of`), N printed
    per group: `max_members`, or for 0 the planner's rule (`planner.members_that_fit`: N runs'
    compiled peak within its share of this device's memory), analysed once per shape."""
    fits: dict[tuple, tuple[int, str]] = {}
    out = []
    for number, indices in enumerate(groups, start=1):
        if len(indices) == 1:
            out.append(indices)
            continue
        size, why = (max_members, "--max_members") if max_members else _members_that_fit(
            todo[indices[0]], len(indices), fits)
        size = size or len(indices)  # 0: the memory could not be analysed
        programs = planner.programs_of(indices, size)
        print(f"[sweep] group {number}: {len(indices)} runs, at most {size} members a program "
              f"({why}): {len(programs)} program{'s' * (len(programs) > 1)}", flush=True)
        out.extend(programs)
    return out


def _members_that_fit(point: Point, count: int,
                      fits: dict[tuple, tuple[int, str]]) -> tuple[int, str]:
    """(N, why) for `point`'s shape, from `fits` or analysed now (0 if that fails: a program
    that cannot compile says why when its group starts). When `count` members fit by
    `planner.peak_bound`, nothing is compiled: the memory analysis costs a compile of the
    train step, which a group that surely fits should not pay."""
    shape = planner.shape_of(point.config, point.model)
    dev = planner.device(measure=False)
    bound = planner.peak_bound(point.config, point.model)
    if planner.members_that_fit(dev, bound) >= count:
        return count, (f"fits: at most {bound / 2**30:.3g} GiB a run, {planner.MEMORY_SHARE:.0%}"
                       f" of {dev.memory_bytes / 2**30:.3g} GiB on {dev.kind}")
    if shape not in fits:
        try:
            peak = planner.shape_cost(point.config, point.model).peak_bytes
        except Exception as error:  # then the group trains unsplit, as it did before N
            fits[shape] = 0, f"memory not analysed: {type(error).__name__}: {error}"
        else:
            fits[shape] = planner.members_that_fit(dev, peak), (
                f"peak {peak / 2**30:.3g} GiB a run, {planner.MEMORY_SHARE:.0%} of "
                f"{dev.memory_bytes / 2**30:.3g} GiB on {dev.kind}")
    return fits[shape]


def _run_groups(sweep_dir: str, todo: list[Point], groups: list[list[int]], progress: Progress,
                outcomes: dict[str, str] | None, extra_hooks: Sequence[hooks.Periodic],
                extend: bool, ahead: Ahead | None, preemption: PreemptionFlag) -> bool:
    """`run_in_process` group by group; `ahead` compiles each group's programs while the one
    before it trains. A signal that came while a group finished (`preemption`, which each
    group's loop passes its signal out to) stops the sweep before the next group."""
    for number, indices in enumerate(groups, start=1):
        if runtime.agreed_signal(preemption.signal) is not None:
            print(f"[sweep] a stop signal came between groups: group {number}/{len(groups)} "
                  "not started", flush=True)
            return False
        if ahead is not None:
            ahead.wait()  # this group's programs, begun while the last one trained
            if number < len(groups):
                ahead.start([todo[index].config for index in groups[number]],
                            [todo[index].model for index in groups[number]])
        points = [todo[index] for index in indices]
        label = points[0].name if len(points) == 1 else f"group {number}/{len(groups)}"
        group_hooks = [*extra_hooks, progress.step_hook(label)]
        if len(points) == 1:
            statuses = [_train_alone(sweep_dir, points[0], group_hooks, extend)]
        else:
            progress.show(running=len(points))
            statuses = _train_together(sweep_dir, points, group_hooks, extend)
        for point, status in zip(points, statuses, strict=True):
            if outcomes is not None:
                outcomes[point.name] = status
        if "preempted" in statuses:
            return False
        for point, status in zip(points, statuses, strict=True):
            progress.finished(status, point.name, _summary(sweep_dir, point))
        progress.show(running=0)
    return True


def _summary(sweep_dir: str, point: Point) -> dict:
    return RunFiles(os.path.join(sweep_dir, point.name)).read_summary() or {}


def _train_alone(sweep_dir: str, point: Point, extra_hooks: Sequence[hooks.Periodic],
                 extend: bool = False) -> str:
    print(f"[sweep] {point.name}", flush=True)
    try:
        workdir = os.path.join(sweep_dir, point.name)
        return train(point.config, workdir, extra_hooks, progress=False, extend=extend,
                     checked=point.checked)["status"]
    except ConfigError as error:
        print(f"[sweep] {point.name}: error: {error}", flush=True)
    except Exception as error:  # a crashed run is recorded (summary.json) and the sweep goes on
        _log_failure(error, f"run {point.name}")
        print(f"[sweep] {point.name}: failed: {type(error).__name__}: {error}", flush=True)
    return "failed"


def _log_failure(error: Exception, what: str) -> None:
    """The traceback of a crashed run, except for a full disk: the one line printed says it."""
    if not (isinstance(error, OSError) and error.errno == errno.ENOSPC):
        logging.exception("%s failed", what)


def _train_together(sweep_dir: str, points: list[Point], extra_hooks: Sequence[hooks.Periodic],
                    extend: bool = False) -> list[str]:
    names = [point.name for point in points]
    print(f"[sweep] ensemble of {len(points)}: {', '.join(names)}", flush=True)
    try:
        summaries = train_runs([p.config for p in points],
                               [os.path.join(sweep_dir, n) for n in names], names, extra_hooks,
                               progress=False, extend=extend,
                               checked=[p.checked for p in points])
    except (ConfigError, ensemble.EnsembleMismatchError) as error:
        # A member was refused, or restored another step than the others (its latest
        # checkpoint was damaged), before any file was written: alone, each run goes on or
        # says why it cannot.
        print(f"[sweep] ensemble not started ({error}): its runs train one by one", flush=True)
        return [_train_alone(sweep_dir, point, extra_hooks, extend) for point in points]
    except Exception as error:  # members without a result are recorded failed; the sweep goes on
        _log_failure(error, f"ensemble {names}")
        print(f"[sweep] ensemble failed: {type(error).__name__}: {error}", flush=True)
        statuses = [run_status(sweep_dir, point) for point in points]
        return [s if s in FINISHED else "failed" for s in statuses]
    return [summary["status"] for summary in summaries]


def visible_gpus() -> list[str]:
    """The GPU ids a sweep hands out to its processes: $CUDA_VISIBLE_DEVICES if set, else one
    per GPU that nvidia-smi lists; none on a machine without NVIDIA GPUs."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return [str(i) for i, line in enumerate(result.stdout.splitlines()) if line.startswith("GPU ")]


def process_env(slot: int, gpus: list[str], xla_flags: str = "") -> dict[str, str]:
    """The environment of the run in `slot`: its own GPU, so that N processes on an N-GPU node
    do not all land on GPU 0 (slots share GPUs round-robin when there are fewer GPUs), and
    `xla_flags` after any XLA_FLAGS of this process's."""
    env = dict(os.environ)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
    if xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    return env


def run_in_processes(spec: str, sweep_dir: str, todo: list[Point], progress: Progress,
                     parallel: int, outcomes: dict[str, str] | None = None,
                     run_flags: RunFlags = RunFlags(),
                     before_start: Callable[[Point], None] | None = None,
                     xla_flags: str = "") -> bool:
    """Run `todo` in `parallel` processes (`xla_flags` added to their XLA_FLAGS); False if
    preempted. `before_start(point)` runs just before a point's process starts (the sweep
    hands over its run directory's lock)."""
    pending, running = list(todo), {}
    free_slots, gpus = list(range(parallel)), visible_gpus()
    preempted = False
    try:
        while pending or running:
            while pending and free_slots and not preempted:
                point, slot = pending.pop(0), free_slots.pop(0)
                if before_start is not None:
                    before_start(point)
                log = open(os.path.join(sweep_dir, f"{point.name}.log"), "ab")  # noqa: SIM115
                process = subprocess.Popen(command(spec, sweep_dir, point, run_flags),
                                           stdout=log,
                                           stderr=subprocess.STDOUT,
                                           env=process_env(slot, gpus, xla_flags))
                running[point.name] = (process, point, log, slot)
                progress.show(running=len(running))
            time.sleep(0.5)
            for name, (process, point, log, slot) in list(running.items()):
                if process.poll() is None:
                    continue
                log.close()
                del running[name]
                free_slots.append(slot)
                status = run_status(sweep_dir, point)
                if status == "preempted":
                    preempted = True
                    continue
                # A process that wrote no summary (bad config: exit 2, or killed) failed.
                status = status if status in (*FINISHED, "failed") else "failed"
                if outcomes is not None:
                    outcomes[point.name] = status
                progress.finished(status, point.name, _summary(sweep_dir, point))
                progress.show(running=len(running))
            if preempted:
                pending.clear()
    except KeyboardInterrupt:
        for process, _, _, _ in running.values():
            process.terminate()  # each run checkpoints and records itself as preempted
        for process, _, log, _ in running.values():
            process.wait()
            log.close()
        return False
    return not preempted


def _hand_over(owned: dict[str, locking.DirectoryLock]) -> Callable[[Point], None]:
    """Release a point's run directory lock, for the process about to train it (and the
    directory, if the sweep made it: a run its process refuses leaves nothing)."""
    def release(point: Point) -> None:
        run_lock = owned.pop(point.name, None)
        if run_lock is not None:
            run_lock.release(remove_created=True)
    return release


def hold_runs(sweep_dir: str, todo: list[Point]) -> dict[str, locking.DirectoryLock]:
    """Run name -> the held lock of its directory, for every run the sweep is to train, all or
    none (DirectoryBusyError naming a busy one): from now on a `main` there is refused. The
    in-process runs re-enter these locks; a `--parallel` run's is handed to its process."""
    held: dict[str, locking.DirectoryLock] = {}
    try:
        for point in todo:
            held[point.name] = locking.DirectoryLock(
                os.path.join(sweep_dir, point.name)).acquire()
    except ConfigError:
        for run_lock in held.values():
            run_lock.release(remove_created=True)
        raise
    return held
