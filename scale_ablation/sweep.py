r"""Run an experiment's grid: one run directory per point, resumable, in-process or in parallel.

  python -m scale_ablation.sweep --config=experiments/dk_sweep.py:quick --workdir=runs/dk \
      [--parallel=N | --workers=N [--threads_per_process=T]] [--noensemble] [--dry_run] \
      [--extend] [--imports=my_policy.py] [--add_policies=SPEC,...] [--plan] [--budget_hours=H] \
      [--device=H200] [--refine [--refine_rounds=N]]

Runs execute in this process by default: on a CPU a short run spends more time importing JAX,
compiling and starting W&B than training, and one process shares all of that (and the compiled
programs) across the sweep. Runs that differ only in a scalar policy's value, the seed or the
learning rate train together as one vmapped ensemble (`scale_ablation.training.ensemble`; each keeps its
own run directory); `--noensemble` trains them one after another. `--parallel=N` runs N
`scale_ablation.main` processes at once instead; `--workers=N` N processes (pinned to
`--threads_per_process` cores each) that each train a share of the groups as ensembles
(`scale_ablation.sweeping.workers`). Rerunning the command skips finished runs
(completed or diverged) and resumes interrupted ones from their checkpoints. The report is
written at the end. `--imports` imports user modules or files (their registered policies) here
and in every process the sweep starts; `--add_policies` adds policy specs to the experiment's grid
at each setting of its other keys (`experiment.with_policies`). `--plan` prints what the runs
still to run cost on `--device` and exits; `--budget_hours` refuses a sweep over it (exit 2),
both writing nothing (`scale_ablation.sweeping.planner`).

On a CPU, a sweep given none of `--parallel`, `--workers`, `--noensemble`, `--max_members`,
`--threads_per_process` and `--process_xla_flags` takes them from the arrangement table measured
for this CPU model and core count (`python -m benchmarks.arrangements`;
`scale_ablation.sweeping.arrangements`) when it predicts another arrangement 10% faster than the
default, and prints which; `--plan` then uses that arrangement's measured rate.

`--refine` runs the sweep, then rounds that add learning rates at half the log spacing around
each setting's best (one beyond it at a grid edge), one run per seed, until every setting's best
is interior and bracketed at ×√2 or `--refine_rounds` rounds are recorded
(`scale_ablation.sweeping.refine_grid`); the report is written after the last round. Each
round's points go into the sweep directory's refined.json before they run: rerunning the
command continues where it stopped, and every later invocation of the sweep has them too.

One sweep at a time writes a sweep directory (a lock; each run directory has its own too). A run
already trained with other steps, warmup or lr is refused unless `--extend`. Exit codes: 0 every
run completed or diverged, 2 bad input (a directory in use included), 3 preempted (rerun to
continue), 4 some run failed or is missing (listed at the top of report/summary.md).
"""

from __future__ import annotations

import logging as stdlib_logging
import math
import os
import sys
from collections.abc import Sequence

from absl import flags, logging

from scale_ablation import command_line, report
from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import optimum
from scale_ablation.errors import ConfigError
from scale_ablation.model import plugins
from scale_ablation.records import checkpoints, jsonfiles, locking
from scale_ablation.records.run_files import FINISHED
from scale_ablation.sweeping import arrangements, closing, plan_text, refine_grid
from scale_ablation.sweeping.progress import Progress
from scale_ablation.sweeping.refine_grid import REFINED_FILE
from scale_ablation.sweeping.sweep_grid import (  # noqa: F401 - the sweep's API
    Point,
    RecordedOutcomes,
    SweepFile,
    check_added_policies,
    check_finished_runs,
    check_recorded_runs,
    expand,
    final_statuses,
    run_status,
    write_sweep_file,
)
from scale_ablation.sweeping.sweep_runners import (  # noqa: F401 - the sweep's API
    RunFlags,
    _hand_over,
    _log_failure,
    _run_groups,
    _summary,
    _train_alone,
    _train_together,
    command,
    hold_runs,
    process_env,
    run_in_process,
    run_in_processes,
    visible_gpus,
)
from scale_ablation.sweeping.workers import run_in_workers
from scale_ablation.training import hooks, run_setup, runtime
from scale_ablation.training.compile_log import CompileLog

_CONFIG = flags.DEFINE_string("config", None, "Experiment file, path.py[:variant].")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory; one subdirectory per run.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once; >1 uses one process per run.",
                                 lower_bound=1)
