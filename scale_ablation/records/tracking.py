"""Where a run's numbers go: the `Tracker` protocol and the fan-out to every tracker of a run.

Two trackers implement it: `run_files.RunFiles` (config.json, metrics.jsonl, summary.json: the
record of truth, which the report reads) and `wandb_tracker.WandbTracker` (a view on top). A third
(TensorBoard, say) is one more class with these four methods, added in `open_trackers`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from scale_ablation.records.run_files import RunFiles
from scale_ablation.records.wandb_tracker import WandbSettings, WandbTracker, resolve_wandb_mode


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """One row of metrics at `step`."""

    def log_table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """A table (a sweep's summary, say) under `key`."""

    def summary(self, fields: Mapping[str, Any]) -> None:
        """The run's summary (summary.json's fields), replacing any earlier one."""

    def finish(self, exit_code: int = 0) -> None:
        """Close; nothing is written after this."""


class RunTrackers:
    """Every tracker of one run, as one Tracker: each call goes to each, run files first (they
    must survive a failure of any other). Empty on processes that do not record (multi-host)."""

    def __init__(self, files: RunFiles | None = None, wandb: WandbTracker | None = None,
                 others: Sequence[Tracker] = ()) -> None:
        self.files, self.wandb = files, wandb
        self._trackers: list[Tracker] = [t for t in (files, wandb) if t is not None]
        self._trackers += others

    @property
    def wandb_run_id(self) -> str | None:
        return self.wandb.run_id if self.wandb is not None else None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for tracker in self._trackers:
            tracker.log(step, metrics)

    def log_table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        for tracker in self._trackers:
            tracker.log_table(key, columns, rows)

    def summary(self, fields: Mapping[str, Any]) -> None:
        fields = {**fields, "wandb_run_id": self.wandb_run_id or fields.get("wandb_run_id")}
        for tracker in self._trackers:
            tracker.summary(fields)

    def finish(self, exit_code: int = 0) -> None:
        for tracker in self._trackers:
            tracker.finish(exit_code)


def open_trackers(workdir: str | os.PathLike, config: Mapping[str, Any], *,
                  wandb: WandbSettings, resume_step: int | None = None,
                  enable: bool = True) -> RunTrackers:
    """The run's trackers: config.json written, metrics.jsonl cut back to `resume_step` (or
    emptied when starting from scratch: rows of an attempt killed before its first checkpoint
    are not this attempt's), the W&B run started (or continued). `enable=False`: none (writes
    nothing)."""
    if not enable:
        return RunTrackers()
    resolve_wandb_mode(wandb.mode)  # a bad mode fails before anything is written
    files = RunFiles(workdir)
    files.truncate_metrics_after(-1 if resume_step is None else resume_step)
    files.write_config(config)
    return RunTrackers(files, WandbTracker(workdir, config, wandb))
