"""Located optima of loss against log learning rate, and the learning rates that would locate
them better.

Rules, stated once:

- The curve is the mean over seeds of a loss (e.g. final validation loss) at each LR of a grid.
  An LR is a point of the curve only where every seed has a finite loss: a mean over the seeds
  that happened to survive would flatter an LR where some runs diverged. A None or non-finite
  value (a run that diverged or failed) makes its LR rank below every finite one, i.e. worse
  than any finished LR: it still bounds the best point on its side, but no parabola is fitted
  through it. LRs whose runs are yet to come must be left out of the grid altogether.
- The best grid point is the LR of lowest mean loss. It is interior when the grid has an LR on
  each side of it, else at the "low" or "high" edge: an optimum at an edge is a lower (or
  upper) bound on the LR, not a location.
- An interior best point with finite neighbours is refined by the vertex of the parabola in
  log10(lr) through it and its two neighbours (three points, so the fit is exact; losses near an
  LR optimum are close to quadratic in log lr over a factor of a few). Because the middle point
  is the lowest, the parabola is convex and its vertex lies between the neighbours; it is
  clamped to that bracket anyway so that a degenerate fit can never leave it. A flat triple
  (zero curvature) keeps the grid point.
- `bracketed_at` is the larger ratio between the best LR and its two neighbours (e.g. √2 on a
  ×√2 grid): the resolution of the location. It is inf at an edge.
- The 95% interval for log10(lr*) is analysis/located.py's: the rule re-run on posterior draws
  of the grid's means (a two-way fit, seed + LR, with the noise pooled over the grid), so the
  choice of the best LR is re-made in every draw; its coverage is measured there (97% at 3
  seeds, 96% at 5 on synthetic curves with the studies' noise; the seed bootstrap this
  replaced covered 77% and 86%). An end beyond the grid is infinite (lr_ci: 0 or inf): the
  grid does not hold the interval. Fewer than two seeds leave no interval.
- `refine_points` proposes LRs until the best point is interior and bracketed at ≤ √2 (the
  default target): at an edge, one LR beyond it at the edge's current spacing (the optimum lies
  outward, at an unknown distance); inside, the geometric midpoint between the best and each
  neighbour further than the target (halving the log spacing, so a ×4 grid needs two rounds).
  It returns [] when nothing is left to add.
- Over a report's rows (`curve_optima`, what summary.md's best-LR table and `sweep --refine`
  read): one curve per setting and d_k (`comparisons.curves`), over the seeds every LR of it
  has; a run that completed gives its value of the validation metric, a diverged one None
  (ranks below every finished LR); an LR with a run yet to finish (pending, preempted, failed,
  interrupted) is left out, and the curve is `waiting` on it. A metric where higher is better
  (MQAR's accuracy) is located as its negative.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import located

TARGET_RATIO = 2**0.5  # a ×√2 bracket: the optimum known to within a factor of 1.19 either way
CONFIDENCE = 0.95
N_BOOT = 1000
# Relative: a ×√2 spacing computed in floats, or rounded to 6 significant digits for a run's
# name (`sweep --refine`), still counts as √2.
_RATIO_TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class Optimum:
    """The located minimum of a mean loss curve over a learning-rate grid."""

    lr_star: float  # the parabola's vertex, or the best grid LR when not fitted
    loss_star: float
    best_lr: float
    best_loss: float
    interior: bool
    edge: str | None  # "low" | "high" | None
    bracketed_at: float  # max ratio between best_lr and its neighbours; inf at an edge
    fitted: bool  # whether lr_star is a fitted vertex
    log10_ci: tuple[float, float] | None  # interval of log10(lr_star) (located.py); ±inf: past the grid
    n_seeds: int
    lrs: tuple[float, ...]  # the grid, ascending
    mean_losses: tuple[float, ...]  # inf where a seed failed

    @property
    def lr_ci(self) -> tuple[float, float] | None:
        return None if self.log10_ci is None else (10 ** self.log10_ci[0], 10 ** self.log10_ci[1])


def _as_loss(value: float | None) -> float:
    """A finite loss, or inf for a run without one (ranks below every finished LR)."""
    return float(value) if value is not None and math.isfinite(value) else math.inf


def _sorted_grid(lrs: Sequence[float]) -> list[int]:
    """Indices that sort `lrs`, after checking they are positive, distinct and at least two."""
    if len(lrs) < 2:
        raise ValueError(f"need at least two learning rates, got {len(lrs)}")
    if any(not lr > 0 for lr in lrs) or len(set(lrs)) != len(lrs):
        raise ValueError(f"learning rates must be positive and distinct, got {list(lrs)}")
    return sorted(range(len(lrs)), key=lambda i: lrs[i])


def _best_index(means: Sequence[float]) -> int:
    if not any(math.isfinite(m) for m in means):
        raise ValueError("no learning rate has a finite loss")
    return min(range(len(means)), key=lambda i: means[i])  # first of equal minima


def _vertex(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Vertex of the parabola through three points with y[1] lowest, clamped to [x0, x2]."""
    (x0, x1, x2), (y0, y1, y2) = x, y
    slope01, slope12 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    curvature = (slope12 - slope01) / (x2 - x0)  # leading coefficient, >= 0 here
    if curvature <= 0:
        return x1, y1
    x_star = min(max((x0 + x1) / 2 - slope01 / (2 * curvature), x0), x2)
    return x_star, y0 + slope01 * (x_star - x0) + curvature * (x_star - x0) * (x_star - x1)