_WORKERS = flags.DEFINE_integer(
    "workers", 1, "Processes that each train a share of the sweep's groups as ensembles (at most "
    "--max_members runs a program), pinned with --threads_per_process.", lower_bound=1)
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the runs and their commands, run nothing.")
_REPORT = flags.DEFINE_bool("report", True, "Write the report when the sweep ends.")
_ENSEMBLE = flags.DEFINE_bool(
    "ensemble", True, "Train runs that differ only in a scalar policy's value, the seed or the "
    "learning rate as one vmapped program (in-process runner, --parallel=1, only).")

_COMPILE_AHEAD = flags.DEFINE_bool(
    "compile_ahead", True, "Compile each group's programs in a background thread while the "
    "group before it trains (in-process runner).")
_MAX_MEMBERS = flags.DEFINE_integer(
    "max_members", 0, "Most runs one ensemble program trains (in-process runner); 0: as many as "
    "fit in the device's memory by the planner's rule (printed per group).", lower_bound=0)
_THREADS = flags.DEFINE_integer(
    "threads_per_process", 0, "With --parallel > 1: pin each run's process to this many cores "
    "of its own (XLA's, OpenMP's and BLAS's threads follow the mask); 0: not pinned.",
    lower_bound=0)
_XLA_FLAGS = flags.DEFINE_string(
    "process_xla_flags", "", "With --parallel > 1: flags added to each run process's XLA_FLAGS.")
# Given none of these, a sweep on a CPU takes them from this CPU's arrangement table.
ARRANGEMENT_FLAGS = ("parallel", "workers", "ensemble", "max_members", "threads_per_process",
                     "process_xla_flags")
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

_REFINE = flags.DEFINE_bool(
    "refine", False, "After the sweep, add learning rates around each setting's best until it "
    "is interior and bracketed at ×√2 (rounds recorded in refined.json; resumable).")
_REFINE_ROUNDS = flags.DEFINE_integer(
    "refine_rounds", 4, "Most rounds --refine records in all (a ×4 grid needs two rounds to "
    "reach ×√2, and an edge one more per step outwards).", lower_bound=1)


def _run_flags(imports: tuple[str, ...]) -> RunFlags:
    return RunFlags(imports, extend=_EXTEND.value, verbose=_VERBOSE.value)


def main(argv: list[str]) -> int:
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
        run_setup.check_workdir(sweep_dir)
        check_added_policies(tuple(_ADD_POLICIES.value), imports)
        points = expand(_CONFIG.value, sweep_dir, tuple(_ADD_POLICIES.value))
        points += refine_grid.recorded_points(sweep_dir, points)
        check_recorded_runs(sweep_dir, points)  # the run set never shrinks silently
        statuses = {p.name: run_status(sweep_dir, p) for p in points}
        check_finished_runs(sweep_dir, points, statuses, _EXTEND.value)
        extra_hooks = hooks.hooks_from_environment(dict(os.environ))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    todo = [p for p in points if statuses[p.name] not in FINISHED]
    arrangement = _arrangement(todo)
    if _PLAN.value or _BUDGET_HOURS.value is not None:
        what = f"{_CONFIG.value} ({len(todo)} of {len(points)} runs to run)"
        code = plan_text.run(todo, what, _PLAN.value, _BUDGET_HOURS.value, _DEVICE.value,
                             arrangement)
        if code is not None:
            return code
    if _DRY_RUN.value:
        for point in points:
            print(f"{statuses[point.name]:>10}  {point.name}")
            print("            " + " ".join(command(_CONFIG.value, sweep_dir, point, _run_flags(imports))))
        print(f"{len(points)} runs, {len(todo)} to run")
        return 0
    return _locked_sweep(sweep_dir, points, todo, imports, extra_hooks)


def _arrangement(todo: list[Point]) -> arrangements.Arrangement:
    """The sweep's arrangement flags; given none, on a CPU, the table's fastest for `todo`
    (printed, and set in the flags the runners read)."""
    if any(flags.FLAGS[name].present for name in ARRANGEMENT_FLAGS) or not todo:
        return arrangements.from_flags(_PARALLEL.value, _ENSEMBLE.value, _MAX_MEMBERS.value,
                                       _THREADS.value, _XLA_FLAGS.value, _WORKERS.value)
    choice = arrangements.choose_here(todo)
    if choice is None:  # no table for this CPU, or not on a CPU: today's default
        return arrangements.DEFAULT
    print(f"[sweep] {choice.line()}", flush=True)
    chosen = choice.arrangement
    flags.FLAGS.threads_per_process = chosen.threads
    if chosen.processes > 1:  # one run a process, or workers that each train ensembles
        flags.FLAGS["workers" if chosen.workers else "parallel"].value = chosen.processes
    flags.FLAGS.max_members, flags.FLAGS.process_xla_flags = chosen.members, chosen.xla_flags
    return chosen


