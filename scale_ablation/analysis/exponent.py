"""The optimal attention scale's exponent in d_k, from a sweep of c·d_k^(-1/2) over c
(experiments/dk_exponent.py): per init and d_k the best c, then log c* against log d_k.

If the best scale is ∝ d_k^α, then c* = scale·√d_k ∝ d_k^(α + 1/2): the slope of log c* on
log d_k is α + 1/2. α = −1/2 (1/√d_k, the article) gives slope 0; α = −1 (1/d_k, μP) slope −1/2;
α = 0 (no divisor) slope +1/2.

Rules, stated once (the located optimum and its interval are analysis/located.py's, whose
docstring gives the method and its measured coverage):

- **c* per d_k** is `located.locate` over the (c, LR) grid: each c at its own best LR (lowest
  mean over seeds), the best c refined by the parabola in ln c through it and its neighbours.
  Its interval re-makes both choices, the LR of every c and the best c, in every posterior draw
  of the grid's means (the LR choice is part of the interval). A best c on the grid's edge is a
  bound, not a location: the fit is then not established (the verdict inconclusive) and the
  numbers name the c to run next. So is a best c whose own LR, or a neighbour's, sat on its LR
  grid's edge (a wider LR grid could move that point of the curve).
- **The slope** is the least-squares slope of log c* on log d_k over the d_k whose c* is
  located (optionally within a d_k range: the claims state −1/2 and −1 per range), its interval
  the slope refitted on every joint draw (`located.fit_slope`). α = slope − 1/2.
- **The curve**: log c* as a quadratic in log d_k (`located.fit_curve`): its curvature and the
  local α at each d_k, each with its interval from the same draws. One power law is adequate
  when the local slope changes by less than the exponent claims' margin across the range.
- **Tolerance**: per d_k the range of c whose loss (each c at its best LR) is within a margin of
  the best, and what c = 1 (1/√d_k) and c = d_k^(-1/2) (1/d_k) cost there, in the metric's
  units (`tolerance.tolerance`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import numpy as np

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import located, optimum
from scale_ablation.model import scale_family

INIT = "override:model.init"
STEPS = "override:train.steps"  # a budget swept as runs of their own (dk_exponent:regime)
DEFAULT_INIT = "fan_in"  # experiments/base.py's model.init
CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class CCurve:
    """One (init, d_k): the metric against c, each c at its own best learning rate."""

    cs: tuple[float, ...]  # ascending
    best_lrs: tuple[float, ...]  # per c
    lr_edges: tuple[bool, ...]  # per c: its best LR on its LR grid's edge
    losses_by_seed: dict[int, list[float | None]]  # seed -> per c, at that c's best LR


def init_of(row: dict) -> str:
    return str(row.get(INIT) or DEFAULT_INIT)


def _grid(rows: list[dict], key: str) -> dict:
    """d_k -> c -> lr -> seed -> value, over the rows of the c·d_k^(-1/2) family."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in rows:
        c = scale_family.multiplier(r["policy"])
        if c is not None:
            out[int(r["d_k"])][c][float(r["lr"])][r["seed"]] = cmp.finished_value(r, key)
    return out


def _at_best_lr(by_lr: dict, seeds: list) -> tuple[float, bool, list[float | None]] | None:
    """(best LR, at its grid's edge, each seed's value there) of one c, or None when no LR has
    every seed run or none has a finite value."""
    lrs = sorted(lr for lr, by_seed in by_lr.items() if set(seeds) <= set(by_seed))
    if not lrs:
        return None
    if len(lrs) == 1:
        values = [by_lr[lrs[0]][s] for s in seeds]
        return lrs[0], True, values
    try:
        found = optimum.fit_optimum(lrs, {s: [by_lr[lr][s] for lr in lrs] for s in seeds},
                                    n_boot=0)
    except ValueError:  # no LR with a finite loss
        return None
    return found.best_lr, not found.interior, [by_lr[found.best_lr][s] for s in seeds]


def c_curves(rows: list[dict], init: str, key: str = "final_val_bpb") -> dict[int, CCurve]:
    """d_k -> the curve over c of the init's runs (`key` chooses; lower is better)."""
    out = {}
    for d_k, by_c in sorted(_grid([r for r in rows if init_of(r) == init], key).items()):
        seeds = sorted({s for by_lr in by_c.values() for by_seed in by_lr.values()
                        for s in by_seed})
        points = {c: p for c, by_lr in by_c.items() if (p := _at_best_lr(by_lr, seeds))}
        cs = sorted(points)
        if len(cs) < 2:
            continue
        out[d_k] = CCurve(tuple(cs), tuple(points[c][0] for c in cs),
                          tuple(points[c][1] for c in cs),
                          {s: [points[c][2][i] for c in cs] for i, s in enumerate(seeds)})
    return out


