"""Training instabilities beyond a non-finite loss, found in a run's metrics rows.

Pure functions over rows as in metrics.jsonl (dicts with a "step" and metric keys); the report
applies them after the fact and a training loop can apply them to the rows logged so far.
A non-finite loss is `diverged` (summary.json's status) and is not judged here: non-finite and
missing values are skipped.

Spike: a logged training loss, at a step after warmup, more than SPIKE_FACTOR times the running
minimum of the training losses logged up to that step (the minimum includes warmup steps) and
at least SPIKE_MIN_RISE nats above it. The running minimum makes a spike a jump above the best
the run has done, not above its last value. The absolute floor keeps a solved task from
spiking: an MQAR run recalling 99% of queries moves between losses of 0.02 and 0.06 (the last
few errors), three times its minimum and nothing a researcher would call an instability; on
text (losses of 1-5 nats) a 1.5x jump is always above the floor.

Collapse: a validation loss, at a step after warmup, at or above (1 − COLLAPSE_MARGIN) times the
unigram baseline loss (nats per byte of the same validation bytes, `baselines.py`), that is no
lower than the run's previous validation loss. The run does no better than byte frequencies and
has stopped improving; a run still descending towards the baseline from its initial loss
(a small learning rate) is slow, not collapsed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

SPIKE_FACTOR = 1.5
SPIKE_MIN_RISE = 0.1  # nats above the running minimum
COLLAPSE_MARGIN = 0.01  # relative: within 1% of the unigram loss counts as reaching it


def _finite_series(rows: Iterable[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    out = []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out.append((int(row["step"]), float(value)))
    return out


def spike_step(rows: Iterable[Mapping[str, Any]], *, warmup_steps: int,
               factor: float = SPIKE_FACTOR, min_rise: float = SPIKE_MIN_RISE,
               key: str = "train/loss") -> int | None:
    """The first step after warmup whose `key` exceeds `factor` × its running minimum, and
    the minimum by at least `min_rise`."""
    if factor <= 1:
        raise ValueError(f"spike factor must be > 1, got {factor}")
    running_min = math.inf
    for step, value in _finite_series(rows, key):
        running_min = min(running_min, value)
        if (step > warmup_steps and value > factor * running_min
                and value - running_min >= min_rise):
            return step
    return None


def collapse_step(rows: Iterable[Mapping[str, Any]], *, warmup_steps: int, unigram_loss: float,
                  margin: float = COLLAPSE_MARGIN, key: str = "val/loss") -> int | None:
    """The first evaluation step after warmup at or above the unigram loss (less the relative
    margin) whose value is no lower than the previous evaluation's."""
    threshold = (1 - margin) * unigram_loss
    previous = math.inf
    for step, value in _finite_series(rows, key):
        if step > warmup_steps and value >= threshold and value >= previous:
            return step
        previous = value
    return None


def instability_steps(rows: list[Mapping[str, Any]], *, warmup_steps: int,
                      unigram_loss: float | None) -> dict[str, int | None]:
    """{"spike_step": ..., "collapse_step": ...} for summary.json (None: not seen; collapse is
    None without a unigram baseline, e.g. for MQAR)."""
    return {
        "spike_step": spike_step(rows, warmup_steps=warmup_steps),
        "collapse_step": (None if unigram_loss is None else
                          collapse_step(rows, warmup_steps=warmup_steps,
                                        unigram_loss=unigram_loss)),
    }