def _locked_sweep(sweep_dir: str, points: list[Point], todo: list[Point],
                  imports: tuple[str, ...], extra_hooks: Sequence[hooks.Periodic]) -> int:
    """The sweep (and --refine's rounds) holding the sweep directory and its runs' locks."""
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
        code = _run_sweep(sweep_dir, points, todo, imports, extra_hooks, owned,
                          write_report=not _REFINE.value)
        return _refine(sweep_dir, points, code, imports, extra_hooks, owned) if _REFINE.value \
            else code
    finally:
        for run_lock in owned.values():
            run_lock.release(remove_created=True)  # a run never started leaves no directory
        lock.release()


def _run_sweep(sweep_dir: str, points: list[Point], todo: list[Point],
               imports: tuple[str, ...], extra_hooks: Sequence[hooks.Periodic],
               owned: dict[str, locking.DirectoryLock] | None = None,
               write_report: bool = True) -> int:
    """Train `todo`, write sweep.json and the report (unless not `write_report`); the
    sweep's exit code."""
    jsonfiles.remove_leftover_temporaries(sweep_dir)
    runtime.enable_compilation_cache(os.path.join(sweep_dir, "run"))
    sweep_file = SweepFile(sweep_dir, _CONFIG.value, points, imports, tuple(_ADD_POLICIES.value))
    sweep_file.write()
    progress = Progress(len(points), len(points) - len(todo))
    progress.show(running=0)
    if _PARALLEL.value > 1 and _ENSEMBLE.value and flags.FLAGS["ensemble"].present:
        print("[sweep] note: --ensemble is ignored with --parallel > 1 (one process per run)",
              flush=True)
    outcomes = RecordedOutcomes(sweep_file)
    try:
        if _WORKERS.value > 1:
            complete = run_in_workers(sweep_dir, todo, progress, _WORKERS.value, _THREADS.value,
                                      _worker_settings(imports), outcomes,
                                      before_start=_hand_over(owned or {}),
                                      env=process_env(0, [], _XLA_FLAGS.value))
        elif _PARALLEL.value == 1:
            with CompileLog() as compile_log:
                complete = run_in_process(sweep_dir, todo, progress, outcomes,
                                          together=_ENSEMBLE.value, extra_hooks=extra_hooks,
                                          extend=_EXTEND.value,
                                          compile_ahead=_COMPILE_AHEAD.value,
                                          max_members=_MAX_MEMBERS.value)
            print(f"[sweep] {compile_log.line()}", flush=True)
        else:
            with arrangements.pinned_children(_THREADS.value, _PARALLEL.value) as pinned:
                complete = run_in_processes(
                    _CONFIG.value, sweep_dir, todo, progress, _PARALLEL.value, outcomes,
                    _run_flags(imports), before_start=pinned(_hand_over(owned or {})),
                    xla_flags=_XLA_FLAGS.value)
    finally:
        sweep_file.write(outcomes)
    if not complete:
        print("[sweep] preempted: rerun the same command to continue", flush=True)
        return 3
    reported = _report(sweep_dir) if _REPORT.value and write_report else True
    missing = {name: status for name, status in final_statuses(
        sweep_dir, points, outcomes).items() if status not in FINISHED}
    if missing:
        print(f"[sweep] {len(missing)} of {len(points)} runs have no result: "
              + ", ".join(f"{name} ({status})" for name, status in missing.items()), flush=True)
    return EXIT_INCOMPLETE if missing or not (reported and sweep_file.written) else 0


def _report(sweep_dir: str) -> bool:
    """The report and the closing lines (`sweeping.closing`); False if there is none."""
    return closing.write_report(sweep_dir, report.write_report, report.verdict_lines)