def _locate(log_lrs: Sequence[float], means: Sequence[float]) -> tuple[float, float, int, bool]:
    """(log10 lr*, loss*, best index, fitted) of one mean curve on an ascending grid."""
    best = _best_index(means)
    triple = slice(best - 1, best + 2)
    if 0 < best < len(means) - 1 and all(math.isfinite(m) for m in means[triple]):
        x_star, y_star = _vertex(log_lrs[triple], means[triple])
        return x_star, y_star, best, True
    return log_lrs[best], means[best], best, False


def _loss_matrix(lrs: Sequence[float], losses_by_seed: Mapping[int, Sequence[float | None]],
                 order: list[int]) -> np.ndarray:
    """[seeds, LRs] losses in grid order, inf where a run has no finite loss."""
    if not losses_by_seed:
        raise ValueError("need the losses of at least one seed")
    rows = []
    for seed, losses in losses_by_seed.items():
        if len(losses) != len(lrs):
            raise ValueError(f"seed {seed}: {len(losses)} losses for {len(lrs)} learning rates")
        rows.append([_as_loss(losses[i]) for i in order])
    return np.array(rows, dtype=float)


def _interval(grid: list[float], matrix: np.ndarray, n_draws: int, seed: int,
              confidence: float) -> tuple[float, float] | None:
    """located.py's interval of log10(lr*), or None with fewer than two seeds or no draws."""
    if matrix.shape[0] < 2 or n_draws < 1:
        return None
    losses = {s: [v if math.isfinite(v) else None for v in row] for s, row in enumerate(matrix)}
    try:
        found = located.locate_curve(grid, losses, n_draws=n_draws, seed=seed,
                                     confidence=confidence)
    except ValueError:  # no degrees of freedom for the noise
        return None
    return found.log_ci[0] / math.log(10), found.log_ci[1] / math.log(10)


def fit_optimum(lrs: Sequence[float], losses_by_seed: Mapping[int, Sequence[float | None]], *,
                n_boot: int = N_BOOT, seed: int = 0,
                confidence: float = CONFIDENCE) -> Optimum:
    """Locate the minimum of the mean loss over seeds against log10(lr).

    `losses_by_seed` maps a training seed to its losses, one per entry of `lrs` (same order;
    None or non-finite where that run ended without a finite loss). `n_boot` is the number of
    posterior draws of the interval (located.py; 0: no interval); `seed` seeds them (numpy's
    default Generator), so the interval is reproducible.
    """
    order = _sorted_grid(lrs)
    grid = [float(lrs[i]) for i in order]
    log_lrs = [math.log10(lr) for lr in grid]
    matrix = _loss_matrix(lrs, losses_by_seed, order)
    means = [m if np.isfinite(column).all() else math.inf
             for m, column in zip(matrix.mean(axis=0).tolist(), matrix.T, strict=True)]
    x_star, y_star, best, fitted = _locate(log_lrs, means)
    edge = "low" if best == 0 else "high" if best == len(grid) - 1 else None
    bracket = (math.inf if edge else
               max(grid[best] / grid[best - 1], grid[best + 1] / grid[best]))
    return Optimum(
        lr_star=10**x_star if fitted else grid[best], loss_star=y_star, best_lr=grid[best], best_loss=means[best],
        interior=edge is None, edge=edge, bracketed_at=bracket, fitted=fitted,
        log10_ci=_interval(grid, matrix, n_boot, seed, confidence),
        n_seeds=matrix.shape[0], lrs=tuple(grid), mean_losses=tuple(means))


