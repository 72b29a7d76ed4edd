r"""Run an experiment's grid: one run directory per point, resumable, in-process or in parallel.

  python -m scale_ablation.sweep --config=experiments/dk_sweep.py:quick --workdir=runs/dk \
      [--parallel=N] [--noensemble] [--dry_run] [--extend] [--imports=my_policy.py] \
      [--add_policies=SPEC,...] [--plan] [--budget_hours=H] [--device=H200]

Runs execute in this process by default: on a CPU a short run spends more time importing JAX,
compiling and starting W&B than training, and one process shares all of that (and the compiled
programs) across the sweep. Runs that differ only in a scalar policy's value, the seed or the
learning rate train together as one vmapped ensemble (`scale_ablation.training.ensemble`; each keeps its
own run directory); `--noensemble` trains them one after another. `--parallel=N` runs N
`scale_ablation.main` processes at once instead. Rerunning the command skips finished runs
(completed or diverged) and resumes interrupted ones from their checkpoints. The report is
written at the end. `--imports` imports user modules or files (their registered policies) here
and in every process the sweep starts; `--add_policies` adds policy specs to the experiment's grid
at each setting of its other keys (`experiment.with_policies`). `--plan` prints what the runs
still to run cost on `--device` and exits; `--budget_hours` refuses a sweep over it (exit 2),
both writing nothing (`scale_ablation.training.planner`).

One sweep at a time writes a sweep directory (a lock; each run directory has its own too). A run
already trained with other steps, warmup or lr is refused unless `--extend`. Exit codes: 0 every
run completed or diverged, 2 bad input (a directory in use included), 3 preempted (rerun to
continue), 4 some run failed or is missing (listed at the top of report/summary.md).
"""

from __future__ import annotations

import dataclasses
import errno
import logging as stdlib_logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from absl import app, flags, logging

from scale_ablation import report
from scale_ablation.errors import ConfigError
from scale_ablation.model import plugins, policies
from scale_ablation.records import checkpoints, jsonfiles, locking
from scale_ablation.records.run_files import FINISHED, RunFiles
from scale_ablation.training import ensemble, hooks, plan_text, runs, runtime
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training.ahead import Ahead
from scale_ablation.training.compile_log import CompileLog
from scale_ablation.training.progress import Progress
from scale_ablation.training.run_config import validate
from scale_ablation.training.train import train, train_runs

_CONFIG = flags.DEFINE_string("config", None, "Experiment file, path.py[:variant].")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory; one subdirectory per run.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once; >1 uses one process per run.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the runs and their commands, run nothing.")
_REPORT = flags.DEFINE_bool("report", True, "Write the report when the sweep ends.")
_ENSEMBLE = flags.DEFINE_bool(
    "ensemble", True, "Train runs that differ only in a scalar policy's value, the seed or the "
    "learning rate as one vmapped program (in-process runner, --parallel=1, only).")

_COMPILE_AHEAD = flags.DEFINE_bool(
    "compile_ahead", True, "Compile each group's programs in a background thread while the "
    "group before it trains (in-process runner).")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show W&B's own console lines (banners per run).")
_EXTEND = flags.DEFINE_bool(
    "extend", False, "Continue runs trained with other train.steps, train.warmup_steps or "
    "train.lr (finished ones included) from their last checkpoints with the new values.")
EXIT_INCOMPLETE = 4  # some run failed or is missing

_PLAN = flags.DEFINE_bool(
    "plan", False, "Print what the sweep costs (runs, parameters, tokens, passes, FLOPs, peak "
    "memory per shape, device-hours on --device) and exit, writing nothing.")
_BUDGET_HOURS = flags.DEFINE_float(
    "budget_hours", None, "Refuse to start (exit 2) a sweep whose plan needs more device-hours.")
_DEVICE = flags.DEFINE_string(
    "device", None, "Device kind the plan is for (H200, H100, A100, TPU v4, TPU v5e, cpu); "
    "default: this process's device.")
_IMPORTS = plugins.imports_flag()
_ADD_POLICIES = flags.DEFINE_list(
    "add_policies", [], "Policy specs to add to the experiment's grid, comma-separated: one more "
    "point per setting of the grid's other keys (e.g. per d_k and seed).")

@dataclasses.dataclass(frozen=True)
class Point:
    name: str
    overrides: dict
    config: object  # ml_collections.ConfigDict, resolved


