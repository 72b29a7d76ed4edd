"""The runs a study should have, and what its files say of each: the report's run set.

The run set is the study's grid: every run sweep.json records (the grid the sweep ran), every
point of refined.json's rounds, and every point its experiment file's grid names (with the
`--add_policies` sweep.json records) that has files here. Each run of the set is finished
(summary.json says completed or diverged) or has no result: failed, preempted, interrupted (a
config.json and no summary.json), missing (no files), or damaged (files that disagree:
sweep.json says it finished and its summary.json is missing or says otherwise, a summary.json
without a config.json). What the set cannot place is listed too: folders holding run files that
no record names (left out of the report), runs that sweep.json or refined.json records and
the other records do not (refined.json lost a round, the experiment file changed), and runs
the experiment file names now that nothing here has (it changed since the sweep ran, or their
record was lost). Nothing is guessed: a report names every one of them with its path.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from scale_ablation.records import study_store
from scale_ablation.records.run_files import FINISHED, RunFiles
from scale_ablation.training import experiment_files as experiment

REFINED_FILE = "refined.json"
RUN_FILES = ("config.json", "summary.json", "metrics.jsonl")


@dataclasses.dataclass(frozen=True)
class RunSet:
    """A sweep directory's runs: the set, each one's status, and what does not fit."""

    sweep_dir: str
    statuses: dict[str, str]  # the run set in grid order -> status
    problems: dict[str, str]  # run -> what is wrong with its files (damaged or unrecorded)
    unplaced: dict[str, str]  # name -> why it is outside the set (listed, never judged)
    unrecorded: dict[str, dict]  # grid runs with files sweep.json lacks -> their overrides
    grid_note: str | None = None  # why the experiment's grid was not read (None: it was)
    overrides: dict[str, dict] = dataclasses.field(default_factory=dict)  # run -> its point
    started: frozenset[str] = frozenset()  # the runs of the set with a config.json

    def absent(self) -> dict[str, tuple[str, dict]]:
        """Run -> (status, overrides) of the runs of the set without a config.json here (never
        started, lost, or damaged): no row of theirs is read, yet they count in their claims'
        arms (`verdicts`), as runs without a result."""
        return {name: (status, self.overrides.get(name, {}))
                for name, status in self.statuses.items() if name not in self.started}

    @property
    def finished(self) -> int:
        return sum(status in FINISHED for status in self.statuses.values())

    def count_line(self) -> str | None:
        """'k of n runs finished' when some run of the set has no result; None otherwise."""
        total = len(self.statuses)
        return None if self.finished == total else f"{self.finished} of {total} runs finished"

    def notice(self) -> list[str]:
        """The markdown paragraph naming every run without a result, damaged or unplaced, with
        its path ([] when there is none)."""
        lines = []
        listed = [(name, status) for name, status in self.statuses.items()
                  if status not in FINISHED or name in self.problems]
        if listed:
            lines += [f"**{len(listed)} run(s) without a result or with damaged files, "
                      f"left out of the tables below (under {self.sweep_dir}/):**", ""]
            lines += [f"- {name}: {status}"
                      + (f" ({self.problems[name]})" if name in self.problems else "")
                      for name, status in listed]
        if self.unplaced:
            lines += [""] if lines else []
            lines += [f"**{len(self.unplaced)} name(s) outside the run set, left out "
                      f"(under {self.sweep_dir}/):**", ""]
            lines += [f"- {name}: {why}" for name, why in self.unplaced.items()]
        if self.grid_note:
            lines += [""] if lines else []
            lines.append(f"**The run set is the sweep's records alone: {self.grid_note}.**")
        return lines


def _grid(record: dict) -> tuple[dict[str, dict] | None, str | None]:
    """The experiment file's grid (name -> overrides), or None and why it cannot be read."""
    spec = record.get("config")
    if not spec:
        return None, "sweep.json names no experiment file"
    try:
        grid = experiment.load_grid(spec, tuple(record.get("add_policies") or ()))
    except ValueError as error:
        return None, f"the experiment's grid cannot be read here ({error})"
    return {experiment.run_name(point): point for point in grid}, None


def _refined(sweep_dir: str) -> dict[str, dict]:
    """Name -> overrides of refined.json's points; ValueError naming a damaged file."""
    record = study_store.study_json(sweep_dir, REFINED_FILE) or {}
    rounds = record.get("rounds", []) if isinstance(record, dict) else None
    if not isinstance(rounds, list) or not all(isinstance(r, list) for r in rounds):
        raise ValueError(f"{os.path.join(sweep_dir, REFINED_FILE)} is damaged: no list of rounds")
    return {entry["name"]: entry.get("overrides", {}) for added in rounds for entry in added}


