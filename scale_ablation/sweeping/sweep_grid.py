"""A sweep's grid and its record: the points an experiment file expands to, their statuses,
and `sweep.json`, rewritten as each run ends."""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Sequence

from scale_ablation.errors import ConfigError
from scale_ablation.model import plugins, policies
from scale_ablation.model.spec import ModelConfig
from scale_ablation.records import jsonfiles
from scale_ablation.records.run_files import FINISHED, RunFiles
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import run_setup
from scale_ablation.training.run_config import validate


@dataclasses.dataclass(frozen=True)
class Point:
    name: str
    overrides: dict
    config: object  # ml_collections.ConfigDict, resolved
    model: ModelConfig | None = None  # the config's, from its one validation (`expand`)
    stored: run_setup.StoredConfig | None = None  # its config.json, once read
    # (`check_finished_runs`)

    @property
    def checked(self) -> run_setup.Checked | None:
        """What the sweep established about the run, for `train` to check on (None: nothing,
        a point made without `expand`)."""
        return None if self.model is None else run_setup.Checked(self.model, self.stored)


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
            model = validate(config)  # the sweep's one validation of this point
        except ConfigError as error:
            raise ValueError(f"grid point {name}: {error}") from None
        points.append(Point(name, dict(overrides), config, model))
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


def check_recorded_runs(sweep_dir: str, points: list[Point]) -> None:
    """Raise ValueError, before anything is written, when sweep.json records runs that the
    grid `points` lacks: rewriting it from this grid would drop them from the sweep's record
    and its report. Names the flags the sweep recorded, which bring them back."""
    record = jsonfiles.read_json(os.path.join(sweep_dir, "sweep.json")) or {}
    names = {p.name for p in points}
    lacking = [r["name"] for r in record.get("runs", []) if r["name"] not in names]
    if not lacking:
        return
    flags = " ".join(f"--{flag}={','.join(record[flag])}" for flag in ("imports", "add_policies")
                     if record.get(flag))
    how = (f"rerun with the flags it was started with: {flags}" if flags else
           "rerun with the --imports and --add_policies it was started with, if any")
    raise ValueError(f"{os.path.join(sweep_dir, 'sweep.json')} records {len(lacking)} run(s) "
                     f"this grid lacks (first: {lacking[0]}): {how} (or the experiment file or "
                     "refined.json changed since; give another --workdir)")


def run_status(sweep_dir: str, point: Point) -> str:
    """The run's status on disk ("pending" if none); ValueError naming a damaged summary."""
    summary = RunFiles(os.path.join(sweep_dir, point.name)).read_summary()
    return (summary or {}).get("status", "pending")


def check_finished_runs(sweep_dir: str, points: list[Point], statuses: dict[str, str],
                        extend: bool = False) -> None:
    """Raise ConfigError if a started run was made with other identity fields than its point
    has now (the experiment file changed): skipping it would report a stale result, resuming it
    would mix two configs. Another schedule is refused too unless `extend`, which marks a
    finished run "extend" in `statuses`. Each point in `points` is replaced by one carrying
    its config.json as read here (`Point.stored`): the run's start reads it no more."""
    for index, point in enumerate(points):
        workdir = os.path.join(sweep_dir, point.name)
        stored = run_setup.StoredConfig.read(workdir)
        points[index] = dataclasses.replace(point, stored=stored)
        if statuses[point.name] in FINISHED:
            if run_setup.finished_summary(point.config, workdir, extend=extend,
                                          stored=stored) is None:
                statuses[point.name] = "extend"
        elif stored.stamp is not None:
            run_setup.check_same_run(workdir, point.config, stored.config or {})
            saved = run_setup.checkpoint_steps(workdir)
            if saved:
                run_setup.check_same_schedule(workdir, point.config, max(saved), extend=extend,
                                              old=stored.config or {})


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
                     imports: Sequence[str] = (), add_policies: Sequence[str] = ()) -> None:
    """sweep.json: the grid, each run's status (`final_statuses`), the `--imports` its runs
    had, which `report` loads again, and the `--add_policies` that made its grid (the report's
    run set, `run_set`, expands the same grid)."""
    statuses = final_statuses(sweep_dir, points, outcomes)
    record = {
        "config": spec,
        "imports": plugins.recorded(imports),
        **({"add_policies": list(add_policies)} if add_policies else {}),
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
                 imports: Sequence[str], add_policies: Sequence[str] = ()) -> None:
        self.sweep_dir, self.spec, self.points, self.imports = sweep_dir, spec, points, imports
        self.add_policies = add_policies
        self.written = True

    def write(self, outcomes: dict[str, str] | None = None) -> None:
        try:
            write_sweep_file(self.sweep_dir, self.spec, self.points, outcomes, self.imports,
                             self.add_policies)
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
