"""How far from the optimum one can be before it costs anything: the range of the target (c)
whose loss, each value at its own best LR, is within a margin of the best, and the cost of given
target values, with intervals over analysis/located.py's posterior draws (the LR and the best
re-chosen in every draw)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from scale_ablation.analysis import located


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """The range of the target (e.g. c) whose loss, each value at its own best LR, is within
    `margin` of the best: its ends in ln units, each with its interval (an infinite end: the
    range reaches past the grid), and the cost of chosen target values."""

    margin: float
    log_range: tuple[float, float]
    log_range_ci: tuple[tuple[float, float], tuple[float, float]]  # (low end's, high end's)
    costs: dict[float, tuple[float, tuple[float, float]]]  # value -> (loss − best, interval)


def _crossing(values: np.ndarray, profile: np.ndarray, limit: np.ndarray, step: int) -> np.ndarray:
    """Per row, where the profile first rises past `limit` walking from its best by `step`
    (−1 left, +1 right), linearly interpolated in the target's log; ±inf when it never does on
    the grid (a failed value, inf, is past any limit)."""
    best = np.argmin(profile, axis=-1)
    out = np.full(len(best), -np.inf if step < 0 else np.inf)
    done = np.zeros(len(best), bool)
    rows = np.arange(len(best))
    for offset in range(1, len(values)):
        here, before = best + step * offset, best + step * (offset - 1)
        inside = (here >= 0) & (here < len(values)) & ~done
        h, b = np.clip(here, 0, len(values) - 1), np.clip(before, 0, len(values) - 1)
        over = inside & (profile[rows, h] > limit)
        rise = profile[rows, h] - profile[rows, b]
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(np.isfinite(rise) & (rise > 0), (limit - profile[rows, b]) / rise, 0.0)
        out = np.where(over, values[b] + share * (values[h] - values[b]), out)
        done |= over
    return out


def tolerance(by_point: Mapping[tuple[float, ...], Mapping[int, float | None]], margin: float,
              at: Sequence[float] = (), *, n_draws: int = located.N_DRAWS, seed: int | Sequence[int] = 0,
              confidence: float = located.CONFIDENCE) -> Tolerance:
    """The target's range within `margin` of the best (the means and posterior draws of
    `located.locate`), and the cost (loss above the best) of each target value in `at` that is on the
    grid, with percentile intervals over the draws."""
    _, _, _, _, values, observed, profiles = located.posterior(by_point, n_draws, seed)
    both = np.concatenate([observed, profiles])
    limit = both.min(axis=-1) + margin
    low, high = _crossing(values, both, limit, -1), _crossing(values, both, limit, +1)
    costs = {}
    for value in at:
        hit = np.flatnonzero(np.isclose(values, math.log(value), atol=1e-9))
        if len(hit):
            cost = both[:, hit[0]] - both.min(axis=-1)
            costs[value] = (float(cost[0]), located.interval(cost[1:], cost[1:], confidence))
    return Tolerance(margin, (float(low[0]), float(high[0])),
                     (located.interval(low[1:], low[1:], confidence),
                      located.interval(high[1:], high[1:], confidence)), costs)
