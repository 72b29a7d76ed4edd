"""Read an offline W&B run back from its `.wandb` transaction log: the history and summary
that were logged, for tests and checks against metrics.jsonl (wandb ships no Python reader)."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

# A .wandb file is a LevelDB log (github.com/google/leveldb/blob/main/doc/log_format.md) of
# wandb Record protos, after a 7-byte header. wandb 0.31 ships no Python reader for it (the
# old wandb.sdk.internal.datastore is gone; the Go core reads it), hence these few lines.
_FILE_HEADER = struct.Struct("<4sHB")  # ident ":W&B", magic 0xBEE1, version 0
_RECORD_HEADER = struct.Struct("<IHB")  # crc32 of type+data, data length, chunk type
_BLOCK_SIZE = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_records(path: Path) -> list[bytes]:
    """The serialized Record protos, up to the first damaged or truncated chunk."""
    data = path.read_bytes()
    if len(data) < _FILE_HEADER.size or _FILE_HEADER.unpack_from(data) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path}: not a version-0 .wandb transaction log")
    records, pending, position = [], b"", _FILE_HEADER.size
    while True:
        room = _BLOCK_SIZE - position % _BLOCK_SIZE
        if room < _RECORD_HEADER.size:  # block trailer: zero padding
            position += room
            continue
        if position + _RECORD_HEADER.size > len(data):
            return records
        checksum, length, chunk_type = _RECORD_HEADER.unpack_from(data, position)
        start = position + _RECORD_HEADER.size
        chunk = data[start : start + length]
        if len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([chunk_type]))) != checksum:
            return records
        position = start + length
        if chunk_type == _FULL:
            records.append(chunk)
        elif chunk_type == _FIRST:
            pending = chunk
        elif chunk_type == _MIDDLE:
            pending += chunk
        elif chunk_type == _LAST:
            records.append(pending + chunk)
        else:
            return records


def _parse_records(raw_records: list[bytes]) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    records = []
    for raw in raw_records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


def _wandb_log_path(run_dir: str | os.PathLike) -> Path:
    path = Path(run_dir)
    if path.is_dir():
        (path,) = path.glob("run-*.wandb")
    return path


def last_record_type(run_dir: str | os.PathLike) -> str | None:
    raw_records = _wandb_records(_wandb_log_path(run_dir))
    return _parse_records(raw_records[-1:])[0].WhichOneof("record_type") if raw_records else None


def _history_value(item: Any) -> Any:
    if item.value_json:
        return json.loads(item.value_json)  # accepts the NaN/Infinity wandb writes
    kind = item.WhichOneof("value")  # the "typed" encoding (x_history_value_encoding)
    if kind is None or kind == "none":
        return None
    return json.loads(item.json) if kind == "json" else getattr(item, kind)


def read_history(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows one wandb process logged, read from its local transaction log.

    `run_dir` is a run's sync directory (`WandbTracker.run_dir`, `workdir/wandb/offline-run-*`)
    or its `.wandb` file. One dict per committed step, in order: the logged keys (slashes kept:
    "train/loss") with their values as wandb stored them (NaN/inf stay floats; 2.0 may come
    back as 2; a logged dict comes back nested, a table as its `{"_type": "table-file",
    "path": ...}` reference), plus wandb's own `_step`, `_runtime` and `_timestamp`. Reading
    stops at the first damaged record, as for a killed process. A resumed run has one
    directory per process: see `find_run_dirs`.
    """
    rows = []
    for record in _parse_records(_wandb_records(_wandb_log_path(run_dir))):
        if record.WhichOneof("record_type") == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:
                _set_nested(row, item, _history_value(item))
            rows.append(row)
    return rows


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The run summary one wandb process left: the last logged values and `update_summary`
    fields, from the same transaction log as `read_history`, nested the same way.
    (Summary removals, which this module never makes, are not replayed.)"""
    summary: dict[str, Any] = {}
    for record in _parse_records(_wandb_records(_wandb_log_path(run_dir))):
        if record.WhichOneof("record_type") != "summary":
            continue
        for item in record.summary.update:
            _set_nested(summary, item, json.loads(item.value_json))
    return summary


def read_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    """What a reviewer sees of the run itself: name, group, job type, tags and config (the
    config's values as wandb stored them, under their top-level keys)."""
    for record in _parse_records(_wandb_records(_wandb_log_path(run_dir))):
        if record.WhichOneof("record_type") == "run":
            run = record.run
            config = {item.key: json.loads(item.value_json) for item in run.config.update
                      if item.key and not item.key.startswith("_")}
            return {"name": run.display_name, "group": run.run_group, "job_type": run.job_type,
                    "tags": list(run.tags), "config": config}
    raise ValueError(f"{run_dir}: no run record")


def _set_nested(row: dict[str, Any], item: Any, value: Any) -> None:
    # A flat key ("train/loss") is one element of nested_key; a logged dict is several.
    *parents, leaf = [item.key] if item.key else item.nested_key
    for parent in parents:
        row = row.setdefault(parent, {})
    row[leaf] = value


def find_run_dirs(workdir: str | os.PathLike, run_id: str | None = None) -> list[Path]:
    """The W&B sync directories under `workdir/wandb`, oldest first (optionally of one run id).

    A resumed run gets one directory per process: `offline-run-<time>-<id>`, then `-<id>-1`
    when two start within the same second.
    """

    def start_order(path: Path) -> tuple[str, int, str]:
        # <prefix>run-<YYYYmmdd_HHMMSS>-<id>[-<n>]: time, then "-<id>" before "-<id>-1".
        started = path.name.removeprefix("offline-").removeprefix("run-")[:15]
        return started, len(path.name), path.name

    found = [
        path
        for path in (Path(workdir) / "wandb").glob("*run-*")
        if path.is_dir()
        and not path.is_symlink()
        and path.name.startswith(("run-", "offline-run-"))
        and (run_id is None or any(path.glob(f"run-{run_id}.wandb")))
    ]
    return sorted(found, key=start_order)