def refine_points(lrs: Sequence[float], mean_losses: Sequence[float | None],
                  target_ratio: float = TARGET_RATIO) -> list[float]:
    """The LRs to run next so that the best point becomes interior and bracketed at
    <= target_ratio (ascending; [] when it already is). None or non-finite mean losses rank
    below every finite one."""
    if len(mean_losses) != len(lrs):
        raise ValueError(f"{len(mean_losses)} losses for {len(lrs)} learning rates")
    if not target_ratio > 1:
        raise ValueError(f"target ratio must be > 1, got {target_ratio}")
    order = _sorted_grid(lrs)
    grid = [float(lrs[i]) for i in order]
    best = _best_index([_as_loss(mean_losses[i]) for i in order])
    if best == 0:  # the optimum may lie anywhere below: step out at the edge's spacing
        return [grid[0] * grid[0] / grid[1]]
    if best == len(grid) - 1:
        return [grid[-1] * grid[-1] / grid[-2]]
    limit = target_ratio * (1 + _RATIO_TOLERANCE)
    return [math.sqrt(grid[best] * grid[side]) for side in (best - 1, best + 1)
            if max(grid[best], grid[side]) / min(grid[best], grid[side]) > limit]


@dataclasses.dataclass(frozen=True)
class CurveOptimum:
    """The located optimum of one setting's curve over the LR grid (`curve_optima`)."""

    setting: str
    policy: str
    d_k: int
    found: Optimum | None  # None: not located (`reason`)
    reason: str | None
    runs: dict[float, tuple[dict, ...]]  # LR -> the runs of the curve's seeds there
    waiting: tuple[float, ...] = ()  # LRs left out: some run there has not finished


_FINAL = ("completed", "diverged")


def _curve(name: str, d_k: int, by_lr: dict[float, list[dict]], key: str, higher: bool,
           n_boot: int, seed: int) -> CurveOptimum:
    seeds = set.intersection(*({r["seed"] for r in runs} for runs in by_lr.values()))
    runs = {lr: tuple(r for r in by_lr[lr] if r["seed"] in seeds) for lr in sorted(by_lr)}
    waiting = tuple(lr for lr, rs in runs.items() if any(r["status"] not in _FINAL for r in rs))
    lrs = [lr for lr in runs if lr not in waiting]
    policy = next(iter(by_lr.values()))[0]["policy"]
    made = functools.partial(CurveOptimum, name, policy, d_k, runs=runs, waiting=waiting)
    if not seeds:
        return made(None, "no seed was run at every learning rate")
    if len(lrs) < 2:
        return made(None, f"{len(lrs)} learning rate(s) finished")
    sign = -1.0 if higher else 1.0
    values = {lr: {r["seed"]: cmp.finished_value(r, key) for r in runs[lr]} for lr in lrs}
    losses = {s: [None if values[lr][s] is None else sign * values[lr][s] for lr in lrs]
              for s in sorted(seeds)}
    try:
        return made(fit_optimum(lrs, losses, n_boot=n_boot, seed=seed), None)
    except ValueError as error:  # every LR failed for some seed
        return made(None, str(error))


def curve_optima(rows: list[dict], key: str, higher_is_better: bool = False, *,
                 n_boot: int = N_BOOT, seed: int = 0) -> list[CurveOptimum]:
    """Per (setting, d_k) with two or more learning rates, its located optimum of `key` (a
    report row key, the validation metric that chooses), by the rules above."""
    return [_curve(name, d_k, by_lr, key, higher_is_better, n_boot, seed)
            for (name, d_k), by_lr in cmp.curves(rows).items() if len(by_lr) >= 2]


def refinements(curve: CurveOptimum, target_ratio: float = TARGET_RATIO) -> list[float]:
    """The LRs `refine_points` adds to a located curve ([] when it is interior and bracketed,
    when it waits on runs, or when nothing was located: no direction to go)."""
    if curve.found is None or curve.waiting:
        return []
    return refine_points(curve.found.lrs, curve.found.mean_losses, target_ratio)
