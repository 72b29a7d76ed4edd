"""Reading a run's metrics rows (as in metrics.jsonl): per-layer attention statistics and series."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable

_LAYER_KEY = re.compile(r"attn/layer(\d+)/([a-z_]+)")  # per layer, not attn/layer0/head1/...


def layer_values(row: dict, stat: str) -> dict[int, float]:
    """layer index -> `attn/layer{i}/{stat}` in one row (absent and None values left out)."""
    out = {}
    for key, value in row.items():
        match = _LAYER_KEY.fullmatch(key)
        if match and match.group(2) == stat and value is not None:
            out[int(match.group(1))] = value
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