def expand(spec: str, sweep_dir: str, add_policies: tuple[str, ...] = ()) -> list[Point]:
    """The grid of `spec` (plus `add_policies`) as resolved configs; raises ValueError naming
    the first bad point."""
    base = experiment.load_config(spec)
    grid = experiment.load_grid(spec, add_policies)
    group = os.path.basename(os.path.normpath(sweep_dir))
    points, names = [], set()
    for overrides in grid:
        name = experiment.run_name(overrides)
        if name in names:
            raise ValueError(f"two grid points share the run name {name!r}")
        names.add(name)
        config = experiment.apply_overrides(base, overrides)
        config.wandb.group = config.wandb.group or group
        config.wandb.job_type = "sweep"
        try:
            validate(config)
        except ConfigError as error:
            raise ValueError(f"grid point {name}: {error}") from None
        points.append(Point(name, dict(overrides), config))
    return points


def check_added_policies(specs: tuple[str, ...], imports: tuple[str, ...]) -> None:
    """Raise ValueError naming the first `--add_policies` spec that is no policy; without
    `--imports`, say that a policy of one's own is registered by importing its module."""
    for spec in specs:
        try:
            policies.get(spec)
        except ValueError as error:
            hint = "" if imports else (" A policy of your own is registered by its file or "
                                       "module: add --imports=my_policy.py (or a module name).")
            raise ValueError(f"--add_policies={spec}: {error}.{hint}".replace("..", ".")) from None


def run_status(sweep_dir: str, point: Point) -> str:
    """The run's status on disk ("pending" if none); ValueError naming a damaged summary."""
    summary = RunFiles(os.path.join(sweep_dir, point.name)).read_summary()
    return (summary or {}).get("status", "pending")


def check_finished_runs(sweep_dir: str, points: list[Point], statuses: dict[str, str],
                        extend: bool = False) -> None:
    """Raise ConfigError if a started run was made with other identity fields than its point
    has now (the experiment file changed): skipping it would report a stale result, resuming it
    would mix two configs. Another schedule is refused too unless `extend`, which marks a
    finished run "extend" in `statuses`."""
    for point in points:
        workdir = os.path.join(sweep_dir, point.name)
        if statuses[point.name] in FINISHED:
            if runs.finished_summary(point.config, workdir, extend=extend) is None:
                statuses[point.name] = "extend"
        elif os.path.isfile(os.path.join(workdir, "config.json")):
            runs.check_same_run(workdir, point.config)
            saved = runs.checkpoint_steps(workdir)
            if saved:
                runs.check_same_schedule(workdir, point.config, max(saved), extend=extend)


def final_statuses(sweep_dir: str, points: list[Point],
                   outcomes: dict[str, str] | None = None) -> dict[str, str]:
    """Each point's status: summary.json's, else `outcomes`' (run name -> status, from this
    invocation's runner), which stand in for runs that left no summary.json: one rejected by
    `train` before writing anything is "failed"."""
    outcomes = outcomes or {}
    result = {}
    for point in points:
        on_disk = run_status(sweep_dir, point)
        result[point.name] = outcomes.get(point.name, on_disk) if on_disk == "pending" else on_disk
    return result


def write_sweep_file(sweep_dir: str, spec: str, points: list[Point],
                     outcomes: dict[str, str] | None = None,
                     imports: Sequence[str] = ()) -> None:
    """sweep.json: the grid, each run's status (`final_statuses`) and the `--imports` its runs
    had, which `report` loads again."""
    statuses = final_statuses(sweep_dir, points, outcomes)
    record = {
        "config": spec,
        "imports": plugins.recorded(imports),
        "runs": [{"name": p.name, "overrides": p.overrides, "status": statuses[p.name]}
                 for p in points],
    }
    # Unsorted: the overrides keep the grid's order, which names the runs.
    jsonfiles.write_json_atomic(os.path.join(sweep_dir, "sweep.json"), record, sort_keys=False)


class SweepFile:
    """sweep.json, written at the start and again as each run ends (a killed sweep's file
    says which runs completed). A full disk is said in one line, once, and not raised: the
    runs' own files hold their results, and the sweep's exit code says it is incomplete."""

    def __init__(self, sweep_dir: str, spec: str, points: list[Point],
                 imports: Sequence[str]) -> None:
        self.sweep_dir, self.spec, self.points, self.imports = sweep_dir, spec, points, imports
        self.written = True

    def write(self, outcomes: dict[str, str] | None = None) -> None:
        try:
            write_sweep_file(self.sweep_dir, self.spec, self.points, outcomes, self.imports)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            if self.written:
                print(f"[sweep] error: no space left on device: sweep.json in {self.sweep_dir} "
                      "is not up to date", flush=True)
            self.written = False
        else:
            self.written = True