def locate(curve: CCurve, n_boot: int = 200, seed: int = 0) -> optimum.Optimum | None:
    """c* of one curve (`optimum.fit_optimum` over log c), or None when no c finished."""
    try:
        return optimum.fit_optimum(curve.cs, curve.losses_by_seed, n_boot=n_boot, seed=seed)
    except ValueError:
        return None


def lr_edge_near(curve: CCurve, found: optimum.Optimum) -> bool:
    """Whether the best c or a neighbour took its LR from its LR grid's edge."""
    best = curve.cs.index(found.best_lr)
    return any(curve.lr_edges[max(best - 1, 0):best + 2])


def ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float | None]:
    """(slope, intercept, the slope's standard error; None below three points)."""
    slope, intercept = np.polyfit(x, y, 1)
    n = len(x)
    if n < 3:
        return float(slope), float(intercept), None
    residuals = y - (slope * x + intercept)
    se = math.sqrt(float(residuals @ residuals) / (n - 2) / float(((x - x.mean()) ** 2).sum()))
    return float(slope), float(intercept), se


@dataclasses.dataclass(frozen=True)
class ExponentFit:
    """The fit of one (init, metric): c* per d_k and the slope of log c* on log d_k."""

    init: str
    optima: dict[int, located.Located]  # d_k -> located c*
    unsettled: dict[int, str]  # d_k -> why its c* is not a location (edge, LR edge)
    slope_fit: located.Slope | None  # over the settled d_k (None below two)
    n_seeds: int  # the fewest seeds of a settled d_k
    confidence: float = CONFIDENCE

    @property
    def settled(self) -> list[int]:
        """The d_k whose c* is a location (the regression's points)."""
        return [d for d in sorted(self.optima) if d not in self.unsettled]

    @property
    def slope(self) -> float | None:
        return None if self.slope_fit is None else self.slope_fit.slope

    @property
    def slope_ci(self) -> tuple[float, float] | None:
        return None if self.slope_fit is None else self.slope_fit.ci

    @property
    def alpha(self) -> float | None:
        return None if self.slope is None else self.slope - 0.5

    @property
    def alpha_ci(self) -> tuple[float, float] | None:
        ci = self.slope_ci
        return None if ci is None else (ci[0] - 0.5, ci[1] - 0.5)

    def curve(self) -> located.Curve | None:
        """The quadratic in log d_k over the settled d_k (None below three)."""
        settled = {d: self.optima[d] for d in self.settled}
        return located.fit_curve(settled, self.confidence) if len(settled) >= 3 else None


def why_unsettled(found: located.Located) -> str | None:
    """Why `found` is not a location of c* (a bound, not an optimum), or None when it is."""
    if found.edge is not None:
        grid = found.grid
        if len(grid) < 2:  # one c ran at this d_k: no curve over c, no next c to name
            return f"only c = {grid[0]:g} was run at this d_k"
        beyond = grid[0] ** 2 / grid[1] if found.edge == "low" else grid[-1] ** 2 / grid[-2]
        return f"best c {found.best[0]:g} on the grid's {found.edge} edge (run c = {beyond:.3g})"
    if found.nuisance_edge:
        return "the best c or a neighbour took its LR from its LR grid's edge"
    return None


def init_rows(rows: list[dict], init: str, d_k_range: tuple[int, int] | None = None,
              steps: int | None = None) -> list[dict]:
    """The rows of one init, within `d_k_range` (inclusive) and of runs of `steps` training
    steps (a budget run as its own runs) when given."""
    low, high = d_k_range or (0, math.inf)
    return [r for r in rows if init_of(r) == init and low <= r["d_k"] <= high
            and (steps is None or str(r.get(STEPS)) == str(steps))]


def fit(rows: list[dict], init: str, key: str = "final_val_bpb", *,
        d_k_range: tuple[int, int] | None = None, steps: int | None = None,
        n_draws: int = located.N_DRAWS, seed: int = 0,
        confidence: float = CONFIDENCE) -> ExponentFit:
    """The exponent fit of one init's runs (of `steps` steps, when given), `key` choosing each
    c's LR and locating c*."""
    optima, missing, _ = located.exponent_fit(init_rows(rows, init, d_k_range, steps), key,
                                              n_draws=n_draws, seed=seed, confidence=confidence)
    unsettled = {**{d: f"no c* ({why})" for d, why in missing.items()},
                 **{d: why for d, o in optima.items() if (why := why_unsettled(o)) is not None}}
    settled = {d: o for d, o in optima.items() if d not in unsettled}
    n_seeds = min((o.n_seeds for o in settled.values()), default=0)
    slope = located.fit_slope(settled, confidence) if len(settled) >= 2 else None
    return ExponentFit(init, optima, dict(sorted(unsettled.items())), slope, n_seeds, confidence)