def _folders_with_files(sweep_dir: str) -> dict[str, bool]:
    """Run folder -> whether it holds a config.json, for every folder holding run files (none
    for a study store, whose runs all have one)."""
    if study_store.store_path(sweep_dir) is not None:
        return {}
    out = {}
    for name in sorted(os.listdir(sweep_dir)):
        folder = os.path.join(sweep_dir, name)
        if any(os.path.isfile(os.path.join(folder, file)) for file in RUN_FILES):
            out[name] = os.path.isfile(os.path.join(folder, "config.json"))
    return out


def _status(recorded: str | None, summary: dict | None, started: bool,
            has_files: bool) -> tuple[str, str | None]:
    """A run's status and what is wrong with its files (None: nothing), by its files first."""
    said = f"sweep.json says {recorded}"
    if started and summary is not None:
        status = summary.get("status") or "damaged"
        wrong = recorded in FINISHED and recorded != status
        return status, (f"{said}, summary.json says {status}" if wrong else None)
    if started:
        if recorded in FINISHED:
            return "damaged", f"{said}, but it has no summary.json"
        return (recorded if recorded in ("failed", "preempted") else "interrupted"), None
    if has_files:
        return "damaged", "run files without a config.json"
    if recorded in FINISHED:
        return "missing", f"{said}, but it has no run files"
    return (recorded if recorded not in (None, "pending") else "missing"), None


def of(sweep_dir: str) -> RunSet:
    """The run set of `sweep_dir` (a sweep directory or a study store); ValueError naming a
    damaged sweep.json or refined.json."""
    record = study_store.study_json(sweep_dir, study_store.SWEEP_FILE)
    summaries = study_store.recorded_summaries(sweep_dir)
    folders = _folders_with_files(sweep_dir)
    if record is None:  # a folder of runs, no record of a grid: the runs with a config are it
        statuses = {name: _status(None, s, True, True)[0] for name, s in summaries.items()}
        return RunSet(sweep_dir, statuses, {}, {}, {})
    if not isinstance(record, dict) or not isinstance(record.get("runs"), list):
        raise ValueError(f"{os.path.join(sweep_dir, study_store.SWEEP_FILE)} is damaged: "
                         "no list of runs")
    recorded = {r["name"]: r.get("status") for r in record["runs"]}
    refined = _refined(sweep_dir)
    grid, why_not = _grid(record)
    points = {**(grid or {}), **refined,
              **{r["name"]: r.get("overrides", {}) for r in record["runs"]}}
    present = set(summaries) | set(folders)
    named = {**dict.fromkeys(recorded), **dict.fromkeys(refined),
             **{name: None for name in (grid or {}) if name in present}}
    statuses, problems = {}, {}
    for name in named:
        status, wrong = _status(recorded.get(name), summaries.get(name), name in summaries,
                                name in folders)
        statuses[name] = status
        if wrong is None and name not in recorded:
            wrong = "sweep.json does not record it" + (
                "; its files are used" if status in FINISHED else "")
        if wrong is None and grid is not None and name not in grid and name not in refined:
            wrong = ("neither the experiment's grid nor refined.json names it (refined.json "
                     "lost a round, or the experiment file changed)")
        if wrong is not None:
            problems[name] = wrong
    unplaced = {name: "run files that no record of the sweep names"
                for name in present if name not in named}
    if grid is not None:
        unplaced |= {name: "the experiment file names it, and neither sweep.json nor a run "
                     "folder has it (the file changed since the sweep ran, or its record "
                     "was lost)" for name in grid if name not in named}
    unrecorded = {name: (grid or {}).get(name, refined.get(name, {}))
                  for name in named if name not in recorded and name in summaries}
    return RunSet(sweep_dir, statuses, problems, unplaced, unrecorded, why_not,
                  {name: points.get(name, {}) for name in named}, frozenset(summaries))


def read_unrecorded(run_set: RunSet) -> list[dict[str, Any]]:
    """The runs of the set that sweep.json does not record and that have a config.json, read
    from their folders as `study_store.load_runs` reads the others."""
    out = []
    for name, overrides in run_set.unrecorded.items():
        files = RunFiles(os.path.join(run_set.sweep_dir, name))
        out.append(study_store.RunRecord(name, overrides, files.read_config(),
                                         files.read_summary(), files.read_result_metrics(),
                                         None).as_loaded())
    return out