class RecordedOutcomes(dict):
    """Run name -> status, each entry written to sweep.json as it is set (`SweepFile`)."""

    def __init__(self, sweep_file: SweepFile) -> None:
        super().__init__()
        self._sweep_file = sweep_file

    def __setitem__(self, name: str, status: str) -> None:
        super().__setitem__(name, status)
        self._sweep_file.write(self)


@dataclasses.dataclass(frozen=True)
class RunFlags:
    """The sweep's flags that each run process of `--parallel` gets too."""

    imports: tuple[str, ...] = ()
    extend: bool = False
    verbose: bool = False

    def args(self) -> list[str]:
        return [*plugins.flag_args(self.imports), *(["--extend"] if self.extend else []),
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
                   compile_ahead: bool = True) -> bool:
    """Returns False if the sweep was preempted (stop; rerun to continue). Each run's status
    goes into `outcomes` (name -> status) when given. `together`: points that can share one
    program (`ensemble.group`) train as one ensemble. `compile_ahead`: each group's programs
    are compiled in a background thread while the group before it trains (`ahead`)."""
    workdirs = [os.path.join(sweep_dir, point.name) for point in todo]
    groups = (ensemble.group([p.config for p in todo], workdirs) if together
              else [[index] for index in range(len(todo))])
    ahead = Ahead() if compile_ahead else None
    try:
        return _run_groups(sweep_dir, todo, groups, progress, outcomes, extra_hooks, extend,
                           ahead)
    finally:
        if ahead is not None:
            ahead.wait()


def _run_groups(sweep_dir: str, todo: list[Point], groups: list[list[int]], progress: Progress,
                outcomes: dict[str, str] | None, extra_hooks: Sequence[hooks.Periodic],
                extend: bool, ahead: Ahead | None) -> bool:
    """`run_in_process` group by group; `ahead` compiles each group's programs while the one
    before it trains."""
    for number, indices in enumerate(groups, start=1):
        if ahead is not None:
            ahead.wait()  # this group's programs, begun while the last one trained
            if number < len(groups):
                ahead.start([todo[index].config for index in groups[number]])
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
        return train(point.config, workdir, extra_hooks, progress=False, extend=extend)["status"]
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
                               progress=False, extend=extend)
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


def process_env(slot: int, gpus: list[str]) -> dict[str, str]:
    """The environment of the run in `slot`: its own GPU, so that N processes on an N-GPU node
    do not all land on GPU 0 (slots share GPUs round-robin when there are fewer GPUs)."""
    env = dict(os.environ)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
    return env


def run_in_processes(spec: str, sweep_dir: str, todo: list[Point], progress: Progress,
                     parallel: int, outcomes: dict[str, str] | None = None,
                     run_flags: RunFlags = RunFlags(),
                     before_start: Callable[[Point], None] | None = None) -> bool:
    """Run `todo` in `parallel` processes; False if preempted. `before_start(point)` runs
    just before a point's process starts (the sweep hands over its run directory's lock)."""
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
                                           stderr=subprocess.STDOUT, env=process_env(slot, gpus))
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


