"""A run's metrics rows (as in metrics.jsonl): each line's checksum, per-layer attention
statistics and series.

Every row is written with `CHECKSUM`, the CRC-32 of the row's canonical JSON without it (keys
sorted, no spaces), so that a line damaged in a way that still parses (a flipped digit) is
told from an intact one. Rows written before the checksum existed have none and still read.
"""

from __future__ import annotations

import json
import re
import statistics
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from scale_ablation.records import jsonfiles

CHECKSUM = "crc32"

_LAYER_KEY = re.compile(r"attn/layer(\d+)/([a-z_]+)")  # per layer, not attn/layer0/head1/...
_HEAD_KEY = re.compile(r"attn/layer(\d+)/head(\d+)/([a-z_]+)")


def checksum(row: Mapping[str, Any]) -> int:
    """CRC-32 of the row's canonical JSON, `CHECKSUM` left out."""
    fields = {k: v for k, v in row.items() if k != CHECKSUM}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return zlib.crc32(canonical.encode("utf-8"))


def row_line(row: Mapping[str, Any]) -> str:
    """One row as its metrics.jsonl line (no newline), its checksum last. Values are made
    plain first (non-finite numbers become null) so that the checksum is of what is written."""
    plain = json.loads(jsonfiles.json_line({k: v for k, v in row.items() if k != CHECKSUM}))
    return jsonfiles.json_line({**plain, CHECKSUM: checksum(plain)})


def checksum_problem(row: dict[str, Any], seen_checksum: bool) -> str | None:
    """Why a parsed row's checksum shows it damaged, or None. `seen_checksum`: an earlier row
    of the file had one (rows without one are then no longer a file's older part)."""
    if CHECKSUM not in row:
        return f"no {CHECKSUM} after rows with one" if seen_checksum else None
    if row[CHECKSUM] != checksum(row):
        return f"{CHECKSUM} {row[CHECKSUM]} does not match its fields ({checksum(row)})"
    return None


def without_checksum(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != CHECKSUM}


def layer_values(row: dict, stat: str) -> dict[int, float]:
    """layer index -> `attn/layer{i}/{stat}` in one row (absent and None values left out)."""
    out = {}
    for key, value in row.items():
        match = _LAYER_KEY.fullmatch(key)
        if match and match.group(2) == stat and value is not None:
            out[int(match.group(1))] = value
    return out


def head_values(row: dict, stat: str) -> dict[tuple[int, int], float]:
    """(layer, head) -> `attn/layer{i}/head{h}/{stat}` in one row (absent and None left out)."""
    out = {}
    for key, value in row.items():
        match = _HEAD_KEY.fullmatch(key)
        if match and match.group(3) == stat and value is not None:
            out[(int(match.group(1)), int(match.group(2)))] = value
    return out


def layer_mean(row: dict, stat: str) -> float | None:
    """Mean over layers of `attn/layer{i}/{stat}` in one metrics row (None if absent)."""
    values = layer_values(row, stat)
    return statistics.fmean(values.values()) if values else None


def layer_max(row: dict, stat: str) -> float | None:
    values = layer_values(row, stat)
    return max(values.values()) if values else None


def series(metrics: list[dict], key_fn: Callable[[dict], float | None]) -> list[tuple[int, float]]:
    """(step, value) of every row where `key_fn` gives a value."""
    return [(row["step"], value) for row in metrics if (value := key_fn(row)) is not None]


def max_over_training(metrics: list[dict], stat: str) -> dict[int, float]:
    """layer index -> the maximum of `attn/layer{i}/{stat}` over every logged step."""
    out: dict[int, float] = {}
    for row in metrics:
        for layer, value in layer_values(row, stat).items():
            out[layer] = max(out.get(layer, value), value)
    return out
