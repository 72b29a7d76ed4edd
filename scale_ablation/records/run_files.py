"""A run directory's record of truth: config.json, metrics.jsonl and summary.json, and every
step's training loss in train_losses.jsonl (`StepLosses`).

They are written whatever the W&B mode, by plain Python, and the report reads only them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scale_ablation.records import jsonfiles
from scale_ablation.records import metrics_rows as rm
from scale_ablation.records.redaction import scrub_secrets

RUN_STATUSES = ("completed", "diverged", "failed", "preempted")
# A finished run is a result and is never trained again; the others resume.
FINISHED = ("completed", "diverged")
SUMMARY_FIELDS = (
    "status",
    "steps_completed",
    "final_train_loss",
    "final_val_loss",
    "final_val_bpb",
    # The test split (`data/heldout.py`), scored once on a completed run's final state; null
    # otherwise. Validation chooses the LR and the steps, the test reports: `test_targets`
    # counts the positions scored (bytes, or MQAR's queries).
    "test_loss",
    "test_bpb",
    "test_accuracy",
    "test_targets",
    "diverged_at_step",
    "spike_step",  # first loss spike (`analysis.failures`; null: none)
    "entropy_collapse_step",  # first one-hot attention head after warmup (`analysis.failures`)
    "collapse_step",  # first collapse to the unigram loss (`analysis.failures`)
    "failures",  # every failure kind of the run (`analysis.failures.FAILURE_KINDS`; []: none)
    # The series spike_step was judged on: "every_step" (train_losses.jsonl) or "logged_rows"
    # (a run resumed from one made before every step's loss was kept); null in older runs.
    "spike_judged_on",
    "wall_seconds",  # of its whole ensemble's loop, which the run shared
    "tokens_per_second",
    # The ensemble it trained in: its first member's directory name and how many members it
    # had (1: alone), so that a sweep's wall time is a sum over ensembles, not over runs.
    "ensemble",
    "ensemble_members",
    # What the run consumed and what reproduces it (`provenance`).
    "parameters",
    "non_embedding_parameters",
    "tokens_seen",
    "passes_over_data",
    "train_flops",
    "environment",  # package versions, git commit and dirty flag, device kind and count
    "wandb_run_id",
)
# What a user can do about a damaged metrics.jsonl.
_REMEDY = ("rerun the run's command to recompute its rows from its newest checkpoint whose rows "
           "are intact, or move the run aside")


@dataclasses.dataclass(frozen=True)
class MetricsScan:
    """metrics.jsonl read line by line: the intact rows before the first damaged line.

    A row is intact when its line is a JSON object with an integer "step" no smaller than the
    row before's and a checksum that matches its fields (`metrics_rows.CHECKSUM`; none in rows
    written before it existed), ended by a newline (rows are written whole, one per line,
    newline last: a line without one was cut off by a kill or a full disk). `rows` are without
    their checksums.
    """

    rows: list[dict[str, Any]]
    damage: str | None  # "PATH:LINE: why" of the first damaged line, None if there is none
    torn_tail: bool = False  # the damage is the last line, cut off mid-write

    @property
    def last_step(self) -> int | None:
        return self.rows[-1]["step"] if self.rows else None

    def count_through(self, step: int) -> int:
        return sum(1 for row in self.rows if row["step"] <= step)


def _row_damage(line: bytes, previous_step: int | None, seen_checksum: bool) -> str | None:
    """Why one newline-terminated line of metrics.jsonl is not an intact row, or None."""
    try:
        row = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"damaged line (not JSON: {error})"
    step = row.get("step") if isinstance(row, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return "damaged line (not a row: no integer step)"
    if previous_step is not None and step < previous_step:
        return f"damaged line (step {step} after step {previous_step})"
    if (problem := rm.checksum_problem(row, seen_checksum)) is not None:
        return f"damaged line ({problem})"
    return None


class RunFiles:
    """The run directory's config.json, metrics.jsonl and summary.json; a `Tracker`.

    Nothing is created until the first write.
    """

    def __init__(self, workdir: str | os.PathLike) -> None:
        self.workdir = Path(workdir)
        self.config_path = self.workdir / "config.json"
        self.metrics_path = self.workdir / "metrics.jsonl"
        self.summary_path = self.workdir / "summary.json"
        self._tail_checked = False

    def write_config(self, config: Mapping[str, Any]) -> None:
        jsonfiles.write_json_atomic(self.config_path, scrub_secrets(config))

    def read_config(self) -> dict[str, Any] | None:
        return jsonfiles.read_json(self.config_path)

    def append_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Appends `{"step": step, **metrics}` as one line, on disk when this returns."""
        row = {"step": int(step)}
        row.update((k, v) for k, v in metrics.items() if k != "step")
        line = rm.row_line(row) + "\n"
        if not self._tail_checked:
            self._drop_partial_last_line()
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())  # a line is small; losing logged steps to a kill is worse

    def _drop_partial_last_line(self) -> None:
        # A process killed mid-write leaves a line without its newline; appending to it would
        # glue the next row onto garbage.
        self._tail_checked = True
        if not self.metrics_path.exists():
            return
        with open(self.metrics_path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            f.truncate(f.read().rfind(b"\n") + 1)

    def scan_metrics(self) -> MetricsScan:
        """The rows before the first damaged line, and that line's description if any."""
        try:
            data = self.metrics_path.read_bytes()
        except FileNotFoundError:
            return MetricsScan([], None)
        *lines, tail = data.split(b"\n")
        rows: list[dict[str, Any]] = []
        seen_checksum = False
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            reason = _row_damage(line, rows[-1]["step"] if rows else None, seen_checksum)
            if reason is not None:
                return MetricsScan(rows, f"{self.metrics_path}:{number}: {reason}")
            row = json.loads(line)
            seen_checksum = seen_checksum or rm.CHECKSUM in row
            rows.append(rm.without_checksum(row))
        if tail.strip():  # every row ends with its newline: without one the write was cut off
            return MetricsScan(rows, f"{self.metrics_path}:{len(lines) + 1}: torn last line (no "
                                     "newline: its write was cut off)", torn_tail=True)
        return MetricsScan(rows, None)

    def read_metrics(self) -> list[dict[str, Any]]:
        """All logged rows in order; a torn last line (a process killed mid-write) is skipped.

        A damaged line elsewhere raises ValueError naming it: that is corruption, not a kill.
        """
        scan = self.scan_metrics()
        if scan.damage is not None and not scan.torn_tail:
            raise ValueError(f"{scan.damage}; {_REMEDY}")
        return scan.rows

    def read_result_metrics(self) -> list[dict[str, Any]]:
        """The rows of a run as a result (the report's reading): `read_metrics`, and for a
        finished run (summary.json) no torn line and rows up to the step its summary says it
        reached (a completed run logs its last step, a diverged one the step that diverged).
        Raises ValueError naming the file otherwise: a report would print wrong "final" values.
        """
        summary = self.read_summary() or {}
        if summary.get("status") not in FINISHED:
            return self.read_metrics()
        scan = self.scan_metrics()
        if scan.damage is not None:
            raise ValueError(f"{scan.damage}; {_REMEDY}")
        reached, last = summary.get("steps_completed") or 0, scan.last_step
        if last is None or last < reached:
            raise ValueError(f"{self.metrics_path}: its rows end at step {last}, before step "
                             f"{reached} that summary.json says the run reached; {_REMEDY}")
        return scan.rows

    def count_rows_through(self, step: int) -> int:
        """Rows logged at steps <= `step` (what a checkpoint at `step` records)."""
        return self.scan_metrics().count_through(step)

    def truncate_metrics_after(self, step: int) -> list[dict[str, Any]]:
        """Drops rows after `step` (and any damaged line with what follows it), so a run
        resumed from a checkpoint at `step` has no duplicates; returns the rows kept. The
        caller has checked that the rows through `step` are intact
        (`checkpoints.Checkpoints.rows_damage`)."""
        if not self.metrics_path.exists():
            return []
        rows = [row for row in self.scan_metrics().rows if row["step"] <= step]
        text = "".join(rm.row_line(row) + "\n" for row in rows)
        jsonfiles.write_text_atomic(self.metrics_path, text)
        self._tail_checked = True
        return rows

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        jsonfiles.write_json_atomic(self.summary_path, summary)

    def read_summary(self) -> dict[str, Any] | None:
        return jsonfiles.read_json(self.summary_path)

    # --- the Tracker protocol

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.append_metrics(step, metrics)

    def log_table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """tables/<key>.json (slashes in `key` become '.'), replaced on every call."""
        path = self.workdir / "tables" / (key.replace("/", ".") + ".json")
        jsonfiles.write_json_atomic(path, {"columns": list(columns), "data": [list(r) for r in rows]})

    def summary(self, fields: Mapping[str, Any]) -> None:
        """summary.json: the standard fields (missing ones as null) plus any extras."""
        status = fields.get("status")
        if status not in RUN_STATUSES:
            raise ValueError(f"summary status must be one of {RUN_STATUSES}; got {status!r}")
        self.write_summary({**dict.fromkeys(SUMMARY_FIELDS), **fields})

    def finish(self, exit_code: int = 0) -> None:
        """Every write is on disk when it returns: nothing to close."""


STEP_LOSSES_FILE = "train_losses.jsonl"


class StepLosses:
    """Every step's training loss of a run, in memory and in train_losses.jsonl.

    One line per `write` (the loop writes at each logged row, before each checkpoint and at the
    end: `hooks.write_step_losses`): `{"step": FIRST, "train/loss": [...]}`, the losses of
    steps FIRST, FIRST+1, ... as float32 values (null where non-finite). Resuming
    from a checkpoint at step S cuts the file back to S, so that the steps retrained after it
    are not there twice. Lines are appended without fsync: a killed process's writes survive in
    the page cache; a machine crash may lose the last lines, and then the series is no longer
    `complete` (the failure rules fall back to the logged rows, `analysis.failures`).
    `path=None` (a process that writes no run files): memory only.
    """

    def __init__(self, path: str | os.PathLike | None, resume_step: int | None) -> None:
        self.path = None if path is None else Path(path)
        self.losses: list[tuple[int, float]] = (
            [] if self.path is None else self._cut_after(-1 if resume_step is None else resume_step))
        self._written = len(self.losses)

    def _read(self) -> list[tuple[int, float]]:
        """The intact lines' losses, in order; reading stops at the first damaged line."""
        try:
            lines = self.path.read_text(encoding="utf-8").split("\n")[:-1]  # last: torn or ""
        except FileNotFoundError:
            return []
        out: list[tuple[int, float]] = []
        for line in lines:
            try:
                record = json.loads(line)
                first, values = int(record["step"]), record["train/loss"]
                out += [(first + i, math.nan if v is None else float(v))
                        for i, v in enumerate(values)]
            except (ValueError, KeyError, TypeError):
                break
        return out

    def _cut_after(self, step: int) -> list[tuple[int, float]]:
        kept = [(s, v) for s, v in self._read() if s <= step]
        if self.path.exists():
            lines, start = [], 0
            for i in range(1, len(kept) + 1):  # one line per stretch of consecutive steps
                if i == len(kept) or kept[i][0] != kept[i - 1][0] + 1:
                    lines.append(_losses_line(kept[start:i]))
                    start = i
            jsonfiles.write_text_atomic(self.path, "".join(lines))
        return kept

    def add(self, step: int, loss: float) -> None:
        self.losses.append((int(step), float(loss)))

    def write(self) -> None:
        """Append the losses added since the last write as one line."""
        new = self.losses[self._written:]
        if self.path is None or not new:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(_losses_line(new))
        self._written = len(self.losses)

    def complete(self) -> list[tuple[int, float]] | None:
        """(step, loss) of steps 1, 2, ..., last with none missing, or None when some are (or
        none was recorded)."""
        steps = [s for s, _ in self.losses]
        return self.losses if steps and steps == list(range(1, len(steps) + 1)) else None


def _losses_line(losses: Sequence[tuple[int, float]]) -> str:
    """One line of train_losses.jsonl; float32's shortest digits keep it compact."""
    values = [float(str(np.float32(v))) if math.isfinite(v) else None for _, v in losses]
    return jsonfiles.json_line({"step": losses[0][0], "train/loss": values}) + "\n"