def _run_flags(imports: tuple[str, ...]) -> RunFlags:
    return RunFlags(imports, extend=_EXTEND.value, verbose=_VERBOSE.value)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not _CONFIG.value or not _WORKDIR.value:
        print("error: --config and --workdir are required", file=sys.stderr)
        return 2
    if _PARALLEL.value < 1:
        print(f"error: --parallel must be >= 1, got {_PARALLEL.value}", file=sys.stderr)
        return 2
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    # The process edge: everything process-wide is set here, nowhere in the library.
    runtime.make_experiments_importable(_CONFIG.value)
    runtime.normalise_environment(verbose=_VERBOSE.value)
    checkpoints.quiet_failed_restores()
    # On a full disk W&B's own log file fails too; each failed write would print a traceback.
    stdlib_logging.raiseExceptions = False
    sweep_dir = _WORKDIR.value
    imports = tuple(_IMPORTS.value)
    try:
        plugins.load(imports)
        runs.check_workdir(sweep_dir)
        check_added_policies(tuple(_ADD_POLICIES.value), imports)
        points = expand(_CONFIG.value, sweep_dir, tuple(_ADD_POLICIES.value))
        statuses = {p.name: run_status(sweep_dir, p) for p in points}
        check_finished_runs(sweep_dir, points, statuses, _EXTEND.value)
        extra_hooks = hooks.hooks_from_environment(dict(os.environ))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    todo = [p for p in points if statuses[p.name] not in FINISHED]
    if _PLAN.value or _BUDGET_HOURS.value is not None:
        what = f"{_CONFIG.value} ({len(todo)} of {len(points)} runs to run)"
        code = plan_text.run(todo, what, _PLAN.value, _BUDGET_HOURS.value, _DEVICE.value)
        if code is not None:
            return code
    if _DRY_RUN.value:
        for point in points:
            print(f"{statuses[point.name]:>10}  {point.name}")
            print("            " + " ".join(command(_CONFIG.value, sweep_dir, point, _run_flags(imports))))
        print(f"{len(points)} runs, {len(todo)} to run")
        return 0
    try:
        lock = locking.DirectoryLock(sweep_dir).acquire()  # one sweep per directory
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        owned = hold_runs(sweep_dir, todo)
    except ConfigError as error:
        lock.release(remove_created=True)
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        return _run_sweep(sweep_dir, points, todo, imports, extra_hooks, owned)
    finally:
        for run_lock in owned.values():
            run_lock.release(remove_created=True)  # a run never started leaves no directory
        lock.release()


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


def _run_sweep(sweep_dir: str, points: list[Point], todo: list[Point],
               imports: tuple[str, ...], extra_hooks: Sequence[hooks.Periodic],
               owned: dict[str, locking.DirectoryLock] | None = None) -> int:
    """Train `todo`, write sweep.json and the report; the sweep's exit code."""
    jsonfiles.remove_leftover_temporaries(sweep_dir)
    runtime.enable_compilation_cache(os.path.join(sweep_dir, "run"))
    sweep_file = SweepFile(sweep_dir, _CONFIG.value, points, imports)
    sweep_file.write()
    progress = Progress(len(points), len(points) - len(todo))
    progress.show(running=0)
    if _PARALLEL.value > 1 and _ENSEMBLE.value and flags.FLAGS["ensemble"].present:
        print("[sweep] note: --ensemble is ignored with --parallel > 1 (one process per run)",
              flush=True)
    outcomes = RecordedOutcomes(sweep_file)
    try:
        if _PARALLEL.value == 1:
            with CompileLog() as compile_log:
                complete = run_in_process(sweep_dir, todo, progress, outcomes,
                                          together=_ENSEMBLE.value, extra_hooks=extra_hooks,
                                          extend=_EXTEND.value,
                                          compile_ahead=_COMPILE_AHEAD.value)
            print(f"[sweep] {compile_log.line()}", flush=True)
        else:
            complete = run_in_processes(
                _CONFIG.value, sweep_dir, todo, progress, _PARALLEL.value, outcomes,
                _run_flags(imports), before_start=_hand_over(owned or {}))
    finally:
        sweep_file.write(outcomes)
    if not complete:
        print("[sweep] preempted: rerun the same command to continue", flush=True)
        return 3
    reported = _write_report(sweep_dir) if _REPORT.value else True
    missing = {name: status for name, status in final_statuses(
        sweep_dir, points, outcomes).items() if status not in FINISHED}
    if missing:
        print(f"[sweep] {len(missing)} of {len(points)} runs have no result: "
              + ", ".join(f"{name} ({status})" for name, status in missing.items()), flush=True)
    return EXIT_INCOMPLETE if missing or not (reported and sweep_file.written) else 0


def _write_report(sweep_dir: str) -> bool:
    """The report, or one line saying why there is none (then the sweep is incomplete: a
    report left by an earlier invocation is not this one's)."""
    stale = os.path.join(sweep_dir, "report")
    stale = stale if os.path.isdir(stale) else None
    try:
        report.write_report(sweep_dir)
        return True
    except ValueError as error:  # no run wrote its config, or a run's files are damaged
        reason = str(error)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        reason = f"no space left on device ({error.filename or sweep_dir})"
    print(f"[sweep] no report: {reason}" + (f" ({stale} is from an earlier invocation)"
                                            if stale else ""), flush=True)
    return False


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
