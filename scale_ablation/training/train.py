"""`train(config, workdir)`: train, resume, or return the result of the run in `workdir`.

`train_runs` trains several runs that `ensemble.group` put together as one program; `train` is
its ensemble of one. Both return what summary.json holds, and raise `ConfigError`, before any
file is written, for a bad config or a workdir that holds another run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import ml_collections

from scale_ablation.records import jsonfiles, locking
from scale_ablation.training import ensemble, hooks, provenance, run_setup
from scale_ablation.training.loop import Member, run_members


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
          extra_hooks: Sequence[hooks.Periodic] = (), progress: bool = True, *,
          extend: bool = False, checked: run_setup.Checked | None = None) -> dict:
    """Train (or resume, or skip if already finished) the run in `workdir`; return its summary.

    `extra_hooks` run after the built-in row hooks, before the row is written
    (`hooks.default_hooks`). `extend`: a run trained with other `config.SCHEDULE_FIELDS`
    (steps, warmup, lr) continues with these instead of being refused. `checked`: what the
    caller's `run_setup.check_before_start` (or a sweep's grid) established, so that the config is
    not validated, nor config.json read, again.
    """
    finished = run_setup.finished_summary(config, workdir, extend=extend,
                                          stored=checked.stored if checked else None)
    if finished is not None:
        return finished
    return train_runs([config], [workdir], extra_hooks=extra_hooks, progress=progress,
                      extend=extend, checked=[checked])[0]


def train_runs(configs: Sequence[ml_collections.ConfigDict],
               workdirs: Sequence[str | os.PathLike], labels: Sequence[str] | None = None,
               extra_hooks: Sequence[hooks.Periodic] = (), progress: bool = True, *,
               extend: bool = False, pipelined: bool = True,
               checked: Sequence[run_setup.Checked | None] | None = None) -> list[dict]:
    """Train unfinished runs that can step as one program (`ensemble.group`); return their
    summaries in order. `labels` prefix each run's printed lines (default: none for one run,
    the directory name for several); `progress=False` prints no step lines (a sweep prints its
    own); `pipelined=False` reads each step's metrics before dispatching the next
    (`loop.run_members`). `checked`: per run, what the caller established (`train`).

    Raises ConfigError if a run is refused (one in use by another process included) and
    ensemble.EnsembleMismatchError if the runs are no ensemble, both before any file is written.
    """
    checked = [run_setup.check_before_start(config, workdir, extend=extend, checked=known)
               for config, workdir, known in zip(configs, workdirs,
                                                 checked or [None] * len(configs), strict=True)]
    # One writer per run directory, held until the members end (process 0 writes the files).
    # Under the lock each run is checked again, on what was established before it.
    with locking.locked(workdirs if jax.process_index() == 0 else []):
        prepared = [run_setup.prepare(config, workdir, extend=extend, checked=known)
                    for config, workdir, known in zip(configs, workdirs, checked, strict=True)]
        # The writer's alone: another process removing them races process 0's writes (a
        # config.json's temporary gone before its rename: test_multiprocess, seen once).
        for workdir in workdirs if jax.process_index() == 0 else []:
            jsonfiles.remove_leftover_temporaries(workdir)
        return _train_prepared(prepared, labels, extra_hooks, progress, pipelined)


def _train_prepared(prepared: list[run_setup.PreparedRun], labels: Sequence[str] | None,
                    extra_hooks: Sequence[hooks.Periodic], progress: bool,
                    pipelined: bool = True) -> list[dict]:
    try:
        ensemble.check_one_ensemble(prepared)
    except ensemble.EnsembleMismatchError:
        for run in prepared:  # nothing was written: each run can start again on its own
            run.checkpoints.close()
        raise
    if labels is None:
        labels = [""] if len(prepared) == 1 else [
            os.path.basename(run.workdir.rstrip(os.sep)) for run in prepared]
    members = []
    environment = provenance.environment()  # packages, commit, devices: as training starts
    try:
        for run, label in zip(prepared, labels, strict=True):
            member_hooks = hooks.default_hooks(run.config, extra=extra_hooks, progress=progress)
            members.append(Member(run, f"[{label}] " if label else "", member_hooks,
                                  environment))
    except Exception as error:  # as in the loop: members with trackers are recorded failed
        for member in members:
            member.fail(error)
        for run in prepared[len(members):]:
            run.checkpoints.close()
        raise
    run_members(members, pipelined=pipelined)
    return [member.summary for member in members]
