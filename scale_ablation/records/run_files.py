"""A run directory's record of truth: config.json, metrics.jsonl and summary.json.

They are written whatever the W&B mode, by plain Python, and the report reads only them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scale_ablation.records import jsonfiles
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
    "diverged_at_step",
    "spike_step",  # first loss spike, `instability.spike_step` (null: none)
    "collapse_step",  # first collapse to the unigram loss, `instability.collapse_step`
    "wall_seconds",
    "tokens_per_second",
    # What the run consumed and what reproduces it (`provenance`).
    "parameters",
    "non_embedding_parameters",
    "tokens_seen",
    "passes_over_data",
    "train_flops",
    "environment",  # package versions, git commit and dirty flag, device kind and count
    "wandb_run_id",
)


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
        line = jsonfiles.json_line(row) + "\n"
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

    def read_metrics(self) -> list[dict[str, Any]]:
        """All logged rows in order; a truncated last line (killed process) is skipped.

        A damaged line elsewhere raises ValueError: that is corruption, not a kill.
        """
        try:
            lines = self.metrics_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        rows = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                if number == len(lines):
                    break
                raise ValueError(f"{self.metrics_path}:{number}: damaged line: {error}") from None
        return rows

    def truncate_metrics_after(self, step: int) -> list[dict[str, Any]]:
        """Drops rows after `step`, so a run resumed from a checkpoint at `step` has no
        duplicates; returns the rows kept."""
        if not self.metrics_path.exists():
            return []
        rows = [row for row in self.read_metrics() if row["step"] <= step]
        text = "".join(jsonfiles.json_line(row) + "\n" for row in rows)
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