def _worker_settings(imports: tuple[str, ...]) -> dict:
    """What each `--workers` process's in-process runner takes from the sweep's flags."""
    return {"imports": imports, "verbose": _VERBOSE.value, "together": _ENSEMBLE.value,
            "extend": _EXTEND.value, "compile_ahead": _COMPILE_AHEAD.value,
            "max_members": _MAX_MEMBERS.value}


def _curves(sweep_dir: str) -> tuple[list[optimum.CurveOptimum], list[str], list[dict]]:
    """Each setting's curve over the LR grid, as the report's best-LR table locates it, a
    line for each setting with one LR, which has no curve to refine, and the runs' rows."""
    rows = [report.summarise_run(run) for run in report.load_runs(sweep_dir)]
    key, higher = cmp.primary_metric(rows)
    return (optimum.curve_optima(rows, key, higher, n_boot=0), refine_grid.unrefinable(rows),
            rows)


def _refine(sweep_dir: str, points: list[Point], code: int, imports: tuple[str, ...],
            extra_hooks: Sequence[hooks.Periodic],
            owned: dict[str, locking.DirectoryLock]) -> int:
    """--refine's rounds after the sweep's own runs (exit `code`), then the report; the
    sweep's exit code. Each round is recorded before it runs, so a rerun resumes it."""
    points = list(points)
    while code != 3:  # preempted: rerun to continue
        done = len(refine_grid.read_rounds(sweep_dir))
        try:
            curves, single, rows = _curves(sweep_dir)
            by_name = {p.name: p for p in points}
            fills = refine_grid.fill_seeds(rows, by_name)
            proposals = refine_grid.propose(curves, by_name)
        except ValueError as error:  # a run's files are damaged
            print(f"[refine] error: {error}", flush=True)
            return EXIT_INCOMPLETE
        for line in [*(proposal.line() for proposal in proposals), *single]:
            print(f"[refine] {line}", flush=True)
        added = [entry for proposal in proposals for entry in proposal.added]
        if fills:  # seeds first: a curve is located on the seeds every LR has
            print(f"[refine] {refine_grid.fill_line(fills, rows)}", flush=True)
        this_round = fills + ([] if done >= _REFINE_ROUNDS.value else added)
        if not this_round:
            line = refine_grid.final_line(proposals, added, done, len(single),
                                          _REFINE_ROUNDS.value)
            print(f"[refine] {line}", flush=True)
            break
        refine_grid.record_round(sweep_dir, this_round)
        print(f"[refine] round {done + 1}: {len(this_round)} runs added to {REFINED_FILE} "
              f"(at most {_REFINE_ROUNDS.value} rounds add LRs)", flush=True)
        new = refine_grid.points_of(this_round, points)
        points += new
        try:
            owned.update(hold_runs(sweep_dir, new))
        except ConfigError as error:  # another process holds one of the new run directories
            print(f"error: {error}", file=sys.stderr)
            return 2
        code = _run_sweep(sweep_dir, points, new, imports, extra_hooks, owned,
                          write_report=False)
    if code == 3:
        return code
    reported = _report(sweep_dir) if _REPORT.value else True
    return code if reported else EXIT_INCOMPLETE


def check_flags() -> None:
    """Raise ValueError naming a flag value absl's types accept and the sweep cannot use."""
    budget = _BUDGET_HOURS.value
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"--budget_hours must be a positive number of hours, got {budget}")
    if flags.FLAGS["refine_rounds"].present and not _REFINE.value:
        raise ValueError("--refine_rounds is a limit on --refine's rounds: give --refine too")
    if _PARALLEL.value > 1 and _WORKERS.value > 1:
        raise ValueError("--parallel (a process a run) and --workers (processes of ensembles) "
                         "are two ways to use processes: give one")
    threads, parallel = _THREADS.value, max(_PARALLEL.value, _WORKERS.value)
    if _XLA_FLAGS.value and parallel < 2:
        raise ValueError("--process_xla_flags is for the sweep's processes: give --parallel=N "
                         "or --workers=N")
    if threads and parallel < 2:
        raise ValueError("--threads_per_process pins the sweep's processes: give --parallel=N "
                         "or --workers=N, N > 1")
    if threads and len(arrangements.cpu_sets(threads, parallel)) < parallel:
        raise ValueError(f"--threads_per_process={threads} × --parallel={parallel} needs "
                         f"{threads * parallel} cores; this process has "
                         f"{len(os.sched_getaffinity(0))}")


if __name__ == "__main__":
    command_line.start(main, validate=check_flags)
