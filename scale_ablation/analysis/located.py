"""Located optima whose 95% intervals count the inner choices, and the slope of log c* on
log d_k, with the intervals' coverage measured rather than assumed.

An optimum is where a loss over a grid is lowest: over log LR (a curve: `locate_curve`), or
over log c and log LR (`locate` with (c, lr) points), where c is the target and the LR a
nuisance, chosen anew for every c. Rules, stated once:

- **The means.** Every finished run is fitted by loss = seed + point (one intercept per seed,
  one free mean per grid point: no shape is assumed), so σ² of the noise is pooled over all the
  grid's cells with df = runs − seeds − points + 1 (e.g. 68 for 35 points × 3 seeds), not the
  n − 1 of a bootstrap over seeds. A point where any seed has no finite loss (a run that
  diverged or failed) ranks below every finished one and is never a point of the curve
  (optimum.py's rule); a seed not run at a point is only missing there.
- **The rule** is optimum.py's: each c at its own best LR (the lowest mean over that c's LRs),
  then the best c; at the grid's first or last value it is a bound (edge), else the vertex of
  the parabola in ln c through the best and its finished neighbours (`window` 1: optimum.py's
  three points, so the point estimate is today's), clamped to their span. `nuisance_edge`
  says that the best c or a neighbour took its LR from its own LR grid's edge (a wider LR
  grid could move that point of the curve: exponent.py's second reason for no location).
- **The interval.** The rule is re-run on draws of the point means from their posterior under
  a flat prior, mean + √(σ²·df/χ²_df)·z/√n per point (a parametric bootstrap of the means that
  redraws the noise level too): the best LR of every c and the best c are re-chosen in every
  draw. A draw whose best is on the grid's edge lies beyond it: below the first value (−inf
  for the interval's low end, that value for its high end) or above the last. The interval is
  the 2.5 and 97.5 percentiles of the draws (order statistics); an infinite end is a bound
  (`bounded` False): the grid does not hold the optimum's interval.
- **The slope** (`fit_slope`) is the least-squares slope of log c* on log d_k; its interval
  the percentiles of the slope refitted on every joint draw (independent draws per d_k: seed
  each d_k's `locate` with its own (seed, d_k)). A draw with a c* beyond its grid's edge gives
  the slope with c* at that edge as a bound on its side (by the weight's sign) and infinity on
  the other. The interval is for the least-squares slope over these d_k: a bend in log c*
  against log d_k is not noise here.

Measured coverage (`python tests/test_located_coverage.py`; tests/test_located_coverage.py
checks the ≥ 90% floor in the fast tier): synthetic studies from a known parabola in ln c and
ln LR (+0.1 bits per byte at ×8 either side of c* and at ×2…×2.8 either side of the best LR,
the best LR tilting with c), iid seed noise of sd 0.027 bits per byte, c on 7 points ×2 apart
and LR on 5 (curves: 7) ×√2 apart, the true optimum off-grid, d_k 8…128 with a true slope.
400 studies per cell (95% uncertainty of a coverage near 95%: ±2.2 points); width = median
width of the bounded intervals in ln units; unbounded = share of intervals with an infinite end:

                                      3 seeds                  5 seeds
                                 cover  width unbounded   cover  width unbounded
    best LR (a curve)            97.2%  0.460   18.5%     96.5%  0.360   12.8%
    c* (each c at its best LR)   98.6%  1.228    1.7%     98.1%  1.063    0.2%
    slope of ln c* on ln d_k    100.0%  0.616    7.5%     99.8%  0.518    0.5%
    steeper basin: c*            97.4%  1.271    5.9%     96.2%  1.107    2.1%
    steeper basin: slope        100.0%  0.666   23.5%     99.8%  0.553    9.0%
    window 2, steeper: c*        92.1%  0.810    5.9%     83.4%  0.619    2.1%
    window 2, steeper: slope     99.8%  0.405   23.5%     99.5%  0.305    9.0%
    best LR, seed's own sd 0.15  96.8%  0.615   32.0%     98.0%  0.555   24.5%
    best LR, seed's own sd 0.3   94.5%  0.848   48.2%     98.5%  0.743   39.0%
    today's (200 studies, ±3 points; the slope "unbounded": no interval, a d_k unsettled):
    optimum.fit_optimum          77.0%  0.304    0%       86.0%  0.302    0%
      seed's own sd 0.15, 0.3    73.5%, 71.5%             83.5%, 86.0%
    exponent.fit's c*            77.6%  0.853    0%       90.6%  0.935    0%
    exponent.fit's slope (union) 98.5%  1.293   10.5%     99.0%  0.938    6.0%

Chosen by that test, and by the same studies with a basin twice as steep above c* as below
(the published grids show such a cliff at large c and at large LR: the "steeper" rows; there
`window` 2, narrower, covers less) and with each seed's own best LR off the true one by
N(0, sd) in ln LR (noise not independent across the grid: the "seed's own" rows). A draft that
fitted a quadratic surface in (ln c, ln LR) over ±2 (±3) grid neighbours, with posterior draws
of its coefficients, covered 95% (95%) on the parabola with narrower intervals but 68% (14%)
at 3 seeds on the steeper basin: rejected, not kept. The slope's interval covers more than its
nominal 95%: conservative, not exact. A best LR whose grid barely spans its basin is often a
bound at 3 seeds (18.5% here): the grid, not the method, is then what to widen.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.model import scale_family

CONFIDENCE = 0.95
N_DRAWS = 4000
WINDOW = 1  # grid positions either side of the best value: 1 is optimum.py's three-point vertex


@dataclasses.dataclass(frozen=True)
class Located:
    """The located optimum along the target axis (the first coordinate of the grid's points)."""

    log_star: float  # natural log of the optimum (the best grid value's when not fitted)
    log_ci: tuple[float, float]  # interval of log_star; an infinite end: beyond the grid
    fitted: bool  # log_star is a fitted vertex
    edge: str | None  # "low" | "high": the best grid value is the grid's first | last
    nuisance_edge: bool  # the best c or a neighbour took its LR from its LR grid's edge
    best: tuple[float, ...]  # the best grid point
    grid: tuple[float, ...]  # the target axis's values, ascending
    n_seeds: int
    df: int  # the noise's degrees of freedom
    draws: np.ndarray = dataclasses.field(repr=False, compare=False)  # of log_star

    @property
    def star(self) -> float:
        return math.exp(self.log_star)

    @property
    def ci(self) -> tuple[float, float]:
        return math.exp(self.log_ci[0]), math.exp(self.log_ci[1])

    @property
    def bounded(self) -> bool:
        """Both ends of the interval inside the grid: a location, not a bound."""
        return all(math.isfinite(end) for end in self.log_ci)


@dataclasses.dataclass(frozen=True)
class Slope:
    """The least-squares slope of log optimum on log d_k, with its interval."""

    slope: float
    ci: tuple[float, float]
    d_ks: tuple[float, ...]
    draws: np.ndarray = dataclasses.field(repr=False, compare=False)


def interval(lower: np.ndarray, upper: np.ndarray,
             confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The central `confidence` interval by order statistics (no interpolation, so infinite
    draws give infinite ends): the low end from the draws' `lower` values, the high end from
    their `upper` ones (a draw known only to lie beyond a bound is that bound on one side and
    infinite on the other)."""
    k = math.floor(len(lower) * (1 - confidence) / 2)
    return float(np.sort(lower)[k]), float(np.sort(upper)[len(upper) - 1 - k])


def _table(by_point: Mapping[tuple[float, ...], Mapping[int, float | None]]
           ) -> tuple[np.ndarray, np.ndarray]:
    """(points [P, k], losses [S, P]: nan not run, inf without a finite loss)."""
    if not by_point:
        raise ValueError("need at least one grid point")
    points = [tuple(float(v) for v in (p if isinstance(p, tuple) else (p,))) for p in by_point]
    if len({len(p) for p in points}) != 1 or len(points[0]) not in (1, 2):
        raise ValueError("grid points must all have one coordinate or all two")
    if any(not v > 0 for p in points for v in p):
        raise ValueError(f"grid coordinates must be positive, got {points}")
    seeds = sorted({s for by_seed in by_point.values() for s in by_seed})
    losses = np.full((len(seeds), len(points)), np.nan)
    for j, by_seed in enumerate(by_point.values()):
        for s, value in by_seed.items():
            ok = value is not None and math.isfinite(value)
            losses[seeds.index(s), j] = float(value) if ok else np.inf
    return np.array(points), losses


def _cell_means(losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, int]:
    """(mean per point: inf where any seed failed, seeds per point, σ², df) of the two-way
    fit loss = seed + point: the point means free (no shape assumed), σ² pooled over cells."""
    failed = np.isinf(losses).any(axis=0) | ~np.isfinite(losses).any(axis=0)
    if failed.all():
        raise ValueError("no grid point has a finite loss")
    seed_index, point_index = np.nonzero(np.isfinite(losses) & ~failed)
    design = np.hstack([np.eye(losses.shape[0])[seed_index], np.eye(losses.shape[1])[point_index]])
    y = losses[seed_index, point_index]
    coef, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
    df = len(y) - int(rank)
    if df < 1:
        raise ValueError(f"{len(y)} finished runs leave no degrees of freedom for the noise "
                         "(need two or more seeds)")
    residual = y - design @ coef
    counts = np.bincount(point_index, minlength=losses.shape[1])
    means = np.where(failed, np.inf, coef[losses.shape[0]:])
    return means, counts, float(residual @ residual) / df, df


def _profile(coords: np.ndarray, means: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(target axis values, [..., values] the lowest mean over the nuisance at each): every
    target value at its own best LR, chosen anew on every row of `means`."""
    values, which = np.unique(np.round(coords[:, 0], 9), return_inverse=True)
    profile = np.full((*means.shape[:-1], len(values)), np.inf)
    for j in range(len(values)):
        profile[..., j] = means[..., which == j].min(axis=-1)
    return values, profile


def _rule(values: np.ndarray, profile: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(optimum, fitted) per row of `profile`: the best value; −inf/+inf when it is the
    grid's first/last; else the vertex of the least-squares parabola through the finished
    values within `window` positions of it (clamped to their span), when they reach both
    sides of the best and the parabola is convex."""
    best = np.argmin(profile, axis=-1)
    positions = np.arange(len(values))
    near = (np.abs(positions - best[:, None]) <= window) & np.isfinite(profile)
    x = np.where(near, values - values[best][:, None], 0.0)
    y = np.where(near, profile, 0.0)
    y = y - np.where(near, profile[np.arange(len(best)), best][:, None], 0.0)
    powers = [near * 1.0, x, x * x, x**3, x**4]
    moments = [p.sum(-1) for p in powers]  # the normal equations of (1, x, x²), by moments
    normal = np.stack([np.stack(moments[i:i + 3], -1) for i in range(3)], -2)
    sides = ((near & (positions < best[:, None])).any(-1)
             & (near & (positions > best[:, None])).any(-1))
    normal[~sides] = np.eye(3)  # solvable; these rows keep the grid point
    right = np.stack([(p * y).sum(-1) for p in powers[:3]], -1)
    coef = np.linalg.solve(normal, right[..., None])[..., 0]
    fitted = sides & (coef[:, 2] > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = np.clip(-coef[:, 1] / (2 * coef[:, 2]), np.where(near, x, np.inf).min(-1),
                         np.where(near, x, -np.inf).max(-1))
    star = values[best] + np.where(fitted, vertex, 0.0)
    star = np.where(best == 0, -np.inf, np.where(best == len(values) - 1, np.inf, star))
    return star, fitted


def _nuisance_edge(coords: np.ndarray, means: np.ndarray, at: int, window: int) -> bool:
    """Whether a target value within `window` of the best (index `at`) is lowest at the first
    or last of its own nuisance values (a failed one still bounds): a wider LR grid could
    lower that point of the profile. False on one axis."""
    if coords.shape[1] == 1:
        return False
    values, which = np.unique(np.round(coords[:, 0], 9), return_inverse=True)
    for j in range(max(at - window, 0), min(at + window, len(values) - 1) + 1):
        points = np.flatnonzero(which == j)
        if not np.isfinite(means[points]).any():
            continue
        if len(points) < 2:  # one LR: no choice was made
            return True
        chosen = coords[points[np.argmin(means[points])], 1]
        if chosen in (coords[points, 1].min(), coords[points, 1].max()):
            return True
    return False


def n_seeds_of(by_point: Mapping[tuple[float, ...], Mapping[int, float | None]]) -> int:
    return len({s for by_seed in by_point.values() for s in by_seed})


def posterior(by_point: Mapping[tuple[float, ...], Mapping[int, float | None]], n_draws: int,
               seed: int | Sequence[int]) -> tuple:
    """(points [P, k], their logs, the point means, df, target values, the observed profile
    [1, V], profiles of the posterior draws of the means [n_draws, V]): the rule's inputs."""
    points, losses = _table(by_point)
    coords = np.log(points)
    means, counts, variance, df = _cell_means(losses)
    values, observed = _profile(coords, means[None, :])
    rng = np.random.default_rng(seed)
    spread = np.sqrt(variance * df / rng.chisquare(df, size=(n_draws, 1)))
    noise = rng.standard_normal((n_draws, len(means))) / np.sqrt(np.maximum(counts, 1))
    _, profiles = _profile(coords, means + spread * noise)
    return points, coords, means, df, values, observed, profiles


def locate(by_point: Mapping[tuple[float, ...], Mapping[int, float | None]], *,
           window: int = WINDOW, n_draws: int = N_DRAWS, seed: int | Sequence[int] = 0,
           confidence: float = CONFIDENCE) -> Located:
    """The optimum along the first coordinate of the grid's points, by the rules above.

    `by_point` maps a grid point, (lr,) or (c, lr) (positive values), to seed -> loss (None
    or non-finite where that run has no finite loss). `seed` seeds the draws (numpy's default
    Generator); give each independent fit its own. Raises ValueError when no point finished
    or the runs leave no degrees of freedom for the noise."""
    points, coords, means, df, values, observed, profiles = posterior(by_point, n_draws, seed)
    star, fitted = _rule(values, observed, window)
    draws, _ = _rule(values, profiles, window)
    at = int(np.argmin(observed[0]))
    edge = "low" if at == 0 else "high" if at == len(values) - 1 else None
    # A draw below the grid lies below its first value: −inf for the low end, that value for
    # the high end (and the mirror image above the grid).
    lower = np.where(draws == np.inf, values[-1], draws)
    upper = np.where(draws == -np.inf, values[0], draws)
    return Located(
        log_star=float(star[0]) if edge is None else float(values[at]),
        log_ci=interval(lower, upper, confidence), fitted=bool(fitted[0]) and edge is None,
        edge=edge,
        nuisance_edge=_nuisance_edge(coords, means, at, window),
        best=tuple(points[int(np.argmin(means))].tolist()),
        grid=tuple(sorted({float(v) for v in points[:, 0]})),
        n_seeds=n_seeds_of(by_point), df=df, draws=draws)


def locate_curve(xs: Sequence[float], losses_by_seed: Mapping[int, Sequence[float | None]],
                 **options) -> Located:
    """`locate` over one axis, with `optimum.fit_optimum`'s arguments: `losses_by_seed` maps
    a seed to its losses, one per entry of `xs` (same order)."""
    for s, losses in losses_by_seed.items():
        if len(losses) != len(xs):
            raise ValueError(f"seed {s}: {len(losses)} losses for {len(xs)} grid values")
    return locate({(x,): {s: losses[j] for s, losses in losses_by_seed.items()}
                   for j, x in enumerate(xs)}, **options)


def _functional(optima: Mapping[float, Located], weights: np.ndarray,
                confidence: float) -> tuple[float, tuple[float, float], np.ndarray]:
    """(estimate, interval, draws) of Σ weights·log optimum over `optima` in d_k order (a
    linear functional: a least-squares coefficient or a local slope). A draw with an optimum
    beyond its grid's edge gives the functional with that optimum at the edge, a bound on the
    side the weight's sign says, and infinity on the other."""
    d_ks = sorted(optima)
    weights = np.where(np.abs(weights) < 1e-12, 0.0, weights)
    stars = np.array([optima[d].log_star for d in d_ks])
    draws = np.stack([optima[d].draws for d in d_ks])
    edges = np.log([[optima[d].grid[0], optima[d].grid[-1]] for d in d_ks])
    values = weights @ np.clip(draws, edges[:, :1], edges[:, 1:])  # beyond a grid: its edge
    # ... where the true value is then above (below) that, by the weight's sign.
    sign = np.sign(weights)[:, None]
    up = (((draws == np.inf) & (sign > 0)) | ((draws == -np.inf) & (sign < 0))).any(axis=0)
    down = (((draws == -np.inf) & (sign > 0)) | ((draws == np.inf) & (sign < 0))).any(axis=0)
    ci = interval(np.where(down, -np.inf, values), np.where(up, np.inf, values), confidence)
    return float(weights @ stars), ci, values


def _least_squares_rows(d_ks: Sequence[float], degree: int) -> tuple[np.ndarray, float]:
    """([degree + 1, d_ks] the rows of (XᵀX)⁻¹Xᵀ for a polynomial in x = ln d_k − its mean:
    each row the weights of one coefficient, lowest power first; that mean)."""
    x = np.log(np.array(d_ks, dtype=float))
    centre = float(x.mean())
    design = np.vander(x - centre, degree + 1, increasing=True)  # [d_ks, degree + 1]
    return np.linalg.pinv(design), centre


def fit_slope(optima: Mapping[float, Located], confidence: float = CONFIDENCE) -> Slope:
    """The slope of log optimum on log d_k over `optima` (d_k -> located optimum), with the
    percentile interval of the slope refitted on every joint draw."""
    if len(optima) < 2:
        raise ValueError(f"need at least two d_k for a slope, got {len(optima)}")
    rows, _ = _least_squares_rows(sorted(optima), 1)
    slope, ci, draws = _functional(optima, rows[1], confidence)
    return Slope(slope, ci, tuple(sorted(optima)), draws)


@dataclasses.dataclass(frozen=True)
class Curve:
    """log optimum as a quadratic in log d_k: its curvature (the x² coefficient: negative when
    the slope steepens as d_k grows) and the local slope at each d_k, each with its interval."""

    curvature: float
    curvature_ci: tuple[float, float]
    local_slopes: dict[float, tuple[float, tuple[float, float]]]  # d_k -> (slope, interval)


def fit_curve(optima: Mapping[float, Located], confidence: float = CONFIDENCE) -> Curve:
    """The quadratic of log optimum on log d_k over `optima` (three d_k or more), by least
    squares, its coefficients' intervals from the same joint draws as `fit_slope`'s. The local
    slope at d_k is b₁ + 2·b₂·(ln d_k − mean ln d_k)."""
    if len(optima) < 3:
        raise ValueError(f"need at least three d_k for a curvature, got {len(optima)}")
    d_ks = sorted(optima)
    rows, centre = _least_squares_rows(d_ks, 2)
    curvature, curvature_ci, _ = _functional(optima, rows[2], confidence)
    local = {}
    for d_k in d_ks:
        slope, ci, _ = _functional(optima, rows[1] + 2 * (math.log(d_k) - centre) * rows[2],
                                   confidence)
        local[d_k] = (slope, ci)
    return Curve(curvature, curvature_ci, local)


def c_grids(rows: list[dict], key: str) -> dict[int, dict[tuple[float, float], dict]]:
    """d_k -> (c, lr) -> seed -> `key` (None where a run has no finished value), over the rows
    of the c·d_k^(-1/2) family (one init's: the caller selects)."""
    out: dict = {}
    for r in rows:
        if (c := scale_family.multiplier(r["policy"])) is not None:
            point = out.setdefault(int(r["d_k"]), {}).setdefault((c, float(r["lr"])), {})
            point[r["seed"]] = cmp.finished_value(r, key)
    return out


def exponent_fit(rows: list[dict], key: str = "final_val_bpb", *, n_draws: int = N_DRAWS,
                 seed: int = 0, confidence: float = CONFIDENCE
                 ) -> tuple[dict[int, Located], dict[int, str], Slope | None]:
    """(d_k -> located c*, d_k -> why not located, the slope over the located d_k or None
    below two) of one init's rows: what `exponent.fit` would call."""
    optima, missing = {}, {}
    for d_k, grid in sorted(c_grids(rows, key).items()):
        try:
            optima[d_k] = locate(grid, n_draws=n_draws, seed=[seed, d_k], confidence=confidence)
        except ValueError as error:
            missing[d_k] = str(error)
    slope = fit_slope(optima, confidence) if len(optima) >= 2 else None
    return optima, missing, slope
